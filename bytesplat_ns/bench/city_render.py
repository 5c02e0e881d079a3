r"""``bytesplat-bench city``: how long the built-in large scene's generator takes, per view and per scene,
on this machine's CPU.

    bytesplat-bench city --presets small large 4k --views-per-kind 2 --generate small --out city.json

Per preset (``bytesplat_ns.data.city``): the time to build the scene and its camera poses, then
``--views-per-kind`` views of each kind rendered one at a time in this process (``render_city_view``,
the generator's own renderer): aerial views orbiting the whole city (the even aerial indices, the slow
ones), closer aerial views (the odd ones) and street views, spread evenly over each kind's indices.
``estimated_scene_core_s`` is each kind's mean seconds per view times its number of views, summed:
the whole scene's render time on one core, an estimate from the sample, not a run (the seed point
cloud and the PNG writes are not in it). ``--generate PRESET`` also runs ``generate_city`` for
that preset with one worker into a temporary folder (every view, the seed points, the files) and
records its wall clock as ``generated_s``: use it for the small presets. Run with
``OMP_NUM_THREADS=1`` for one core (the suite ``city-render-cpu`` does).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from bytesplat_ns.errors import BytesplatError

KINDS = ("aerial_orbit", "aerial_close", "street")


def view_indices(aerial_views: int, street_views: int) -> Dict[str, List[int]]:
    """Every view index of each kind (city_camera_poses' order: aerial first, even ones orbiting)."""
    return {"aerial_orbit": list(range(0, aerial_views, 2)), "aerial_close": list(range(1, aerial_views, 2)),
            "street": list(range(aerial_views, aerial_views + street_views))}


def spread(indices: Sequence[int], count: int) -> List[int]:
    """``count`` of ``indices`` spread evenly from first to last (all of them when there are fewer)."""
    if count <= 0 or not indices:
        return []
    if count >= len(indices):
        return list(indices)
    if count == 1:
        return [indices[len(indices) // 2]]
    return [indices[round(i * (len(indices) - 1) / (count - 1))] for i in range(count)]


def estimate_scene_seconds(per_view_s: Dict[str, List[float]], counts: Dict[str, int]) -> float:
    """Each kind's mean seconds per view times its number of views, summed (kinds without a timed view:
    the mean of all timed views)."""
    timed = [s for times in per_view_s.values() for s in times]
    if not timed:
        raise BytesplatError("no view was timed, so the scene's render time cannot be estimated")
    overall = statistics.fmean(timed)
    return sum(n * (statistics.fmean(per_view_s[k]) if per_view_s.get(k) else overall) for k, n in counts.items())


def measure_preset(preset: str, views_per_kind: int, generate: bool) -> Dict:
    from bytesplat_ns.data.city import CitySpec, build_city, city_camera_poses, generate_city, render_city_view

    spec = CitySpec(preset=preset)
    t0 = time.perf_counter()
    scene = build_city(spec)
    build_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    poses = city_camera_poses(spec, scene)
    poses_s = time.perf_counter() - t0
    kinds = view_indices(spec.aerial_views, spec.street_views)
    per_view: Dict[str, List[float]] = {k: [] for k in KINDS}
    timed = []
    for kind in KINDS:
        for index in spread(kinds[kind], views_per_kind):
            t0 = time.perf_counter()
            render_city_view(scene, poses[index], spec)
            seconds = time.perf_counter() - t0
            per_view[kind].append(seconds)
            timed.append({"index": index, "kind": kind, "seconds": seconds})
            print(f"[city] {preset} view {index} ({kind}): {seconds:.2f} s", flush=True)
    counts = {k: len(v) for k, v in kinds.items()}
    row = {"preset": preset, "width": spec.width, "height": spec.height, "views": spec.num_views,
           "views_by_kind": counts, "num_points": spec.num_points, "build_s": build_s, "poses_s": poses_s,
           "views_timed": timed, "estimated_scene_core_s": estimate_scene_seconds(per_view, counts)}
    if generate:
        with tempfile.TemporaryDirectory(prefix=f"bytesplat-city-{preset}-") as out:
            t0 = time.perf_counter()
            generate_city(spec, out, progress=False, workers=1)
            row["generated_s"] = time.perf_counter() - t0
        print(f"[city] {preset}: generated in {row['generated_s']:.1f} s (one worker)", flush=True)
    return row


def cpu_model() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what platform reports."""
    import platform

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def parser() -> argparse.ArgumentParser:
    from bytesplat_ns.data.city import CITY_PRESETS

    p = argparse.ArgumentParser(prog="bytesplat-bench city", description=__doc__.split("\n\n")[0].strip(" r\"`"))
    p.add_argument("--presets", nargs="+", default=["small", "large"], choices=list(CITY_PRESETS),
                   help="the city presets to time")
    p.add_argument("--views-per-kind", type=int, default=2,
                   help="views of each kind (aerial orbit, aerial close, street) rendered and timed per preset")
    p.add_argument("--generate", nargs="*", default=[], choices=list(CITY_PRESETS), metavar="PRESET",
                   help="presets also generated whole (one worker, a temporary folder) for their wall clock")
    p.add_argument("--out", type=Path, default=Path("city.json"))
    return p


def main(argv: Optional[Sequence[str]] = None) -> Dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    if args.views_per_kind < 1:
        raise BytesplatError(f"--views-per-kind must be at least 1, got {args.views_per_kind}")
    from bytesplat_ns.bench.train import environment

    rows = [measure_preset(preset, args.views_per_kind, preset in args.generate) for preset in args.presets]
    result: Dict = {"benchmark": "bytesplat-bench city", "rows": rows,
                    "cpu": cpu_model(), "cpu_count": os.cpu_count(),
                    "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
                    **environment(argv, prog="bytesplat-bench city")}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
