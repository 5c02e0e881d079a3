r"""``bytesplat-bench dram``: device-memory traffic of one raster + loss pass (forward, loss, backward),
counted by Nsight Compute.

    bytesplat-bench dram --num-gaussians 1000000 4000000 --stages split two_launch gsplat-fussim --out dram.json

For every scene and stage the command runs, in a child process under ``ncu``::

    ncu --clock-control none --profile-from-start off --metrics dram__bytes_read.sum,dram__bytes_write.sum --csv \
        --print-units base python -m bytesplat_ns.bench.dram --stage STAGE ...

The child builds the scene's projected and binned 2D inputs (``bench.raster.StageInputs``, the inputs
the raster benchmark times), runs the stage a few times, then exactly once between
``cudaProfilerStart`` and ``cudaProfilerStop``, so ncu counts that one pass's kernels; the parent sums
ncu's CSV per stage (read and written bytes, kernels counted). Stages:

- ``split``: the fused backend's split schedule (render_fwd -> loss_grad -> render_bwd) on the square 3-sigma
  lists;
- ``split-trimmed``: the pass training runs by default, the same schedule on the opacity-aware lists trimmed,
  with the trimming's launches in the pass and the default falloff (2^q);
- ``two_launch`` / ``one_launch``: the fused kernel twice / once;
- ``gsplat-pytorch_msssim`` / ``gsplat-fussim``: this process's gsplat ``rasterize_to_pixels`` with
  splatfacto's loss, its SSIM from that package, and the backward; with ``--gsplat-site DIR`` (a
  ``pip install --target DIR`` of another version, e.g. 1.5.3) each gsplat stage is counted again with
  DIR first on the child's path. Every gsplat row names its ``gsplat_version``. With ``-reach``
  (``gsplat-fussim-reach``: the raster benchmark's strongest baseline) on the opacity-aware lists, counted
  only for the versions that bin per axis (1.5 and later).

``--kernels`` also profiles each stage's pass kernel by kernel (a second child, under ncu's
SpeedOfLight, ComputeWorkloadAnalysis, Occupancy, LaunchStats and MemoryWorkloadAnalysis sections):
per kernel its duration, SM throughput, issue slots busy (near 100%: the kernel is bound by the
instructions it issues, and only fewer instructions make it faster), achieved and theoretical
occupancy, registers per thread, local-memory spill requests and DRAM bytes; the row's
``kernel_profile`` lists them in launch order.

ncu reads the device's DRAM counters, so run it alone on the GPU: another process's kernels would
add their traffic. ``--ncu`` names the profiler (default ``ncu`` on the PATH). A stage that fails
(no ncu, counters not readable, a package missing) is its row's ``error``.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum")
KERNEL_SECTIONS = ("SpeedOfLight", "ComputeWorkloadAnalysis", "Occupancy", "LaunchStats", "MemoryWorkloadAnalysis")
# (section, metric) of ncu's details page -> the field of a kernel_profile entry
KERNEL_FIELDS = {
    ("GPU Speed Of Light Throughput", "Duration"): "duration_us",
    ("GPU Speed Of Light Throughput", "Compute (SM) Throughput"): "sm_throughput_pct",
    ("Compute Workload Analysis", "Issue Slots Busy"): "issue_slots_busy_pct",
    ("Occupancy", "Achieved Occupancy"): "achieved_occupancy_pct",
    ("Occupancy", "Theoretical Occupancy"): "theoretical_occupancy_pct",
    ("Launch Statistics", "Registers Per Thread"): "registers",
    ("Memory Workload Analysis", "Local Memory Spilling Requests"): "local_spill_requests",
    ("Memory Workload Analysis", "Memory Throughput"): "dram_bytes_per_s",
}
TIME_UNITS_US = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "s": 1e6, "second": 1e6}
FUSED_STAGES = ("split", "split-trimmed", "two_launch", "one_launch")
# "-reach": on the opacity-aware lists (gsplat >= 1.5 bins per axis), as the raster benchmark's strongest baseline
REACH = "-reach"
GSPLAT_STAGES = ("gsplat-pytorch_msssim", "gsplat-fussim", "gsplat-pytorch_msssim" + REACH, "gsplat-fussim" + REACH)
STAGES = FUSED_STAGES + GSPLAT_STAGES


def parse_ncu_csv(text: str) -> Dict[str, float]:
    """Sum each metric over all profiled kernels of an ``ncu --csv --print-units base`` report."""
    totals = {m: 0.0 for m in METRICS}
    kernels = set()
    for row in _csv_rows(text):
        name = row.get("Metric Name")
        if name in totals:
            totals[name] += _number(row.get("Metric Value", "0"))
            kernels.add(row.get("ID"))
    return {"kernels": len(kernels), "dram_read_bytes": totals[METRICS[0]],
            "dram_write_bytes": totals[METRICS[1]], "dram_bytes": totals[METRICS[0]] + totals[METRICS[1]]}


def _csv_rows(text: str):
    start = text.find('"ID"')
    if start < 0:
        raise ValueError("no ncu CSV table in the output")
    return csv.DictReader(io.StringIO(text[start:]))


def _number(value: str) -> float:
    return float(str(value).replace(",", ""))


def short_kernel_name(name: str) -> str:
    """``void ns::<unnamed>::render_bwd_kernel<0, 1, 0>(int, ...)`` -> ``render_bwd_kernel<0, 1, 0>``:
    the function without its namespaces, return type and parameters; template arguments are kept
    when short (they tell a kernel's instances apart), else dropped."""
    depth, cut = 0, len(name)
    for i, ch in enumerate(name):  # the parameter list: the first '(' outside template brackets
        depth += ch == "<"
        depth -= ch == ">"
        if ch == "(" and depth == 0:
            cut = i
            break
    head = name[:cut].strip()
    depth, start = 0, 0
    for i, ch in enumerate(head):  # after the last '::' or space outside template brackets
        depth += ch == "<"
        depth -= ch == ">"
        if depth == 0 and (head.startswith("::", i) or ch == " "):
            start = i + (2 if head.startswith("::", i) else 1)
    head = head[start:]
    base, bracket, args = head.partition("<")
    return head if not bracket or len(args) <= 16 else base


def parse_ncu_kernels(text: str) -> List[Dict]:
    """One entry per profiled kernel of an ``ncu --csv --page details`` report of KERNEL_SECTIONS, in
    launch order: its name (short and full), grid and block, KERNEL_FIELDS, and the DRAM bytes it
    moved (throughput times duration)."""
    kernels: Dict[str, Dict] = {}
    for row in _csv_rows(text):
        if row.get("Kernel Name") is None:  # not a table row (ncu's ==PROF== lines)
            continue
        entry = kernels.setdefault(row["ID"], {"name": short_kernel_name(row["Kernel Name"]),
                                               "kernel": row["Kernel Name"], "grid": row.get("Grid Size"),
                                               "block": row.get("Block Size")})
        field = KERNEL_FIELDS.get((row.get("Section Name"), row.get("Metric Name")))
        if field is None or row.get("Metric Value") in (None, "", "n/a"):
            continue
        value = _number(row["Metric Value"])
        if field == "duration_us":
            unit = row.get("Metric Unit", "")
            if unit not in TIME_UNITS_US:
                raise ValueError(f"kernel {entry['name']}: duration in an unknown unit {unit!r}")
            value *= TIME_UNITS_US[unit]
        elif field in ("registers", "local_spill_requests"):
            value = int(value)
        entry[field] = value
    out = []
    for kid in sorted(kernels, key=int):
        entry = kernels[kid]
        rate = entry.pop("dram_bytes_per_s", None)
        if rate is not None and "duration_us" in entry:
            entry["dram_bytes"] = round(rate * entry["duration_us"] * 1e-6)
        out.append(entry)
    return out


def profile_summary(row: Dict, top: int = 3) -> str:
    """The stage's longest kernels in one line, e.g. ``render_bwd_kernel<0, 1, 0> 1698 us (issue 82%), ...``."""
    if "kernel_profile" not in row:
        return f"error: {row.get('kernel_profile_error')}"
    longest = sorted((k for k in row["kernel_profile"] if "duration_us" in k), key=lambda k: -k["duration_us"])[:top]
    total = sum(k.get("duration_us", 0.0) for k in row["kernel_profile"])
    return f"{total:.0f} us in {len(row['kernel_profile'])}; " + ", ".join(
        f"{k['name']} {k['duration_us']:.0f} us (issue {k.get('issue_slots_busy_pct', float('nan')):.0f}%)" for k in longest)


def stage_function(stage: str, inp) -> Callable[[], object]:
    """One pass of ``stage`` on ``inp`` (``bench.raster.StageInputs``)."""
    if stage == "split-trimmed":
        return lambda: trimmed_split_pass(inp)
    if stage in FUSED_STAGES:
        return lambda: inp.fused_raster_loss(schedule=stage)
    if stage in GSPLAT_STAGES:
        from bytesplat_ns.bench.baselines import gsplat_bins, gsplat_raster_loss_pass, gsplat_version, ssim_function

        ssim = stage.removeprefix("gsplat-").removesuffix(REACH)
        return gsplat_raster_loss_pass(inp, *gsplat_bins(inp, gsplat_version(), opacity_aware=stage.endswith(REACH)),
                                       ssim_function(ssim))
    raise SystemExit(f"unknown stage {stage!r} (choose from {', '.join(STAGES)})")


def trimmed_split_pass(inp):
    """The pass training runs by default: the opacity-aware lists trimmed (``FusedOptions.trim_tile_lists``;
    the trimming's launches inside the pass, as in a training step), then the split schedule on them."""
    from bytesplat_ns.raster.options import DEFAULT_OPTIONS

    inp.trim()
    return inp.fused_raster_loss(schedule="split", trimmed=True, fast_exp=DEFAULT_OPTIONS.fast_exp)


def run_stage(stage: str, inp, warmup: int) -> None:
    """Warm ``stage`` up, then run it once inside the profiler range ncu measures."""
    import torch

    one_pass = stage_function(stage, inp)
    for _ in range(warmup):
        one_pass()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    one_pass()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def ncu_command(ncu: str, stage: str, scene_file: Path, warmup: int, kernels: bool = False) -> List[str]:
    # counting bytes needs no locked clocks: leave the GPU's clock control alone (and so the
    # profile's durations are at the clocks training runs at)
    what = ([arg for section in KERNEL_SECTIONS for arg in ("--section", section)] + ["--csv", "--page", "details"]
            if kernels else ["--metrics", ",".join(METRICS), "--csv", "--print-units", "base"])
    return [ncu, "--clock-control", "none", "--profile-from-start", "off", *what,
            sys.executable, "-m", "bytesplat_ns.bench.dram", "--stage", stage, "--scene-file", str(scene_file),
            "--warmup", str(warmup)]


def _ncu_child(ncu: str, stage: str, scene_file: Path, warmup: int, site: Optional[str], kernels: bool,
               parse: Callable[[str], object]):
    """(parsed ncu report, None) or (None, the error that stopped it)."""
    from bytesplat_ns.bench.baselines import child_failure, site_env

    env = site_env(site) if site is not None else None
    try:
        done = subprocess.run(ncu_command(ncu, stage, scene_file, warmup, kernels), capture_output=True, text=True,
                              env=env)
    except OSError as e:
        return None, f"{ncu}: {e.strerror or e}"
    if done.returncode != 0:
        return None, child_failure(done)
    try:
        return parse(done.stdout), None
    except ValueError as e:
        return None, str(e)


def measure_stage(ncu: str, stage: str, scene_file: Path, warmup: int, site: Optional[str] = None,
                  kernels: bool = False) -> Dict:
    """``stage``'s row: ncu's sums (and with ``kernels`` its kernel_profile, or kernel_profile_error),
    or the error that stopped it; ``site`` goes first on the child's path."""
    sums, error = _ncu_child(ncu, stage, scene_file, warmup, site, False, parse_ncu_csv)
    if error is not None:
        return {"stage": stage, "error": error}
    row = {"stage": stage, **sums}
    if kernels:
        profile, error = _ncu_child(ncu, stage, scene_file, warmup, site, True, parse_ncu_kernels)
        row.update({"kernel_profile": profile} if error is None else {"kernel_profile_error": error})
    return row


def stage_runs(stages: Sequence[str], gsplat_sites: Sequence[str]) -> List[Tuple[str, Optional[str], Optional[str]]]:
    """(stage, site, gsplat version) per child: the fused stages once, each gsplat stage with this
    process's gsplat and with each site's (a ``-reach`` stage only with the versions that bin per axis)."""
    from bytesplat_ns.bench.baselines import per_axis_radii, site_gsplat_version

    runs: List[Tuple[str, Optional[str], Optional[str]]] = []
    for stage in stages:
        if stage in GSPLAT_STAGES:
            found = [(stage, site, site_gsplat_version(site)) for site in (None, *gsplat_sites)]
            runs += [run for run in found if not stage.endswith(REACH) or per_axis_radii(run[2])]
        else:
            runs.append((stage, None, None))
    return runs


def stage_label(row: Dict) -> str:
    """A row's stage, with its gsplat version where it has one."""
    return f"{row['stage']} {row['gsplat_version']}" if row.get("gsplat_version") else row["stage"]


def parser() -> argparse.ArgumentParser:
    from bytesplat_ns.bench.trained import add_scene_options

    p = argparse.ArgumentParser(prog="bytesplat-bench dram", description=__doc__.split("\n\n")[0].strip(" r\"`"))
    add_scene_options(p, "measured from one of its train views (--trained-view) at full resolution")
    p.add_argument("--trained-view", type=int, default=0, help="with --trained: the train view")
    p.add_argument("--stages", nargs="+", default=["split", "gsplat-fussim"], choices=STAGES)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--ncu", default="ncu", help="the Nsight Compute command line tool")
    p.add_argument("--kernels", action="store_true",
                   help="also profile each stage kernel by kernel (duration, issue slots busy, occupancy, registers, "
                        "spills, DRAM bytes): a second ncu child per stage")
    p.add_argument("--gsplat-site", nargs="+", default=[], metavar="DIR",
                   help="count each gsplat stage again with the gsplat installed in DIR (pip install --target DIR)")
    p.add_argument("--out", type=Path, default=Path("dram.json"))
    # the child under ncu: one stage on the scene of --scene-file
    p.add_argument("--stage", choices=STAGES, default=None, help=argparse.SUPPRESS)
    p.add_argument("--scene-file", type=Path, default=None, help=argparse.SUPPRESS)
    return p


def main(argv: Optional[Sequence[str]] = None) -> Dict:
    p = parser()
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    import torch

    from bytesplat_ns.bench.raster import StageInputs
    from bytesplat_ns.bench.scene_file import load_scene, save_scene

    if args.stage is not None:  # the child
        if args.scene_file is None:
            p.error("--stage needs --scene-file")
        run_stage(args.stage, StageInputs(0, 0, 0, 0, projection="torch", scene=load_scene(args.scene_file)), args.warmup)
        return {}
    if args.trained is not None:
        from bytesplat_ns.bench.trained import reject_random_scene_options

        reject_random_scene_options(p, args)
    if not torch.cuda.is_available():
        from bytesplat_ns.errors import BytesplatError

        raise BytesplatError("bytesplat-bench dram needs a CUDA GPU (and Nsight Compute)")
    rows: List[Dict] = []
    from bytesplat_ns.bench.trained import scenes_from_options

    runs = stage_runs(args.stages, args.gsplat_site)
    for label, scene in scenes_from_options(args, [1_000_000]):
        with tempfile.TemporaryDirectory() as tmp:
            scene_file = save_scene(scene, Path(tmp) / "scene.pt")
            for stage, site, version in runs:
                row = dict(measure_stage(args.ncu, stage, scene_file, args.warmup, site, args.kernels), scene=label,
                           num_gaussians=int(scene["means"].shape[0]), width=scene["width"], height=scene["height"])
                if version is not None:
                    row["gsplat_version"] = version
                rows.append(row)
                print(f"[dram] {row['num_gaussians']:,} Gaussians, {stage_label(row)}: " + (
                    f"{row['dram_bytes'] / 1e6:.1f} MB in {row['kernels']} kernels" if "dram_bytes" in row
                    else row["error"]), flush=True)
                if "kernel_profile" in row or "kernel_profile_error" in row:
                    print(f"[dram]   kernels: {profile_summary(row)}", flush=True)
    result: Dict = {"benchmark": "bytesplat-bench dram", "rows": rows}
    from bytesplat_ns.bench.train import environment

    result.update(environment(list(sys.argv[1:] if argv is None else argv), prog="bytesplat-bench dram"))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
