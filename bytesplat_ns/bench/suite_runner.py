r"""``bytesplat-bench suite NAME``: run a declared suite (``bytesplat_ns.bench.suites``) and write one
JSON document plus its plots.

Each step runs in its own process (``bench.matrix.run_piece``: a step that crashes or runs out of
memory does not take the others with it); steps of one ``group`` run at the same time. The
document, ``RESULTS_DIR/NAME.json``::

    {suite, purpose, gpus_needed, command, date, gpu, versions: {python, torch, cuda, nerfstudio,
     gsplat, nccl, bytesplat_ns}, steps: [{name, command, status, seconds, result}], plots, complete}

and the figures of its results in ``RESULTS_DIR/plots/NAME/`` (``bench.plots``; for wall-clock steps,
``wallclock_breakdown.png``: the mean time per phase of each method over every run of the document
that had the GPU alone, earlier ``--only`` runs' steps included). Step outputs, logs and run
directories stay under ``--out-dir``. ``--replot`` draws the wall-clock figure of a committed
document again without running anything; ``--merge`` folds the documents that ``--only`` runs wrote
to other results folders into the one in ``--results-dir``. Runs of one suite may share a results
folder at the same time: the document is read, merged and written under a lock
(``NAME.json.lock``), through a temporary file and a rename.

    bytesplat-bench suite --list
    bytesplat-bench suite raster-1080p --dry-run
    bytesplat-bench suite wallclock-fox --data /path/to/fox --results-dir docs/results
    bytesplat-bench suite wallclock-fox-seeds --replot --results-dir docs/results
    bytesplat-bench suite wallclock-fox-30k --merge run1/wallclock-fox-30k.json --results-dir docs/results
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import json
import os
import re
import shlex
import sys
import threading
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence

from bytesplat_ns.bench.commands import OUTPUT_OPTION
from bytesplat_ns.bench.matrix import Piece, run_piece
from bytesplat_ns.bench.suites import SUITES, Step, Suite
from bytesplat_ns.errors import BytesplatError

CLI = [sys.executable, "-m", "bytesplat_ns.bench.cli"]


def step_args(step: Step, work: Path, data: Optional[Path]) -> List[str]:
    """The step's arguments with ``{work}`` and ``{data}`` filled in."""
    out = []
    for a in step.args:
        if "{data}" in a and data is None:
            raise BytesplatError(f"suite step '{step.command}' needs a data path",
                                 hint="give it on the suite's command line: --data PATH")
        out.append(a.replace("{work}", str(work)).replace("{data}", str(data)))
    return out


def step_name(index: int, step: Step) -> str:
    return step.name or f"{index:02d}_{step.command}"


def named_steps(suite: Suite) -> Suite:
    """``suite`` with every step's name filled in (its 1-based index and command where it has none)."""
    return dataclasses.replace(suite, steps=tuple(dataclasses.replace(step, name=step_name(i, step))
                                                  for i, step in enumerate(suite.steps, 1)))


def data_meaning(suite: Suite) -> str:
    """What --data names for ``suite``: what its purpose says after ``--data:``, else the capture its runs use."""
    said = re.search(r"--data: ([^)]*)\)", suite.purpose)
    return said.group(1) if said else "the capture (a dataset folder) its runs use"


def plan(suite: Suite, out_dir: Path, data: Optional[Path]) -> List[Piece]:
    """One matrix piece per step: the process to run, its output file and its environment."""
    if suite.needs_data and data is None:
        raise BytesplatError(f"suite '{suite.name}' needs --data: {data_meaning(suite)}", hint="add --data PATH")
    work = (out_dir / "work").resolve()
    pieces = []
    for i, step in enumerate(suite.steps, 1):
        name = step_name(i, step)
        output, target = f"steps/{name}.json", out_dir / f"steps/{name}.json"
        if step.command == "matrix":  # it writes a folder, indexed by its matrix.json
            output, target = f"steps/{name}/matrix.json", out_dir / f"steps/{name}"
        launch = CLI if step.ranks == 1 else [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(step.ranks),
            "-m", "bytesplat_ns.bench.cli"]
        argv = launch + [step.command, *step_args(step, work, data), OUTPUT_OPTION[step.command],
                         str(target.resolve())]
        env = dict(step.env)
        if step.devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = step.devices
        pieces.append(Piece(name, step.command, {"group": step.group}, argv=argv, output=output, env=env))
    return pieces


def user_command(piece: Piece, ranks: int) -> str:
    """How a person would type the step: ``bytesplat-bench ...`` (under torchrun for several ranks)."""
    args = piece.argv[piece.argv.index("bytesplat_ns.bench.cli") + 1:]
    head = "bytesplat-bench" if ranks == 1 else f"torchrun --standalone --nproc-per-node {ranks} -m bytesplat_ns.bench.cli"
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in piece.env.items())
    return " ".join(x for x in (env, head, shlex.join(args)) if x)


def versions() -> Dict[str, Optional[str]]:
    import torch

    def version(package: str) -> Optional[str]:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return None

    nccl = None
    if torch.cuda.is_available():
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
    return {"python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda,
            "nccl": nccl, "nerfstudio": version("nerfstudio"), "gsplat": version("gsplat"),
            "bytesplat_ns": version("bytesplat_ns") or version("bytesplat-ns")}


def _gpu() -> str:
    import torch

    if not torch.cuda.is_available():
        return "cpu"
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return names[0] if len(names) == 1 else f"{len(names)}x {names[0]}"


def _batches(suite: Suite) -> List[List[int]]:
    """Indices of steps to run together: consecutive steps of one group, else one at a time."""
    batches: List[List[int]] = []
    for i, step in enumerate(suite.steps):
        if batches and step.group is not None and suite.steps[batches[-1][0]].group == step.group:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def wallclock_runs(steps: List[Dict]) -> Dict[str, List[Dict]]:
    """A suite with wallclock steps also lists their runs at the top level (``{"runs": [{"method",
    "seed", "iterations", "wall_s", "steps_s", "psnr", "ssim", ...}]}``), one row per method and seed."""
    results = [step.get("result") or {} for step in steps]
    runs = [run for r in results if r.get("benchmark") == "bytesplat-bench wallclock" for run in r.get("runs", [])]
    return {"runs": runs} if runs else {}


WALLCLOCK_FIGURE = "wallclock_breakdown.png"


def wallclock_figure(doc: Dict, plot_dir: Path) -> Optional[Path]:
    """Stacked bars of the mean seconds per phase for each method (and iteration count), over the
    document's wall-clock runs that had the GPU alone; None when it has none. A run that shared the
    GPU (``--parallel``, or another job's process seen beside it) measured the sharing, not the
    method, and one that skipped its image writes skipped part of the method: both are left out, as
    on the results page."""
    from bytesplat_ns.bench.gpu_sharing import measures_the_method
    from bytesplat_ns.bench.wallclock import plot_breakdown, summarize

    runs = [run for run in doc.get("runs", []) if "error" not in run and run.get("wall_s") is not None]
    alone = [run for run in runs if measures_the_method(run)]
    if not alone:
        return None
    iterations = "/".join(str(i) for i in sorted({run["iterations"] for run in alone}))
    gpu = steps_gpu(doc.get("steps", []), doc.get("gpu")) or "unknown GPU"
    title = (f"launch to exit, {iterations} iterations\n{gpu}, "
             f"{len(alone)} of {len(runs)} runs (those alone on the GPU, nothing skipped)")
    path = plot_dir / WALLCLOCK_FIGURE
    plot_breakdown(summarize(alone), path, title)
    return path


def replot(name: str, results_dir: Path, log=print) -> Dict:
    """Draw the wall-clock figure of the committed ``results_dir/NAME.json`` again and list it in the
    document's plots (its other figures are kept as they are)."""
    path = results_dir / f"{name}.json"
    with document_lock(path):
        doc = earlier_document(path, name)
        if doc is None:
            raise BytesplatError(f"no document of suite '{name}' at {path}",
                                 hint=f"run the suite first: bytesplat-bench suite {name} --results-dir {results_dir}")
        drawn = wallclock_figure(doc, results_dir / "plots" / name)
        if drawn is None:
            raise BytesplatError(f"{path} holds no wall-clock run that had the GPU alone; nothing to draw")
        doc["plots"] = list(dict.fromkeys([*doc.get("plots", []), str(drawn.relative_to(results_dir))]))
        write_document(path, doc)
    log(f"wrote {drawn} and {path}")
    return doc


def merge_earlier(steps: List[Dict], earlier: Optional[Dict], order: Sequence[str]) -> List[Dict]:
    """``steps`` just run, plus the steps of the suite's ``earlier`` document that were not run again
    (each keeps its own date), in the suite's step ``order``: ``--only`` completes a suite over several
    calls, such as one whose training step and timing steps must not share the GPU."""
    by_name = {}
    for step in (earlier or {}).get("steps", []):
        step.setdefault("date", earlier.get("date"))
        step.setdefault("gpu", earlier.get("gpu"))
        by_name[step["name"]] = step
    by_name.update({step["name"]: step for step in steps})
    return [by_name[name] for name in order if name in by_name]


def earlier_document(path: Path, suite: str) -> Optional[Dict]:
    """The suite's document at ``path`` from an earlier run, if there is one of this suite."""
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text())
    except ValueError:
        return None
    return doc if isinstance(doc, dict) and doc.get("suite") == suite else None


def run_suite(suite: Suite, out_dir: Path, results_dir: Path, data: Optional[Path] = None,
              command: str = "", step_timeout: Optional[float] = None, plots: bool = True, log=print,
              whole: Optional[Suite] = None) -> Dict:
    """Run every step of ``suite``, then write ``results_dir/<name>.json`` and its plots (``whole``:
    the declared suite when ``suite`` holds some of its steps only, ``--only``; the steps of ``whole``
    that an earlier document in ``results_dir`` holds and this run does not are kept, and the result
    is complete only when every step of ``whole`` is there and ok)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    pieces = plan(suite, out_dir, data)
    date = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    doc = {"suite": suite.name, "purpose": suite.purpose, "gpus_needed": suite.gpus,
           "command": command or f"bytesplat-bench suite {suite.name}",
           "date": date, "gpu": _gpu(), "versions": versions(), "steps": [], "complete": False}
    for batch in _batches(suite):
        threads = []
        for i in batch:
            timeout = suite.steps[i].timeout_s or step_timeout
            log(f"[{suite.name}] step {i + 1}/{len(pieces)} {pieces[i].name}: {user_command(pieces[i], suite.steps[i].ranks)}")
            threads.append(threading.Thread(target=run_piece, args=(pieces[i], out_dir, timeout)))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for i in batch:
            p = pieces[i]
            log(f"[{suite.name}] {p.name}: {p.status} in {p.seconds:.1f} s" + (f" ({p.reason})" if p.reason else ""))
    for i, p in enumerate(pieces):
        entry = {"name": p.name, "command": user_command(p, suite.steps[i].ranks), "status": p.status,
                 "seconds": p.seconds, "date": date, "gpu": doc["gpu"], "result": None}
        output = out_dir / p.output if p.output else None
        if p.status == "ok" and output is not None and output.is_file():
            entry["result"] = json.loads(output.read_text())
        if p.status != "ok":
            entry["reason"], entry["stderr_tail"] = p.reason, p.stderr_tail
        doc["steps"].append(entry)
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / f"{suite.name}.json"
    every = plan(named_steps(whole or suite), out_dir, data)
    order = [p.name for p in every]
    # --only runs of one suite may share results_dir at the same time: each reads, merges and writes
    # the document while holding its lock, so that none drops another's step
    with document_lock(path):
        previous = earlier_document(path, suite.name)
        earlier = previous if whole is not None else None
        if whole is not None:
            doc["steps"] = merge_earlier(doc["steps"], earlier, order)
        if previous is not None and previous.get("notes"):
            # the hand-written notes on how the suite measures (its baselines' provenance): a rerun keeps them
            doc.setdefault("notes", previous["notes"])
        ok = {step["name"] for step in doc["steps"] if step["status"] == "ok"}
        # a matrix step's figures come from its pieces' files, in its folder; an earlier run's steps
        # are drawn too while their files are still in out_dir
        outputs = [(out_dir / p.output).parent if p.kind == "matrix" else out_dir / p.output
                   for p in every if p.name in ok and p.output and (out_dir / p.output).exists()]
        drawn: List[Path] = []
        if plots and outputs:
            from bytesplat_ns.bench.plots import PlotInputError, plot_inputs

            try:
                drawn = plot_inputs(outputs, results_dir / "plots" / suite.name, log=log)
            except PlotInputError as e:
                doc["plots_error"] = str(e)
        finish_document(doc, order, results_dir, drawn, earlier, plots)
        write_document(path, doc)
    log(f"wrote {path}")
    return doc


def step_gpu(step: Dict, default: Optional[str] = None) -> Optional[str]:
    """The GPU a step ran on: its result's own record where it keeps one, else the suite run's (``default``
    for a step from before steps named it: its document's)."""
    result = step.get("result")
    device = (result.get("device") or result.get("gpu")) if isinstance(result, dict) else None
    return device or step.get("gpu") or default


def steps_gpu(steps: Sequence[Dict], default: Optional[str]) -> Optional[str]:
    """The GPU a document's page and figure name: the one its steps ran on, or, for a suite run in parts on
    different cards, each of them (the steps then name their own). ``default``: the document's own ``gpu``,
    the card of one of its runs, for the steps from before steps kept theirs."""
    gpus = list(dict.fromkeys(gpu for gpu in (step_gpu(step, default) for step in steps) if gpu))
    if len(gpus) <= 1:
        return gpus[0] if gpus else default
    return " and ".join(gpus) + " (each step names its own)"


def finish_document(doc: Dict, order: Sequence[str], results_dir: Path, drawn: List[Path],
                    earlier: Optional[Dict], plots: bool) -> None:
    """The fields that follow from ``doc``'s steps: the wall-clock runs and their figure, the figures
    listed (``drawn``, then an ``earlier`` document's that are still there and were not redrawn) and
    whether every step of the suite (``order``) is there and ok."""
    doc.pop("runs", None)
    doc.update(wallclock_runs(doc["steps"]))
    if plots:
        figure = wallclock_figure(doc, results_dir / "plots" / doc["suite"])
        drawn = drawn + ([figure] if figure is not None else [])
    kept = [plot for plot in (earlier or {}).get("plots", []) if (results_dir / plot).is_file()]
    doc["plots"] = list(dict.fromkeys([*(str(w.relative_to(results_dir)) for w in drawn), *kept]))
    doc["complete"] = [s["name"] for s in doc["steps"]] == list(order) and all(s["status"] == "ok" for s in doc["steps"])


@contextlib.contextmanager
def document_lock(path: Path) -> Iterator[None]:
    """Hold ``PATH.lock`` (an advisory lock, released when the process ends however it ends)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def write_document(path: Path, doc: Dict) -> None:
    """Write ``doc`` as JSON through a temporary file and a rename: a reader never sees half of it."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.write_text(json.dumps(doc, indent=1))
    os.replace(partial, path)


def merge_documents(name: str, sources: Sequence[Path], results_dir: Path, plots: bool = True, log=print) -> Dict:
    """Fold the steps of other documents of suite ``name`` (``--only`` runs written to other results
    folders, such as several at once on one machine) into ``results_dir/NAME.json``: a step of a
    source replaces the step of the same name, every step keeps its own date, and the wall-clock
    runs, their figure and ``complete`` are worked out again. The header (GPU, versions) is the
    target document's while some of its steps stay, else the first source's: a document whose every
    step was run again names the machine that ran them."""
    order = [step.name for step in named_steps(SUITES[name]).steps]
    path = results_dir / f"{name}.json"
    with document_lock(path):
        earlier = earlier_document(path, name)
        incoming: List[Dict] = []
        first: Optional[Dict] = None  # the first source document
        for source in sources:
            other = earlier_document(source, name)
            if other is None:
                raise BytesplatError(f"{source} is not a document of suite '{name}'",
                                     hint="give the NAME.json files that bytesplat-bench suite NAME wrote")
            unknown = [step["name"] for step in other["steps"] if step["name"] not in order]
            if unknown:
                raise BytesplatError(f"{source} holds steps that suite '{name}' does not declare: {', '.join(unknown)}")
            incoming += [{**step, "date": step.get("date") or other.get("date"), "gpu": step.get("gpu") or other.get("gpu")}
                         for step in other["steps"]]
            first = first or other
        replaced = {step["name"] for step in incoming}
        header = earlier
        every_step_again = earlier is None or all(step["name"] in replaced for step in earlier.get("steps", []))
        if first is not None and every_step_again:
            header = first
        if header is None:
            raise BytesplatError("nothing to merge", hint="give at least one document after --merge")
        doc = {**header, "purpose": SUITES[name].purpose,
               "steps": merge_earlier(incoming, earlier, order)}
        if earlier is not None and "notes" in earlier:  # written by hand: kept whichever header is taken
            doc["notes"] = earlier["notes"]
        doc["date"] = max((step["date"] for step in doc["steps"] if step.get("date")), default=header.get("date"))
        finish_document(doc, order, results_dir, [], earlier, plots)
        write_document(path, doc)
    log(f"wrote {path} ({len(incoming)} step(s) merged from {len(sources)} document(s))")
    return doc


def describe(suites: Sequence[Suite]) -> str:
    width = max(len(s.name) for s in suites)
    return "\n".join(f"{s.name:<{width}}  {s.gpus} GPU{'s' if s.gpus != 1 else ''}  {s.purpose}"
                     + ("  [needs --data]" if s.needs_data else "") for s in suites)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bytesplat-bench suite", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", nargs="?", help="the suite to run (--list names them)")
    p.add_argument("--list", action="store_true", help="list the suites with their purpose and GPUs")
    p.add_argument("--dry-run", action="store_true", help="print the steps' commands, run nothing")
    p.add_argument("--data", type=Path, default=None, help="the path a suite needs: its dataset (raster-baselines: the folder another gsplat version is "
                   "installed in)")
    p.add_argument("--out-dir", type=Path, default=None,
                   help="step outputs, logs and run directories (default outputs/suites/NAME)")
    p.add_argument("--results-dir", type=Path, default=None,
                   help="where NAME.json and plots/NAME/ go (default: --out-dir); docs/results for the results page")
    p.add_argument("--step-timeout", type=float, default=None, help="seconds before a step is stopped and marked failed")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--replot", action="store_true",
                   help="run nothing: draw the wall-clock figure of RESULTS_DIR/NAME.json again (with --results-dir)")
    p.add_argument("--merge", nargs="+", type=Path, default=None, metavar="DOC",
                   help="run nothing: fold these documents of the suite (--only runs written to other results folders) "
                   "into RESULTS_DIR/NAME.json, their steps replacing those of the same name (with --results-dir)")
    p.add_argument("--only", nargs="+", default=None, metavar="STEP",
                   help="run only these steps (names as --dry-run's output files); the other steps' results "
                   "from an earlier NAME.json in --results-dir are kept, and the result is complete once all are ok")
    return p


def select_steps(suite: Suite, names: Optional[Sequence[str]]) -> Suite:
    """``suite`` with only the steps named (each keeping its full name); all of them for ``None``."""
    if names is None:
        return suite
    named = named_steps(suite).steps
    unknown = sorted(set(names) - {step.name for step in named})
    if unknown:
        raise BytesplatError(f"suite '{suite.name}' has no step {', '.join(unknown)}",
                             hint=f"its steps: {', '.join(step.name for step in named)}")
    return dataclasses.replace(suite, steps=tuple(step for step in named if step.name in names))


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    a = parser().parse_args(argv)
    if a.list:
        print(describe(list(SUITES.values())))
        return 0
    if a.name is None:
        raise BytesplatError("bytesplat-bench suite needs a suite name", hint="bytesplat-bench suite --list names them")
    if a.name not in SUITES:
        raise BytesplatError(f"unknown suite '{a.name}'", hint=f"choose one of {', '.join(SUITES)}")
    whole = SUITES[a.name]
    if a.merge is not None:
        if a.results_dir is None:
            raise BytesplatError("--merge needs --results-dir: the folder of the document the steps go into")
        merge_documents(whole.name, a.merge, a.results_dir, plots=not a.no_plots)
        return 0
    if a.replot:
        replot(whole.name, a.results_dir or a.out_dir or Path("outputs/suites") / whole.name)
        return 0
    suite = select_steps(whole, a.only)
    out_dir = a.out_dir or Path("outputs/suites") / suite.name
    data = a.data.resolve() if a.data is not None else None
    if data is not None and not data.exists():
        raise BytesplatError(f"--data {a.data} does not exist")
    if a.dry_run:
        for p, step in zip(plan(suite, out_dir, data), suite.steps):
            together = f"  (with the other '{step.group}' steps)" if step.group else ""
            print(user_command(p, step.ranks) + together)
        return 0
    doc = run_suite(suite, out_dir, a.results_dir or out_dir, data, "bytesplat-bench suite " + shlex.join(argv),
                    a.step_timeout, plots=not a.no_plots, whole=whole if a.only is not None else None)
    return 0 if all(step["status"] == "ok" for step in doc["steps"]) else 1
