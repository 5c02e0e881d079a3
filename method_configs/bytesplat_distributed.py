"""The ``bytesplat-distributed`` method: ``bytesplat`` with its Gaussians sharded over the processes.

Same schedule, model and hyper-parameters as ``bytesplat`` (method_configs/bytesplat.py); the pipeline
is ``bytesplat_ns.distributed.pipeline.ShardedPipeline`` (no DDP; ``--pipeline.communicator
{dense,sparse-grad,pixel,auto}`` picks how the ranks split a batch) and the trainer checkpoints every rank's
Gaussians from rank 0. Run it with ``ns-train bytesplat-distributed --machine.num-devices N`` on one
GPU host (nerfstudio's own launcher spawns the ranks and builds this config's sharded trainer and
pipeline in each), or with ``torchrun --nproc-per-node N -m bytesplat_ns.train bytesplat ...``
(multi-node, and CPU/gloo: nerfstudio 1.1.5's launcher asserts CUDA, so on CPU ``ns-train
--machine.num-devices N`` stops at once with a message pointing to torchrun). In one process it
trains like ``bytesplat`` with a batch of ``--pipeline.views-per-step`` views. See docs/distributed.md.
"""

from __future__ import annotations

from nerfstudio.plugins.types import MethodSpecification

from bytesplat_ns.method_configs.bytesplat import bytesplat_config
from bytesplat_ns.distributed.trainer import sharded_variant

bytesplat_distributed_config = sharded_variant(bytesplat_config, method_name="bytesplat-distributed")

bytesplat_distributed = MethodSpecification(
    config=bytesplat_distributed_config,
    description="bytesplat with Gaussians sharded over GPUs (sparse-coded gradient exchange, no DDP).",
)
