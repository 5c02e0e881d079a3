"""Communicators: how 2D Gaussian records reach the renderers and their gradients come back.

One interface (:class:`Communicator`), chosen by name (``make_communicator``):

- ``dense`` (Grendel-style baseline): every 2D record sent forward has its full gradient record
  returned, zero or not. The owner knows the sizes, so the backward needs no size exchange.
- ``sparse-grad`` (ByteSplat 3): the renderer *encodes* only the records whose gradient is not all
  zero as ``(index, values)``; the owner *decodes* them by scatter-adding the values straight into
  its gradient buffer. Where so many records are non-zero that their indices would cost more than
  the zero rows they leave out, the message carries the dense rows instead, so sparse-grad never
  sends more than dense. On CUDA tensors ``encode``/``decode`` run the GPU kernels of
  ``cuda/sparse_grad.cu`` (``sparse_kernels``: warp-ballot compaction, atomicAdd decode); on the
  CPU (and where the kernels cannot be built, or ``--pipeline.sparse-kernels False``) the torch
  implementation (``encode_torch``/``decode_torch``), which gives the same bytes.

Both give bit-identical owner gradients: the buffer starts at zero and every (view, Gaussian)
record is produced by exactly one renderer, so adding the non-zero rows equals copying all rows.

Wire formats (one message per pair of ranks and phase, built with ``exchange.pack``):

- forward, owner -> renderer: ``floats [m, F]`` (means2d 2, conics 3, colors D, opacity 1,
  depth 1; the parameters' dtype), ``radii [m] int32``, ``global ids [m] int32``, the renderer's
  views in order. Record size ``F*itemsize + 8`` bytes. No header and no size exchange: how many
  records every rank sends for every view is known to all ranks before the exchange (the step's
  one all-gather, ``sharding.gather_layout_and_view_counts``, counted as meta bytes).
- backward ``dense``, renderer -> owner: ``grads [m, G] `` (G = D + 6: the differentiable columns,
  depth is only a sort key). ``G*itemsize`` bytes per record.
- backward ``sparse-grad``: ``values [k, G]``, ``index [k] int32`` (row in the forward message);
  ``G*itemsize + 4`` bytes per non-zero record, after a size exchange (``world`` int64 per rank,
  counted as meta bytes). Only when that is smaller than the dense message ``grads [m, G]``
  (``k (G*itemsize + 4) < m G*itemsize``); otherwise the dense message itself. The owner tells them
  apart by size: it knows ``m``, and a sparse message is always shorter than ``m G*itemsize``.

Every communicator reports per step (``CommStats``): bytes and records sent to other ranks forward
and backward, and the meta bytes of size exchanges. Messages a rank sends to itself are not counted.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass
from typing import ClassVar, Dict, List, NamedTuple, Optional, Sequence, Tuple, Type

import torch
from torch import Tensor

from bytesplat_ns.distributed.exchange import ExchangeStats, exchange, nbytes, pack, rank_and_world, unpack

INDEX_DTYPE = torch.int32


def float_columns(num_channels: int) -> int:
    """F: floats per forward record (means2d 2, conics 3, colors D, opacity 1, depth 1)."""
    return num_channels + 7


def grad_columns(num_channels: int) -> int:
    """G: differentiable floats per record (all but depth)."""
    return num_channels + 6


def forward_record_bytes(num_channels: int, dtype: torch.dtype = torch.float32) -> int:
    return float_columns(num_channels) * nbytes(dtype) + 2 * nbytes(INDEX_DTYPE)


def dense_grad_record_bytes(num_channels: int, dtype: torch.dtype = torch.float32) -> int:
    return grad_columns(num_channels) * nbytes(dtype)


def sparse_grad_record_bytes(num_channels: int, dtype: torch.dtype = torch.float32) -> int:
    return grad_columns(num_channels) * nbytes(dtype) + nbytes(INDEX_DTYPE)


class Records(NamedTuple):
    """The 2D records one owner sends to one renderer, for all of the renderer's views in order."""

    floats: Tensor  # [m, F]
    radii: Tensor  # [m] int32
    gids: Tensor  # [m] int32 global Gaussian ids (depth-order tie-break)


@dataclass
class CommStats:
    """Bytes/records this rank sent to other ranks in one step."""

    forward_bytes: int = 0
    backward_bytes: int = 0
    forward_records: int = 0
    backward_records: int = 0
    meta_bytes: int = 0

    def as_dict(self) -> Dict[str, int]:
        return asdict(self)

    def add(self, other: "CommStats") -> None:
        for key, value in asdict(other).items():
            setattr(self, key, getattr(self, key) + value)


class Communicator(ABC):
    """Moves 2D records forward and their gradients backward between owners and renderers."""

    name: ClassVar[str]

    def __init__(self, group=None):
        self.group = group

    # ---- forward (shared by all communicators) ----
    def send_records(
        self,
        outgoing: Sequence[Records],
        num_channels: int,
        incoming_counts: Sequence[Sequence[int]],
        dtype: torch.dtype,
        stats: CommStats,
    ) -> List[Records]:
        """Send ``outgoing[d]`` to rank ``d``; return the records received from every rank.
        ``incoming_counts[s]``: how many records rank ``s`` sends for each of this rank's views
        (every rank knows them before the exchange, so the messages' sizes need no round of their own)."""
        rank, world = rank_and_world(self.group)
        messages = [pack([r.floats, r.radii.to(INDEX_DTYPE), r.gids.to(INDEX_DTYPE)]) for r in outgoing]
        F = float_columns(num_channels)
        rec_bytes = forward_record_bytes(num_channels, dtype)
        sizes = [sum(int(c) for c in counts) for counts in incoming_counts]
        ex = ExchangeStats()
        received = exchange(messages, [m * rec_bytes for m in sizes], self.group, ex, phase="forward exchange of 2D records")
        out: List[Records] = []
        for s, (msg, m) in enumerate(zip(received, sizes)):
            if msg.numel() != m * rec_bytes:
                raise ValueError(f"malformed record message from rank {s}: {msg.numel()} bytes, expected {m} records")
            floats, radii, gids = unpack(msg, [(dtype, (m, F)), (INDEX_DTYPE, (m,)), (INDEX_DTYPE, (m,))])
            out.append(Records(floats, radii, gids))
        stats.forward_bytes += ex.payload_bytes
        stats.meta_bytes += ex.meta_bytes
        stats.forward_records += sum(int(outgoing[d].radii.numel()) for d in range(world) if d != rank)
        return out

    # ---- backward ----
    @abstractmethod
    def return_gradients(
        self,
        grads: Sequence[Tensor],
        sent_index: Sequence[Tensor],
        grad_buffer: Tensor,
        stats: CommStats,
    ) -> None:
        """Renderer side: ``grads[s]`` [m_s, G] are the gradients of the records received from rank s.
        Owner side: ``sent_index[d]`` [m_d] are the rows of ``grad_buffer`` [rows, G] the records
        sent to rank d came from; their gradients are added into ``grad_buffer``."""


class DenseCommunicator(Communicator):
    name = "dense"

    def return_gradients(self, grads, sent_index, grad_buffer, stats):
        rank, world = rank_and_world(self.group)
        G = grad_buffer.shape[1]
        item = grad_buffer.element_size()
        messages = [pack([g.to(grad_buffer.dtype)]) for g in grads]
        sizes = [int(idx.numel()) * G * item for idx in sent_index]
        ex = ExchangeStats()
        received = exchange(messages, sizes, self.group, ex, phase="backward exchange of 2D gradients (dense)")
        for d, msg in enumerate(received):
            m = int(sent_index[d].numel())
            if m == 0:
                continue
            (values,) = unpack(msg, [(grad_buffer.dtype, (m, G))])
            grad_buffer.index_add_(0, sent_index[d], values)
        stats.backward_bytes += ex.payload_bytes
        stats.meta_bytes += ex.meta_bytes
        stats.backward_records += sum(int(grads[s].shape[0]) for s in range(world) if s != rank)


class SparseGradCommunicator(Communicator):
    name = "sparse-grad"

    def __init__(self, group=None, gpu_kernels: bool = True):
        super().__init__(group)
        self.gpu_kernels = gpu_kernels  # False: the torch implementation on the GPU too (A/B runs)

    def encode(self, grad: Tensor) -> Tuple[Tensor, Tensor]:
        """[m, G] gradients -> (index [k] int32 of rows with any non-zero entry, values [k, G])."""
        from bytesplat_ns.distributed import sparse_kernels

        if self.gpu_kernels and sparse_kernels.usable(grad):
            return sparse_kernels.encode(grad)
        return self.encode_torch(grad)

    def decode(self, index: Tensor, values: Tensor, sent_index: Tensor, grad_buffer: Tensor, bad: Optional[Tensor] = None) -> None:
        """Scatter-add received ``values`` into the owner's gradient buffer rows they belong to.
        ``bad``: see ``sparse_kernels.decode`` (GPU kernels only; lets one check cover every peer)."""
        from bytesplat_ns.distributed import sparse_kernels

        if self.gpu_kernels and index.numel() and grad_buffer.is_contiguous() and sparse_kernels.usable(grad_buffer):
            sparse_kernels.decode(index, values, sent_index, grad_buffer, bad)
            return
        self.decode_torch(index, values, sent_index, grad_buffer)

    # The torch implementation (CPU, and the reference the GPU kernels are tested against).
    @staticmethod
    def encode_torch(grad: Tensor) -> Tuple[Tensor, Tensor]:
        keep = (grad != 0).any(dim=1)
        index = torch.nonzero(keep).squeeze(1)
        return index.to(INDEX_DTYPE), grad.index_select(0, index)

    @staticmethod
    def decode_torch(index: Tensor, values: Tensor, sent_index: Tensor, grad_buffer: Tensor) -> None:
        if index.numel():
            grad_buffer.index_add_(0, sent_index.index_select(0, index.long()), values)

    @staticmethod
    def sends_dense(nonzero: int, rows: int, G: int, dtype: torch.dtype) -> bool:
        """Whether a message of ``rows`` gradient records, ``nonzero`` of them non-zero, goes dense:
        unless the sparse form is strictly smaller (so a sparse message is always shorter than the
        dense one, which is how the owner tells them apart)."""
        return nonzero * (G * nbytes(dtype) + nbytes(INDEX_DTYPE)) >= rows * G * nbytes(dtype)

    def return_gradients(self, grads, sent_index, grad_buffer, stats):
        rank, world = rank_and_world(self.group)
        G = grad_buffer.shape[1]
        dtype = grad_buffer.dtype
        messages, kept = [], []
        for g in grads:
            g = g.to(dtype)
            index, values = self.encode(g)
            k = int(index.numel())
            messages.append(pack([g]) if self.sends_dense(k, g.shape[0], G, dtype) else pack([values, index]))
            kept.append(k)
        ex = ExchangeStats()
        received = exchange(messages, None, self.group, ex, phase="backward exchange of 2D gradients (sparse)")
        row_bytes = G * nbytes(dtype)
        rec_bytes = row_bytes + nbytes(INDEX_DTYPE)
        bad = None
        if grad_buffer.is_cuda:
            from bytesplat_ns.distributed.sparse_kernels import new_flag

            bad = new_flag(grad_buffer.device)  # one host sync for all peers' messages, below
        for d, msg in enumerate(received):
            m = int(sent_index[d].numel())
            if m and msg.numel() == m * row_bytes:  # the dense rows (see sends_dense)
                (values,) = unpack(msg, [(dtype, (m, G))])
                grad_buffer.index_add_(0, sent_index[d], values)
                continue
            if msg.numel() % rec_bytes or msg.numel() >= max(m, 1) * row_bytes:
                raise ValueError(f"malformed sparse gradient message from rank {d}: {msg.numel()} bytes "
                                 f"for {m} records")
            k = msg.numel() // rec_bytes
            values, index = unpack(msg, [(dtype, (k, G)), (INDEX_DTYPE, (k,))])
            self.decode(index, values, sent_index[d], grad_buffer, bad)
        if bad is not None:
            from bytesplat_ns.distributed.sparse_kernels import check_decoded

            check_decoded(bad)
        stats.backward_bytes += ex.payload_bytes
        stats.meta_bytes += ex.meta_bytes
        stats.backward_records += sum(kept[s] for s in range(world) if s != rank)


COMMUNICATORS: Dict[str, Type[Communicator]] = {
    DenseCommunicator.name: DenseCommunicator,
    SparseGradCommunicator.name: SparseGradCommunicator,
}


def make_communicator(name: str, group=None, sparse_kernels: bool = True) -> Communicator:
    """``sparse_kernels``: whether sparse-grad encodes and decodes with its GPU kernels where they build."""
    try:
        cls = COMMUNICATORS[name]
    except KeyError:
        raise ValueError(f"Unknown communicator '{name}'; choose one of {', '.join(COMMUNICATORS)}.") from None
    return cls(group, gpu_kernels=sparse_kernels) if cls is SparseGradCommunicator else cls(group)
