"""nerfstudio's event writers, made cheaper around the training loop.

nerfstudio's loop puts three timing scalars into its event storage at every step (``Train Iter
(time)`` and ``ETA (time)``, running averages over the last ``max_buffer_size`` steps, and ``Train
Rays / Sec``) and writes them to tensorboard at every step; on logged steps about a dozen more (the
loss, its terms, the training metrics, the GPU memory). Each one is a ``SummaryWriter.add_scalar``: a
read of the value (a wait for the GPU, for a tensor), a protobuf built, serialised and queued on the
training thread, then checksummed and written by tensorboard's writer thread. Its queue holds 10
events: a logged step's dozen fill it, and the training thread blocks until the writer thread,
which needs the interpreter lock for each event, has taken them. Measured on the H200 machine (suite
wallclock-fox-seeds, 5000 iterations on fox): 2.4-2.8 s of ``add_scalar`` on the training thread,
~5 ms per logged step, against 0.05 s of waiting for the GPU.

nerfstudio's optimizers also put each scheduled group's learning rate (``learning_rate/means``) at
every step. Every event handed to tensorboard wakes its writer thread, and the hand-over of the
interpreter lock costs the training thread far more than the event itself (~0.5 ms on the H200
machine, ~2.5 ms on a 2-core CPU): these per-step events were most of the ~3 s above.

:class:`TrainingLoopTensorboardWriter` (same ``SummaryWriter``, tags and values) writes

- the three timing scalars only on the steps nerfstudio logs (``--logging.steps-per-log``), like the
  console table (``--timing-scalars-every-step False``);
- the learning rates only on logged steps: the same schedule, sampled every ``steps_per_log`` steps
  (``--learning-rates-every-step False``);
- a logged step's scalars as one event (one summary with every value; tensorboard reads the same
  tags, steps and values), its tensors copied to the host in one non-blocking copy that is read once
  later logged steps have arrived (or at close), so the training thread never waits for the GPU here
  (``--batched-tensorboard-scalars True``). The closed steps are handed to tensorboard a few at a
  time (``--batched-scalars-steps-per-write``): each hand-over wakes its writer thread. This includes the
  loss and metrics dicts: nerfstudio's ``write_scalar_dict`` reads each value with ``float()``, so
  every logged step waited for the GPU to finish the step's queued work, then left it idle while
  the host wrote the logs and issued the next step.

Images go through unchanged. :func:`close_tensorboard_writers` writes what is held back and puts
every queued event on disk (nerfstudio never closes them).
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Tuple

import nerfstudio.configs.base_config  # noqa: F401 - imports nerfstudio's writer without its import cycle
import torch
from nerfstudio.utils import writer
from tensorboard.compat.proto.summary_pb2 import Summary

PER_STEP_TIMINGS = frozenset(
    event.value for event in (writer.EventName.ITER_TRAIN_TIME, writer.EventName.ETA, writer.EventName.TRAIN_RAYS_PER_SEC)
)


LEARNING_RATE_PREFIX = "learning_rate/"  # nerfstudio's Optimizers.scheduler_step_all: one per scheduled group, every step


def stack_as_float64(tensors: List[torch.Tensor]) -> Tuple[torch.Tensor, List[int]]:
    """One-element tensors of one device as one float64 vector and, for each of its entries, the index
    of the tensor it holds: one stack and one cast per dtype (a logged step's dozen float32 values take
    two launches, not a cast each), grouped by dtype; the caller puts the values back in order on the
    host, after its copy (no index tensor sent to the device)."""
    by_dtype: dict = {}
    for i, t in enumerate(tensors):
        by_dtype.setdefault(t.dtype, []).append(i)
    parts = [torch.stack([tensors[i].detach().reshape(()) for i in indices]).to(torch.float64)
             for indices in by_dtype.values()]
    order = [i for indices in by_dtype.values() for i in indices]
    return (parts[0] if len(parts) == 1 else torch.cat(parts)), order


class HostValues:
    """Scalars (numbers and one-element tensors) read to the host: values already on the host are read
    at once (no wait), device tensors with one non-blocking copy into pinned memory, ready once the
    GPU has reached it (``values()`` waits only if it has not)."""

    def __init__(self, scalars: List[Any]):
        scalars = list(scalars)
        self.on_device = [i for i, v in enumerate(scalars) if isinstance(v, torch.Tensor) and v.device.type != "cpu"]
        device_slots = set(self.on_device)
        self.host: List[Optional[float]] = [None if i in device_slots else float(v) for i, v in enumerate(scalars)]
        self.copy: Optional[torch.Tensor] = None
        self.ready: Optional[torch.cuda.Event] = None
        if self.on_device:
            stacked, order = stack_as_float64([scalars[i] for i in self.on_device])
            self.on_device = [self.on_device[k] for k in order]  # the slots in the stack's order
            self.copy = stacked.to("cpu", non_blocking=True)
            if stacked.device.type == "cuda":
                self.ready = torch.cuda.Event()
                self.ready.record()

    def values(self) -> List[float]:
        out = list(self.host)
        if self.on_device:
            if self.ready is not None:
                self.ready.synchronize()
            for i, value in zip(self.on_device, self.copy.tolist()):
                out[i] = value
        return out


class TrainingLoopTensorboardWriter(writer.TensorboardWriter):
    """nerfstudio's ``TensorboardWriter`` on the same ``SummaryWriter``: the per-step timing scalars only
    on logged steps (unless ``timings_every_step``), and each step's scalars as one event, read from
    the device without waiting (``batch_scalars``)."""

    def __init__(self, tb_writer: Any, steps_per_log: int, timings_every_step: bool = False,
                 batch_scalars: bool = True, learning_rates_every_step: bool = False,
                 steps_per_write: int = 1):  # noqa: D107 - adopts an open SummaryWriter
        self.tb_writer = tb_writer
        self.steps_per_log = max(1, int(steps_per_log))
        self.timings_every_step = timings_every_step
        self.learning_rates_every_step = learning_rates_every_step
        self.batch_scalars = batch_scalars
        self.steps_per_write = int(steps_per_write)  # logged steps handed to tensorboard at once (at least 1)
        self._held: List[Tuple[int, float, List[str], HostValues]] = []  # closed steps, oldest first
        self._open: Optional[Tuple[int, List[str], List[Any]]] = None  # the step being collected

    def write_scalar(self, name: str, scalar: Any, step: int) -> None:
        if step % self.steps_per_log and (
                (name in PER_STEP_TIMINGS and not self.timings_every_step)
                or (name.startswith(LEARNING_RATE_PREFIX) and not self.learning_rates_every_step)):
            return
        if not self.batch_scalars:
            super().write_scalar(name, scalar, step)
            return
        if self._open is not None and self._open[0] != step:
            self._close_step()
        if self._open is None:
            self._open = (step, [], [])
        self._open[1].append(name)
        self._open[2].append(scalar)

    def write_scalar_dict(self, name: str, scalar_dict: Dict[str, Any], step: int) -> None:
        """nerfstudio's writes each value as ``float(value)``: on a logged step a wait for the GPU (the
        whole step's queued work) and a copy per value. Batched, the values go in as they are."""
        if not self.batch_scalars:
            super().write_scalar_dict(name, scalar_dict, step)
            return
        for key, scalar in scalar_dict.items():
            self.write_scalar(f"{name}/{key}", scalar, step)

    def _close_step(self) -> None:
        """The collected step's values start their copy to the host. Once ``steps_per_write`` closed steps
        are held before it, they are written together: each hand-over to tensorboard wakes its writer
        thread, so a burst costs the training thread one thread switch instead of one per step."""
        step, names, scalars = self._open
        self._open = None
        if len(self._held) >= self.steps_per_write:
            self.write_held()
        self._held.append((step, time.time(), names, HostValues(scalars)))

    def write_held(self) -> None:
        """Write each held step's scalars as one event (waiting for the GPU only where a copy is not there yet)."""
        held, self._held = self._held, []
        file_writer = self.tb_writer._get_file_writer() if held else None
        for step, wall_time, names, host in held:
            summary = Summary(value=[Summary.Value(tag=name, simple_value=value) for name, value in zip(names, host.values())])
            file_writer.add_summary(summary, step, wall_time)

    def flush_scalars(self) -> None:
        """Write everything collected or held (end of training, exit)."""
        if self._open is not None:
            self._close_step()
        self.write_held()


def adopt_tensorboard_writers(steps_per_log: int, timings_every_step: bool, batch_scalars: bool,
                              learning_rates_every_step: bool, steps_per_write: int = 1) -> int:
    """Replace nerfstudio's tensorboard writers by :class:`TrainingLoopTensorboardWriter` s on the same
    event files. Returns how many were replaced."""
    replaced = 0
    for i, event_writer in enumerate(writer.EVENT_WRITERS):
        if type(event_writer) is writer.TensorboardWriter:
            writer.EVENT_WRITERS[i] = TrainingLoopTensorboardWriter(event_writer.tb_writer, steps_per_log,
                                                                    timings_every_step, batch_scalars,
                                                                    learning_rates_every_step, steps_per_write)
            replaced += 1
    return replaced


def read_between_logged_steps(kind: str) -> bool:
    """Whether an event writer keeps the events of ``kind`` ("timings": nerfstudio's three per-step timing
    scalars; "learning_rates") put on steps that are not logged: any writer but the console (which reads
    the timings' running averages on logged steps only) and :class:`TrainingLoopTensorboardWriter` s that
    drop them there."""
    every_step = {"timings": "timings_every_step", "learning_rates": "learning_rates_every_step"}[kind]
    return any(not isinstance(w, writer.LocalWriter)
               and not (isinstance(w, TrainingLoopTensorboardWriter) and not getattr(w, every_step))
               for w in writer.EVENT_WRITERS)


def flush_held_scalars() -> None:
    """Write the scalars our writers hold back (the last logged step's)."""
    for event_writer in writer.EVENT_WRITERS:
        if isinstance(event_writer, TrainingLoopTensorboardWriter):
            event_writer.flush_scalars()


def close_tensorboard_writers() -> None:
    """Write what is held back, then flush and close every tensorboard ``SummaryWriter`` of nerfstudio's
    event writers."""
    flush_held_scalars()
    for event_writer in writer.EVENT_WRITERS:
        if isinstance(event_writer, writer.TensorboardWriter):
            event_writer.tb_writer.close()


def retire_event_writers() -> int:
    """Close and drop the event writers an earlier trainer of this process left in nerfstudio's global
    list (``writer.EVENT_WRITERS`` only grows: a second trainer in one process, e.g. ``bytesplat-bench
    train`` with several methods, would otherwise also write its events into the first run's files and
    print its console table twice). Returns how many were dropped."""
    close_tensorboard_writers()
    dropped = len(writer.EVENT_WRITERS)
    writer.EVENT_WRITERS.clear()
    return dropped
