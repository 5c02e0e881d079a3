"""A small local launcher with torchrun's environment contract, for tests and CPU runs.

``launch_local(cmd, nprocs)`` starts ``nprocs`` copies of ``cmd`` with RANK, LOCAL_RANK,
WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT (a free port) set, captures each rank's
output in files, and enforces a wall-clock bound: ranks still running after ``timeout_s`` are
killed and reported as timed out. Unlike torchrun it does NOT kill the other ranks when one fails
(unless ``kill_on_failure_s`` is given), so tests can check that every rank stops on its own.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RankResult:
    rank: int
    returncode: Optional[int]  # None: killed at the wall-clock bound
    stdout: str
    stderr: str
    seconds: float

    @property
    def timed_out(self) -> bool:
        return self.returncode is None


def launch_local(
    cmd: Sequence[str],
    nprocs: int,
    timeout_s: float,
    env: Optional[Dict[str, str]] = None,
    cwd: Optional[Path] = None,
    kill_on_failure_s: Optional[float] = None,
) -> List[RankResult]:
    """Run ``cmd`` as ``nprocs`` ranks on this host; return every rank's result."""
    port = free_port()
    logdir = Path(tempfile.mkdtemp(prefix="bytesplat-launch-"))
    procs, files = [], []
    start = time.monotonic()
    for rank in range(nprocs):
        rank_env = dict(os.environ if env is None else env)
        rank_env.update(
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(nprocs),
            LOCAL_WORLD_SIZE=str(nprocs),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
        out = open(logdir / f"rank{rank}.out", "w+")
        err = open(logdir / f"rank{rank}.err", "w+")
        files.append((out, err))
        procs.append(subprocess.Popen(list(cmd), env=rank_env, cwd=cwd, stdout=out, stderr=err, start_new_session=True))
    ended: Dict[int, float] = {}
    first_failure: Optional[float] = None
    while len(ended) < nprocs:
        now = time.monotonic()
        for rank, proc in enumerate(procs):
            if rank not in ended and proc.poll() is not None:
                ended[rank] = now - start
                if proc.returncode != 0 and first_failure is None:
                    first_failure = now
        overdue = now - start > timeout_s
        if kill_on_failure_s is not None and first_failure is not None and now - first_failure > kill_on_failure_s:
            overdue = True
        if overdue:
            break
        time.sleep(0.05)
    results = []
    for rank, proc in enumerate(procs):
        killed = False
        if proc.poll() is None:
            killed = True
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        out, err = files[rank]
        out.seek(0)
        err.seek(0)
        results.append(
            RankResult(rank, None if killed else proc.returncode, out.read(), err.read(), ended.get(rank, time.monotonic() - start))
        )
        out.close()
        err.close()
    return results
