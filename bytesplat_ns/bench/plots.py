"""``bytesplat-bench plots``: the figures of the results page (docs/results.md), drawn from the
benchmarks' JSON files.

The kind of each file is read from its content, not its name, so renamed or hand-collected results
plot the same way:

- ``raster`` (``bytesplat-bench raster``): time per stage, fused vs gsplat, per Gaussian count;
- ``distributed`` (``bytesplat-bench distributed``): views/s vs ranks per implementation and
  communicator (one panel per Gaussian count) and bytes sent per step per communicator;
- ``train`` (``bytesplat-bench train``): eval PSNR and ms/iteration per method, and the share of
  tiles over the fused capacity vs step when the runs logged tile occupancy;
- ``matrix`` (``bytesplat-bench matrix``'s index): the pieces it lists.

Files of one kind measured on the same device and settings (the per-piece files of a matrix run)
are merged into one figure; each figure's footer names the device(s) and date(s). Other JSON files
(``ns-eval`` output, ...) are skipped with a message; a file that is not JSON, or one of these kinds
with its fields missing, is an error naming the file.

    bytesplat-bench plots --inputs outputs/suites/raster-1080p/steps --out-dir plots
    bytesplat-bench plots --inputs raster.json distributed.json --out-dir plots
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

KINDS = ("raster", "distributed", "train", "matrix")


class PlotInputError(ValueError):
    """A benchmark file that cannot be read or lacks the fields its kind needs."""


# ---------------------------------------------------------------------------------------------
# Reading


def detect_kind(data) -> Optional[str]:
    """Which benchmark wrote ``data`` (None: not one of ours)."""
    if not isinstance(data, dict):
        return None
    bench = data.get("benchmark")
    if bench == "bytesplat-bench matrix":
        return "matrix"
    if bench == "raster":
        return "raster"
    if bench == "bytesplat-bench distributed":
        return "distributed"
    runs, results = data.get("runs"), data.get("results")
    if isinstance(runs, list) and runs and isinstance(runs[0], dict):
        if any(k.startswith(("raster_loss_", "full_")) for k in runs[0]):
            return "raster"
        if "ms_per_iteration" in runs[0] and "label" in runs[0]:
            return "train"
    if isinstance(results, list) and results and isinstance(results[0], dict) and "impl" in results[0]:
        return "distributed"
    return None


_REQUIRED = {
    "raster": (("runs",), ("num_gaussians",)),
    "distributed": (("results", "environment"), ("num_gaussians", "impl", "communicator", "status")),
    "train": (("runs", "environment"), ("label", "ms_per_iteration", "eval")),
    "matrix": (("pieces",), ("name", "status")),
}


def _check(path: Path, kind: str, data: Dict) -> None:
    top, per_row = _REQUIRED[kind]
    for key in top:
        if key not in data:
            raise PlotInputError(f"{path}: a {kind} benchmark file without '{key}'")
    rows = data["pieces" if kind == "matrix" else "results" if kind == "distributed" else "runs"]
    if not isinstance(rows, list):
        raise PlotInputError(f"{path}: '{kind}' rows are not a list")
    for i, row in enumerate(rows):
        missing = [k for k in per_row if not isinstance(row, dict) or k not in row]
        if missing:
            raise PlotInputError(f"{path}: {kind} row {i} lacks {', '.join(missing)}")
        if kind == "distributed" and row["status"] == "ok":
            for k in ("ranks", "views_per_second", "bytes_per_step"):
                if k not in row:
                    raise PlotInputError(f"{path}: distributed row {i} (status ok) lacks {k}")


def load(path: Path) -> Tuple[Optional[str], object]:
    """(kind, data) of one file; PlotInputError naming the file when it is not usable JSON."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise PlotInputError(f"{path}: cannot read ({e.strerror or e})") from e
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise PlotInputError(f"{path}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from e
    kind = detect_kind(data)
    if kind is not None:
        _check(Path(path), kind, data)
    return kind, data


def collect(inputs: Sequence, log=print) -> Dict[str, List[Tuple[Path, Dict]]]:
    """Every benchmark file under ``inputs`` (files, or folders searched for ``*.json``), by kind.
    A matrix index brings in the outputs of its pieces; a file is read once however it is named."""
    by_kind: Dict[str, List[Tuple[Path, Dict]]] = {k: [] for k in KINDS}
    seen = set()
    queue: List[Path] = []
    for item in inputs:
        p = Path(item)
        if p.is_dir():
            queue.extend(sorted(p.rglob("*.json")))
        elif p.exists():
            queue.append(p)
        else:
            raise PlotInputError(f"{p}: no such file or folder")
    while queue:
        p = queue.pop(0)
        key = p.resolve()
        if key in seen:
            continue
        seen.add(key)
        kind, data = load(p)
        if kind is None:
            log(f"plots: {p}: not a bytesplat-bench result (raster, distributed, train or matrix); skipped")
            continue
        by_kind[kind].append((p, data))
        if kind == "matrix":
            for piece in data["pieces"]:
                if piece["status"] == "ok" and piece.get("output"):
                    out = p.parent / piece["output"]
                    if out.exists():
                        queue.append(out)
    return by_kind


# ---------------------------------------------------------------------------------------------
# Helpers


def _plt():
    import matplotlib

    matplotlib.use("Agg")  # files only, never a display
    import matplotlib.pyplot as plt

    return plt


def _count(n: float) -> str:
    n = int(n)
    for div, suffix in ((1_000_000, "M"), (1_000, "k")):
        if n >= div:
            v = n / div
            return f"{v:g}{suffix}" if v == int(v) or v >= 10 else f"{v:.1f}{suffix}"
    return str(n)


def _slug(*parts) -> str:
    s = "_".join(str(p) for p in parts if p not in (None, ""))
    return re.sub(r"[^A-Za-z0-9_.+-]+", "-", s).strip("-").lower() or "x"


def _footer(fig, devices: Iterable[str], dates: Iterable[str], extra: str = "") -> None:
    devices = sorted({d for d in devices if d}) or ["unknown device"]
    dates = sorted({d for d in dates if d}) or ["unknown date"]
    text = f"device: {', '.join(devices)}   date: {' / '.join(dates)}"
    if extra:
        text += f"   {extra}"
    fig.text(0.01, 0.01, text, fontsize=7, color="0.3", ha="left", va="bottom")


def _save(fig, out_dir: Path, name: str, written: List[Path]) -> None:
    path = out_dir / f"{name}.png"
    k = 2
    while path in written:
        path = out_dir / f"{name}_{k}.png"
        k += 1
    fig.savefig(path, dpi=120)
    _plt().close(fig)
    written.append(path)


def _bars(ax, groups: Sequence[str], series: Dict[str, List[Optional[float]]], errs=None, ylabel="", hatched=None, fmt="{:.3g}"):
    """Grouped bars: one group per entry of ``groups``, one bar per series (None: no bar)."""
    import numpy as np

    names = list(series)
    width = 0.8 / max(len(names), 1)
    x = np.arange(len(groups))
    for i, name in enumerate(names):
        vals = series[name]
        xs = [x[j] + (i - (len(names) - 1) / 2) * width for j, v in enumerate(vals) if v is not None]
        ys = [v for v in vals if v is not None]
        yerr = None
        if errs is not None and errs.get(name) is not None:
            lo_hi = [e for e, v in zip(errs[name], vals) if v is not None]
            if all(e is not None for e in lo_hi):
                yerr = np.array(lo_hi).T
        bars = ax.bar(xs, ys, width * 0.95, label=name, yerr=yerr, capsize=2,
                      hatch="//" if hatched and hatched.get(name) else None)
        for b, v in zip(bars, ys):
            ax.annotate(fmt.format(v), (b.get_x() + b.get_width() / 2, b.get_height()), ha="center", va="bottom",
                        fontsize=6, xytext=(0, 1), textcoords="offset points")
    ax.set_xticks(x)
    ax.set_xticklabels(groups)
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7)


def _spread_out(ax, values: Sequence[float], num_groups: int) -> None:
    """A log value axis when the bars span more than 100x (a count sweep), slanted group labels
    when there are many groups, so that neither the small bars nor the labels vanish."""
    if values and max(values) > 100 * min(values):
        ax.set_yscale("log")
    if num_groups > 4:
        ax.tick_params(axis="x", labelrotation=30, labelsize=7)


# ---------------------------------------------------------------------------------------------
# (a) raster: time per stage

RASTER_PANELS = (
    ("rasterization + loss, forward + backward", (("gsplat", "raster_loss_gsplat"), ("fused, one launch", "raster_loss_fused"),
                                                  ("fused, two launches", "raster_loss_fused_two_phase"),
                                                  ("fused, split", "raster_loss_fused_split"),
                                                  ("fused, split, no warp culling", "raster_loss_fused_split_no_warp_cull"),
                                                  ("fused, split, rows warp cull", "raster_loss_fused_split_rows_cull"),
                                                  ("fused, split, opacity-aware tiles", "raster_loss_fused_split_opacity_tiles"),
                                                  ("fused, split, falloff as 2^q", "raster_loss_fused_split_fast_exp"),
                                                  ("fused, split, 2 pixels per thread in the backward",
                                                   "raster_loss_fused_split_bwd_2px"))),
    ("full step (projection included)", (("gsplat", "full_gsplat"), ("fused, the run's default schedule", "full_fused"),
                                         ("fused, split", "full_fused_split"),
                                         ("fused, split, opacity-aware tiles", "full_fused_split_opacity_tiles"),
                                         ("fused raster, torch loss", "full_fused_raster_torch_loss"))),
    ("rasterization forward only", (("gsplat", "raster_fwd_gsplat"), ("fused", "raster_fwd_fused"),
                                    ("fused, no warp culling", "raster_fwd_fused_no_warp_cull"),
                                    ("fused, falloff as 2^q", "raster_fwd_fused_fast_exp"))),
)


def plot_raster(files: List[Tuple[Path, Dict]], out_dir: Path, written: List[Path]) -> None:
    groups: Dict[Tuple, List[Tuple[Path, Dict]]] = {}
    for path, data in files:
        key = (data.get("gpu"), data.get("width"), data.get("height"), data.get("projection", "gsplat"))
        groups.setdefault(key, []).append((path, data))
    plt = _plt()
    for (gpu, w, h, projection), members in groups.items():
        runs: Dict[int, Dict] = {}
        for _, data in members:
            for run in data["runs"]:
                runs.setdefault(int(run["num_gaussians"]), run)
        counts = sorted(runs)
        panels = []
        for title, stages in RASTER_PANELS:
            series, errs = {}, {}
            for label, key in stages:
                if any(isinstance(runs[n].get(key), dict) for n in counts):
                    series[label] = [runs[n][key]["median_ms"] if isinstance(runs[n].get(key), dict) else None for n in counts]
                    errs[label] = [(runs[n][key]["median_ms"] - runs[n][key].get("min_ms", runs[n][key]["median_ms"]),
                                    runs[n][key].get("max_ms", runs[n][key]["median_ms"]) - runs[n][key]["median_ms"])
                                   if isinstance(runs[n].get(key), dict) else None for n in counts]
            if series:
                panels.append((title, series, errs))
        if not panels:
            print(f"plots: raster files {[str(p) for p, _ in members]} hold no stage timings; skipped")
            continue
        fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4.2), squeeze=False)
        for ax, (title, series, errs) in zip(axes[0], panels):
            _bars(ax, [f"{_count(n)} Gaussians" for n in counts], series, errs, ylabel="median ms (min-max)")
            ax.set_title(title, fontsize=9)
        fig.suptitle(f"Time per stage, fused vs gsplat: {w}x{h}, projection {projection}")
        _footer(fig, [gpu], [d.get("date") for _, d in members])
        fig.tight_layout(rect=(0, 0.04, 1, 1))
        _save(fig, out_dir, _slug("raster_time_per_stage", gpu, f"{w}x{h}",
                                  None if projection == "gsplat" else f"{projection}-projection"), written)


# ---------------------------------------------------------------------------------------------
# (b) distributed: scaling curves and bytes per step


def _dist_devices(env: Dict) -> str:
    devices = env.get("devices") or []
    if not devices:
        return env.get("device_type", "")
    names = sorted(set(devices))
    return ", ".join(f"{devices.count(n)} x {n}" if devices.count(n) > 1 else n for n in names)


def _series_label(impl: str, communicator: str) -> str:
    c = communicator.split(",")[0].strip()
    return c if c.startswith(impl) else f"{impl} {c}"


def plot_distributed(files: List[Tuple[Path, Dict]], out_dir: Path, written: List[Path]) -> None:
    groups: Dict[Tuple, List[Tuple[Path, Dict]]] = {}
    for path, data in files:
        env, scene = data.get("environment", {}), data.get("scene", {})
        devices = env.get("devices") or []
        key = (devices[0] if devices else env.get("device_type"), scene.get("width"), scene.get("height"),
               scene.get("views_per_step"))
        groups.setdefault(key, []).append((path, data))
    plt = _plt()
    for (device, w, h, views), members in groups.items():
        rows: Dict[Tuple, Dict] = {}
        for _, data in members:
            for r in data["results"]:
                if r["status"] == "ok":
                    rows.setdefault((int(r["num_gaussians"]), r["impl"], r["communicator"], int(r["ranks"])), r)
        if not rows:
            print(f"plots: distributed files {[str(p) for p, _ in members]} hold no measured rows; skipped")
            continue
        counts = sorted({k[0] for k in rows})
        footer_devices = [_dist_devices(d.get("environment", {})) for _, d in members]
        dates = [d.get("environment", {}).get("date") for _, d in members]
        setting = f"{w}x{h}, {views} views per step"

        # Scaling: one line per (impl, multi-rank communicator), starting at that impl's 1-rank row.
        fig, axes = plt.subplots(1, len(counts), figsize=(5 * len(counts), 4.2), squeeze=False)
        max_ranks = 1
        for ax, n in zip(axes[0], counts):
            mine = {k: r for k, r in rows.items() if k[0] == n}
            for impl in sorted({k[1] for k in mine}):
                one = [r for k, r in mine.items() if k[1] == impl and k[3] == 1]
                multi: Dict[str, List[Tuple[int, float]]] = {}
                for k, r in mine.items():
                    if k[1] == impl and k[3] > 1:
                        multi.setdefault(k[2], []).append((k[3], r["views_per_second"]))
                if not multi and one:
                    multi = {"1 rank": []}
                for comm, pts in multi.items():
                    pts = sorted(([(1, one[0]["views_per_second"])] if one else []) + pts)
                    max_ranks = max(max_ranks, pts[-1][0])
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
                            label=impl if comm == "1 rank" else _series_label(impl, comm))
            base = [r for k, r in mine.items() if k[1] == "bytesplat" and k[3] == 1]
            ranks_seen = sorted({k[3] for k in mine})
            if base and len(ranks_seen) > 1:
                ax.plot(ranks_seen, [base[0]["views_per_second"] * r for r in ranks_seen], ls="--", color="0.6",
                        label="bytesplat ideal (linear)")
            ax.set_xticks(ranks_seen)
            ax.set_xlabel("ranks (GPUs)")
            ax.set_ylabel("views / s (median step)")
            ax.set_title(f"{_count(n)} Gaussians", fontsize=9)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        fig.suptitle(f"Multi-GPU scaling: {setting}")
        _footer(fig, footer_devices, dates)
        fig.tight_layout(rect=(0, 0.04, 1, 1))
        _save(fig, out_dir, _slug("distributed_scaling", device, f"{w}x{h}", f"{views}views"), written)

        _plot_counts(plt, members, rows, out_dir, written, device, (w, h, views), footer_devices, dates)

        # Bytes sent to other ranks per step, per communicator, for every multi-rank row.
        multi_rows = {k: r for k, r in rows.items() if k[3] > 1}
        if not multi_rows:
            print(f"plots: distributed ({device}, {setting}): no multi-rank rows; no bytes-per-step chart")
            continue
        cases = sorted({(k[0], k[3]) for k in multi_rows})
        labels = sorted({(k[1], k[2]) for k in multi_rows})
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), squeeze=False)
        for ax, field, title in ((axes[0][0], "backward_bytes", "backward (gradients)"),
                                 (axes[0][1], "forward_bytes", "forward (2D records / pixels)")):
            series, hatched = {}, {}
            for impl, comm in labels:
                name = _series_label(impl, comm)
                vals = []
                exact = True
                for n, ranks in cases:
                    r = multi_rows.get((n, impl, comm, ranks))
                    vals.append(None if r is None else r["bytes_per_step"].get(field, 0) / 1e6)
                    exact = exact and (r is None or r.get("bytes_exact", True))
                if not exact:
                    name += " (estimated)"
                series[name], hatched[name] = vals, not exact
            _bars(ax, [f"{_count(n)}, {ranks} ranks" for n, ranks in cases], series, ylabel="MB per step (all ranks)",
                  hatched=hatched, fmt="{:.0f}")
            ax.set_title(title, fontsize=9)
            _spread_out(ax, [v for vals in series.values() for v in vals if v], len(cases))
        fig.suptitle(f"Bytes sent to other ranks per step: {setting}")
        _footer(fig, footer_devices, dates)
        fig.tight_layout(rect=(0, 0.04, 1, 1))
        _save(fig, out_dir, _slug("distributed_bytes_per_step", device, f"{w}x{h}", f"{views}views"), written)


def _plot_counts(plt, members, rows: Dict[Tuple, Dict], out_dir: Path, written: List[Path], device, setting,
                 footer_devices, dates) -> None:
    """With three or more Gaussian counts (a capacity sweep): views/s and peak memory per GPU against
    the count, one line per implementation, communicator and rank count; a configuration that failed
    at a count (out of memory) is an x at that count."""
    counts = sorted({k[0] for k in rows})
    if len(counts) < 3:
        return
    failed: Dict[Tuple, List[int]] = {}
    for _, data in members:
        for r in data["results"]:
            if r["status"] != "ok":
                failed.setdefault((r["impl"], r["communicator"], int(r["ranks"])), []).append(int(r["num_gaussians"]))
    series = sorted({k[1:] for k in rows} | set(failed), key=lambda k: (k[2], k[0], k[1]))
    tried_and_failed = [n for ns in failed.values() for n in ns]
    w, h, views = setting
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6), squeeze=False)
    for ax, field, ylabel in ((axes[0][0], "views_per_second", "views / s (median step)"),
                              (axes[0][1], "peak_memory_mb", "peak GiB per GPU (largest rank)")):
        ax.set_xscale("log")  # before any limit is read: the crosses' limits are log-scale ones
        if field == "views_per_second":
            ax.set_yscale("log")
        ax.set_xlim(min(counts + tried_and_failed) / 1.6, max(counts + tried_and_failed) * 1.6)
        crosses, failed_at = [], {}
        for impl, comm, ranks in series:
            pts = sorted((k[0], r) for k, r in rows.items() if k[1:] == (impl, comm, ranks))
            label = f"{_series_label(impl, comm)}, {ranks} GPU{'s' if ranks > 1 else ''}"
            ys = [r[field] if field == "views_per_second"
                  else max((m for m in r[field] if m is not None), default=float("nan")) / 1024 for _, r in pts]
            line = ax.plot([n for n, _ in pts], ys, marker="o" if pts else "x", ls="-" if pts else "", label=label)[0]
            bad = sorted(set(failed.get((impl, comm, ranks), [])) - {n for n, _ in pts})
            for n in bad:  # side by side where several configurations failed at one count
                crosses.append((n * 1.03 ** failed_at.get(n, 0), line.get_color()))
                failed_at[n] = failed_at.get(n, 0) + 1
        if crosses:  # at the bottom edge, once every line has set the axis range
            lo = ax.get_ylim()[0]
            ax.scatter([n for n, _ in crosses], [lo] * len(crosses), c=[c for _, c in crosses], marker="x", s=60,
                       zorder=3, clip_on=False)
            ax.set_ylim(bottom=lo)
        ax.set_xlabel("Gaussians (x: out of memory or failed)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.suptitle(f"Growing Gaussian counts: {w}x{h}, {views} views per step")
    _footer(fig, footer_devices, dates)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    _save(fig, out_dir, _slug("distributed_counts", device, f"{w}x{h}", f"{views}views"), written)


# ---------------------------------------------------------------------------------------------
# (c) training: quality and speed per method, tile occupancy


def plot_train(files: List[Tuple[Path, Dict]], out_dir: Path, written: List[Path]) -> None:
    groups: Dict[Tuple, List[Tuple[Path, Dict]]] = {}
    for path, data in files:
        env = data.get("environment", {})
        iterations = sorted({r.get("iterations") for r in data["runs"]}, key=str)
        key = (env.get("device"), Path(str(data.get("scene", ""))).name, tuple(iterations))
        groups.setdefault(key, []).append((path, data))
    plt = _plt()
    for (device, scene, iterations), members in groups.items():
        runs: Dict[str, Dict] = {}
        files_of = {}  # label -> the files holding a run of that label
        for path, data in members:
            for r in data["runs"]:
                files_of.setdefault(r["label"], set()).add(path)
        for path, data in members:
            for r in data["runs"]:
                # the same label in several files (e.g. two calls' runs of one method): keep each,
                # named by its file, instead of silently showing the first
                label = r["label"] if len(files_of[r["label"]]) == 1 else f"{r['label']} ({path.stem})"
                runs.setdefault(label, r)
        if not runs:
            print(f"plots: train files {[str(p) for p, _ in members]} hold no runs; skipped")
            continue
        labels = list(runs)
        dates = [d.get("environment", {}).get("date") for _, d in members]
        its = "/".join(str(i) for i in iterations)
        fig, axes = plt.subplots(1, 2, figsize=(max(8, 2.2 * len(labels) + 4), 4.2), squeeze=False)
        _bars(axes[0][0], [""], {lab: [runs[lab]["eval"].get("psnr")] for lab in labels}, ylabel="eval PSNR (dB)",
              fmt="{:.2f}")
        axes[0][0].set_title("quality (all held-out views)", fontsize=9)
        psnrs = [runs[lab]["eval"].get("psnr") for lab in labels if runs[lab]["eval"].get("psnr") is not None]
        if psnrs:
            axes[0][0].set_ylim(max(0.0, min(psnrs) - 3), max(psnrs) + 1.5)
        _bars(axes[0][1], [""], {lab: [runs[lab]["ms_per_iteration"]] for lab in labels}, ylabel="ms / iteration (wall)")
        axes[0][1].set_title("speed (whole training step)", fontsize=9)
        fig.suptitle(f"Training: scene {scene}, {its} iterations")
        _footer(fig, [device], dates)
        fig.tight_layout(rect=(0, 0.04, 1, 1))
        _save(fig, out_dir, _slug("train_psnr_time", device, scene), written)

        logged = {lab: r["tile_occupancy"] for lab, r in runs.items() if r.get("tile_occupancy")}
        if not logged:
            print(f"plots: train (scene {scene}): no tile occupancy logged (--tile-stats-every); no occupancy chart")
            continue
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for lab, log in logged.items():
            ax.plot([e["step"] for e in log], [100.0 * e["over_capacity_share"] for e in log], marker=".", label=lab)
        caps = sorted({e.get("capacity") for log in logged.values() for e in log if e.get("capacity") is not None})
        ax.set_xlabel("training step")
        ax.set_ylabel("tiles over the fused capacity (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.suptitle(f"Tile occupancy during training: scene {scene}")
        _footer(fig, [device], dates, extra=f"capacity: {', '.join(f'{c:g}' for c in caps)} entries per tile" if caps else "")
        fig.tight_layout(rect=(0, 0.04, 1, 1))
        _save(fig, out_dir, _slug("train_tile_occupancy", device, scene), written)


# ---------------------------------------------------------------------------------------------
# Entry points


def plot_inputs(inputs: Sequence, out_dir: Path, log=print) -> List[Path]:
    """Every figure the inputs allow, written under ``out_dir``; the paths written."""
    by_kind = collect(inputs, log=log)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written: List[Path] = []
    for kind, fn, what in (("raster", plot_raster, "time per stage"),
                           ("distributed", plot_distributed, "scaling curves and bytes per step"),
                           ("train", plot_train, "PSNR, ms/iteration and tile occupancy")):
        if not by_kind[kind]:
            log(f"plots: no {kind} benchmark among the inputs; skipping {what}")
            continue
        before = len(written)
        try:
            fn(by_kind[kind], out_dir, written)
        except (KeyError, TypeError, ValueError) as e:
            names = ", ".join(str(p) for p, _ in by_kind[kind])
            raise PlotInputError(f"{names}: {kind} results not in the expected shape ({type(e).__name__}: {e})") from e
        for p in written[before:]:
            log(f"wrote {p}")
    return written


def parser() -> argparse.ArgumentParser:
    """``bytesplat-bench plots``'s options."""
    p = argparse.ArgumentParser(prog="bytesplat-bench plots", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--inputs", nargs="+", required=True, help="benchmark JSON files and/or folders (searched for *.json)")
    p.add_argument("--out-dir", type=Path, required=True, help="where the PNG files go")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    a = parser().parse_args(argv)
    try:
        written = plot_inputs(a.inputs, a.out_dir)
    except PlotInputError as e:
        print(f"bytesplat-bench plots: {e}", file=sys.stderr)
        return 1
    print(f"{len(written)} figure(s) in {a.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
