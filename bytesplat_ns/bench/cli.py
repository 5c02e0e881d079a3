r"""``bytesplat-bench``: the project's benchmarks, each writing one JSON file.

    bytesplat-bench raster --num-gaussians 1000000 4000000 --width 1920 --height 1080 \
        --out raster.json
    bytesplat-bench raster --trained RUN_DIR --trained-scale 2.4 --out raster_trained.json
        (a trained scene instead of random Gaussians: RUN_DIR is a finished ns-train / bytesplat-bench
        train run; raster and distributed both take --trained)
    bytesplat-bench train ...   (forwards to ``python -m bytesplat_ns.bench.train``)
    bytesplat-bench distributed ...   (multi-GPU side by side: ``bytesplat_ns.bench.distributed``)
    bytesplat-bench profile ...   (where a training iteration's time goes, host vs GPU:
        ``bytesplat_ns.bench.profile_train``)
    bytesplat-bench matrix --out-dir outputs/bench_matrix ...
        (all of the above over backends x strategies x GPU counts x scene sizes, each piece in its
        own process, then the plots: ``bytesplat_ns.bench.matrix``)
    bytesplat-bench plots --inputs outputs/suites --out-dir plots
        (PNG figures from any of the JSON files above: ``bytesplat_ns.bench.plots``)
    bytesplat-bench wallclock --data DATA --iterations 5000 --seeds 0 1 2 --out wallclock.json
        (``ns-train`` + ``ns-eval`` as a user runs them, per method and seed: the wall clock and
        where it goes: ``bytesplat_ns.bench.wallclock``)
    bytesplat-bench spoilers --load-config RUN/config.yml --image 0052.jpg --out spoilers.json
        (the Gaussians that spoil one eval view, what they are and since when: ``bytesplat_ns.bench.spoilers``)

    bytesplat-bench dram --num-gaussians 1000000 4000000 --stages split gsplat-fussim --out dram.json
        (device-memory bytes of one raster + loss pass, counted by Nsight Compute: ``bytesplat_ns.bench.dram``)

    bytesplat-bench sass --arch 90 --out sass.json
        (the compositing loops' instruction counts in the machine code, no GPU needed: ``bytesplat_ns.bench.sass``)

    bytesplat-bench city --presets small large 4k --generate small --out city.json
        (the built-in large scene's generator: seconds per view and per scene on the CPU: ``bytesplat_ns.bench.city_render``)

    bytesplat-bench loop --iterations 3000 --repeats 3 --out loop.json
        (the training loop's own host time per step, the step stubbed out, on the CPU: ``bytesplat_ns.bench.loop_overhead``)

    bytesplat-bench suite NAME [--data PATH] [--results-dir docs/results]
        (a declared suite of the runs above, one JSON document plus plots: ``bytesplat_ns.bench.suites``;
        ``--list`` names them, ``--dry-run`` prints their commands)
    bytesplat-bench report
        (docs/results.md from the committed suite documents docs/results/*.json)
    bytesplat-bench queue start -- JOB ... / bytesplat-bench queue collect --wait 570
        (a GPU machine lent for short calls: the setup and the jobs in a detached process that
        outlives the call, results packed for the device to return: ``bytesplat_ns.bench.queue``)

Each subcommand's ``--help`` lists its options.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import List, Optional


def raster_parser() -> argparse.ArgumentParser:
    """``bytesplat-bench raster``'s options (also how a suite's raster steps are checked)."""
    from bytesplat_ns.bench.timing import QUEUE_MS
    from bytesplat_ns.bench.trained import add_scene_options

    p = argparse.ArgumentParser(prog="bytesplat-bench raster",
                                description="gsplat vs fused: rasterization + loss, forward + backward, "
                                "on random Gaussians (--num-gaussians) or on a trained scene (--trained)")
    add_scene_options(p, "rendered from one of its train cameras against that view's real image")
    p.add_argument("--trained-view", type=int, default=0, help="--trained: which train view (index in the train split)")
    p.add_argument("--trained-scale", type=float, default=1.0,
                   help="--trained: render at this multiple of the view's resolution (intrinsics scaled, ground truth "
                   "resized), e.g. 2.4 turns 800x600 into 1920x1440")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--queue-ms", type=float, default=QUEUE_MS,
                   help="the GPU spins this long before each timed pass, so the host has issued every launch of the "
                   "pass before its first runs: the events time the GPU's work alone, as a CUDA graph replays it "
                   "(0: the host's issue time is timed too)")
    p.add_argument("--skip-gsplat", action="store_true", help="time only the fused backend")
    p.add_argument("--projection", choices=["gsplat", "torch"], default="gsplat",
                   help="projection for the fused paths and the shared 2D inputs (gsplat's CUDA one by default)")
    p.add_argument("--raster-only", action="store_true", help="skip the full (projection included) timings")
    p.add_argument("--baseline-ssim", nargs="*", default=["pytorch_msssim", "fussim"],
                   choices=["pytorch_msssim", "fussim"],
                   help="the baselines' SSIM: gsplat + splatfacto's loss with each (a package that does not import: "
                   "its rows say why)")
    p.add_argument("--gsplat-site", action="append", default=[], metavar="DIR",
                   help="also time the gsplat installed in DIR (pip install --target DIR gsplat==1.5.3), in a child "
                   "process with DIR first on its path; repeatable")
    p.add_argument("--out", type=str, default=None, help="JSON output path")
    return p


def _raster(argv: List[str]) -> int:
    from bytesplat_ns.bench.trained import reject_random_scene_options, run_paths

    p = raster_parser()
    a = p.parse_args(argv)
    if a.trained is not None:
        reject_random_scene_options(p, a)
        run_paths(a.trained)  # a bad directory: one clear error line now, before anything else runs
    elif a.trained_view != 0 or a.trained_scale != 1.0:
        p.error("--trained-view and --trained-scale need --trained")
    from bytesplat_ns.bench.baselines import site_gsplat_version

    for site in a.gsplat_site:  # a folder without gsplat: one clear error now, not a mislabelled row later
        site_gsplat_version(site)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    from bytesplat_ns.bench.raster import run

    command = "bytesplat-bench raster " + " ".join(shlex.quote(x) for x in argv)
    run(a.num_gaussians or [1_000_000], a.width or 1920, a.height or 1080, a.sh_degree, a.warmup, a.repeats, a.out,
        command, a.skip_gsplat, a.projection, a.raster_only, trained=a.trained, trained_view=a.trained_view,
        trained_scale=a.trained_scale, baseline_ssim=a.baseline_ssim, gsplat_sites=a.gsplat_site, queue_ms=a.queue_ms)
    return 0


# Each subcommand's module: its ``main(argv)`` returns an exit code, or its result (success).
SUBCOMMANDS = {
    "step": "bytesplat_ns.bench.step",
    "dram": "bytesplat_ns.bench.dram",
    "sass": "bytesplat_ns.bench.sass",
    "city": "bytesplat_ns.bench.city_render",
    "loop": "bytesplat_ns.bench.loop_overhead",
    "train": "bytesplat_ns.bench.train",
    "profile": "bytesplat_ns.bench.profile_train",
    "distributed": "bytesplat_ns.bench.distributed",
    "matrix": "bytesplat_ns.bench.matrix",
    "plots": "bytesplat_ns.bench.plots",
    "wallclock": "bytesplat_ns.bench.wallclock",
    "spoilers": "bytesplat_ns.bench.spoilers",
    "suite": "bytesplat_ns.bench.suite_runner",
    "report": "bytesplat_ns.bench.report",
    "queue": "bytesplat_ns.bench.queue",
}


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "raster":
        return _raster(rest)
    if cmd in SUBCOMMANDS:
        import importlib

        result = importlib.import_module(SUBCOMMANDS[cmd]).main(rest)
        return result if isinstance(result, int) else 0
    print(f"bytesplat-bench: unknown benchmark '{cmd}' (choose raster, {', '.join(SUBCOMMANDS)})", file=sys.stderr)
    return 2


def entrypoint() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entrypoint()
