r"""``bytesplat-bench wallclock``: the wall clock of ``ns-train`` as a user runs it, then ``ns-eval``.

    bytesplat-bench wallclock --data DATA --iterations 5000 --seeds 0 1 2 \
        --out outputs/wallclock_fox.json --work-dir outputs/wallclock

For each method and seed, one separate process runs nerfstudio's own ``ns-train`` entry point with
the method's defaults and the same data, iterations and ``--machine.seed``, through
:mod:`bytesplat_ns.bench.timed_ns_train` (timers around the trainer's phases, nothing else changed);
then ``ns-eval`` scores the final checkpoint. ``wall_s`` is measured here, from launching the
process to its exit; the breakdown comes from the timers (``other_s`` is what they do not cover).

A method entry is ``METHOD`` or ``LABEL=METHOD EXTRA ARGS`` (e.g. ``"ref=bytesplat
--pipeline.model.rasterizer reference"``) to compare configurations of one method; a first word
naming a launcher picks it (``"fast=bytesplat-train bytesplat"``: bytesplat's own launcher instead of
``ns-train``). See docs/wallclock.md for what each timer includes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Collection, Dict, List, Optional, Sequence

from bytesplat_ns.bench.gpu_sharing import GpuProcessWatch
from bytesplat_ns.bench.timed_ns_train import LAUNCHERS, step_window
from bytesplat_ns.errors import BytesplatError
from bytesplat_ns.strategy import REFINE_SCHEDULE, refine_due

BREAKDOWN = ("startup_s", "data_s", "steps_s", "eval_s", "log_s", "save_s", "other_s")
SUMMARY_KEYS = ("wall_s", *BREAKDOWN, "psnr", "ssim", "lpips", "psnr_worst_image", "num_gaussians",
                "peak_gpu_memory_mb", "peak_host_memory_mb", "gc_full_s",
                "step_median_ms", "step_p99_ms", "first_step_ms", "slow_steps", "slow_steps_excess_s")


@dataclass(frozen=True)
class MethodEntry:
    label: str
    method: str
    extra_args: tuple
    launcher: str = "ns-train"

    @staticmethod
    def parse(text: str) -> "MethodEntry":
        label, _, rest = text.partition("=") if "=" in text.split(" ", 1)[0] else ("", "", text)
        words = shlex.split(rest)
        launcher = words.pop(0) if words and words[0] in LAUNCHERS else "ns-train"
        if not words:
            raise BytesplatError(f"wallclock: method entry {text!r} names no method")
        default_label = words[0] if launcher == "ns-train" else f"{launcher}-{words[0]}"  # not the ns-train run's
        return MethodEntry(label or default_label, words[0], tuple(words[1:]), launcher)


def run_name(seed: int, repeat: int = 0) -> str:
    """A run's timestamp folder: ``seed0``, and ``seed0-r1``... for the repeats of one seed."""
    return f"seed{seed}" + (f"-r{repeat}" if repeat else "")


def ns_train_args(entry: MethodEntry, data: Optional[Path], iterations: int, seed: int, out_dir: Path,
                  dataparser: Sequence[str], repeat: int = 0, keep_checkpoints: bool = False) -> List[str]:
    """The arguments after ``ns-train``: what a user types, plus where the run goes (and, with
    ``keep_checkpoints``, every checkpoint kept, not only the latest: for ``--spoilers``)."""
    args = [entry.method]
    if data is not None:
        args += ["--data", str(data)]
    args += ["--vis", "tensorboard", "--max-num-iterations", str(iterations), "--machine.seed", str(seed),
             "--viewer.quit-on-train-completion", "True", "--output-dir", str(out_dir),
             "--experiment-name", entry.label, "--timestamp", run_name(seed, repeat)]
    if keep_checkpoints:
        args += ["--save-only-latest-checkpoint", "False"]
    return args + [*entry.extra_args, *dataparser]


def _run_logged(command: List[str], log: Path) -> float:
    """Run ``command`` with its output in ``log``; its wall seconds from launch to exit."""
    with open(log, "w") as out:
        start = time.perf_counter()
        rc = subprocess.call(command, stdout=out, stderr=subprocess.STDOUT)
        wall = time.perf_counter() - start
    if rc != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
        raise BytesplatError(f"wallclock: {shlex.join(command[:6])} ... exited with {rc}: {tail[0]}",
                             hint=f"the full output is in {log}")
    return wall


def breakdown(wall_s: float, launch: float, timings: Dict) -> Dict[str, float]:
    """The phases of one run; they sum to ``wall_s``. ``startup_s`` is launch to ``Trainer.setup``
    plus the setup that is not data loading (model, optimizers, writers)."""
    seconds = timings["seconds"]
    parts = {
        "startup_s": (timings.get("setup_start", launch) - launch) + seconds["setup_s"],
        **{key: seconds[key] for key in ("data_s", "steps_s", "eval_s", "log_s", "save_s")},
    }
    parts["other_s"] = wall_s - sum(parts.values())
    return parts


def startup_fields(launch: float, timings: Dict) -> Dict[str, float]:
    """``startup_s`` in its three parts: the interpreter up to the timing wrapper's first line, which
    comes after the bytesplat package's import and so after torch's (``startup_interpreter_s``); the
    imports and argument parsing up to ``Trainer.setup``, nerfstudio's method table for ``ns-train``
    included (``startup_imports_s``); the setup that is not data: model, optimizers, writers
    (``startup_setup_s``)."""
    start, setup = timings.get("process_start"), timings.get("setup_start")
    if start is None or setup is None:
        return {}
    return {"startup_interpreter_s": start - launch, "startup_imports_s": setup - start,
            "startup_setup_s": timings["seconds"]["setup_s"]}


def gc_fields(timings: Dict) -> Dict[str, float]:
    """Full garbage collections while training and their seconds (part of whichever phase they stalled)."""
    gc = timings.get("gc")
    if not gc:
        return {}
    return {"gc_full_collections": gc["collections"][2], "gc_full_s": gc["seconds"][2], "gc_s": sum(gc["seconds"])}


SLOW_STEP_FACTOR = 3.0
STEP_WINDOW = 1000  # nerfstudio's schedules (SH degree, splatfacto's coarse-to-fine resolution) change on thousands


def step_time_fields(step_ms: List[float]) -> Dict[str, float]:
    """The distribution of single step times (in the order they ran): the typical step, its tail, the
    first (kernel loading and lazy initialisation land there), and the steps slower than
    ``SLOW_STEP_FACTOR`` x the median with the seconds they took beyond a median step; and the median of
    each ``STEP_WINDOW`` steps in turn (a step's cost moves with the schedule: the Gaussian count, the SH
    degree and the training image's resolution all grow)."""
    if not step_ms:
        return {}
    ordered = sorted(step_ms)
    median = statistics.median(ordered)
    slow = [t for t in ordered if t > SLOW_STEP_FACTOR * median]
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"step_median_ms": median, "step_p90_ms": pick(0.9), "step_p99_ms": pick(0.99), "step_max_ms": ordered[-1],
            "first_step_ms": step_ms[0],
            "slow_steps": len(slow), "slow_steps_excess_s": sum(t - median for t in slow) / 1000.0,
            "step_median_ms_by_window": [statistics.median(step_ms[i:i + STEP_WINDOW])
                                         for i in range(0, len(step_ms), STEP_WINDOW)]}


STEP_KINDS = ("first", "capture", "schedule_change", "refine", "after_eval", "plain")


def step_kind(step: int, schedule: Dict[str, int], capture_steps: Collection[int] = ()) -> str:
    """What a train iteration does beyond a plain step (its own after-callbacks included), by the run's
    ``schedule`` (``timed_ns_train.training_schedule``): the first; one that captured a CUDA graph of the step
    (``capture_steps``, bytesplat's --cuda-graph-steps); a change of the SH degree or of the training
    resolution (new shapes); a densification step (gsplat's rule, ``strategy.refine_due``); the step after an
    eval (whose render it queued behind); otherwise plain. The first match in that order."""
    if step == schedule["start_step"]:
        return "first"
    if step in capture_steps:
        return "capture"
    sh_every, res_every = schedule["sh_degree_interval"], schedule["resolution_schedule"]
    if (sh_every > 0 and step % sh_every == 0 and step // sh_every <= schedule["sh_degree"]) or (
            res_every > 0 and step % res_every == 0 and step // res_every <= schedule["num_downscales"]):
        return "schedule_change"
    if refine_due(step, **{key: schedule[key] for key in REFINE_SCHEDULE}):
        return "refine"
    evals = (schedule["steps_per_eval_image"], schedule["steps_per_eval_all_images"], schedule["steps_per_eval_batch"])
    if step - 1 > 0 and any(every > 0 and (step - 1) % every == 0 for every in evals):
        return "after_eval"  # nerfstudio's step_check: no eval at step 0
    return "plain"


def step_kind_fields(step_ms: List[float], schedule: Optional[Dict[str, int]],
                     capture_steps: Collection[int] = ()) -> Dict:
    """The steps by kind (``step_kind``): how many, their median and their total, so that a run's step time
    splits into the plain steps' and the scheduled extra work's."""
    if not step_ms or not schedule:
        return {}
    kinds: Dict[str, List[float]] = {}
    captures = set(capture_steps)
    for i, ms in enumerate(step_ms):
        kinds.setdefault(step_kind(schedule["start_step"] + i, schedule, captures), []).append(ms)
    return {"step_kinds": {kind: {"steps": len(kinds[kind]), "median_ms": statistics.median(kinds[kind]),
                                  "total_s": sum(kinds[kind]) / 1000.0} for kind in STEP_KINDS if kind in kinds}}


def read_eval(path: Path, lpips_measured: bool = True) -> Dict[str, float]:
    """ns-eval's psnr, ssim and lpips; lpips only where it was really computed (``lpips_measured``:
    False when the offline check stood a placeholder in for it)."""
    results = json.loads(path.read_text())["results"]
    keys = ("psnr", "ssim", "lpips") if lpips_measured else ("psnr", "ssim")
    # ns-eval's spread over the eval images (get_std): a mean over a few images hides one bad view
    keys += tuple(f"{key}_std" for key in keys)
    # a single eval image has no spread (ns-eval writes NaN): left out
    return {key: float(results[key]) for key in keys if key in results and math.isfinite(float(results[key]))}


def eval_image_fields(images: List[Dict]) -> Dict:
    """Each eval image's metrics (``eval_images.py``) and the worst image's PSNR."""
    psnrs = [image["psnr"] for image in images if image.get("psnr") is not None]
    return {"eval_images": images, **({"psnr_worst_image": min(psnrs)} if psnrs else {})}


def lpips_weights_cached() -> bool:
    from bytesplat_ns.compat import lpips_weights

    return lpips_weights()[1].is_file()


def run_one(entry: MethodEntry, seed: int, args: argparse.Namespace, repeat: int = 0) -> Dict:
    name = run_name(seed, repeat)
    run_dir = Path(args.work_dir) / f"{entry.label}-{name}"
    run_dir.mkdir(parents=True, exist_ok=True)
    timings_path = run_dir / "timings.json"
    train_args = ns_train_args(entry, args.data, args.iterations, seed, run_dir, shlex.split(args.dataparser), repeat,
                               keep_checkpoints=args.spoilers)
    command = [sys.executable, "-m", "bytesplat_ns.bench.timed_ns_train", "--timings", str(timings_path),
               *(["--offline-lpips"] if args.offline_lpips else []),
               *(["--skip-image-writes"] if args.skip_image_writes else []),
               *(["--profile-steps", "{}:{}".format(*args.profile_steps)] if args.profile_steps else []),
               "--launcher", entry.launcher, "--", *train_args]
    launch = time.time()
    with GpuProcessWatch() as gpu_watch:
        wall_s = _run_logged(command, run_dir / "train.log")
    timings = json.loads(timings_path.read_text())
    # OUT/EXPERIMENT/METHOD_NAME/TIMESTAMP: a method's config may name itself unlike its CLI name
    config = next(iter(sorted(run_dir.glob(f"{entry.label}/*/{name}/config.yml"))), run_dir / "config.yml")
    record = {
        "method": entry.label, "ns_method": entry.method, "launcher": entry.launcher, "seed": seed, "repeat": repeat,
        "iterations": args.iterations, "concurrent_runs": args.parallel,
        # work outside this invocation shares the GPU too (gpu_sharing.py); None: no nvidia-smi
        "gpu_processes_max": gpu_watch.most,
        # the host's load beside it (a busy host slows a host-bound step): highest 1-minute average seen
        "host_load_max": gpu_watch.host_load_max, "host_cpus": os.cpu_count(),
        # tensorboard's image writes skipped (quality only): the wall clock is not what a user waits for
        "image_writes_skipped": args.skip_image_writes,
        "wall_s": wall_s, **breakdown(wall_s, launch, timings), **startup_fields(launch, timings),
        # the part of other_s after the trainer finished: interpreter and writer shutdown
        "exit_s": launch + wall_s - timings["process_end"],
        # the part of other_s inside Trainer.train: the loop's own overhead (None: not recorded)
        "train_untimed_s": timings.get("train_untimed_s"),
        # ... of which the loop's, up to the trainer's _after_train (the final save and the wait for
        # queued eval images and checkpoint writes are after it)
        "loop_untimed_s": timings.get("loop_untimed_s"),
        "num_gaussians": timings.get("num_gaussians"), "peak_gpu_memory_mb": timings.get("peak_gpu_memory_mb"),
        "peak_host_memory_mb": timings.get("peak_host_memory_mb"), "train_image_size": timings.get("train_image_size"),
        # Gaussians the budget removed (bytesplat; None for other methods): the default changed on 2026-12-06
        "budget_removed": timings.get("budget_removed"),
        # the trainer's all-images eval on its schedule (steps_per_eval_all_images): when quality moved
        "eval_curve": timings.get("eval_curve", []),
        **gc_fields(timings), **step_time_fields(timings.get("step_ms") or []),
        **step_kind_fields(timings.get("step_ms") or [], timings.get("schedule"), timings.get("graph_capture_steps") or ()),
        # bytesplat's steps replayed as CUDA graphs: how many, the captures' count and host seconds, and the
        # captures that failed (step and error; two in a row end graph steps for the run)
        **({"graph_replays": timings["graph_replays"], "graph_captures": len(timings["graph_capture_steps"]),
            "graph_capture_s": timings["graph_capture_s"],
            "graph_capture_failures": timings.get("graph_capture_failures", [])} if "graph_replays" in timings else {}),
        **({"step_profile": timings["step_profile"]} if timings.get("step_profile") else {}),
        **({"detail_s": timings["detail_s"]} if timings.get("detail_s") else {}),
        "ns_train_command": f"{entry.launcher} " + shlex.join(train_args),
        "launched_command": shlex.join(command), "config": str(config),
    }
    if args.eval:
        # ns-eval itself, keeping each eval image's metrics and the worst one's panel (eval_images.py)
        record["ns_eval_wall_s"] = run_eval(config, run_dir, args.offline_lpips)
        eval_json = run_dir / "eval.json"
        record["ns_eval_command"] = f"ns-eval --load-config {shlex.quote(str(config))} --output-path {shlex.quote(str(eval_json))}"
        record.update(eval_outputs(run_dir, lpips_measured=not args.offline_lpips or lpips_weights_cached()))
        if (run_dir / WORST_VIEW).is_file():
            record["worst_view"] = str(run_dir / WORST_VIEW)
        if args.spoilers and record.get("eval_images"):
            record["spoilers"] = run_spoilers(config, run_dir, min(record["eval_images"], key=lambda i: i["psnr"])["file"])
        if entry.method.startswith("bytesplat"):
            # the same checkpoint rendered by other backends: a view spoiled by our eval render only
            # scores better there; one spoiled by the trained Gaussians scores the same
            by_rasterizer = {}
            for name in args.eval_rasterizers:
                run_eval(config, run_dir, args.offline_lpips, rasterizer=name)
                by_rasterizer[name] = eval_outputs(run_dir, lpips_measured=False, rasterizer=name)
                # flat too: the summary and the results page's table show them beside the run's own eval
                for key in OTHER_BACKEND_KEYS:
                    if key in by_rasterizer[name]:
                        record[f"{key}_with_{name}"] = by_rasterizer[name][key]
            if by_rasterizer:
                record["eval_by_rasterizer"] = by_rasterizer
    return record


# psnr_with_gsplat, psnr_worst_image_with_gsplat: the run's checkpoint evaluated through gsplat (--eval-rasterizers)
OTHER_BACKEND_KEYS = ("psnr", "psnr_worst_image")
WORST_VIEW = "worst_view.png"  # in each run folder: ground truth | render | depth of the worst eval image


def eval_outputs(run_dir: Path, lpips_measured: bool, rasterizer: Optional[str] = None) -> Dict:
    """What :func:`run_eval` wrote: ns-eval's means and spreads and each eval image's metrics."""
    suffix = f"-{rasterizer}" if rasterizer else ""
    return {**read_eval(run_dir / f"eval{suffix}.json", lpips_measured),
            **eval_image_fields(json.loads((run_dir / f"eval_images{suffix}.json").read_text()))}


def run_eval(config: Path, run_dir: Path, offline_lpips: bool, rasterizer: Optional[str] = None) -> float:
    """ns-eval of ``config`` through eval_images.py, into ``run_dir`` (``eval[-R].json``,
    ``eval_images[-R].json``, ``worst_view[-R].png``, ``eval[-R].log``); its wall seconds.
    ``offline_lpips``: every method's LPIPS goes through bytesplat's offline check (no network
    wait, no crash)."""
    suffix = f"-{rasterizer}" if rasterizer else ""
    worst = run_dir / WORST_VIEW.replace(".png", f"{suffix}.png")
    command = [sys.executable, "-m", "bytesplat_ns.bench.eval_images", "--images", str(run_dir / f"eval_images{suffix}.json"),
               "--worst-view", str(worst), *(["--offline-lpips"] if offline_lpips else []),
               *(["--rasterizer", rasterizer] if rasterizer else []),
               "--", "--load-config", str(config), "--output-path", str(run_dir / f"eval{suffix}.json")]
    return _run_logged(command, run_dir / f"eval{suffix}.log")


def run_spoilers(config: Path, run_dir: Path, image: str) -> Dict:
    """``bytesplat-bench spoilers`` on the run's worst eval image (``spoilers.json``, ``spoilers.log``); a
    failure is recorded in its place (the run's own numbers stand without it)."""
    out = run_dir / "spoilers.json"
    try:
        _run_logged([sys.executable, "-m", "bytesplat_ns.bench.spoilers", "--load-config", str(config), "--image",
                     image, "--out", str(out)], run_dir / "spoilers.log")
    except BytesplatError as e:
        return {"image": image, "error": str(e)}
    return json.loads(out.read_text())


def summarize(runs: List[Dict]) -> Dict[str, Dict[str, Dict[str, float]]]:
    """Per method: mean, median, min and max over its runs of every number they have (per method
    and iteration count, named "METHOD@ITERATIONS", when the runs have several counts)."""
    several = len({r["iterations"] for r in runs}) > 1

    def group(run: Dict) -> str:
        return f"{run['method']}@{run['iterations']}" if several else run["method"]

    summary: Dict[str, Dict[str, Dict[str, float]]] = {}
    for label in dict.fromkeys(map(group, runs)):
        mine = [r for r in runs if group(r) == label]
        summary[label] = {"seeds": len({r["seed"] for r in mine}), "runs": len(mine)}  # type: ignore[dict-item]
        other_backends = sorted({f"{key}_with_{name}" for r in mine for name in r.get("eval_by_rasterizer", {})
                                 for key in OTHER_BACKEND_KEYS if f"{key}_with_{name}" in r})
        for key in (*SUMMARY_KEYS, *other_backends):
            values = [float(r[key]) for r in mine if r.get(key) is not None]
            if values:
                summary[label][key] = {"mean": statistics.fmean(values), "median": statistics.median(values),
                                       "min": min(values), "max": max(values)}
    return summary


def plot_breakdown(summary: Dict, path: Path, title: str) -> None:
    """Stacked bars, one per method: the mean seconds of each phase."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(summary)
    fig, ax = plt.subplots(figsize=(max(4.0, 1.6 * len(labels) + 2), 4.5))
    bottom = [0.0] * len(labels)
    for key in BREAKDOWN:
        heights = [max(0.0, summary[m].get(key, {}).get("mean", 0.0)) for m in labels]
        ax.bar(labels, heights, bottom=bottom, label=key[:-2])
        bottom = [b + h for b, h in zip(bottom, heights)]
    for i, m in enumerate(labels):
        ax.text(i, bottom[i], f"{summary[m]['wall_s']['mean']:.1f} s", ha="center", va="bottom")
    ax.set_ylabel("seconds (mean over seeds)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bytesplat-bench wallclock", description=__doc__.split("\n\n")[0].strip(" r\"`"))
    p.add_argument("--methods", nargs="+", default=["splatfacto", "bytesplat"],
                   help="METHOD or 'LABEL=METHOD EXTRA ARGS' (default: splatfacto bytesplat)")
    p.add_argument("--seeds", nargs="+", type=int, default=[0])
    p.add_argument("--repeats", type=int, default=1,
                   help="runs of each (method, seed): the same command again, for the spread that GPU atomics and "
                   "threaded CPU reductions leave between identical runs")
    p.add_argument("--parallel", type=int, default=1,
                   help="runs at once (on one machine: their wall times then measure contention, not the method; "
                   "for quality and spread only; recorded as concurrent_runs)")
    p.add_argument("--iterations", type=int, default=5000)
    p.add_argument("--data", type=Path, default=None, help="dataset path (omitted: each method's default data)")
    p.add_argument("--dataparser", default="nerfstudio-data --downscale-factor 1",
                   help="the dataparser subcommand and its options, after the method's ('' for the method's own); "
                        "the default pins the photos' own resolution: without --downscale-factor nerfstudio-data "
                        "trains at half resolution whenever an images_2/ folder exists")
    p.add_argument("--work-dir", type=Path, default=Path("outputs/wallclock"), help="run directories and logs")
    p.add_argument("--out", type=Path, default=Path("wallclock.json"), help="JSON output path")
    p.add_argument("--plot", type=Path, default=None, help="PNG of the stacked breakdown (default: next to --out)")
    p.add_argument("--no-eval", dest="eval", action="store_false", help="skip ns-eval")
    p.add_argument("--offline-lpips", action="store_true",
                   help="every method builds LPIPS through bytesplat's offline check (compat.offline_safe_lpips): on a "
                   "machine without the network or cached AlexNet weights, splatfacto then skips LPIPS as bytesplat does "
                   "instead of waiting on (and failing) the download; lpips is reported only where it was computed")
    p.add_argument("--skip-image-writes", action="store_true",
                   help="quality-only runs: the trainer renders its eval images on schedule (the same training and "
                   "random stream) but tensorboard does not encode them (465 of splatfacto's 1071 s at 30000 "
                   "iterations on the fox capture); recorded as image_writes_skipped, and such runs' wall clocks are "
                   "left out of wall-clock comparisons, as --parallel runs are")
    p.add_argument("--eval-rasterizers", nargs="+", default=[], choices=("reference", "gsplat", "fused"),
                   help="bytesplat runs: ns-eval the final checkpoint again with each of these backends (recorded as "
                   "eval_by_rasterizer: the metrics and each eval image's)")
    p.add_argument("--spoilers", action="store_true",
                   help="after ns-eval, which Gaussians spoil the worst eval view and since when (bytesplat-bench "
                   "spoilers, recorded as spoilers); ns-train then keeps every checkpoint (--save-only-latest-checkpoint "
                   "False), one per steps-per-save")
    p.add_argument("--profile-steps", type=step_window, default=None, metavar="START:STOP",
                   help="torch.profiler over train iterations START to STOP-1 of each run, between its other "
                   "steps (STOP below --iterations): its GPU kernel time, kernel launches and host-device "
                   "synchronisations per step, and the ops taking the most of the host's own time, recorded as "
                   "step_profile (the window's steps are slower for it)")
    p.add_argument("--merge", nargs="+", type=Path, default=None, metavar="JSON",
                   help="run nothing: combine the runs of earlier wallclock JSON files (e.g. one per seed, "
                   "each in its own session) into --out, with the summary and plot over all of them")
    return p


def merged(paths: Sequence[Path]) -> Dict:
    """One result from several wallclock files: their runs, the first file's environment."""
    parts = []
    for path in paths:
        try:
            parts.append(json.loads(Path(path).read_text()))
        except (OSError, json.JSONDecodeError) as error:
            raise BytesplatError(f"wallclock --merge: cannot read {path}: {error}") from error
        if parts[-1].get("benchmark") != "bytesplat-bench wallclock":
            raise BytesplatError(f"wallclock --merge: {path} is not a bytesplat-bench wallclock result")
    runs = [run for part in parts for run in part["runs"]]
    keys = [(r["method"], r["seed"], r.get("repeat", 0), r["iterations"]) for r in runs]
    if len(set(keys)) != len(keys):
        raise BytesplatError("wallclock --merge: the files repeat a (method, seed, repeat, iterations) run")
    result = {k: v for k, v in parts[0].items() if k not in ("runs", "summary")}
    result["merged_from"] = [str(p) for p in paths]
    result["commands"] = [part.get("command") for part in parts]
    return {**result, "runs": runs, "summary": summarize(runs)}


def main(argv: Optional[List[str]] = None) -> Dict:
    from bytesplat_ns.bench.train import environment

    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    if args.merge:
        return write_result(merged(args.merge), args)
    entries = [MethodEntry.parse(m) for m in args.methods]
    if len({e.label for e in entries}) != len(entries):
        raise BytesplatError("wallclock: two method entries share a label", hint="name them: 'LABEL=METHOD ARGS'")
    if args.data is not None and not args.data.exists():
        raise BytesplatError(f"wallclock: data path {args.data} does not exist")
    if args.profile_steps is not None and args.profile_steps[1] >= args.iterations:
        raise BytesplatError(f"wallclock: --profile-steps ends at iteration {args.profile_steps[1]}, which a run of "
                             f"{args.iterations} iterations does not reach", hint="STOP below --iterations")
    if args.repeats < 1 or args.parallel < 1:
        raise BytesplatError("wallclock: --repeats and --parallel must be at least 1")
    jobs = [(entry, seed, repeat) for seed in args.seeds for repeat in range(args.repeats) for entry in entries]

    def attempt(job) -> Dict:
        entry, seed, repeat = job
        try:
            return run_one(entry, seed, args, repeat)
        except BytesplatError as error:  # recorded; the other runs still count
            return {"method": entry.label, "seed": seed, "repeat": repeat, "iterations": args.iterations,
                    "error": error.message, "hint": error.hint}

    if args.parallel == 1:
        runs = [attempt(job) for job in jobs]
    else:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(args.parallel) as pool:  # each run is its own process; threads only wait
            runs = list(pool.map(attempt, jobs))
    summary = summarize([run for run in runs if "error" not in run])
    result = {"benchmark": "bytesplat-bench wallclock", **environment(argv, prog="bytesplat-bench wallclock"),
              "iterations": args.iterations, "data": None if args.data is None else str(args.data),
              "runs": runs, "summary": summary}
    write_result(result, args)
    failed = [run for run in runs if "error" in run]
    if failed:
        raise BytesplatError(f"wallclock: {len(failed)} of {len(runs)} runs failed, the others are in {args.out}: "
                             + "; ".join(run["error"] for run in failed)[:600],
                             hint=failed[0].get("hint"))
    return result


def write_result(result: Dict, args: argparse.Namespace) -> Dict:
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    plot = args.plot or args.out.with_suffix(".png")
    iterations = sorted({r["iterations"] for r in result["runs"]})
    plot_breakdown(result["summary"], plot, f"ns-train wall, {'/'.join(map(str, iterations))} iterations, {result['device']}")
    print(f"wrote {args.out} and {plot}")
    return result
