"""The bytesplat trainers: multi-process launches shard instead of DDP; checkpoints are atomic."""

from __future__ import annotations

import copy

import torch

from bytesplat_ns.distributed.pipeline import ShardedPipelineConfig
from bytesplat_ns.distributed.trainer import ShardedTrainerConfig
from bytesplat_ns.method_configs.bytesplat import bytesplat_config
from bytesplat_ns.trainer import write_checkpoint


def test_several_processes_get_the_sharded_trainer(monkeypatch):
    built = {}
    monkeypatch.setattr(ShardedTrainerConfig, "setup", lambda self, **kwargs: built.update(config=self, **kwargs))
    config = copy.deepcopy(bytesplat_config)
    config.setup(local_rank=1, world_size=2)
    assert isinstance(built["config"], ShardedTrainerConfig)
    assert isinstance(built["config"].pipeline, ShardedPipelineConfig)
    assert built["config"].method_name == "bytesplat"
    assert (built["local_rank"], built["world_size"]) == (1, 2)


def test_write_checkpoint_replaces_atomically_and_removes_only_the_superseded_one(tmp_path):
    models = tmp_path / "nerfstudio_models"
    first = write_checkpoint({"step": 1, "x": torch.ones(3)}, models, 1, keep_only_latest=True)
    second = write_checkpoint({"step": 2, "x": torch.zeros(3)}, models, 2, keep_only_latest=True, supersedes=first)
    assert sorted(p.name for p in models.iterdir()) == [second.name]  # no .partial, no older step
    assert not first.exists()
    assert torch.load(second)["step"] == 2
    third = write_checkpoint({"step": 3, "x": torch.zeros(3)}, models, 3, keep_only_latest=True)
    assert second.exists() and third.exists()  # not superseded by this caller: kept


def test_gpu_backend_on_cpu_is_a_clear_error():
    import pytest

    from bytesplat_ns.errors import BytesplatError
    from bytesplat_ns.raster import resolve_backend

    assert resolve_backend("auto", torch.device("cpu")) == "reference"
    with pytest.raises(BytesplatError, match="needs a CUDA device"):
        resolve_backend("gsplat", torch.device("cpu"))
    with pytest.raises(BytesplatError, match="Unknown rasterizer"):
        resolve_backend("magic", torch.device("cpu"))


def test_a_burst_of_no_steps_is_a_clear_error_before_the_run_directory_is_made(tmp_path):
    import copy

    import pytest

    from bytesplat_ns.errors import SettingError
    from bytesplat_ns.method_configs.bytesplat import bytesplat_config

    config = copy.deepcopy(bytesplat_config)
    config.output_dir = tmp_path
    config.batched_scalars_steps_per_write = 0
    with pytest.raises(SettingError, match="--batched-scalars-steps-per-write must be at least 1, got 0"):
        config.set_timestamp()
    assert list(tmp_path.iterdir()) == []


def test_auto_backend_on_cuda_is_fused_or_gsplat_with_the_cause(monkeypatch):
    """auto on a CUDA device: the fused kernels when they build, else gsplat with the build error
    named in a warning (resolution only; no GPU needed)."""
    import pytest

    from bytesplat_ns.raster import _build, resolve_backend

    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(_build, "load_extension", lambda verbose=False: object())
    assert resolve_backend("auto", cuda) == "fused"

    def broken(verbose=False):
        raise _build.CudaBuildError("nvcc was not found (set CUDA_HOME)")

    monkeypatch.setattr(_build, "load_extension", broken)
    with pytest.warns(UserWarning, match="nvcc was not found.*rasterizing with gsplat"):
        assert resolve_backend("auto", cuda) == "gsplat"


def test_cuda_extensions_name_their_cause_without_a_gpu(monkeypatch, tmp_path):
    """Both JIT extensions (rasterizer, sparse-grad) refuse with one message naming the cause on a
    machine without a usable GPU, and a build's name follows its sources (no stale cache reuse)."""
    import shutil

    import pytest

    from bytesplat_ns.distributed import sparse_kernels
    from bytesplat_ns.raster import _build

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for load in (_build.load_extension, sparse_kernels.load_extension):
        with pytest.raises(_build.CudaBuildError, match="needs a CUDA GPU, but torch sees none"):
            load()
    copy = tmp_path / "cuda"
    shutil.copytree(_build.cuda_source_dir(), copy)
    monkeypatch.setattr(_build, "cuda_source_dir", lambda: copy)
    before = (_build.RASTER_KERNELS.name("90"), _build.SPARSE_GRAD_KERNELS.name("90"))
    assert before[0].startswith("bytesplat_cuda_90_") and before[1].startswith("bytesplat_sparse_grad_90_")
    flags = _build.nvcc_flags
    with monkeypatch.context() as patched:  # flags are part of the name
        patched.setattr(_build, "nvcc_flags", lambda arch: flags(arch) + ["-DEDITED"])
        assert _build.RASTER_KERNELS.name("90") != before[0]
    assert _build.RASTER_KERNELS.name("90") == before[0]
    (copy / "common.cuh").write_text((copy / "common.cuh").read_text() + "\n// edited\n")
    assert _build.RASTER_KERNELS.name("90") != before[0]  # a header edit rebuilds the rasterizer
    assert _build.SPARSE_GRAD_KERNELS.name("90") == before[1]  # ... not the independent sparse-grad kernels
    (copy / "sparse_grad.cu").write_text((copy / "sparse_grad.cu").read_text() + "\n// edited\n")
    assert _build.SPARSE_GRAD_KERNELS.name("90") != before[1]
