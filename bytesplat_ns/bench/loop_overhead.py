r"""``bytesplat-bench loop``: the training loop's own host time per step, with the step itself stubbed out.

    bytesplat-bench loop --iterations 3000 --repeats 3 --out loop.json

A trainer of the built-in small scene on the CPU (reference rasterizer) runs one real step, then its
``train_iteration`` returns that step's loss and metrics without computing anything and its callbacks
are removed: what ``trainer.train()`` still spends is the loop around the step (mode switches, the
timing events and their writer dispatch, the logged steps' console table and tensorboard event, the
eval and checkpoint schedule checks, the final checkpoint). Each loop of ``--loops`` (``lean``:
bytesplat's, ``--lean-training-loop True``; ``nerfstudio``: ``Trainer.train``) runs ``--repeats``
times, alternating, on the same trainer; microseconds per step for each run. No evals run (their
schedules are off), so this is the per-step cost alone.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from bytesplat_ns.errors import BytesplatError

LOOPS = ("lean", "nerfstudio")


def stubbed_trainer(work: Path):
    """A set-up CPU trainer of the built-in small scene whose step returns one real step's outputs."""
    import torch
    from nerfstudio.engine.callbacks import TrainingCallbackLocation

    from bytesplat_ns.bench.train import setup_trainer
    from bytesplat_ns.data.scene import SceneSpec, ensure_scene
    from bytesplat_ns.method_configs.bytesplat import bytesplat_config

    scene = ensure_scene(SceneSpec(size="small", num_views=6, width=32), cache_dir=work / "scenes")
    trainer, _ = setup_trainer("loop", copy.deepcopy(bytesplat_config), scene, 1, work / "runs", seed=0, device="cpu")
    for callback in trainer.callbacks:  # the model's step-0 set-up (its optimizers), as the loop would
        callback.run_callback_at_location(0, TrainingCallbackLocation.BEFORE_TRAIN_ITERATION)
    loss, loss_dict, metrics_dict = trainer.train_iteration(0)

    def detached(value):
        return value.detach() if isinstance(value, torch.Tensor) else value

    outputs = (loss.detach(), {k: detached(v) for k, v in loss_dict.items()}, {k: detached(v) for k, v in metrics_dict.items()})
    trainer.train_iteration = lambda step: outputs
    trainer.callbacks = []
    trainer._start_step = 1
    return trainer


def time_loop(trainer, lean: bool, iterations: int) -> float:
    """Microseconds per step of one ``trainer.train()`` of ``iterations`` stubbed steps."""
    trainer.config.lean_training_loop = lean
    trainer.config.max_num_iterations = iterations
    start = time.perf_counter()
    trainer.train()
    return (time.perf_counter() - start) / iterations * 1e6


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bytesplat-bench loop", description=__doc__.split("\n\n")[0].strip(" r\"`"))
    p.add_argument("--iterations", type=int, default=3000, help="stubbed steps per run")
    p.add_argument("--repeats", type=int, default=3, help="runs of each loop, alternating")
    p.add_argument("--loops", nargs="+", choices=LOOPS, default=list(LOOPS))
    p.add_argument("--out", type=Path, default=Path("loop.json"))
    return p


def main(argv: Optional[Sequence[str]] = None) -> Dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    if args.iterations < 1 or args.repeats < 1:
        raise BytesplatError(f"--iterations and --repeats must be at least 1, got {args.iterations} and {args.repeats}")
    from bytesplat_ns.bench.city_render import cpu_model
    from bytesplat_ns.bench.train import environment

    times: Dict[str, List[float]] = {loop: [] for loop in args.loops}
    with tempfile.TemporaryDirectory(prefix="bytesplat-loop-") as work:
        trainer = stubbed_trainer(Path(work))
        for repeat in range(args.repeats):
            for loop in args.loops:
                times[loop].append(time_loop(trainer, loop == "lean", args.iterations))
                print(f"[loop] {loop} run {repeat + 1}: {times[loop][-1]:.1f} us per step", flush=True)
    rows = [{"loop": loop, "iterations": args.iterations, "us_per_step": runs, "median_us": statistics.median(runs)}
            for loop, runs in times.items()]
    result: Dict = {"benchmark": "bytesplat-bench loop", "rows": rows, "cpu": cpu_model(), "cpu_count": os.cpu_count(),
                    **environment(argv, prog="bytesplat-bench loop")}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
