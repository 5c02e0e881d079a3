r"""``bytesplat-bench matrix``: the whole comparison matrix in one command.

Backends x strategies x GPU counts x scene sizes, each piece one run of an existing benchmark in
its own process (``python -m bytesplat_ns.bench.cli raster|train|distributed``; the multi-GPU
pieces under ``python -m torch.distributed.run --standalone --nproc-per-node R``), so a piece that
crashes, runs out of memory or hangs (``--piece-timeout``) does not take the others with it:

- ``raster``: one piece per Gaussian count (needs CUDA);
- ``train``: one piece per scene size and method (splatfacto / bytesplat backends; the gsplat- and
  fused-backed methods need CUDA);
- ``distributed``: one piece per rank count R > 1 and Gaussian count, each with every requested
  communicator (each such run also measures the 1-rank rows); R = 1 runs on its own only when no
  R > 1 piece can run. On CUDA, R may not exceed the GPU count; on the CPU the ranks use gloo.

Pieces this machine cannot run are recorded as skipped with the reason. Output, in ``--out-dir``:
one JSON file per piece, ``logs/`` (each piece's stdout and stderr), ``matrix.json`` (the index:
per piece its command, status, output file, seconds and, when it failed, its stderr's tail;
rewritten after every piece) and ``plots/`` (``bytesplat-bench plots`` on what the pieces wrote).

    bytesplat-bench matrix --out-dir outputs/bench_matrix                    # defaults below
    bytesplat-bench matrix --scene-sizes small --iterations 3 --methods bytesplat:reference \
        --gaussians 2000 --ranks 1 2 --width 64 --height 48 --views 2 --out-dir /tmp/m   # CPU smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Dict, List, Optional

CUDA_METHODS = ["splatfacto", "bytesplat:gsplat", "bytesplat:fused"]
CPU_METHODS = ["bytesplat:reference"]
STDERR_TAIL_CHARS = 4000


@dataclass
class Piece:
    name: str
    kind: str
    params: Dict
    argv: List[str] = field(default_factory=list)
    output: Optional[str] = None  # relative to the matrix folder
    status: str = "pending"  # pending, ok, failed, skipped, planned (--dry-run)
    reason: Optional[str] = None
    seconds: Optional[float] = None
    returncode: Optional[int] = None
    stderr_tail: Optional[str] = None
    logs: Optional[Dict[str, str]] = None
    env: Dict[str, str] = field(default_factory=dict)  # set for this piece's process only

    def record(self) -> Dict:
        d = asdict(self)
        d["command"] = shlex.join(d.pop("argv")) if self.argv else None
        d["env"] = self.env or None
        return {k: v for k, v in d.items() if v is not None}


def _machine() -> Dict:
    """What the pieces can use here: CUDA and how many GPUs."""
    import torch

    cuda = torch.cuda.is_available()
    count = torch.cuda.device_count() if cuda else 0
    return {
        "cuda": cuda,
        "gpu_count": count,
        "devices": [torch.cuda.get_device_name(i) for i in range(count)] if cuda else [platform.processor() or "cpu"],
        "cpu_count": os.cpu_count(),
        "host": platform.node(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def _method_needs_cuda(entry: str) -> Optional[str]:
    """Why a ``method[:rasterizer][@options]`` entry cannot train without CUDA (None: it can)."""
    spec = entry.partition("@")[0]
    name, _, rasterizer = spec.partition(":")
    if name == "splatfacto" or name.startswith("splatfacto"):
        return "splatfacto rasterizes with gsplat, whose kernels need CUDA"
    if rasterizer == "gsplat":
        return "the gsplat rasterizer's kernels need CUDA"
    if rasterizer == "fused":
        return "the fused kernels need CUDA (on the CPU the model would silently fall back to the reference rasterizer)"
    return None


def _label(entry: str) -> str:
    return "".join(c if c.isalnum() or c in "._" else "-" for c in entry)


def plan(args, machine: Dict) -> List[Piece]:
    """Every piece of the matrix, with the ones this machine cannot run already marked skipped."""
    cli = [sys.executable, "-m", "bytesplat_ns.bench.cli"]
    pieces: List[Piece] = []
    cuda = machine["cuda"]

    if "raster" in args.benchmarks:
        for n in args.gaussians:
            p = Piece(f"raster_N{n}", "raster", {"num_gaussians": n, "width": args.width, "height": args.height},
                      output=f"raster_N{n}.json")
            p.argv = cli + ["raster", "--num-gaussians", str(n), "--width", str(args.width), "--height", str(args.height),
                            "--out", str(args.out_dir / p.output)]
            if args.warmup is not None:
                p.argv += ["--warmup", str(args.warmup)]
            if args.repeats is not None:
                p.argv += ["--repeats", str(args.repeats)]
            if not cuda:
                p.status, p.reason = "skipped", "the raster benchmark times CUDA kernels; this machine has no GPU"
            pieces.append(p)

    if "train" in args.benchmarks:
        for scene in args.scene_sizes:
            for method in args.methods:
                name = f"train_{scene}_{_label(method)}"
                p = Piece(name, "train", {"scene": scene, "method": method, "iterations": args.iterations},
                          output=f"{name}.json")
                p.argv = cli + ["train", "--scene", scene, "--iterations", str(args.iterations), "--methods", method,
                                "--work-dir", str(args.out_dir / "train_outputs"), "--out", str(args.out_dir / p.output)]
                if args.tile_stats_every:
                    p.argv += ["--tile-stats-every", str(args.tile_stats_every)]
                if args.num_downscales is not None:
                    p.argv += ["--num-downscales", str(args.num_downscales)]
                if args.hw_prune is not None:
                    p.argv += ["--hw-prune", args.hw_prune]
                why = None if cuda else _method_needs_cuda(method)
                if why:
                    p.status, p.reason = "skipped", f"{why}; this machine has no GPU"
                pieces.append(p)

    if "distributed" in args.benchmarks:
        def runnable(r: int) -> Optional[str]:
            if r < 1:
                return f"{r} ranks"
            if cuda and r > machine["gpu_count"]:
                return f"{r} ranks need {r} GPUs; this machine has {machine['gpu_count']}"
            return None

        multi = [r for r in args.ranks if r > 1]
        multi_ok = [r for r in multi if runnable(r) is None]
        for r in sorted(set(args.ranks)):
            for n in args.gaussians:
                name = f"distributed_R{r}_N{n}"
                p = Piece(name, "distributed", {"ranks": r, "num_gaussians": n, "communicators": args.communicators,
                                                "width": args.width, "height": args.height, "views": args.views},
                          output=f"{name}.json")
                launch = (cli if r == 1 else
                          [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(r),
                           "-m", "bytesplat_ns.bench.cli"])
                p.argv = launch + ["distributed", "--num-gaussians", str(n), "--width", str(args.width),
                                   "--height", str(args.height), "--views", str(args.views),
                                   "--communicators", *args.communicators, "--device", "cuda" if cuda else "cpu",
                                   "--out", str(args.out_dir / p.output)]
                if args.warmup is not None:
                    p.argv += ["--warmup", str(args.warmup)]
                if args.repeats is not None:
                    p.argv += ["--repeats", str(args.repeats)]
                why = runnable(r)
                if why is None and r == 1 and multi_ok:
                    why = f"the 1-rank rows are measured by the {', '.join(map(str, multi_ok))}-rank pieces"
                    p.status = "covered"
                if why:
                    p.status, p.reason = p.status if p.status == "covered" else "skipped", why
                pieces.append(p)
    for p in pieces:
        if p.status != "pending":
            p.output = None  # nothing will be written for it
    return pieces


def _tail(path: Path) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return text[-STDERR_TAIL_CHARS:]


def run_piece(p: Piece, out_dir: Path, timeout: Optional[float]) -> None:
    """Run one piece in its own process; its status, time and (on failure) stderr tail on ``p``."""
    logs = out_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    out_log, err_log = logs / f"{p.name}.stdout.log", logs / f"{p.name}.stderr.log"
    p.logs = {"stdout": str(out_log.relative_to(out_dir)), "stderr": str(err_log.relative_to(out_dir))}
    output = out_dir / p.output
    if output.exists():
        output.unlink()  # never take a previous run's file for this one's
    env = dict(os.environ)
    # The children import the bytesplat_ns this process runs (a worktree may shadow the installed one).
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([root] + [x for x in env.get("PYTHONPATH", "").split(os.pathsep) if x])
    env.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast off (scripts/gpu_setup.sh says why)
    env.update(p.env)
    start = time.perf_counter()
    with open(out_log, "w") as so, open(err_log, "w") as se:
        try:
            proc = subprocess.run(p.argv, stdout=so, stderr=se, env=env, timeout=timeout, stdin=subprocess.DEVNULL)
            p.returncode = proc.returncode
        except subprocess.TimeoutExpired:
            p.returncode = None
            p.reason = f"timed out after {timeout:g} s (--piece-timeout)"
    p.seconds = round(time.perf_counter() - start, 3)
    if p.reason is None and p.returncode != 0:
        p.reason = f"exit status {p.returncode}"
    elif p.reason is None and not output.exists():
        p.reason = "exit status 0 but no output file was written"
    if p.reason is None:
        p.status = "ok"
    else:
        p.status = "failed"
        p.stderr_tail = _tail(err_log)
        if not output.exists():
            p.output = None  # the index names only files that exist


def _write_index(out_dir: Path, report: Dict) -> Path:
    path = out_dir / "matrix.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=1))
    tmp.replace(path)
    return path


def parser() -> argparse.ArgumentParser:
    """``bytesplat-bench matrix``'s options (also how a suite's matrix steps are checked)."""
    p = argparse.ArgumentParser(prog="bytesplat-bench matrix", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out-dir", type=Path, default=Path("outputs/bench_matrix"))
    p.add_argument("--benchmarks", nargs="+", choices=["raster", "train", "distributed"],
                   default=["raster", "train", "distributed"], help="which parts of the matrix to run")
    p.add_argument("--scene-sizes", nargs="+", choices=["small", "medium", "large"], default=["small", "medium"],
                   help="train: built-in scenes")
    p.add_argument("--iterations", type=int, default=7000, help="train: iterations per method")
    p.add_argument("--methods", nargs="+", default=None,
                   help="train: method[:rasterizer][@field=value,...] entries (default: "
                   f"{' '.join(CUDA_METHODS)} on CUDA, {' '.join(CPU_METHODS)} on the CPU)")
    p.add_argument("--num-downscales", type=int, default=None, help="train: splatfacto's coarse-to-fine start")
    p.add_argument("--tile-stats-every", type=int, default=100,
                   help="train: log tile occupancy every N steps (bytesplat methods; 0: off)")
    p.add_argument("--hw-prune", choices=["auto", "on", "off"], default=None, help="train: bytesplat's hardware-aware pruning")
    p.add_argument("--gaussians", type=int, nargs="+", default=[1_000_000, 4_000_000], help="raster, distributed: scene sizes")
    p.add_argument("--width", type=int, default=1920, help="raster, distributed")
    p.add_argument("--height", type=int, default=1080, help="raster, distributed")
    p.add_argument("--views", type=int, default=8, help="distributed: views per step")
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2], help="distributed: rank (GPU) counts")
    p.add_argument("--communicators", nargs="+", choices=["dense", "sparse-grad", "pixel"], default=["dense", "sparse-grad"],
                   help="distributed: bytesplat's communicators")
    p.add_argument("--warmup", type=int, default=None, help="raster, distributed (default: each benchmark's own)")
    p.add_argument("--repeats", type=int, default=None, help="raster, distributed (default: each benchmark's own)")
    p.add_argument("--piece-timeout", type=float, default=None, help="seconds before a piece is stopped and marked failed")
    p.add_argument("--dry-run", action="store_true", help="write matrix.json with the planned commands, run nothing")
    p.add_argument("--no-plots", action="store_true")
    return p


def parse_args(argv: Optional[List[str]] = None):
    return parser().parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    from rich.console import Console

    console = Console()
    machine = _machine()
    if args.methods is None:
        args.methods = CUDA_METHODS if machine["cuda"] else CPU_METHODS
    args.out_dir.mkdir(parents=True, exist_ok=True)
    pieces = plan(args, machine)
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    report = {"benchmark": "bytesplat-bench matrix",
              "command": "bytesplat-bench matrix " + shlex.join(argv),
              "environment": machine, "settings": settings, "complete": False, "pieces": [], "plots": []}

    def index():
        report["pieces"] = [p.record() for p in pieces]
        report["summary"] = {s: sum(p.status == s for p in pieces) for s in sorted({p.status for p in pieces})}
        return _write_index(args.out_dir, report)

    index()
    todo = [p for p in pieces if p.status == "pending"]
    console.rule(f"[bold]bytesplat-bench matrix: {len(todo)} piece(s) to run, "
                 f"{len(pieces) - len(todo)} skipped or covered, on {', '.join(machine['devices'])}")
    for p in pieces:
        if p.status != "pending":
            console.print(f"  [dim]{p.status:>8}[/dim]  {p.name}: {p.reason}")
    for i, p in enumerate(todo, 1):
        if args.dry_run:
            p.status = "planned"
            console.print(f"  [{i}/{len(todo)}] {p.name}: {shlex.join(p.argv)}")
            continue
        with console.status(f"[{i}/{len(todo)}] {p.name} ..."):
            run_piece(p, args.out_dir, args.piece_timeout)
        colour = "green" if p.status == "ok" else "red"
        detail = f" -> {p.output}" if p.status == "ok" else f": {p.reason} (see {p.logs['stderr']})"
        console.print(f"  [{i}/{len(todo)}] [{colour}]{p.status:>6}[/{colour}]  {p.name}  {p.seconds:8.1f} s{detail}")
        index()

    if not args.dry_run and not args.no_plots:
        outputs = [args.out_dir / p.output for p in pieces if p.status == "ok"]
        if outputs:
            from bytesplat_ns.bench.plots import PlotInputError, plot_inputs

            try:
                written = plot_inputs(outputs, args.out_dir / "plots", log=console.print)
                report["plots"] = [str(w.relative_to(args.out_dir)) for w in written]
            except PlotInputError as e:
                report["plots_error"] = str(e)
                console.print(f"[red]plots failed: {e}")
        else:
            console.print("no piece produced results; no plots")
    report["complete"] = not args.dry_run
    path = index()
    s = report["summary"]
    console.print(f"wrote {path}: " + ", ".join(f"{v} {k}" for k, v in s.items()))
    return 1 if s.get("failed") else 0


if __name__ == "__main__":
    sys.exit(main())
