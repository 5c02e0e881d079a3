"""Where a training iteration's time goes: nerfstudio's loop body under torch.profiler.

For each method entry (as ``bytesplat_ns.bench.train``'s ``--methods``), on the same scene and seed:
train ``--warmup-iters`` iterations through the real trainer (densification included, so the
Gaussian count is a trained one), then run ``--profile-iters`` more iterations of the trainer's loop
body (callbacks before, ``train_iteration``, callbacks after) and report

- wall ms per iteration (mean, and the median and quartiles of each iteration's host time: the mean
  carries the refine steps and garbage collections, counted apart in ``gc_pauses``), and the GPU's busy
  ms per iteration (sum of kernel times): when wall is well above busy, the step is bound by the host
  (Python, launches, synchronisations), not the GPU;
- the ops with the largest host time and the largest device time, and the number of host-device
  synchronisations (``cudaStreamSynchronize``, ``cudaDeviceSynchronize``, blocking copies);
- where those synchronisations come from (CUDA only): ``--profile-iters`` more iterations under
  torch's sync debug mode, each synchronising call counted at the innermost Python line outside
  torch that made it (``sync_sources``);
- the Python functions with the most host time, their own and under them (``python_top``):
  ``--profile-iters`` more iterations under cProfile.

    python -m bytesplat_ns.bench.profile_train --scene large --warmup-iters 1000 --profile-iters 30 \\
        --methods splatfacto bytesplat:fused --out profile.json
    bytesplat-bench profile --data .data/fox --methods bytesplat bytesplat@fused.trim_tile_lists=true
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import json
import pstats
import statistics
import time
import traceback
import warnings
from collections import Counter
from pathlib import Path
from typing import Callable, Dict, List, Optional

import torch

SYNC_EVENTS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy ")
LAUNCH_EVENTS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")


def kernel_busy_ms(events) -> float:
    """The GPU's kernel time in a profiler's ``key_averages()``, milliseconds (0 without CUDA)."""
    kernels = [e for e in events if getattr(e, "device_type", None) is not None and "CUDA" in str(e.device_type)]
    return sum(e.self_device_time_total for e in kernels) / 1e3


def sync_calls(events) -> Dict[str, int]:
    """The host-device synchronisations in a profiler's ``key_averages()``, by CUDA call."""
    return {e.key: e.count for e in events if e.key.startswith(SYNC_EVENTS)}


def loop_body(trainer, step: int) -> None:
    """One iteration as nerfstudio's Trainer.train runs it, without its logging and viewer."""
    from nerfstudio.engine.callbacks import TrainingCallbackLocation

    trainer.pipeline.train()
    for callback in trainer.callbacks:
        callback.run_callback_at_location(step, location=TrainingCallbackLocation.BEFORE_TRAIN_ITERATION)
    trainer.train_iteration(step)
    for callback in trainer.callbacks:
        callback.run_callback_at_location(step, location=TrainingCallbackLocation.AFTER_TRAIN_ITERATION)


def sync_sources(run_steps, iters: int) -> List[Dict]:
    """Each host-device synchronisation ``run_steps()`` makes, counted per iteration at the innermost
    Python frame outside torch (torch's sync debug mode warns at every synchronising call)."""
    counts: Counter = Counter()

    def record(message, *_args, **_kwargs) -> None:
        if "synchronizing" not in str(message):  # another warning raised during the steps
            return
        frames = [f for f in traceback.extract_stack()[:-1]
                  if "/torch/" not in f.filename and not f.filename.endswith("warnings.py")]
        where = frames[-1] if frames else None
        if where is not None and where.name == "sync_sources":  # switching the debug mode itself
            return
        counts["?" if where is None else f"{'/'.join(Path(where.filename).parts[-2:])}:{where.lineno} {where.name}"] += 1

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            run_steps()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return [{"where": where, "per_iteration": n / iters} for where, n in counts.most_common()]


def top_events(events, key: str, top: int) -> List:
    """The ``top`` profiled events with the most ``key`` (e.g. ``self_cpu_time_total``), the most first."""
    return sorted(events, key=lambda e: getattr(e, key), reverse=True)[:top]


def _table(events, key: str, top: int) -> List[Dict]:
    return [{"name": e.key, "calls": e.count, "host_ms": e.self_cpu_time_total / 1e3,
             "device_ms": getattr(e, "self_device_time_total", 0.0) / 1e3} for e in top_events(events, key, top)]


def profile_method(label: str, config, data: Path, warmup: int, iters: int, work_dir: Path, seed: int,
                   top: int) -> Dict:
    from torch.profiler import ProfilerActivity, profile

    from bytesplat_ns.bench.train import setup_trainer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    trainer, _ = setup_trainer(label, config, data, warmup, work_dir, seed, device)
    trainer.train()  # the warm-up: the real loop, so densification has grown the scene
    step0 = trainer.step + 1
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    t = time.perf_counter()
    ends = []
    with _gc_pauses() as pauses:
        for i in range(iters):  # timed without the profiler's own overhead
            loop_body(trainer, step0 + i)
            ends.append(time.perf_counter())
        sync()
    wall_ms = 1e3 * (time.perf_counter() - t) / iters
    # each iteration's host time (the loop's one device read per step keeps the host at most a step ahead):
    # the median leaves out the refine steps and garbage collections the mean carries
    iteration_ms = [1e3 * (b - a) for a, b in zip([t] + ends[:-1], ends)]
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        for i in range(iters):
            loop_body(trainer, step0 + iters + i)
        sync()
    events = prof.key_averages()
    busy_ms = kernel_busy_ms(events) / iters
    syncs = {key: count / iters for key, count in sync_calls(events).items()}
    sources: List[Dict] = []
    if device == "cuda":
        def run_steps() -> None:
            for i in range(iters):
                loop_body(trainer, step0 + 2 * iters + i)

        sources = sync_sources(run_steps, iters)
        sync()
    python_first = step0 + (3 if device == "cuda" else 2) * iters
    python_top = python_functions(lambda: [loop_body(trainer, python_first + i) for i in range(iters)], iters, top)
    sync()
    result = {
        "label": label,
        "num_gaussians": int(trainer.pipeline.model.num_points),
        "profiled_steps": [step0, python_first + iters - 1],
        "wall_ms_per_iteration": wall_ms,
        "wall_ms_median": statistics.median(iteration_ms),
        "wall_ms_quartiles": [float(q) for q in statistics.quantiles(iteration_ms, n=4)] if iters > 1 else [],
        "gc_pauses": pauses,
        "device_busy_ms_per_iteration": busy_ms,
        "syncs_per_iteration": syncs,
        "sync_sources": sources,
        "pair_room": _pair_room_counts(trainer.pipeline.model),
        "top_host": _table(events, "self_cpu_time_total", top),
        "top_device": _table(events, "self_device_time_total", top) if device == "cuda" else [],
        "python_top": python_top,
    }
    return result


def _pair_room_counts(model) -> Optional[Dict[str, int]]:
    """The steps binned into a room sized ahead and those that did not fit it (bytesplat_ns/pair_capacity.py),
    over the whole run, warm-up included; None where the steps read their pair count back."""
    room = getattr(model, "pair_room", None)
    return None if room is None else {"sized_steps": room.sized_steps, "overflows": room.overflows}


@contextlib.contextmanager
def _gc_pauses():
    """Yields a dict that ends up holding the garbage collections inside the block, per generation:
    how many and their milliseconds (a full collection of a trainer's heap can take tens of them)."""
    pauses: Dict[str, Dict[str, float]] = {}
    began: List[float] = []

    def callback(phase: str, info: Dict) -> None:
        if phase == "start":
            began.append(time.perf_counter())
        elif began:
            row = pauses.setdefault(f"gen{info['generation']}", {"count": 0, "ms": 0.0})
            row["count"] += 1
            row["ms"] += 1e3 * (time.perf_counter() - began.pop())

    gc.callbacks.append(callback)
    try:
        yield pauses
    finally:
        gc.callbacks.remove(callback)


def python_functions(run: Callable[[], object], iters: int, top: int) -> Dict[str, List[Dict]]:
    """``run()`` under cProfile: the Python functions with the most time of their own (``self``) and with
    the most time under them (``total``), per iteration. On a GPU the kernels run asynchronously, so this
    is the host's time: interpreter, dispatch, launches and the waits of device reads. cProfile's own
    overhead inflates every call alike; the ranking, not the absolute times, is the point."""
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        run()
    finally:
        profiler.disable()
    stats = pstats.Stats(profiler).stats  # {(file, line, name): (calls, primitive calls, self s, total s, callers)}

    def rows(index: int) -> List[Dict]:
        ranked = sorted(stats.items(), key=lambda item: item[1][index], reverse=True)[:top]
        return [{"function": _function_name(key), "calls": value[1] / iters, "self_ms": 1e3 * value[2] / iters,
                 "total_ms": 1e3 * value[3] / iters} for key, value in ranked]

    return {"self": rows(2), "total": rows(3)}


def _function_name(key) -> str:
    """``package/module.py:LINE name`` from pstats' (file, line, name), built-ins as cProfile names them."""
    filename, line, name = key
    if filename == "~":
        return name
    return f"{'/'.join(Path(filename).parts[-2:])}:{line} {name}"


def parser() -> argparse.ArgumentParser:
    """``bytesplat-bench profile``'s options (also how a suite's profile steps are checked)."""
    p = argparse.ArgumentParser(prog="bytesplat-bench profile", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scene", default="large", choices=["small", "medium", "large"])
    p.add_argument("--data", type=Path, default=None,
                   help="a capture (nerfstudio or instant-ngp transforms.json) instead of the built-in scene, at its "
                   "photos' own resolution (nerfstudio-data --downscale-factor 1, as the wall-clock suites)")
    p.add_argument("--methods", nargs="+", default=["splatfacto", "bytesplat:fused"])
    p.add_argument("--warmup-iters", type=int, default=1000)
    p.add_argument("--profile-iters", type=int, default=30)
    p.add_argument("--num-downscales", type=int, default=0)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--work-dir", type=Path, default=Path("outputs/bench_profile"))
    p.add_argument("--out", type=Path, default=None)
    return p


def main(argv: Optional[List[str]] = None) -> Dict:
    a = parser().parse_args(argv)

    import bytesplat_ns  # noqa: F401  (registers the torch.load allow-list)
    from bytesplat_ns.bench.train import environment, method_from_entry
    from bytesplat_ns.data.scene import SceneSpec, ensure_scene

    def configure(config) -> None:
        config.pipeline.model.num_downscales = a.num_downscales
        if a.data is not None:
            config.pipeline.datamanager.dataparser.downscale_factor = 1

    data = a.data.resolve() if a.data is not None else ensure_scene(SceneSpec(size=a.scene))
    scene = str(a.data) if a.data is not None else a.scene
    report = {"benchmark": "bytesplat-bench profile", "environment": environment(argv, "python -m bytesplat_ns.bench.profile_train"),
              "scene": scene, "warmup_iters": a.warmup_iters, "profile_iters": a.profile_iters, "runs": []}
    for entry in a.methods:
        label, config = method_from_entry(entry, configure)
        r = profile_method(label, config, data, a.warmup_iters, a.profile_iters, a.work_dir, a.seed, a.top)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # the method's trainer is gone with profile_method's frame
        report["runs"].append(r)
        print(f"{label}: {r['num_gaussians']} Gaussians, wall {r['wall_ms_per_iteration']:.2f} ms/it "
              f"(median {r['wall_ms_median']:.2f}, garbage collections {r['gc_pauses']}), "
              f"GPU busy {r['device_busy_ms_per_iteration']:.2f} ms/it, syncs/it {r['syncs_per_iteration']}, "
              f"pair room {r['pair_room']}", flush=True)
        for row in r["top_host"][:12]:
            print(f"   host {row['host_ms'] / a.profile_iters:7.3f} ms/it  x{row['calls'] / a.profile_iters:5.1f}  {row['name'][:70]}")
        for row in r["top_device"][:12]:
            print(f"    dev {row['device_ms'] / a.profile_iters:7.3f} ms/it  x{row['calls'] / a.profile_iters:5.1f}  {row['name'][:70]}")
        for row in r["sync_sources"][:12]:
            print(f"   sync x{row['per_iteration']:5.2f}/it  {row['where']}")
        for row in r["python_top"]["self"][:12]:
            print(f"     py {row['self_ms']:7.3f} ms/it self, {row['total_ms']:7.3f} total  x{row['calls']:5.1f}  "
                  f"{row['function'][:70]}")
        if a.out:
            a.out.parent.mkdir(parents=True, exist_ok=True)
            a.out.write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
