"""Multi-process training with sharded Gaussians (ByteSplat 3; docs/distributed.md).

How the ranks split a batch is an exchange (``batch_exchange``), picked by
``--pipeline.communicator``: the record exchange (``dense``, ``sparse-grad``: each rank owns a
contiguous shard of the Gaussians and their optimizer state, ``sharding``; 2D records travel owner
-> renderer and their gradients back through a communicator, ``communicators``), the pixel exchange
(``pixel``: each rank owns a kd cell, ``cells``; partial images travel, ``pixel``), or ``auto``,
which picks ``sparse-grad`` or ``pixel`` from a cost model (``auto``). All of them run on a
point-to-point exchange that also works over gloo (``exchange``); ``step`` runs one record-exchange
step; ``sparse_kernels`` holds the sparse-grad GPU encoder/decoder (``cuda/sparse_grad.cu``);
``pipeline`` plugs it into nerfstudio (rank 0's full copy for the viewer and evaluation included)
and ``trainer`` is its nerfstudio trainer. No DDP anywhere.
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
