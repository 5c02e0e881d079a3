"""Process-group setup from torchrun-style environment variables, and a per-step watchdog.

Failure model (docs/design.md, "Data and bad input": a rank that dies ends every rank with a clear message, in
bounded time):

- a peer that DIES closes its sockets: gloo/NCCL operations with it fail at once and
  ``exchange`` turns that into a ``DistributedError`` naming the peer and the phase;
- a peer that STALLS is detected by the process group's timeout (``timeout_s``; gloo raises,
  NCCL's watchdog aborts): again a ``DistributedError`` on every waiting rank;
- the stalled rank itself (stuck in a kernel, a deadlock, a sleep) cannot raise: the
  :class:`StepWatchdog` thread notices that the step passed its deadline, prints one clear line and
  ends the process (``os._exit``), the only thing that works when the main thread is stuck in C.
"""

from __future__ import annotations

import datetime
import os
import sys
import threading
import time
from typing import Optional

import torch
import torch.distributed as dist

from bytesplat_ns.distributed.exchange import DistributedError, rank_and_world

DEFAULT_TIMEOUT_S = 600.0
WATCHDOG_EXIT_CODE = 75


def launched_distributed() -> bool:
    """True when started by torchrun (or our launcher) with more than one process."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def cpu_threads_per_rank(ranks_on_host: int, cpu_count: Optional[int] = None) -> Optional[int]:
    """Intra-op CPU threads for one of ``ranks_on_host`` processes, or None to leave torch's default.

    torchrun sets ``OMP_NUM_THREADS=1`` for its workers; nerfstudio's own launcher
    (``ns-train --machine.num-devices N``) sets nothing, so each of its N workers starts one thread
    per core and they fight over the cores in every CPU op. On two H200s the pixel step, which has
    CPU work between its kernels, took 180-360 ms under that launcher and 24.6 ms under torchrun;
    with the cores split (and ``KdCells.locate`` on the GPU) it took 25-34 ms under the launcher
    (2026-11-30; commit 8757b9f, docs/benchmarks.md). An explicit ``OMP_NUM_THREADS`` wins; otherwise the cores
    are split evenly."""
    if ranks_on_host <= 1 or os.environ.get("OMP_NUM_THREADS"):
        return None
    return max(1, (cpu_count or os.cpu_count() or 1) // ranks_on_host)


def share_cpu_threads(ranks_on_host: int) -> None:
    """Apply :func:`cpu_threads_per_rank` to this process."""
    threads = cpu_threads_per_rank(ranks_on_host)
    if threads is not None:
        torch.set_num_threads(threads)


def init_distributed(backend: Optional[str] = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> torch.device:
    """Initialise the default process group from RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT.

    ``backend``: None picks NCCL when CUDA is available, gloo otherwise. Returns the device this
    rank computes on (``cuda:LOCAL_RANK`` for NCCL, the CPU for gloo). ``timeout_s``: how long a
    collective waits for the other ranks (``--pipeline.rank-timeout``).
    """
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise DistributedError(
            f"Distributed launch needs the environment variables {', '.join(missing)}.",
            hint="Start with `torchrun --nproc-per-node N -m bytesplat_ns.train ...`.",
        )
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if not timeout_s > 0:
        raise DistributedError(f"the rank timeout must be a positive number of seconds, got {timeout_s!r}")
    timeout = datetime.timedelta(seconds=timeout_s)
    device = torch.device("cpu")
    if backend == "nccl":
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    if not dist.is_initialized():
        try:
            dist.init_process_group(backend, timeout=timeout)
        except Exception as error:  # noqa: BLE001 - rendezvous failures of every kind
            raise DistributedError(
                f"rank {os.environ['RANK']}: cannot join the process group at "
                f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']} ({' '.join(str(error).split())[:300]})."
            ) from error
    return device


class StepWatchdog:
    """Ends this process with a clear message if a step runs past ``timeout_s``.

    Use as a context manager around each step (``with watchdog.step(n): ...``), or ``arm``/``disarm``
    when the step spans several calls (nerfstudio's forward, backward and callbacks).
    """

    def __init__(self, timeout_s: float, exit_code: int = WATCHDOG_EXIT_CODE):
        self.timeout_s = float(timeout_s)
        self.exit_code = exit_code
        self._deadline: Optional[float] = None
        self._label = ""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bytesplat-step-watchdog", daemon=True)
        self._thread.start()

    def arm(self, label: str) -> None:
        with self._lock:
            self._deadline = time.monotonic() + self.timeout_s
            self._label = label

    def disarm(self) -> None:
        with self._lock:
            self._deadline = None

    def step(self, label: str) -> "_Armed":
        return _Armed(self, label)

    def close(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(min(1.0, max(0.05, self.timeout_s / 20))):
            with self._lock:
                expired = self._deadline is not None and time.monotonic() > self._deadline
                label = self._label
            if expired:
                rank, world = rank_and_world()
                sys.stderr.write(
                    f"\nbytesplat: error: rank {rank}/{world}: {label} did not finish within {self.timeout_s:g} s "
                    "(this rank or a peer stalled); exiting so that no rank hangs.\n"
                )
                sys.stderr.flush()
                os._exit(self.exit_code)


class _Armed:
    def __init__(self, watchdog: StepWatchdog, label: str):
        self.watchdog, self.label = watchdog, label

    def __enter__(self):
        self.watchdog.arm(self.label)
        return self.watchdog

    def __exit__(self, *exc):
        self.watchdog.disarm()
        return False
