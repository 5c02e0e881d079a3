r"""``bytesplat-bench queue``: benchmark jobs that outlive the call that started them.

The lent GPU machines take one command at a time, at most 10 minutes each, and are kept between
calls for only a few seconds; a 30000-iteration splatfacto run takes longer than one call. The queue
runs the machine's setup and then a list of jobs in a detached process, so that each call only
starts the queue or collects from it:

    python3 -m bytesplat_ns.bench.queue start -- \
        'bytesplat-bench suite wallclock-fox-30k --data .data/fox --only splatfacto_seed1_quality \
             --results-dir $RESULTS --out-dir $SUITES/wallclock-fox-30k' \
        '+python3 -m pytest -m gpu tests -q -p no:cacheprovider' \
        'bytesplat-bench suite wallclock-fox-30k --data .data/fox --only splatfacto_seed2_quality \
             --results-dir $RESULTS --out-dir $SUITES/wallclock-fox-30k' \
        '@1400 bytesplat-bench suite wallclock-fox-seeds --data .data/fox --only bytesplat_seed1 \
             --results-dir $RESULTS --out-dir $SUITES/wallclock-fox-seeds'
    python3 -m bytesplat_ns.bench.queue collect --wait 570     # this call and every later one

(``python3 -m``: before the setup has run, ``bytesplat-bench`` is not installed on that machine.)

``start`` copies the checkout to ``DIR/repo`` (later calls replace the working tree they run in;
the queue keeps its own) and ``docs/results/*.json`` to ``DIR/results`` (a suite run with
``--only`` keeps the steps of earlier runs, and runs of one suite at once in one group share the
document safely: it is locked while each merges its step), then leaves; a finished queue in ``DIR`` moves aside
to ``DIR-TIME`` first. The detached runner sources the setup
(default ``source scripts/gpu_setup.sh``, with ``OUT=DIR/out``, where it leaves the extensions it
built), then runs the jobs in order in ``DIR/repo`` with the setup's environment plus ``Q`` (the
queue's folder), ``RESULTS`` and ``SUITES``. A job written ``+JOB`` runs alongside the one before
it; ``@SECONDS JOB`` starts only if the queue has run for less than that (otherwise it is recorded
as skipped). A failed job does not stop the next; a failed setup skips them all. A job whose
``--data PATH`` is not in the checkout (on the device machine: not carried) stops ``start`` at once,
before the setup's minutes are spent.

``collect`` waits until every job has finished or ``--wait`` seconds have passed, prints each job's
state and the end of the logs of the running and failed ones, and writes to ``--out`` (default
``$OUT``) what the device returns: ``queue-results.tar.xz`` (the JSON and PNG files of ``RESULTS``
and ``SUITES``, run folders left out), ``queue-logs.tar.xz`` (the queue's and the jobs' logs, and
each run's ``train.log``, ``eval.log``, ``timings.json`` and ``config.yml``), ``queue-views.tar.xz``
(each run's ``worst_view*.png``, when there are any) and, for each extension the setup built,
``NAME.so.xz``, which ``scripts/gpu_setup.sh`` loads when carried in ``.ext/``, and the setup's own
``bytesplat_jit.tar.xz`` (our kernels' modules, when it built them), carried in ``.ext/`` the same way.
On a machine where no queue was started (a fresh one: the last was given back) it says so at once
and exits with status 3 instead of waiting.
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Dict, List, Optional

DEFAULT_DIR = Path("/tmp/bytesplat-queue")
DEFAULT_SETUP = "source scripts/gpu_setup.sh"
STATUS = "status.json"
# the device returns files of at most 16 MiB each
MAX_RETURNED_BYTES = 16 * 1024 * 1024
RESULT_SUFFIXES = (".json", ".png")
RUN_LOG_NAMES = ("train.log", "eval.log", "timings.json", "config.yml")
RUN_VIEW_PATTERN = "worst_view*.png"  # each run's worst eval image (bench.wallclock)
NO_QUEUE_STATUS = 3


def parse_job(text: str, group: int) -> Dict:
    """One job as ``start`` takes it: ``[+][@SECONDS ]COMMAND``; returns its record with the group."""
    alongside = text.startswith("+")
    if alongside:
        text = text[1:]
    not_after = None
    if text.startswith("@"):
        limit, _, text = text[1:].partition(" ")
        not_after = float(limit)
    command = text.strip()
    if not command:
        raise ValueError("an empty job")
    return {"command": command, "group": group if alongside else group + 1, "not_after_s": not_after,
            "state": "pending", "rc": None, "started_s": None, "seconds": None}


def parse_jobs(texts: List[str]) -> List[Dict]:
    jobs: List[Dict] = []
    group = -1
    for text in texts:
        if text.startswith("+") and not jobs:
            raise ValueError(f"'{text}': a '+' job runs alongside the one before it, and there is none")
        job = parse_job(text, group)
        group = job["group"]
        jobs.append(job)
    return jobs


def _write_status(queue: Path, status: Dict) -> None:
    tmp = queue / (STATUS + ".tmp")
    tmp.write_text(json.dumps(status, indent=1))
    os.replace(tmp, queue / STATUS)


def read_status(queue: Path) -> Optional[Dict]:
    path = queue / STATUS
    return json.loads(path.read_text()) if path.exists() else None


def missing_data(jobs: List[Dict], repo: Path) -> Optional[str]:
    """What is wrong when a job's ``--data PATH`` is not there (None when every one is): checked
    before the setup, which takes minutes of device time, rather than when the job starts. A path
    with a variable in it is left to the job."""
    for i, job in enumerate(jobs):
        try:
            words = shlex.split(job["command"])
        except ValueError:
            continue
        for option, value in zip(words, words[1:]):
            if option != "--data" or "$" in value or "{" in value:
                continue
            path = Path(value) if Path(value).is_absolute() else repo / value
            if not path.exists():
                return (f"job{i} trains on --data {value}, which is not in {repo} (on the device machine: carry it, "
                        f"e.g. carry [\".whl\", \".data\"])")
    return None


def start(queue: Path, repo: Path, setup: str, jobs: List[Dict]) -> None:
    """Copy the checkout and the committed results, write the status, detach the runner."""
    if queue.exists():
        status = read_status(queue)
        if status is not None and not status.get("done"):
            raise SystemExit(f"queue: {queue} already runs a queue; collect from it, or remove the folder")
        # a finished queue's results stay on the machine, beside the new one
        kept = queue.with_name(f"{queue.name}-{int((status or {}).get('started_at', time.time()))}")
        os.replace(queue, kept)
        print(f"queue: the finished queue moved to {kept}")
    (queue / "logs").mkdir(parents=True)
    shutil.copytree(repo, queue / "repo", symlinks=True)
    (queue / "results").mkdir()
    (queue / "suites").mkdir()
    (queue / "out").mkdir()
    for doc in sorted((repo / "docs" / "results").glob("*.json")):
        shutil.copy2(doc, queue / "results" / doc.name)
    _write_status(queue, {"started_at": time.time(), "setup": {"command": setup, "state": "pending"},
                          "jobs": jobs, "done": False})
    # the runner imports this module from the copy: later calls replace the checkout it came from
    copy = queue / "repo"
    package_root = str(copy if (copy / "bytesplat_ns").is_dir() else Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p))
    with open(queue / "logs" / "queue.log", "ab") as log:
        subprocess.Popen([sys.executable, "-m", "bytesplat_ns.bench.queue", "_run", str(queue)],
                         cwd=queue / "repo", env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                         start_new_session=True)
    print(f"queue: started in {queue}: setup '{setup}', {len(jobs)} job(s)")


def _setup_environment(queue: Path, setup: str) -> Optional[Dict[str, str]]:
    """Source the setup in bash and return the environment it leaves (None if it failed)."""
    env_file = queue / "setup-env.json"
    dump = f"{sys.executable} -c 'import json, os, sys; json.dump(dict(os.environ), open(sys.argv[1], \"w\"))' {env_file}"
    env = dict(os.environ, OUT=str(queue / "out"), Q=str(queue))
    with open(queue / "logs" / "setup.log", "ab") as log:
        rc = subprocess.call(["bash", "-c", f"{setup} && {dump}"], cwd=queue / "repo", env=env,
                             stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    if rc != 0 or not env_file.exists():
        return None
    return json.loads(env_file.read_text())


def run(queue: Path) -> None:
    """The detached runner: setup, then the jobs group by group."""
    status = read_status(queue)
    t0 = status["started_at"]
    setup = status["setup"]
    setup["state"] = "running"
    _write_status(queue, status)
    env = _setup_environment(queue, setup["command"])
    setup["seconds"] = round(time.time() - t0, 1)
    setup["state"] = "ok" if env is not None else "failed"
    if env is None:
        for job in status["jobs"]:
            job["state"] = "skipped"
        status["done"] = True
        _write_status(queue, status)
        return
    env.update(Q=str(queue), RESULTS=str(queue / "results"), SUITES=str(queue / "suites"))
    _write_status(queue, status)
    for group in sorted({job["group"] for job in status["jobs"]}):
        members = [(i, job) for i, job in enumerate(status["jobs"]) if job["group"] == group]
        running = []
        for i, job in members:
            elapsed = time.time() - t0
            if job["not_after_s"] is not None and elapsed >= job["not_after_s"]:
                job["state"] = "skipped"
                continue
            log = open(queue / "logs" / f"job{i}.log", "ab")
            job.update(state="running", started_s=round(elapsed, 1))
            running.append((job, log, time.time(), subprocess.Popen(
                ["bash", "-c", job["command"]], cwd=queue / "repo", env=env, stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT)))
        _write_status(queue, status)
        for job, log, began, proc in running:
            job["rc"] = proc.wait()
            log.close()
            job.update(state="ok" if job["rc"] == 0 else "failed", seconds=round(time.time() - began, 1))
            _write_status(queue, status)
    status["done"] = True
    _write_status(queue, status)


def _tail(path: Path, lines: int = 8) -> str:
    if not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def describe(queue: Path, status: Dict) -> str:
    now = time.time() - status["started_at"]
    setup = status["setup"]
    out = [f"queue {queue}: {'done' if status['done'] else 'running'} after {now:.0f} s; "
           f"setup {setup['state']}" + (f" in {setup['seconds']:.0f} s" if setup.get("seconds") is not None else "")]
    for i, job in enumerate(status["jobs"]):
        took = f" in {job['seconds']:.0f} s" if job["seconds"] is not None else ""
        began = f", began at +{job['started_s']:.0f} s" if job["started_s"] is not None else ""
        out.append(f"  job{i} [{job['state']}{took}{began}] {job['command']}")
    if setup["state"] in ("running", "failed"):
        out.append(f"--- setup.log\n{_tail(queue / 'logs' / 'setup.log')}")
    for i, job in enumerate(status["jobs"]):
        if job["state"] in ("running", "failed"):
            out.append(f"--- job{i}.log\n{_tail(queue / 'logs' / f'job{i}.log')}")
    return "\n".join(out)


def _is_run_folder_file(path: Path, root: Path) -> bool:
    return "work" in path.relative_to(root).parts


def _pack(target: Path, files: List[Path], base: Path) -> Optional[Path]:
    with tarfile.open(target, "w:xz") as tar:
        for path in files:
            tar.add(path, arcname=str(path.relative_to(base)))
    if target.stat().st_size > MAX_RETURNED_BYTES:
        print(f"queue: {target.name} is {target.stat().st_size / 2**20:.1f} MiB, over what the device returns; "
              f"left out")
        target.unlink()
        return None
    return target


def collect(queue: Path, out: Path) -> List[Path]:
    """Pack what the device returns into ``out``; returns the files written."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    results = [p for root in (queue / "results", queue / "suites") for p in sorted(root.rglob("*"))
               if p.is_file() and p.suffix in RESULT_SUFFIXES and not _is_run_folder_file(p, root)]
    logs = sorted(p for p in (queue / "logs").iterdir() if p.is_file())
    logs += sorted(p for p in (queue / "suites").rglob("*") if p.is_file() and (
        p.name in RUN_LOG_NAMES or p.name.startswith("eval-") and p.suffix == ".log"))  # eval-R.log: other backends
    # apart from the results: a few MB of images must not push those over what the device returns
    views = sorted(p for p in (queue / "suites").rglob(RUN_VIEW_PATTERN) if p.is_file())
    packs = [("queue-results.tar.xz", results), ("queue-logs.tar.xz", logs)]
    packs += [("queue-views.tar.xz", views)] if views else []
    for name, files in packs:
        packed = _pack(out / name, files, queue)
        if packed is not None:
            written.append(packed)
    for built in sorted((queue / "out").glob("*.so")):
        # compressed once, next to the build: every later collect copies it (xz takes seconds)
        packed = built.with_name(built.name + ".xz")
        if not packed.exists():
            with open(built, "rb") as src, lzma.open(packed.with_suffix(".tmp"), "wb", preset=6) as dst:
                shutil.copyfileobj(src, dst)
            os.replace(packed.with_suffix(".tmp"), packed)
        written += _copy_returnable(packed, out)
    for packed in sorted((queue / "out").glob("*.tar.xz")):  # built modules the setup packed itself
        written += _copy_returnable(packed, out)
    return written


def _copy_returnable(packed: Path, out: Path) -> List[Path]:
    """``packed`` copied into ``out`` (as a one-item list), or nothing when the device would not return it."""
    if packed.stat().st_size > MAX_RETURNED_BYTES:
        print(f"queue: {packed.name} is over what the device returns; left out")
        return []
    return [Path(shutil.copy2(packed, out / packed.name))]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bytesplat-bench queue", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="verb", required=True)
    s = sub.add_parser("start", help="copy the checkout, detach the setup and the jobs")
    s.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="the queue's folder")
    s.add_argument("--repo", type=Path, default=Path("."), help="the checkout to copy")
    s.add_argument("--setup", default=DEFAULT_SETUP, help="bash sourced before the jobs, once")
    s.add_argument("jobs", nargs="+", metavar="JOB", help="'[+][@SECONDS ]COMMAND' (module docstring)")
    c = sub.add_parser("collect", help="wait, report and pack the results into --out")
    c.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="the queue's folder")
    c.add_argument("--wait", type=float, default=0.0, help="seconds to wait for the last job at most")
    c.add_argument("--out", type=Path, default=None, help="where the packed files go (default $OUT)")
    r = sub.add_parser("_run", help=argparse.SUPPRESS)
    r.add_argument("dir", type=Path)
    return p


def main(argv: Optional[List[str]] = None) -> int:
    args = parser().parse_args(argv)
    if args.verb == "_run":
        run(args.dir)
        return 0
    if args.verb == "start":
        try:
            jobs = parse_jobs(args.jobs)
        except ValueError as e:
            print(f"queue: error: {e}", file=sys.stderr)
            return 2
        if not (args.repo / "docs" / "results").is_dir():
            print(f"queue: error: {args.repo} is not a bytesplat-ns checkout (no docs/results)", file=sys.stderr)
            return 2
        missing = missing_data(jobs, args.repo)
        if missing:
            print(f"queue: error: {missing}", file=sys.stderr)
            return 2
        start(args.dir, args.repo.resolve(), args.setup, jobs)
        return 0
    status = read_status(args.dir)
    if status is None:
        print(f"queue: error: no queue in {args.dir}: none was started on this machine (a fresh machine: the one "
              f"that ran `start` was given back)", file=sys.stderr)
        return NO_QUEUE_STATUS
    deadline = time.time() + args.wait
    while not status["done"] and time.time() < deadline:
        time.sleep(min(5.0, max(0.0, deadline - time.time())))
        status = read_status(args.dir)
    print(describe(args.dir, status))
    out = args.out or (Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    if out is None:
        print("queue: error: no --out and no $OUT to pack into", file=sys.stderr)
        return 2
    for path in collect(args.dir, out):
        print(f"queue: wrote {path} ({path.stat().st_size / 2**20:.2f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
