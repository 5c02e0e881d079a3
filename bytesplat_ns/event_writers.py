"""nerfstudio's event writers, made cheaper around the training loop.

nerfstudio's loop puts three timing scalars into its event storage at every step (``Train Iter
(time)`` and ``ETA (time)``, running averages over the last ``max_buffer_size`` steps, and ``Train
Rays / Sec``) and writes them to tensorboard at every step. Each tensorboard scalar is a protobuf
built and queued on the training thread and serialised, checksummed and written by tensorboard's
writer thread, which competes with the training thread for the interpreter lock. Measured on a
2-core CPU with protobuf's pure-Python implementation, the three cost ~0.7 ms a step; on the H200
machine (suite wallclock-fox-seeds) nerfstudio's writer time did not drop measurably with them gone:
there it is spent elsewhere (docs/wallclock.md).

:class:`LoggedStepsTensorboardWriter` writes those three only on the steps nerfstudio logs
(``--logging.steps-per-log``), like the console table; every other event is written as before.
:func:`close_tensorboard_writers` puts every queued event on disk (nerfstudio never closes them).
"""

from __future__ import annotations

from typing import Any

import nerfstudio.configs.base_config  # noqa: F401 - imports nerfstudio's writer without its import cycle
from nerfstudio.utils import writer

PER_STEP_TIMINGS = frozenset(
    event.value for event in (writer.EventName.ITER_TRAIN_TIME, writer.EventName.ETA, writer.EventName.TRAIN_RAYS_PER_SEC)
)


class LoggedStepsTensorboardWriter(writer.TensorboardWriter):
    """nerfstudio's ``TensorboardWriter`` (same ``SummaryWriter``, tags and values) that skips the
    per-step timing scalars on steps that are not logged."""

    def __init__(self, tb_writer: Any, steps_per_log: int):  # noqa: D107 - adopts an open SummaryWriter
        self.tb_writer = tb_writer
        self.steps_per_log = max(1, int(steps_per_log))

    def write_scalar(self, name: str, scalar: Any, step: int) -> None:
        if name in PER_STEP_TIMINGS and step % self.steps_per_log:
            return
        super().write_scalar(name, scalar, step)


def write_timings_on_logged_steps(steps_per_log: int) -> int:
    """Replace nerfstudio's tensorboard writers by :class:`LoggedStepsTensorboardWriter` s on the same
    event files. Returns how many were replaced."""
    replaced = 0
    for i, event_writer in enumerate(writer.EVENT_WRITERS):
        if type(event_writer) is writer.TensorboardWriter:
            writer.EVENT_WRITERS[i] = LoggedStepsTensorboardWriter(event_writer.tb_writer, steps_per_log)
            replaced += 1
    return replaced


def close_tensorboard_writers() -> None:
    """Flush and close every tensorboard ``SummaryWriter`` of nerfstudio's event writers."""
    for event_writer in writer.EVENT_WRITERS:
        if isinstance(event_writer, writer.TensorboardWriter):
            event_writer.tb_writer.close()
