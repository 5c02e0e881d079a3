"""Multi-process training with sharded Gaussians (DESIGN "Distributed", ByteSplat 3).

Each rank owns a contiguous shard of the Gaussians and their optimizer state (``sharding``);
a batch of views is spread over the ranks; 2D records travel owner -> renderer and their gradients
back through a communicator (``communicators``: ``dense``, ``sparse-grad``) built on a
point-to-point exchange that also works over gloo (``exchange``); ``step`` runs one training step;
``sparse_kernels`` holds the sparse-grad GPU encoder/decoder (``cuda/sparse_grad.cu``); ``pipeline``
plugs all of it into nerfstudio (rank 0's full copy for the viewer and evaluation included).
No DDP anywhere. User guide: docs/distributed.md.
"""

from bytesplat_ns.distributed.communicators import (
    COMMUNICATORS,
    CommStats,
    Communicator,
    DenseCommunicator,
    Records,
    SparseGradCommunicator,
    dense_grad_record_bytes,
    forward_record_bytes,
    make_communicator,
    sparse_grad_record_bytes,
)
from bytesplat_ns.distributed.exchange import DistributedError, ExchangeStats, exchange, pack, unpack
from bytesplat_ns.distributed.runtime import StepWatchdog, init_distributed
from bytesplat_ns.distributed.sharding import ShardLayout, gather_layout, gather_to_rank0, rebalance, shard_of
from bytesplat_ns.distributed.step import (
    ShardedForward,
    StepResult,
    Views,
    assign_views,
    composite_records,
    distributed_step,
    SPLATFACTO_LRS,
    make_adam_optimizers,
    scale_adam_for_batch,
    sharded_render_loss,
    single_process_loss,
    single_process_step,
    splatfacto_loss,
)

__all__ = [
    "COMMUNICATORS",
    "CommStats",
    "Communicator",
    "DenseCommunicator",
    "DistributedError",
    "ExchangeStats",
    "Records",
    "ShardLayout",
    "ShardedForward",
    "SparseGradCommunicator",
    "StepResult",
    "StepWatchdog",
    "Views",
    "assign_views",
    "composite_records",
    "dense_grad_record_bytes",
    "distributed_step",
    "exchange",
    "forward_record_bytes",
    "gather_layout",
    "gather_to_rank0",
    "init_distributed",
    "SPLATFACTO_LRS",
    "make_adam_optimizers",
    "make_communicator",
    "pack",
    "rebalance",
    "scale_adam_for_batch",
    "shard_of",
    "sharded_render_loss",
    "single_process_loss",
    "single_process_step",
    "sparse_grad_record_bytes",
    "splatfacto_loss",
    "unpack",
]
