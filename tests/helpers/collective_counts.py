"""Host work per training step of ``python -m bytesplat_ns.train`` (run as ``python -m tests.helpers.collective_counts``).

``python -m tests.helpers.collective_counts OUT <bytesplat_ns.train arguments>``: every rank counts, inside
each training iteration (from the pipeline's loss to the end of its after-iteration callback):

- the torch.distributed calls it makes (``all_reduce``, ``all_gather``, ...);
- ``read FILE:FUNCTION``: the host reads of tensor values (``item``, ``tolist``, ``cpu``, ``int(t)``, ...)
  made by code in ``bytesplat_ns/distributed/`` (what only a sharded run runs; the rasterizer, the
  strategy and torch's own reads are the one-process run's too);
- ``device sync``: the pixel exchange's waits for the device (``pixel._sync``; a no-op on the CPU, counted
  all the same);

and writes ``OUT/counts-rank{R}.json`` (step -> name -> calls) and ``OUT/logged-rank{R}.json`` (step -> the
scalars the step handed nerfstudio's writer, ``GROUP/NAME`` -> value).
"""

from __future__ import annotations

import json
import os
import sys
from collections import defaultdict
from pathlib import Path

import torch
import torch.distributed as dist

COUNTED = ("all_reduce", "all_gather", "batch_isend_irecv", "broadcast", "barrier", "broadcast_object_list")
READS = ("item", "tolist", "cpu", "numpy", "__float__", "__int__", "__bool__", "__index__")
SHARDED_CODE = os.sep + os.path.join("bytesplat_ns", "distributed") + os.sep


def main(out: Path, argv) -> None:
    import bytesplat_ns  # noqa: F401
    from bytesplat_ns.distributed import pixel
    from bytesplat_ns.distributed.pipeline import ShardedPipeline
    from bytesplat_ns.train import parse, run, teardown
    from nerfstudio.utils import writer  # after the pipeline: nerfstudio's configs import the writer first

    counts = defaultdict(lambda: defaultdict(int))
    logged = defaultdict(dict)
    current = {"step": None}

    def count(name: str) -> None:
        if current["step"] is not None:
            counts[current["step"]][name] += 1

    def counting(name, original):
        def call(*args, **kwargs):
            count(name)
            return original(*args, **kwargs)

        return call

    def reading(name, original):
        def read(self, *args, **kwargs):
            caller = sys._getframe(1).f_code
            if SHARDED_CODE in caller.co_filename:
                count(f"read {os.path.basename(caller.co_filename)}:{caller.co_name}")
            return original(self, *args, **kwargs)

        return read

    for name in COUNTED:
        setattr(dist, name, counting(name, getattr(dist, name)))
    for name in READS:
        setattr(torch.Tensor, name, reading(name, getattr(torch.Tensor, name)))
    pixel._sync = counting("device sync", pixel._sync)

    put_scalar, put_dict = writer.put_scalar, writer.put_dict

    def record(name, scalar, step):
        value = scalar.detach() if isinstance(scalar, torch.Tensor) else scalar
        logged[int(step)][str(getattr(name, "value", name))] = float(value)

    def put_scalar_recorded(name, scalar, step):
        record(name, scalar, step)
        return put_scalar(name, scalar, step)

    def put_dict_recorded(name, scalar_dict, step):
        for key, value in scalar_dict.items():
            record(f"{name}/{key}", value, step)
        return put_dict(name, scalar_dict, step)

    writer.put_scalar, writer.put_dict = put_scalar_recorded, put_dict_recorded

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
    (out / f"logged-rank{rank}.json").write_text(json.dumps(logged))
    teardown()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
