// Python bindings of the sparse-grad communicator's encoder/decoder kernels (cuda/sparse_grad.cu),
// a separate extension from the rasterizer's (built by bytesplat_ns/distributed/sparse_kernels.py).
#include <torch/extension.h>

#include <vector>

namespace bytesplat {
std::vector<at::Tensor> sparse_grad_encode(const at::Tensor &grad);
void sparse_grad_decode(const at::Tensor &index, const at::Tensor &values, const at::Tensor &sent_index,
                        const at::Tensor &buffer, const at::Tensor &bad);
}  // namespace bytesplat

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "bytesplat sparse-coded gradient encoder/decoder kernels";
    m.def("sparse_grad_encode", &bytesplat::sparse_grad_encode,
          "[m, G] gradients -> (int32 index of rows with any non-zero entry, their values)");
    m.def("sparse_grad_decode", &bytesplat::sparse_grad_decode,
          "buffer[sent_index[index[i]]] += values[i] (atomicAdd, in place); out-of-range indices set bad[0] = 1");
}
