"""Collectives per training step of ``python -m bytesplat_ns.train`` (run as ``python -m tests.helpers.collective_counts``).

``python -m tests.helpers.collective_counts OUT <bytesplat_ns.train arguments>``: every rank counts the
torch.distributed calls it makes inside each training iteration (from the pipeline's loss to the
end of its after-iteration callback) and writes ``OUT/counts-rank{R}.json``: step -> name -> calls.
"""

from __future__ import annotations

import json
import os
import sys
from collections import defaultdict
from pathlib import Path

import torch.distributed as dist

COUNTED = ("all_reduce", "all_gather", "batch_isend_irecv", "broadcast", "barrier", "broadcast_object_list")


def main(out: Path, argv) -> None:
    import bytesplat_ns  # noqa: F401
    from bytesplat_ns.distributed.pipeline import ShardedPipeline
    from bytesplat_ns.train import parse, run, teardown

    counts = defaultdict(lambda: defaultdict(int))
    current = {"step": None}

    def counting(name, original):
        def call(*args, **kwargs):
            if current["step"] is not None:
                counts[current["step"]][name] += 1
            return original(*args, **kwargs)

        return call

    for name in COUNTED:
        setattr(dist, name, counting(name, getattr(dist, name)))

    loss_dict, after_iteration = ShardedPipeline.get_train_loss_dict, ShardedPipeline._after_iteration

    def get_train_loss_dict(self, step):
        current["step"] = step
        return loss_dict(self, step)

    def _after_iteration(self, step, trainer):
        after_iteration(self, step, trainer)
        current["step"] = None

    ShardedPipeline.get_train_loss_dict = get_train_loss_dict
    ShardedPipeline._after_iteration = _after_iteration
    run(parse(argv))
    rank = int(os.environ.get("RANK", "0"))
    (out / f"counts-rank{rank}.json").write_text(json.dumps({int(s): dict(c) for s, c in counts.items()}))
    teardown()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
