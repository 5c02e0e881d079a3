r"""``bytesplat-bench report``: regenerate the results page (docs/results.md) from the committed suite
documents (``docs/results/<suite>.json``, written by ``bytesplat-bench suite``) and their figures
(``docs/results/plots/<suite>/``).

Every table names the suite command that reproduces it, and the GPU, versions and date of the run
behind it. The page is a pure function of the JSON files (sorted by suite name, no time of
generation), so regenerating unchanged results gives the same bytes.

    bytesplat-bench report                     # docs/results/*.json -> docs/results.md
    bytesplat-bench report --results-dir R --out R.md

It also writes the wall-clock runs of each capture's suites as one flat list
(``docs/benchmarks/wallclock_fox_h200.json`` and ``_h100.json``: ``{"runs": [...]}``, one entry per ``ns-train`` run with
its method, seed, iterations, wall clock and breakdown, eval metrics, and the suite, command, GPU,
versions and date it came from), for tools that want the numbers without the suite documents.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import random
import re
import shlex
import statistics
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from bytesplat_ns.bench.city_render import KINDS as CITY_VIEW_KINDS
from bytesplat_ns.bench.gpu_sharing import measures_the_method, runs_sharing_gpu
from bytesplat_ns.bench.plots import detect_kind
from bytesplat_ns.bench.wallclock import STEP_KINDS
from bytesplat_ns.errors import BytesplatError

HOWTO = """\
## Running a suite on a GPU machine

Each table below comes from one suite: a declared list of `bytesplat-bench` runs
(`bytesplat_ns/bench/suites.py`; `bytesplat-bench suite --list` names them with their purpose and
GPUs, `--dry-run` prints their commands). On the GPU machine, from a checkout:

```bash
scripts/fetch_bench_baselines.sh     # once, where PyPI is reachable: gsplat 1.5.3 and fussim into .whl_bench/
source scripts/gpu_setup.sh          # carried wheels (.whl/, .whl_bench/), built extensions (.ext/), our kernels
bytesplat-bench suite raster-1080p --results-dir docs/results
bytesplat-bench suite wallclock-fox --data /path/to/capture --results-dir docs/results
bytesplat-bench report               # rewrites this page from docs/results/*.json
```

A suite writes `docs/results/<suite>.json` (every step's command, status and JSON output, with the
GPU, versions and date) and its figures in `docs/results/plots/<suite>/`; step logs and run
directories stay in `outputs/suites/<suite>/`. Commit the JSON and the figures, then the page.

On a machine lent for short calls (a few minutes each, released when idle), `bytesplat-bench queue`
runs the setup and the suites in a detached process that outlives the call: the first call starts
it and collects, every later call collects (`python3 -m bytesplat_ns.bench.queue --help`). Each
collect packs the suites' JSON and figures, the logs and the extensions the setup built (carried in
`.ext/` they spare the next machine the build), and says at once when the machine is a fresh one.
"""

RASTER_COLUMNS = (("fused", "raster_loss_fused_split"), ("gsplat", "raster_loss_gsplat"))
FULL_COLUMNS = (("fused", "full_fused_split"), ("gsplat", "full_gsplat"))


def _ms(stage) -> Optional[float]:
    return stage.get("median_ms") if isinstance(stage, dict) else None


def _f(value, fmt: str = "{:.2f}") -> str:
    return "-" if value is None else fmt.format(value)


def _times(slow: Optional[float], fast: Optional[float]) -> str:
    """How many times ``fast`` is faster than ``slow`` ("-" unless both are measured)."""
    return _f(slow / fast if slow and fast else None, "{:.2f}x")


def _count(n: float) -> str:
    return f"{n / 1e6:g}M" if n >= 1e6 else f"{n / 1e3:g}k" if n >= 1e3 else f"{n:g}"


def _table(header: Sequence[str], rows: List[Sequence[str]]) -> List[str]:
    return (["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            + ["| " + " | ".join(r) + " |" for r in rows])


def raster_table(steps: List[Dict]) -> List[str]:
    """Raster + loss (and the whole step from 3D Gaussians when measured), fused vs gsplat, per count."""
    rows = []
    for step in steps:
        r = step["result"]
        for run in r["runs"]:
            cells = [step["name"], f"{r.get('width')}x{r.get('height')}", _count(run["num_gaussians"])]
            for columns in (RASTER_COLUMNS, FULL_COLUMNS):
                fused, gsplat = (_ms(run.get(key)) for _, key in columns)
                cells += [_f(fused), _f(gsplat), _times(gsplat, fused)]
            rows.append(cells)
    lines = _table(["step", "size", "Gaussians", "raster+loss fused ms", "gsplat ms", "speed-up",
                    "from 3D: render+loss+bwd fused ms", "gsplat ms", "speed-up"], rows)
    for table in (baseline_table(steps), opacity_tiles_table(steps), fast_exp_table(steps), bwd_2px_table(steps),
                  rows_cull_table(steps), trimmed_table(steps)):
        lines += [""] + table if table else []
    return lines


def _ab_rows(steps: List[Dict], marker: str, suffix: str, keys: Sequence[str], first_cells) -> List[List[str]]:
    """One row per run that measured the A/B variant ``suffix`` (``marker`` in the run): ``first_cells(run)``,
    then for each of ``keys`` the default's and the variant's median ms and the ratio, then the relative
    difference of the split schedule's loss values (``fused_split<suffix>_loss_value`` against the default's)."""
    rows = []
    for step in steps:
        for run in step["result"]["runs"]:
            if marker not in run:
                continue
            variant_loss = run.get(f"fused_split{suffix}_loss_value")
            cells = first_cells(run)
            for key in keys:
                default, variant = _ms(run.get(key)), _ms(run.get(key + suffix))
                cells += [_f(default), _f(variant), _times(default, variant)]
            a = run.get("fused_split_loss_value")
            cells.append(_f(abs(variant_loss - a) / abs(a) if isinstance(a, float) and isinstance(variant_loss, float)
                            and a else None, "{:.1e}"))
            rows.append(cells)
    return rows


def fast_exp_table(steps: List[Dict]) -> List[str]:
    """The split schedule and the forward with expf and with the falloff as 2^q (``FusedOptions.fast_exp``),
    and the two loss values' relative difference (float rounding only)."""
    rows = _ab_rows(steps, "raster_loss_fused_split_fast_exp", "_fast_exp", ("raster_loss_fused_split", "raster_fwd_fused"),
                    lambda run: [_count(run["num_gaussians"])])
    return _table(["Gaussians", "raster+loss ms", "falloff as 2^q", "faster by", "forward ms", "falloff as 2^q",
                   "faster by", "loss diff (rel.)"], rows) if rows else []


def bwd_2px_table(steps: List[Dict]) -> List[str]:
    """The split schedule with one and with two pixels per thread in its backward
    (``FusedOptions.bwd_pixels_per_thread``), and the two loss values' relative difference."""
    rows = _ab_rows(steps, "raster_loss_fused_split_bwd_2px", "_bwd_2px", ("raster_loss_fused_split",),
                    lambda run: [_count(run["num_gaussians"])])
    return _table(["Gaussians", "raster+loss ms", "2 pixels per thread in the backward", "faster by",
                   "loss diff (rel.)"], rows) if rows else []


def rows_cull_table(steps: List[Dict]) -> List[str]:
    """The split schedule with the backward's per-warp cull on the box and with the rows test
    (``FusedOptions.warp_cull_rows``), on the square and on the opacity-aware tile lists, and the two loss
    values' relative difference (the same render: summation order only)."""
    rows = _ab_rows(steps, "raster_loss_fused_split_rows_cull", "_rows_cull",
                    ("raster_loss_fused_split", "raster_loss_fused_split_opacity_tiles"),
                    lambda run: [_count(run["num_gaussians"]), _f(run.get("warp_blocks_per_entry_box")),
                                 _f(run.get("warp_blocks_per_entry_rows"))])
    return _table(["Gaussians", "warp blocks per entry: box", "rows", "raster+loss ms", "rows cull", "faster by",
                   "on opacity-aware lists ms", "rows cull", "faster by", "loss diff (rel.)"], rows) if rows else []


def trimmed_table(steps: List[Dict]) -> List[str]:
    """The opacity-aware tile lists as binned and trimmed of the entries no 8x4 block of their tile can
    composite (``FusedOptions.trim_tile_lists``): entries, the trimming's time, the split schedule (also with
    the rows cull, with the falloff as 2^q, and with every opt-in render lever) and the forward on each, and the
    two loss values' relative difference (summation order)."""
    rows = []
    for step in steps:
        for run in step["result"]["runs"]:
            if "intersections_trimmed" not in run:
                continue
            cells = [_count(run["num_gaussians"]), str(run.get("intersections_opacity_aware")),
                     str(run["intersections_trimmed"]), _f(_ms(run.get("trim_tile_lists_cuda")))]
            for default, variant in (("raster_loss_fused_split_opacity_tiles", "raster_loss_fused_split_trimmed"),
                                     ("raster_loss_fused_split_opacity_tiles", "raster_loss_fused_split_trimmed_rows_cull"),
                                     ("raster_loss_fused_split_opacity_tiles", "raster_loss_fused_split_trimmed_fast_exp"),
                                     ("raster_loss_fused_split_opacity_tiles", "raster_loss_fused_split_trimmed_levers"),
                                     ("raster_fwd_fused_opacity_tiles", "raster_fwd_fused_trimmed")):
                a, b = _ms(run.get(default)), _ms(run.get(variant))
                cells += [_f(a), _f(b), _times(a, b)]
            a, b = run.get("fused_split_opacity_tiles_loss_value"), run.get("fused_split_trimmed_loss_value")
            cells.append(_f(abs(b - a) / abs(a) if isinstance(a, float) and isinstance(b, float) and a else None,
                            "{:.1e}"))
            rows.append(cells)
    return _table(["Gaussians", "opacity-aware entries", "trimmed", "trimming ms", "raster+loss ms", "trimmed",
                   "faster by", "raster+loss ms", "trimmed + rows cull", "faster by", "raster+loss ms",
                   "trimmed + 2^q falloff", "faster by", "raster+loss ms",
                   "trimmed + 2^q falloff + 2 px per backward thread", "faster by", "forward ms", "trimmed",
                   "faster by", "loss diff (rel.)"], rows) if rows else []


def opacity_tiles_table(steps: List[Dict]) -> List[str]:
    """The split schedule on the projection's square tile boxes and on the opacity-aware reach
    (``FusedOptions.opacity_aware_tiles``): tile-list entries, binning, raster + loss and from-3D times,
    and the two loss values' relative difference (the same render: rounding only)."""
    rows = _ab_rows(steps, "intersections_opacity_aware", "_opacity_tiles", ("binning_cuda", "raster_loss_fused_split", "full_fused_split"),
                    lambda run: [_count(run["num_gaussians"]), str(run.get("intersections")),
                                 str(run["intersections_opacity_aware"])])
    return _table(["Gaussians", "tile entries", "opacity-aware", "binning ms", "opacity-aware", "faster by",
                   "raster+loss ms", "opacity-aware", "faster by", "from 3D ms", "opacity-aware", "faster by",
                   "loss diff (rel.)"], rows) if rows else []


def baseline_table(steps: List[Dict]) -> List[str]:
    """Each baseline pair (gsplat version x SSIM) against the fused split schedule, per count: the
    raster + loss from the same 2D inputs and the whole render + loss + backward from 3D, with the
    pair's loss value relative to the fused one."""
    runs = [run for step in steps for run in step["result"]["runs"]]
    # pairs also timed on the opacity-aware lists get two more columns (results before those lists have none), and
    # two more where the fused split also ran on the trimmed lists (the default): against the same baseline time
    tight_lists = any("raster_loss_opacity_tiles" in b for run in runs for b in run.get("baselines") or [])
    trimmed = tight_lists and any(_trimmed_default_ms(run) is not None for run in runs)
    extra = 2 * tight_lists + 2 * trimmed
    rows = []
    for run in runs:
        fused_raster, fused_full = _ms(run.get("raster_loss_fused_split")), _ms(run.get("full_fused_split"))
        fused_tight, fused_default = _ms(run.get("raster_loss_fused_split_opacity_tiles")), _trimmed_default_ms(run)
        for b in run.get("baselines") or []:
            if "error" in b:
                rows.append([_count(run["num_gaussians"]), str(b.get("gsplat", b.get("site", "?"))), str(b.get("ssim", "-")),
                             *["-"] * (5 + extra), b["error"][:80]])
                continue
            raster, full, tight = _ms(b.get("raster_loss")), _ms(b.get("full")), _ms(b.get("raster_loss_opacity_tiles"))
            rows.append([_count(run["num_gaussians"]), b["gsplat"], b["ssim"], _f(raster), _times(raster, fused_raster),
                         _f(full), _times(full, fused_full),
                         *([_f(tight), _times(tight, fused_tight)] if tight_lists else []),
                         *([_f(fused_default), _times(tight, fused_default)] if trimmed else []),
                         _f(b.get("loss_rel_diff_vs_fused"), "{:.1e}"), ""])
    if not rows:
        return []
    return _table(["Gaussians", "gsplat", "SSIM", "raster+loss ms", "fused speed-up", "from 3D ms", "fused speed-up",
                   *(["on opacity-aware lists ms", "fused speed-up"] if tight_lists else []),
                   *(["fused on its default lists, trimming included, ms", "speed-up vs those"] if trimmed else []),
                   "loss vs fused (rel.)", "note"], rows)


def _trimmed_default_ms(run: Dict) -> Optional[float]:
    """The fused split schedule as training runs it by default (the run's ``training_arm``; before runs named it,
    the trimmed opacity-aware lists with expf, the default then), with the trimming's own time added (the
    binning, before it, is left out of every raster + loss time alike)."""
    arm = run.get("training_arm", "raster_loss_fused_split_trimmed")
    render, trim = _ms(run.get(arm)), _ms(run.get("trim_tile_lists_cuda"))
    return None if render is None or trim is None else render + trim


def train_table(steps: List[Dict]) -> List[str]:
    """Per method over all the suite's train runs: ms/iteration and eval quality (mean +- std over seeds),
    with the seed-paired differences against splatfacto when it ran."""
    runs = [run for step in steps for run in step["result"]["runs"]]
    methods = list(dict.fromkeys(run.get("method", run["label"]) for run in runs))
    by_seed = {(run.get("method", run["label"]), run.get("seed")): run for run in runs}
    baseline = "splatfacto" if "splatfacto" in methods else None

    def spread(values: List[float], fmt: str) -> str:
        if not values:
            return "-"
        if len(values) == 1:
            return fmt.format(values[0])
        return f"{fmt.format(statistics.fmean(values))} +- {fmt.replace('+', '').format(statistics.stdev(values))}"

    rows = []
    for m in methods:
        mine = [run for run in runs if run.get("method", run["label"]) == m]
        psnr = [run["eval"]["psnr"] for run in mine if run.get("eval", {}).get("psnr") is not None]
        ssim = [run["eval"]["ssim"] for run in mine if run.get("eval", {}).get("ssim") is not None]
        pairs = [(run, by_seed.get((baseline, run.get("seed")))) for run in mine] if baseline and m != baseline else []
        pairs = [(a, b) for a, b in pairs if b is not None]
        speedup = [b["ms_per_iteration"] / a["ms_per_iteration"] for a, b in pairs]
        dpsnr = [a["eval"]["psnr"] - b["eval"]["psnr"] for a, b in pairs]
        rows.append([m, str(len(mine)), spread([run["ms_per_iteration"] for run in mine], "{:.2f}"),
                     spread(psnr, "{:.2f}"), spread(ssim, "{:.4f}"),
                     spread([float(run["num_gaussians"]) for run in mine if run.get("num_gaussians")], "{:,.0f}"),
                     spread(speedup, "{:.2f}x"), spread(dpsnr, "{:+.2f}")])
    vs = f"vs {baseline}, by seed" if baseline else "vs baseline"
    return _table(["method", "runs", "ms/iteration", "eval PSNR dB", "SSIM", "Gaussians",
                   f"speed-up {vs}", f"PSNR diff {vs}"], rows)


def distributed_table(steps: List[Dict]) -> List[str]:
    rows = []
    for step in steps:
        for res in step["result"]["results"]:
            ok = res.get("status") == "ok"
            sent = res.get("bytes_per_step") or {}
            memory = res.get("peak_memory_mb")
            peak = max(memory) / 1024 if isinstance(memory, list) and memory else (memory / 1024 if memory else None)
            rows.append([_count(res["num_gaussians"]), res["impl"], res["communicator"], str(res["ranks"]),
                         res.get("status", "-"), _f(res.get("views_per_second") if ok else None),
                         _f(res.get("median_step_ms") if ok else None, "{:.1f}"),
                         _f(peak if ok else None, "{:.1f}"),
                         _f(sent.get("forward_bytes") / 1e6 if ok and sent.get("forward_bytes") is not None else None,
                            "{:,.0f}"),
                         _f(sent.get("backward_bytes") / 1e6 if ok and sent.get("backward_bytes") is not None else None,
                            "{:,.0f}")])
    return _table(["Gaussians", "impl", "communicator", "ranks", "status", "views/s", "step ms",
                   "peak GiB/GPU", "forward MB/step", "backward MB/step"], rows)


def _paired(diffs: List[float]) -> str:
    """Paired differences as mean +- standard deviation ("-" for none)."""
    if not diffs:
        return "-"
    return f"{statistics.fmean(diffs):+.3f} +- {statistics.stdev(diffs) if len(diffs) > 1 else 0.0:.3f}"


def wallclock_table(steps: List[Dict]) -> List[str]:
    """Per method: the mean of every summarized number over its seeds, and its eval PSNR paired by seed
    with the step's first method."""
    rows, keys = [], []
    for step in steps:
        runs = step["result"].get("runs", [])
        first = runs[0]["method"] if runs else None
        psnr = {(r["method"], r["seed"]): r["psnr"] for r in runs if r.get("psnr") is not None and not r.get("repeat")}
        for method, row in step["result"].get("summary", {}).items():
            stats = {k: v for k, v in row.items() if isinstance(v, dict) and "mean" in v}
            keys += [k for k in stats if k not in keys]
            diffs = [v - psnr[(first, seed)] for (m, seed), v in psnr.items() if m == method and (first, seed) in psnr]
            paired = "baseline" if method == first else _paired(diffs)
            psnr_stats = stats.get("psnr", {})
            spread = f"{psnr_stats['min']:.2f}-{psnr_stats['max']:.2f}" if "min" in psnr_stats else "-"
            run_count = row.get("runs")
            runs_of = f"{row.get('seeds')}" + (
                f" ({run_count} runs)" if run_count is not None and run_count != row.get("seeds") else "")
            label = f"{step['name']}: {method}" if len(steps) > 1 else method
            at_once = max((runs_sharing_gpu(r) for r in runs if r["method"] == method), default=1)
            label += f" ({at_once} at once)" if at_once > 1 else ""
            label += " (image writes skipped)" if any(r.get("image_writes_skipped") for r in runs
                                                       if r["method"] == method) else ""
            rows.append((label, runs_of, stats, paired, spread))
    table = _table(["method", "seeds", *keys, "PSNR min-max", "PSNR diff vs the first method, by seed"],
                   [[m, n, *(_f(s[k]["mean"]) if k in s else "-" for k in keys), sp, d] for m, n, s, d, sp in rows])
    across = across_steps_table(steps) if len(steps) > 1 else []
    kinds = step_kinds_table(steps)
    profiles = step_profile_table(steps)
    return (table + (["", *across] if across else []) + (["", *kinds] if kinds else [])
            + (["", *profiles] if profiles else []))


def step_profile_table(steps: List[Dict]) -> List[str]:
    """One row per run that profiled a window of its steps (``wallclock --profile-steps``): per step in the
    window, the wall (the profiler's overhead included), the GPU's kernel time, kernel launches, host-device
    waits, and the three ops that took the most of the host's own time; beside the run's plain-step median."""
    rows = []
    for step in steps:
        for run in step["result"].get("runs", []):
            profile = run.get("step_profile")
            if not profile:
                continue
            start, stop = profile["steps"]
            plain = (run.get("step_kinds") or {}).get("plain", {}).get("median_ms")
            top = sorted((profile.get("host_top_ops_ms_per_step") or {}).items(), key=lambda kv: -kv[1])[:3]
            rows.append([f"{step['name']}: {run['method']}" if len(steps) > 1 else run["method"], f"{start}-{stop - 1}",
                         _f(plain) if plain is not None else "-", _f(profile["wall_ms_per_step"]),
                         _f(profile["device_busy_ms_per_step"]), _f(profile["kernel_launches_per_step"], "{:.1f}"),
                         _f(sum(profile["syncs_per_step"].values())),
                         "; ".join(f"{name} {ms:.2f}" for name, ms in top) or "-"])
    if not rows:
        return []
    return _table(["profiled steps: method", "steps", "plain step median ms (whole run)", "wall ms per step",
                   "GPU kernel ms per step", "kernel launches per step", "host-device waits per step",
                   "most host time of their own (ms per step)"], rows)


def step_kinds_table(steps: List[Dict]) -> List[str]:
    """Per method, over its runs that recorded them: the steps by kind (``wallclock.step_kind``), the plain
    steps' median and total and each other kind's total seconds (means over the runs)."""
    by_method: Dict[str, List[Dict]] = {}
    for step in steps:
        for run in step["result"].get("runs", []):
            if run.get("step_kinds"):
                by_method.setdefault(run["method"], []).append(run["step_kinds"])
    if not by_method:
        return []
    mean = lambda kinds, kind, key, fmt="{:.2f}": (  # noqa: E731
        _f(statistics.fmean([k[kind][key] for k in kinds if kind in k]), fmt) if any(kind in k for k in kinds) else "-")
    others = [kind for kind in STEP_KINDS if kind != "plain"]
    rows = [[method, str(len(kinds)), mean(kinds, "plain", "steps", "{:.0f}"), mean(kinds, "plain", "median_ms"),
             mean(kinds, "plain", "total_s"), *(mean(kinds, kind, "total_s") for kind in others)]
            for method, kinds in by_method.items()]
    return _table(["steps by kind: method", "runs", "plain steps", "plain median ms", "plain total s",
                   *(f"{kind} total s" for kind in others)], rows)


def _one_seed_per_step(steps: List[Dict]) -> bool:
    """The steps split one comparison by seed: no method and seed is run by two steps (steps that
    repeat a seed are different configurations or code versions, not more samples)."""
    pairs = [(r["method"], r["seed"]) for step in steps for r in step["result"].get("runs", [])]
    return bool(pairs) and len(pairs) == len(set(pairs))


def across_steps_table(steps: List[Dict]) -> List[str]:
    """Per method (``pooled_label``, and the GPU where the wall clocks come from several) over the runs of every
    step (a suite with one step per seed): wall clock (median and
    range) and the share outside the steps over the runs that had the GPU alone, eval PSNR / SSIM means
    over all runs, and PSNR paired by step and seed with the first method."""
    if not _one_seed_per_step(steps):
        return []
    sizes = sorted({tuple(r["train_image_size"]) for step in steps for r in step["result"].get("runs", [])
                    if r.get("train_image_size")})
    if len(sizes) > 1:  # e.g. nerfstudio-data's automatic half resolution in some runs: not one comparison
        return [f"Not pooled over the steps: their runs trained at different resolutions "
                f"({', '.join(f'{w}x{h}' for w, h in sizes)})."]
    gpus = {step["result"].get("device") for step in steps if any(measures_the_method(r) for r in step["result"].get("runs", []))}
    # each run under its pooled label (a default run that pruned is not the default before it), and where
    # wall clocks come from different GPUs, on its own GPU's row: two cards' wall clocks are not one sample
    runs = [(step["name"], dict(r, method=pooled_label(r) + (f" on {step['result'].get('device')}" if len(gpus) > 1 else "")))
            for step in steps for r in step["result"].get("runs", [])]
    methods = list(dict.fromkeys(r["method"] for _, r in runs))
    psnr = {(name, r["method"], r["seed"]): r["psnr"] for name, r in runs if r.get("psnr") is not None}
    mean = lambda xs, fmt="{:.2f}": _f(statistics.fmean(xs), fmt) if xs else "-"  # noqa: E731
    rows = []
    for method in methods:
        mine = [(name, r) for name, r in runs if r["method"] == method]
        # a run that shared the GPU, or skipped its image writes, counts for quality only
        alone = [r for _, r in mine if measures_the_method(r)]
        walls = [r["wall_s"] for r in alone if r.get("wall_s") is not None]
        outside = [1 - r["steps_s"] / r["wall_s"] for r in alone if r.get("wall_s") and r.get("steps_s") is not None]
        quality = {k: [r[k] for _, r in mine if r.get(k) is not None] for k in ("psnr", "ssim", "num_gaussians")}
        diffs = [psnr[(name, method, r["seed"])] - psnr[(name, methods[0], r["seed"])] for name, r in mine
                 if (name, method, r["seed"]) in psnr and (name, methods[0], r["seed"]) in psnr]
        paired = "baseline" if method == methods[0] else _paired(diffs)
        shared = len(mine) - len(alone)
        runs_of = f"{len(mine)}" + (f" ({shared} at once or without image writes: quality only)" if shared else "")
        rows.append([method, runs_of, _f(statistics.median(walls)) if walls else "-",
                     f"{min(walls):.2f}-{max(walls):.2f}" if walls else "-", mean(walls),
                     mean([100 * x for x in outside], "{:.1f}%"), mean(quality["psnr"]),
                     _f(statistics.median(quality["psnr"])) if quality["psnr"] else "-",
                     f"{min(quality['psnr']):.2f}-{max(quality['psnr']):.2f}" if quality["psnr"] else "-",
                     mean(quality["ssim"], "{:.4f}"), mean(quality["num_gaussians"], "{:.0f}"), paired])
    # PSNR's median and range beside its mean: one collapsed run moves the mean of a few seeds by a dB
    return _table(["all steps: method", "runs", "wall_s median", "wall_s min-max", "wall_s mean", "outside the steps",
                   "psnr mean", "psnr median", "psnr min-max", "ssim mean", "Gaussians mean",
                   "PSNR diff vs the first method, by step and seed"], rows)


def quality_table(steps: List[Dict]) -> List[str]:
    """Runs paired by seed with a baseline configuration: eval PSNR per seed and the paired differences."""
    rows = []
    for step in steps:
        r = step["result"]
        for config, row in r["summary"].items():
            per_seed = r["runs"].get(config, {})
            psnr = ", ".join(f"{per_seed[str(s)]['psnr']:.3f}" for s in row["seeds"] if str(s) in per_seed)
            diff = "baseline" if config == r["baseline"] else \
                f"{row['psnr_diff_mean']:+.3f} +- {row['psnr_diff_std']:.3f}"
            rows.append([step["name"], config, " ".join(map(str, row["seeds"])), psnr, diff,
                         f"{row['ssim_diff_mean']:+.4f}" if config != r["baseline"] else "-",
                         _f(row.get("median_ms_per_step"))])
    return _table(["views", "run", "seeds", "PSNR dB per seed", "PSNR diff vs baseline, by seed",
                   "SSIM diff", "median ms/step"], rows)


STEP_CATEGORIES = ("projection", "sh", "binning", "render", "loss", "optimizer", "other kernels")


def step_table(steps: List[Dict]) -> List[str]:
    """A whole training step per implementation: wall, GPU busy and host gaps, the host's time to issue a
    step on an idle GPU (documents from before it was measured: "-"), the stages' spans, the GPU time per
    kernel category (forward + backward), and bytesplat's speed-up against each."""
    rows = []
    for step in steps:
        for row in step["result"]["rows"]:
            if "wall_ms" not in row:
                rows.append([_count(row["num_gaussians"]), row.get("name", "?"), f"error: {row.get('error')}"]
                            + ["-"] * (6 + len(STEP_CATEGORIES)))
                continue
            cats = row["kernel_categories_ms"]
            per = [sum(v for k, v in cats.items() if k == c or k.startswith(c + " ")) for c in STEP_CATEGORIES]
            stages = ", ".join(f"{k} {v:.2f}" for k, v in row["stages_ms"].items())
            host_stages = ", ".join(f"{k} {v:.2f}" for k, v in row.get("host_issue_stages_ms", {}).items()) or "-"
            speedup = step["result"].get("speedups", {}).get(str(row["num_gaussians"]), {}).get(f"vs {row['implementation']}")
            scene = _count(row["num_gaussians"]) + (" trained" if row.get("scene", "synthetic") != "synthetic" else "")
            rows.append([scene, row["implementation"], _f(row["wall_ms"]), _f(row["gpu_busy_ms"]),
                         _f(row["host_gaps_ms"]), _f(row.get("host_issue_ms")), host_stages, stages,
                         *(_f(v) for v in per),
                         "-" if speedup is None else f"{speedup:.2f}x"])
    return _table(["Gaussians", "step", "wall ms", "GPU busy ms", "host gaps ms", "host issue ms",
                   "host issue by stage ms", "stage spans ms",
                   *(f"{c} ms" for c in STEP_CATEGORIES), "bytesplat faster by"], rows)


def dram_table(steps: List[Dict]) -> List[str]:
    """Device-memory bytes of one raster + loss pass per stage, and each against the split schedule's."""
    from bytesplat_ns.bench.dram import stage_label

    rows = []
    for step in steps:
        result_rows = step["result"]["rows"]
        for row in result_rows:
            if "dram_bytes" not in row:
                rows.append([_count(row["num_gaussians"]), stage_label(row), f"error: {row.get('error')}", "-", "-", "-", "-"])
                continue
            split = next((r for r in result_rows if r["stage"] == "split" and r["num_gaussians"] == row["num_gaussians"]
                          and r.get("scene") == row.get("scene") and "dram_bytes" in r), None)
            rows.append([_count(row["num_gaussians"]), stage_label(row), _f(row["dram_read_bytes"] / 1e6, "{:.1f}"),
                         _f(row["dram_write_bytes"] / 1e6, "{:.1f}"), _f(row["dram_bytes"] / 1e6, "{:.1f}"),
                         str(row["kernels"]), "-" if split is None else f"{row['dram_bytes'] / split['dram_bytes']:.2f}x"])
    lines = _table(["Gaussians", "stage", "read MB", "written MB", "total MB", "kernels", "vs split"], rows)
    profiles = kernel_profile_table(steps)
    return lines + ([""] + profiles if profiles else [])


def kernel_profile_table(steps: List[Dict], min_share: float = 0.02) -> List[str]:
    """Each profiled stage's kernels (dram --kernels) that take at least ``min_share`` of its kernel
    time, then the rest in one line: where a stage's time goes and what bounds each kernel."""
    from bytesplat_ns.bench.dram import stage_label

    rows = []
    for step in steps:
        for row in step["result"]["rows"]:
            if "kernel_profile_error" in row:
                rows.append([_count(row["num_gaussians"]), stage_label(row), f"error: {row['kernel_profile_error']}"]
                            + ["-"] * 7)
            profile = row.get("kernel_profile")
            if not profile:
                continue
            total = sum(k.get("duration_us", 0.0) for k in profile)
            shown = [k.get("duration_us", 0.0) >= min_share * total for k in profile]
            rest = [k for k, show in zip(profile, shown) if not show]
            for k in (k for k, show in zip(profile, shown) if show):
                rows.append([_count(row["num_gaussians"]), stage_label(row), f"`{k['name']}`", _f(k.get("duration_us"), "{:.0f}"),
                             f"{k['duration_us'] / total:.0%}", _f(k.get("issue_slots_busy_pct"), "{:.0f}%"),
                             f"{_f(k.get('achieved_occupancy_pct'), '{:.0f}')} / {_f(k.get('theoretical_occupancy_pct'), '{:.0f}')}%",
                             str(k.get("registers", "-")), str(k.get("local_spill_requests", "-")),
                             _f(k["dram_bytes"] / 1e6 if "dram_bytes" in k else None, "{:.1f}")])
            if rest:
                rest_us = sum(k.get("duration_us", 0.0) for k in rest)
                rows.append([_count(row["num_gaussians"]), stage_label(row), f"{len(rest)} other kernels",
                             f"{rest_us:.0f}", f"{rest_us / total:.0%}", "-", "-", "-", "-",
                             _f(sum(k.get("dram_bytes", 0) for k in rest) / 1e6, "{:.1f}")])
    if not rows:
        return []
    return ["Kernel by kernel (Nsight Compute sections, one pass each; issue slots busy near 100%: bound by the "
            "instructions it issues):", ""] + _table(
        ["Gaussians", "stage", "kernel", "us", "share", "issue slots busy", "occupancy achieved / theoretical",
         "registers", "spill requests", "DRAM MB"], rows)


def sass_table(steps: List[Dict]) -> List[str]:
    """Per kernel instance (``bytesplat-bench sass``): registers, spills (and those inside the compositing
    loops), instructions and its compositing loops, and for a ``fast_exp`` instance how many instructions
    each loop has fewer than the same instance with expf. The shuffle-reduction instances (``bwd_reduce shuffle``, an A/B path) stay in the JSON."""
    rows = []
    for step in steps:
        found = step["result"]["rows"]
        for r in found:
            sw = r["switches"]
            if sw.get("butterfly") is False:
                continue
            twin = next((t for t in found if t["kernel"] == r["kernel"] and t["source"] == r["source"]
                         and t["switches"] == {**sw, "fast_exp": False}), None) if sw.get("fast_exp") else None
            fewer = ", ".join(str(a - b) for a, b in zip(twin["loop_instructions"], r["loop_instructions"])) \
                if twin else "-"
            in_loop = ", ".join(map(str, r["loop_local_accesses"])) if r.get("loop_local_accesses") else "-"
            rows.append([r["source"], r["kernel"], ", ".join(k for k, v in sw.items() if v) or "-",
                         str(r.get("registers", "-")), f"{r.get('spill_stores', '-')} / {r.get('spill_loads', '-')}",
                         in_loop, str(r["instructions"]), ", ".join(map(str, r["loop_instructions"])) or "-", fewer])
    if not rows:
        return []
    arch = steps[0]["result"].get("arch", "-")
    return [f"Machine code for {arch}, nvcc {steps[0]['result'].get('nvcc', '-')} (static counts: every path of a "
            "loop body once):", ""] + _table(
        ["source", "kernel", "switches on", "registers", "spill bytes stored / loaded",
         "spill accesses in the loop(s)", "instructions", "compositing loop(s)", "fewer than with expf"], rows)


def city_table(steps: List[Dict]) -> List[str]:
    """Per city preset (``bytesplat-bench city``): seconds per view of each kind (min-max of the timed
    views), the whole scene's render time on one core estimated from them, and the wall clock of a whole
    generation where one ran."""
    rows = []
    for step in steps:
        for r in step["result"]["rows"]:
            cells = []
            for kind in CITY_VIEW_KINDS:
                times = [v["seconds"] for v in r["views_timed"] if v["kind"] == kind]
                cells.append(f"{min(times):.2f}-{max(times):.2f}" if times else "-")
            hours = r["estimated_scene_core_s"] / 3600
            rows.append([r["preset"], f"{r['width']}x{r['height']}", str(r["views"]), *cells,
                         f"{hours:.1f} h" if hours >= 1 else f"{r['estimated_scene_core_s'] / 60:.1f} min",
                         _f(r.get("generated_s"), "{:.1f} s")])
    if not rows:
        return []
    first = steps[0]["result"]
    return [f"One process on {first.get('cpu', '-')} ({first.get('cpu_count', '-')} cores, OMP_NUM_THREADS="
            f"{first.get('omp_num_threads') or 'unset'}); seconds per view rendered:", ""] + _table(
        ["preset", "size", "views", "aerial orbit s", "aerial close s", "street s",
         "whole scene, one core (estimated)", "generated whole, one worker"], rows)


def loop_table(steps: List[Dict]) -> List[str]:
    """Per training loop (``bytesplat-bench loop``): its own host time per step with the step stubbed out."""
    rows = []
    for step in steps:
        for r in step["result"]["rows"]:
            runs = r["us_per_step"]
            rows.append([r["loop"], str(r["iterations"]), f"{r['median_us']:.1f}", f"{min(runs):.1f}-{max(runs):.1f}",
                         str(len(runs))])
    if not rows:
        return []
    first = steps[0]["result"]
    return [f"One process on {first.get('cpu', '-')} ({first.get('cpu_count', '-')} cores); the loop's host time "
            "per step, the step stubbed out:", ""] + _table(
        ["loop", "steps per run", "us per step (median)", "range", "runs"], rows)


def _python_function(name: str) -> str:
    """A profiled function's short name: ``file:line name`` -> name; cProfile's built-ins
    (``<method 'run_backward' of '...' objects>``, ``<built-in method torch.isfinite>``) -> run_backward, torch.isfinite."""
    quoted = re.match(r"<method '([^']+)'", name)
    if quoted:
        return quoted.group(1)
    builtin = re.match(r"<built-in method (\S+?)>?$", name)
    if builtin:
        return builtin.group(1)
    return name.split(" ")[-1]


def profile_table(steps: List[Dict]) -> List[str]:
    """nerfstudio's training loop body per method entry (``bytesplat-bench profile``): each iteration's host
    time (median, quartiles, mean), the GPU's busy time, the host-device waits per iteration and the Python
    functions with the most time of their own (cProfile, which inflates them: read the ranking)."""
    rows = []
    for step in steps:
        for run in step["result"]["runs"]:
            quartiles = run.get("wall_ms_quartiles") or []
            spread = f"{quartiles[0]:.2f}-{quartiles[2]:.2f}" if len(quartiles) == 3 else "-"
            syncs = sum(run.get("syncs_per_iteration", {}).values())
            python = run.get("python_top", {}).get("self", [])[:3]
            top = "; ".join(f"{_python_function(r['function'])} {r['self_ms']:.2f}" for r in python) or "-"
            rows.append([run["label"], _count(run["num_gaussians"]), _f(run.get("wall_ms_median")), spread,
                         _f(run["wall_ms_per_iteration"]), _f(run["device_busy_ms_per_iteration"]), _f(syncs),
                         top])
    return _table(["method", "Gaussians", "iteration ms (median)", "quartiles", "mean", "GPU busy ms",
                   "host-device waits per iteration", "most Python time of their own (cProfile ms)"], rows)


TABLES = {"raster": raster_table, "train": train_table, "distributed": distributed_table,
          "wallclock": wallclock_table, "quality": quality_table, "step": step_table, "dram": dram_table,
          "sass": sass_table, "profile": profile_table, "city": city_table,
          "loop": loop_table}


# the subcommands whose JSON names itself ("benchmark": "bytesplat-bench NAME") and has a table here
_NAMED_KINDS = ("wallclock", "step", "dram", "sass", "profile", "city", "loop")


def _kind(result) -> Optional[str]:
    prog, _, name = (result.get("benchmark") or "").partition(" ") if isinstance(result, dict) else ("", "", "")
    if prog == "bytesplat-bench" and name in _NAMED_KINDS:
        return name
    if isinstance(result, dict) and {"baseline", "runs", "summary"} <= set(result) \
            and all("psnr_diff_mean" in row for row in result["summary"].values()):
        return "quality"
    return detect_kind(result)


def _date(step: Dict) -> Optional[str]:
    result = step.get("result")
    if not isinstance(result, dict):
        return step.get("date")
    return result.get("date") or (result.get("environment") or {}).get("date") or step.get("date")


def _step_gpu(step: Dict, doc: Dict) -> Optional[str]:
    """The GPU a step ran on where it is not the document's (a suite run in parts on different cards)."""
    from bytesplat_ns.bench.suite_runner import step_gpu

    device = step_gpu(step, doc.get("gpu"))
    return device if device and device != _header_gpu(doc) else None


def _header_gpu(doc: Dict) -> Optional[str]:
    """The GPU a document's header names: its steps' (a document written before the steps kept theirs names
    the machine of one of its runs only)."""
    from bytesplat_ns.bench.suite_runner import steps_gpu

    return steps_gpu(doc.get("steps", []), doc.get("gpu"))


def steps_not_run(doc: Dict) -> List[str]:
    """The declared steps of ``doc``'s suite (``bench.suites``) that an incomplete document holds no run
    of (a complete one, or one measured before its suite existed, lists its own steps)."""
    from bytesplat_ns.bench.suite_runner import named_steps
    from bytesplat_ns.bench.suites import SUITES

    suite = SUITES.get(doc["suite"])
    if suite is None or doc.get("complete") is not False:
        return []
    have = {step["name"] for step in doc["steps"]}
    return [step.name for step in named_steps(suite).steps if step.name not in have]


# options of `bytesplat-bench suite` that say where a run wrote, not what it ran
_WHERE_OPTIONS = ("--results-dir", "--out-dir")


def suite_command(command: str) -> str:
    """The page's line for a document's command. A document completed by ``--only`` runs holds the
    command of the last of them, with that machine's folders: the page gives the whole suite's
    command instead (each step lists its own command)."""
    words = shlex.split(command)
    if "--only" not in words:
        return f"`{command}`"
    kept, skip = [], False
    for i, word in enumerate(words):
        if word == "--only":
            skip = True
            continue
        if skip and not word.startswith("--"):
            continue
        skip = False
        if word in _WHERE_OPTIONS or (i > 0 and words[i - 1] in _WHERE_OPTIONS):
            continue
        kept.append(word)
    return f"`{shlex.join(kept)}`, run in parts (`--only STEP`; each step's command below)"


def suite_section(doc: Dict, results_dir: Path, page_dir: Path) -> List[str]:
    v = doc.get("versions", {})
    versions = ", ".join(f"{k} {v[k]}" for k in ("torch", "cuda", "nccl", "nerfstudio", "gsplat") if v.get(k))
    lines = [f"## {doc['suite']}", "", doc.get("purpose", ""), "",
             f"- Suite command: {suite_command(doc['command'])}",
             f"- GPU: {_header_gpu(doc) or '-'}; versions: {versions or '-'}; date: {doc.get('date', '-')}"]
    if doc.get("measured_with"):
        lines.append(f"- Measured with: {doc['measured_with']}")
    lines += [f"- Step `{s['name']}`: `{s['command']}` ({', '.join(x for x in (s['status'], _date(s), _step_gpu(s, doc)) if x)})"
              for s in doc["steps"]]
    missing = steps_not_run(doc)
    if missing:
        lines.append("- Not run yet: " + ", ".join(f"`{name}`" for name in missing)
                     + f" (`bytesplat-bench suite {doc['suite']} --only NAME` adds a step to this document)")
    by_kind: Dict[str, List[Dict]] = {}
    for step in doc["steps"]:
        if step.get("status") in ("ok", "partial") and step.get("result") is not None:  # partial: some runs failed
            by_kind.setdefault(_kind(step["result"]) or "other", []).append(step)
    for kind, steps in by_kind.items():
        table = TABLES.get(kind)
        if table is not None:
            lines += ["", *table(steps)]
    for note in doc.get("notes", []):
        lines += ["", note]
    for plot in doc.get("plots", []):
        rel = os.path.relpath(results_dir / plot, page_dir)
        lines += ["", f"![{Path(plot).stem}]({Path(rel).as_posix()})"]
    return lines + [""]


def load_suites(results_dir: Path) -> List[Dict]:
    docs = []
    for path in sorted(results_dir.glob("*.json")):
        try:
            doc = json.loads(path.read_text())
        except ValueError as e:
            raise BytesplatError(f"{path} is not JSON ({e})") from e
        if not isinstance(doc, dict) or "suite" not in doc or not isinstance(doc.get("steps"), list):
            raise BytesplatError(f"{path} is not a suite document (no 'suite' and 'steps')",
                                 hint="bytesplat-bench suite NAME --results-dir writes them")
        docs.append(doc)
    return docs


def _wallclock_steps(docs: Sequence[Dict]) -> Iterator[Tuple[Dict, Dict, Dict]]:
    """(document, step, result) of every wall-clock step that ran (ok or partial), in document order."""
    for doc in docs:
        for step in doc["steps"]:
            result = step.get("result")
            if step.get("status") in ("ok", "partial") and _kind(result) == "wallclock":
                yield doc, step, result


def permutation_p(a: Sequence[float], b: Sequence[float], draws: int = 20000) -> float:
    """Two-sided permutation p-value of the difference of the means of ``a`` and ``b``: the share of the
    relabellings of the pooled values whose difference is at least as large. Exact (every relabelling)
    up to 200000 of them, else ``draws`` seeded random ones (the page stays the same for the same runs)."""
    pooled, k = list(a) + list(b), len(a)
    total, n = sum(pooled), len(pooled)
    observed = abs(sum(a) / k - (total - sum(a)) / (n - k)) - 1e-9

    def extreme(subset_sum: float) -> bool:
        return abs(subset_sum / k - (total - subset_sum) / (n - k)) >= observed

    if math.comb(n, k) <= 200000:
        hits = count = 0
        for subset in itertools.combinations(pooled, k):
            hits += extreme(sum(subset))
            count += 1
        return hits / count
    rng = random.Random(0)
    return sum(extreme(sum(rng.sample(pooled, k))) for _ in range(draws)) / draws


def pooled_label(run: Dict) -> str:
    """A run's method label for pooling: a run whose Gaussian budget removed Gaussians under a label that
    does not say so (bytesplat's default since 2026-12-06) is not pooled with the runs before it."""
    method = run["method"]
    return f"{method} (budget)" if run.get("budget_removed") and "budget" not in method else method


def pooled_quality_table(docs: Sequence[Dict]) -> List[str]:
    """Eval PSNR / SSIM of every wall-clock run on a capture (``--data``) in the documents, pooled by data,
    iteration count and method (each run one sample: runs of one seed differ through GPU atomics), against
    splatfacto's runs of the same data and iterations: the difference of the means and its permutation
    p-value. Runs on each method's built-in scene are left out: that scene changed between versions."""
    groups: Dict[Tuple[str, int, str], List[Dict]] = {}
    for _, _, result in _wallclock_steps(docs):
        if not result.get("data"):
            continue
        data = Path(str(result["data"])).name
        for run in result.get("runs", []):
            if run.get("psnr") is not None and run.get("iterations") is not None:
                groups.setdefault((data, int(run["iterations"]), pooled_label(run)), []).append(run)
    rows = []
    for (data, iterations, method), runs in sorted(groups.items()):
        psnr = [r["psnr"] for r in runs]
        ssim = [r["ssim"] for r in runs if r.get("ssim") is not None]
        base = [r["psnr"] for r in groups.get((data, iterations, "splatfacto"), [])]
        versus = method != "splatfacto" and len(base) >= 2 and len(psnr) >= 2
        rows.append([data, str(iterations), method, str(len(psnr)), _f(statistics.fmean(psnr)),
                     _f(statistics.median(psnr)), _f(statistics.stdev(psnr) if len(psnr) > 1 else None),
                     f"{min(psnr):.2f}-{max(psnr):.2f}", _f(statistics.fmean(ssim) if ssim else None, "{:.4f}"),
                     f"{statistics.fmean(psnr) - statistics.fmean(base):+.2f}" if versus else "-",
                     _f(permutation_p(psnr, base) if versus else None)])
    return _table(["data", "iterations", "method", "runs", "PSNR mean", "median", "std", "min-max", "SSIM mean",
                   "vs splatfacto's mean", "p (permutation, two-sided)"], rows) if rows else []


POOLED_INTRO = """## Eval quality over every run

Every `ns-train` run on a capture (`--data`) of the wall-clock steps below with an eval, pooled by data, iteration count and
method label (a labelled variant such as `budget40` is its own method; a run whose Gaussian budget removed
Gaussians under a label that does not say so, such as bytesplat's default since 2026-12-06, is
`LABEL (budget)`), whatever suite, date or number
of runs at once it came from. Runs of one seed count once each: GPU atomics make each run's trajectory
its own. The p-value is the share of relabellings of the two methods' runs whose means differ at least
as much (exact where there are at most 200000 relabellings): a large one says these runs cannot tell the
two apart, not that they are equal.
"""


def render(docs: Sequence[Dict], results_dir: Path, page: Path) -> str:
    lines = ["# Results", "",
             "Generated by `bytesplat-bench report` from `docs/results/*.json`; do not edit by hand.", "", HOWTO]
    lines += ["## Suites", ""] + [f"- [{d['suite']}](#{d['suite']}): {d.get('purpose', '')}" for d in docs] + [""]
    pooled = pooled_quality_table(docs)
    lines += [POOLED_INTRO, *pooled, ""] if pooled else []
    for doc in docs:
        lines += suite_section(doc, results_dir, page.parent)
    return "\n".join(lines).rstrip() + "\n"


# Flat run lists: file name -> (the suites whose wall-clock runs it gathers: name prefix, the GPU they ran on).
RUN_LISTS = {"wallclock_fox_h200.json": ("wallclock-fox", "H200"), "wallclock_fox_h100.json": ("wallclock-fox", "H100")}


def wallclock_runs(docs: Sequence[Dict], suite_prefix: str, gpu: str) -> Dict:
    """Every ``ns-train`` run of the wall-clock steps of the suites named ``suite_prefix``* that ran on
    ``gpu``, each with where it came from; in suite and step order (stable for unchanged documents)."""
    from bytesplat_ns.bench.suite_runner import step_gpu

    runs = []
    for doc, step, result in _wallclock_steps(docs):
        card = step_gpu(step, doc.get("gpu"))
        if doc["suite"].startswith(suite_prefix) and gpu in str(card or ""):
            source = {"suite": doc["suite"], "step": step["name"], "command": step["command"],
                      "date": result.get("date"), "gpu": card,
                      "versions": {k: result.get(k) for k in ("python", "torch", "nerfstudio", "gsplat") if result.get(k)},
                      "data": Path(str(result.get("data"))).name if result.get("data") else None}
            runs += [{**run, "source": source} for run in result.get("runs", [])]
    return {"generated_by": "bytesplat-bench report (from docs/results/*.json)",
            "suites": f"{suite_prefix}*", "gpu": gpu, "runs": runs}


def write_run_lists(docs: Sequence[Dict], out_dir: Path) -> List[Path]:
    written = []
    for name, (prefix, gpu) in RUN_LISTS.items():
        doc = wallclock_runs(docs, prefix, gpu)
        if not doc["runs"]:
            continue
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / name
        path.write_text(json.dumps(doc, indent=1) + "\n")
        written.append(path)
    return written


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bytesplat-bench report", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results-dir", type=Path, default=Path("docs/results"), help="the suite JSON documents")
    p.add_argument("--out", type=Path, default=Path("docs/results.md"), help="the page to write")
    p.add_argument("--benchmarks-dir", type=Path, default=Path("docs/benchmarks"),
                   help="where the flat run lists go (" + ", ".join(RUN_LISTS) + ")")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    a = parser().parse_args(argv)
    docs = load_suites(a.results_dir)
    if not docs:
        raise BytesplatError(f"no suite documents in {a.results_dir}", hint="bytesplat-bench suite NAME --results-dir "
                             f"{a.results_dir} writes one")
    a.out.write_text(render(docs, a.results_dir, a.out))
    print(f"wrote {a.out} ({len(docs)} suites)")
    for path in write_run_lists(docs, a.benchmarks_dir):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
