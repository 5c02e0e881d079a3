"""``python -m bytesplat_ns.train <method> <ns-train arguments>``: ns-train for sharded multi-process runs.

Meant to be started by torchrun (single- or multi-node)::

    torchrun --nproc-per-node N -m bytesplat_ns.train bytesplat [ns-train arguments] \\
        [--pipeline.communicator {dense,sparse-grad,pixel,auto}] [--pipeline.views-per-step B]

It takes the same arguments as ``ns-train`` for the bytesplat methods, with their pipeline swapped for
the sharded one (``bytesplat_ns.distributed.trainer.sharded_variant``: no DDP, Gaussians and optimizer
state sharded over the ranks). The process group comes from torchrun's environment (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT, LOCAL_RANK): gloo with ``--machine.device-type cpu``, NCCL with cuda.
Without torchrun it runs as one process. Every user error and every failed rank ends this process
with one ``bytesplat: error: ...`` line and a non-zero exit.
"""

from __future__ import annotations

import os
import random
import sys
from typing import Dict, Tuple

import numpy as np
import torch

from bytesplat_ns.errors import BytesplatError


def _bytesplat_methods() -> Tuple[Dict, Dict]:
    from bytesplat_ns.distributed.trainer import sharded_variant
    from bytesplat_ns.method_registry import registered_methods

    configs, descriptions = registered_methods()
    methods = {name: sharded_variant(config) for name, config in configs.items()}
    return methods, {name: descriptions[name] + " (sharded over the torchrun ranks)" for name in methods}


def parse(argv=None):
    from bytesplat_ns.method_registry import parse_method_config

    return parse_method_config(*_bytesplat_methods(), argv, __doc__)


def run(config):
    """Set up and train on this rank (the process group comes from torchrun's environment); returns
    the trainer. The caller ends with ``teardown()``."""
    import torch.distributed as dist

    from bytesplat_ns.distributed.runtime import DEFAULT_TIMEOUT_S, init_distributed, launched_distributed

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if config.data:
        config.pipeline.datamanager.data = config.data
    if config.load_config:
        raise BytesplatError("--load-config is not supported by bytesplat_ns.train; pass the arguments again.")
    # A bad command line fails on every rank alike (rank 0 alone prints it) before the ranks meet: a rank that
    # left after the process group formed could leave a peer still connecting to its store.
    if hasattr(config, "check_inputs"):
        config.check_inputs()
    if launched_distributed():
        if config.machine.device_type == "cuda" and not torch.cuda.is_available():
            raise BytesplatError("--machine.device-type cuda was asked for but no CUDA device is available.")
        init_distributed("nccl" if config.machine.device_type == "cuda" else "gloo",
                         timeout_s=getattr(config.pipeline, "rank_timeout", DEFAULT_TIMEOUT_S))
    config.machine.num_devices = world
    # One timestamp (output directory) for all ranks.
    if rank == 0:
        config.set_timestamp()
    if world > 1:
        box = [config.timestamp]
        dist.broadcast_object_list(box, src=0)
        config.timestamp = box[0]
    if rank == 0:
        config.print_to_terminal()
        config.save_config()

    seed = config.machine.seed + rank
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)

    trainer = config.setup(local_rank=local_rank, world_size=world)
    trainer.setup()
    trainer.train()
    return trainer


def teardown() -> None:
    """Wait for every rank, then leave the process group (after ``run``)."""
    import torch.distributed as dist

    from bytesplat_ns.distributed.exchange import wrap_failure

    if dist.is_initialized():
        if dist.get_world_size() > 1:
            try:
                dist.barrier()
            except Exception as error:  # noqa: BLE001
                raise wrap_failure("waiting for every rank at the end of training", None, error) from error
        dist.destroy_process_group()


def main(argv=None) -> None:
    import bytesplat_ns  # noqa: F401  (checkpoint allow-list, error hook)

    rank = int(os.environ.get("RANK", "0"))
    config = parse_once(argv, rank)
    try:
        run(config)
        teardown()
    except BytesplatError as error:
        if speaks_for_all_ranks(error, rank):
            sys.stderr.write(f"\nbytesplat: error: {error}\n")
            sys.stderr.flush()
        # A peer may be gone: do not wait in process-group teardown.
        os._exit(1)


def parse_once(argv, rank: int):
    """Parse on every rank, but let only rank 0 print tyro's usage or error text: every rank parses
    the same command line, so the others would only repeat it."""
    if rank == 0:
        return parse(argv)
    with open(os.devnull, "w") as devnull:
        saved = sys.stderr, sys.stdout
        sys.stderr = sys.stdout = devnull
        try:
            return parse(argv)
        finally:
            sys.stderr, sys.stdout = saved


def speaks_for_all_ranks(error: BytesplatError, rank: int) -> bool:
    """Whether this rank prints ``error``: rank 0 prints every error; the others only their own
    communication failures (a bad flag, data set or checkpoint fails the same way on every rank)."""
    from bytesplat_ns.distributed.exchange import DistributedError

    return rank == 0 or isinstance(error, DistributedError)


if __name__ == "__main__":
    main()
