"""How many processes computed on the GPU while a timed run trained.

``wallclock --parallel P`` records ``concurrent_runs = P``, but a run can also share the GPU with
work started elsewhere (another job of ``bytesplat-bench queue`` alongside it, a user's process).
:class:`GpuProcessWatch` polls ``nvidia-smi`` for the GPU's compute processes while the run trains
and keeps the most it saw at once (the run's own process included): a run that had the GPU alone
reads 1, and the results page treats a higher count like ``concurrent_runs`` (quality only). Where
``nvidia-smi`` lists no processes (some containers hide them) it reads 0: unknown, not alone.
The same polls read the host's 1-minute load average (``host_load_max``, the highest seen): a step
bound by its host side slows down when other work, such as a compiler, runs on the CPUs beside it.
:func:`measures_the_method` is the one test of whether a run's wall clock counts: alone on the GPU,
and none of the method's work skipped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from typing import Callable, Dict, Optional, Set


def runs_sharing_gpu(run: Dict) -> int:
    """How many runs shared the GPU with this one, itself included: ``wallclock --parallel``, or the
    most compute processes seen on the GPU while it trained, when that was more. A run whose count
    is 1 had the GPU alone; only those runs' wall clocks measure the method."""
    return max(run.get("concurrent_runs") or 1, run.get("gpu_processes_max") or 1)


def measures_the_method(run: Dict) -> bool:
    """Whether a run's wall clock measures its method as a user runs it: it had the GPU alone and
    skipped none of the method's work (``wallclock --skip-image-writes`` runs are quality only)."""
    return runs_sharing_gpu(run) == 1 and not run.get("image_writes_skipped")


QUERY = ("nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader")


def query_compute_pids() -> Optional[Set[str]]:
    """The pids of the processes computing on the machine's GPUs; None without ``nvidia-smi``."""
    if shutil.which(QUERY[0]) is None:
        return None
    try:
        out = subprocess.run(QUERY, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return {line.strip() for line in out.stdout.splitlines() if line.strip()}


def host_load() -> Optional[float]:
    """The host's 1-minute load average (runnable processes), None where the system has none."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


class GpuProcessWatch:
    """``with GpuProcessWatch() as watch: ...``; then ``watch.most``: the largest number of compute
    processes seen at once, None where nothing could be queried. One query every ``interval`` seconds
    (a query costs tens of milliseconds of one CPU core), the first after ``first`` seconds, once the
    run has had time to start computing, and one when the run ends."""

    def __init__(self, interval: float = 10.0, first: float = 3.0,
                 query: Callable[[], Optional[Set[str]]] = query_compute_pids,
                 load: Callable[[], Optional[float]] = host_load):
        self.interval, self.first, self.query, self.load = interval, first, query, load
        self.most: Optional[int] = None
        self.host_load_max: Optional[float] = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _sample(self) -> None:
        pids = self.query()
        if pids is not None:
            self.most = max(self.most or 0, len(pids))
        load = self.load()
        if load is not None:
            self.host_load_max = max(self.host_load_max or 0.0, load)

    def _poll(self) -> None:
        wait = self.first
        while not self._stop.wait(wait):
            self._sample()
            wait = self.interval

    def __enter__(self) -> "GpuProcessWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        if exc[0] is None:
            self._sample()
