"""The training step's tile-pair buffer, sized ahead so that the step never waits for the GPU.

Binning a view's Gaussians into tile lists (cuda/binning.cu) needs the number of (Gaussian, tile) pairs to
size its buffers. Read back from the GPU, it makes the host wait once per training step for everything
queued before it, and where the step is bound by its host side the GPU then idles while the host issues
the rest of the step. :class:`PairRoom` sizes the buffer from the totals of earlier steps instead, and the
binning reads nothing back (``raster.fused.bin_tiles_in_room``). The sort also sorts the unused room; sized
per view, that cost no measurable GPU time on an H100, and nerfstudio's profiled loop body ran faster on a slow
host, but ``ns-train``'s eager steps did not, so for them it is opt-in
(``--pipeline.model.fused.sync-free-binning``, docs/wallclock.md). It is also what gives a step the fixed-size
buffers a CUDA graph of it needs, so the trainer's graph steps (``--cuda-graph-steps``, on by default,
step_graphs.py) turn it on.

The rules, the same whatever the GPU's timing (so a run is reproducible):

- every training step's true total is copied to the host without a wait; the copy of step ``s`` is read at
  step ``s + lag`` (waiting for it then, which in practice finished long before);
- the room at step ``s`` for a view: ``margin`` times that view's last total read, scaled by the Gaussian
  count now over the count at its step (densification grows the scene between reads); for a view with no
  total read yet, ``margin`` times the largest total read in the last ``window`` steps, scaled alike; before
  any total is read, no room (the binning reads its total, as without this);
- a step whose true total exceeded its room rendered incomplete tile lists. Its Adam step and its
  densification statistics depend on a flag on the GPU (``valid``) and change nothing; the trainer trains
  that view again at step ``s + lag``, binned exactly, before the step's own view
  (``ByteSplatTrainer.train_iteration``). A step that fits bins the same tile lists as one that reads its
  count back.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any, Deque, Dict, Hashable, List, Optional, Tuple

import torch
from torch import Tensor

from bytesplat_ns.errors import SettingError

LAG = 2
"""Steps between a step and the read of its total: the host stays at most this many steps ahead of the GPU."""
SLACK = 1024
"""Pairs added to every room: views with few pairs."""


def room_for(pairs: float, margin: float) -> int:
    """The room for a step expected to bin ``pairs`` (Gaussian, tile) pairs: ``margin`` times them, plus :data:`SLACK`."""
    return int(math.ceil(margin * pairs)) + SLACK


@dataclass
class _Sent:
    step: int
    slot: int  # in the pinned ring (CUDA totals); -1: ``value`` holds it already
    value: int
    room: Optional[int]
    gaussians: int
    key: Optional[Hashable]  # the view's, for its room next time
    view: Any  # what the trainer needs to train the step's view again


class PairRoom:
    """Room for the training step's tile pairs (module docstring). ``margin`` > 1 trades a longer sort (the
    radix sort also sorts the unused room) against fewer steps trained twice."""

    def __init__(self, margin: float = 1.2, window: int = 100, lag: int = LAG):
        if not margin >= 1.0:
            raise SettingError(f"--pipeline.model.fused.pair-room-margin must be at least 1, got {margin}",
                               hint="the room is this many times the view's last pair count")
        self.margin = float(margin)
        self.lag = int(lag)
        self.recent: Deque[Tuple[int, int]] = deque(maxlen=int(window))  # (total, Gaussians) read so far
        self.by_view: Dict[Hashable, Tuple[int, int]] = {}  # each view's last (total, Gaussians) read
        self.sent: Deque[_Sent] = deque()
        self.sized_steps = 0
        self.overflows = 0
        self.last_overflow_step = -1  # the latest step read whose lists did not fit (-1: none)
        self._ring: Optional[Tensor] = None  # pinned host int64, one slot per step in flight
        self._events: List[Any] = []
        self._next_slot = 0

    def room(self, gaussians: int, key: Optional[Hashable] = None) -> Optional[int]:
        """Pairs to make room for in a step rendering view ``key`` with ``gaussians`` Gaussians; None before any
        total was read."""
        last = self.by_view.get(key) if key is not None else None
        if last is not None:
            scaled = last[0] * gaussians / max(last[1], 1)
        elif self.recent:
            scaled = max(total * gaussians / max(then, 1) for total, then in self.recent)
        else:
            return None
        return room_for(scaled, self.margin)

    def send(self, step: int, total: Tensor, room: Optional[int], gaussians: int, view: Any = None,
             key: Optional[Hashable] = None) -> Optional[Tensor]:
        """Queue the read of step ``step``'s true ``total`` ([1] int64) for view ``key``; returns the step's flag
        on the device (``total <= room``: its lists were complete), or None for a step binned without a room."""
        valid = None if room is None else (total[0] <= room)
        if room is not None:
            self.sized_steps += 1
        if total.is_cuda:
            slot = self._copy_out(total)
            self.sent.append(_Sent(step, slot, 0, room, gaussians, key, view))
        else:
            self.sent.append(_Sent(step, -1, int(total[0]), room, gaussians, key, view))
        return valid

    def views_to_train_again(self, step: int) -> List[Any]:
        """Read the totals of the steps up to ``step - lag``; the views of those whose lists did not fit."""
        return self._read(step - self.lag)

    def finish(self) -> List[Any]:
        """Read every total still in flight (training ends); the views to train again."""
        return self._read(None)

    def _read(self, up_to: Optional[int]) -> List[Any]:
        again = []
        while self.sent and (up_to is None or self.sent[0].step <= up_to):
            sent = self.sent.popleft()
            total = sent.value
            if sent.slot >= 0:
                self._events[sent.slot].synchronize()
                total = int(self._ring[sent.slot])
            self.recent.append((total, sent.gaussians))
            if sent.key is not None:
                self.by_view[sent.key] = (total, sent.gaussians)
            if sent.room is not None and total > sent.room:
                self.overflows += 1
                self.last_overflow_step = max(self.last_overflow_step, sent.step)
                again.append(sent.view)
        return again

    def _copy_out(self, total: Tensor) -> int:
        slots = self.lag + 4  # the steps in flight, and spare ones
        if self._ring is None:
            self._ring = torch.zeros(slots, dtype=torch.int64, pin_memory=True)
            self._events = [torch.cuda.Event() for _ in range(slots)]
        if len(self.sent) >= slots:
            raise RuntimeError(f"PairRoom: more than {slots} totals in flight; read them with views_to_train_again")
        slot = self._next_slot
        self._next_slot = (slot + 1) % slots
        self._ring[slot : slot + 1].copy_(total, non_blocking=True)
        self._events[slot].record()
        return slot
