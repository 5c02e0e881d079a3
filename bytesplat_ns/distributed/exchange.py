"""Point-to-point "all-to-all-v" exchange of byte buffers that works on every backend.

gloo has no ``all_to_all``, so the exchange is built from what every backend has: one
``all_gather`` of the message sizes (skipped when the receiver already knows them) and one batch of
``isend``/``irecv`` pairs (``torch.distributed.batch_isend_irecv``: coalesced on NCCL, a loop of
non-blocking sends/receives on gloo). Messages are flat ``uint8`` tensors; ``pack``/``unpack`` turn
a list of typed tensors into one message and back, so each pair of ranks exchanges at most one
message per phase.

Accounting (``ExchangeStats``): ``payload_bytes`` is what this rank put on the wire to OTHER ranks
(the message to itself is handed over in memory and not counted); ``meta_bytes`` is this rank's own
contribution to the size exchange (``world_size`` int64 values). Failures of the transport (a peer
died: connection reset; a peer stalled: the process group's timeout) become one
:class:`DistributedError` naming this rank, the peer and the phase.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

from bytesplat_ns.errors import BytesplatError


class DistributedError(BytesplatError):
    """A rank could not complete a collective or exchange (a peer died or stalled, or a timeout)."""


@dataclass
class ExchangeStats:
    payload_bytes: int = 0  # bytes sent to other ranks
    meta_bytes: int = 0  # bytes this rank contributed to size exchanges / small collectives
    messages: int = 0  # non-empty messages sent to other ranks
    per_peer_bytes: List[int] = field(default_factory=list)  # payload bytes by destination rank

    def add(self, other: "ExchangeStats") -> None:
        self.payload_bytes += other.payload_bytes
        self.meta_bytes += other.meta_bytes
        self.messages += other.messages
        if len(self.per_peer_bytes) < len(other.per_peer_bytes):
            self.per_peer_bytes += [0] * (len(other.per_peer_bytes) - len(self.per_peer_bytes))
        for i, b in enumerate(other.per_peer_bytes):
            self.per_peer_bytes[i] += b


def rank_and_world(group=None) -> Tuple[int, int]:
    if not dist.is_available() or not dist.is_initialized():
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def comm_device(group=None) -> torch.device:
    """Device that collective tensors must live on for ``group``'s backend (cuda for NCCL)."""
    if dist.is_initialized() and dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _short(error: BaseException) -> str:
    text = " ".join(str(error).split())
    # gloo prefixes messages with a source location; keep the human part.
    if "] " in text[:200]:
        text = text.split("] ", 1)[1]
    return text[:300]


def wrap_failure(phase: str, peer: Optional[int], error: BaseException, group=None) -> DistributedError:
    rank, world = rank_and_world(group)
    with_peer = f" with rank {peer}" if peer is not None else ""
    return DistributedError(
        f"rank {rank}/{world}: {phase}: communication{with_peer} failed ({_short(error)}).",
        hint="Another rank died or stalled (see its log); every rank stops instead of hanging. "
        "Waits are bounded by the process-group timeout (--pipeline.rank-timeout seconds, default 600).",
    )


def all_gather_ints(values: Sequence[int], group=None, stats: Optional[ExchangeStats] = None, phase: str = "all_gather") -> Tensor:
    """All ranks' integer vectors of equal length -> [world, len] int64 tensor (on the CPU)."""
    return all_gather_rows(torch.tensor(list(values), dtype=torch.int64), group, stats, phase)


def all_gather_rows(local: Tensor, group=None, stats: Optional[ExchangeStats] = None, phase: str = "all_gather") -> Tensor:
    """All ranks' 1-D tensors of equal length (any device: values computed on the GPU are gathered
    there, with no read before) -> [world, len] on the CPU: one host read for the whole collective."""
    _, world = rank_and_world(group)
    local = local.to(comm_device(group))
    if world == 1:
        return local[None].cpu()
    out = [torch.empty_like(local) for _ in range(world)]
    try:
        dist.all_gather(out, local, group=group)
    except Exception as error:  # noqa: BLE001 - transport errors of any kind
        raise wrap_failure(phase, None, error, group) from error
    if stats is not None:
        stats.meta_bytes += local.numel() * local.element_size()
    return torch.stack(out).cpu()


def all_reduce_(tensor: Tensor, op=None, group=None, stats: Optional[ExchangeStats] = None, phase: str = "all_reduce") -> Tensor:
    """In-place all_reduce (SUM by default) with failures turned into DistributedError."""
    _, world = rank_and_world(group)
    if world == 1:
        return tensor
    try:
        dist.all_reduce(tensor, op=op if op is not None else dist.ReduceOp.SUM, group=group)
    except Exception as error:  # noqa: BLE001
        raise wrap_failure(phase, None, error, group) from error
    if stats is not None:
        stats.meta_bytes += tensor.numel() * tensor.element_size()
    return tensor


def exchange(
    send: Sequence[Tensor],
    recv_sizes: Optional[Sequence[int]] = None,
    group=None,
    stats: Optional[ExchangeStats] = None,
    phase: str = "exchange",
) -> List[Tensor]:
    """Send ``send[d]`` (1-D uint8) to rank ``d`` and return the message received from every rank.

    ``recv_sizes[s]`` is the byte size of the message from rank ``s`` when the caller knows it;
    otherwise the sizes are all-gathered first. ``send[rank]`` is returned as is (no copy, not
    counted). Empty messages are not sent.
    """
    rank, world = rank_and_world(group)
    if len(send) != world:
        raise ValueError(f"exchange needs one message per rank ({world}), got {len(send)}")
    for msg in send:
        if msg.dtype != torch.uint8 or msg.dim() != 1:
            raise ValueError("exchange messages must be 1-D uint8 tensors (use pack())")
    if world == 1:
        return [send[0]]
    if recv_sizes is None:
        sizes = all_gather_ints([int(m.numel()) for m in send], group, stats, phase=f"{phase} (sizes)")
        recv_sizes = sizes[:, rank].tolist()
    device = send[rank].device
    recv: List[Tensor] = [send[rank] if s == rank else torch.empty(int(recv_sizes[s]), dtype=torch.uint8, device=device) for s in range(world)]
    ops, peers = [], []
    per_peer = [0] * world
    for offset in range(1, world):
        # Rotate the order so every rank starts with a different partner.
        dst = (rank + offset) % world
        src = (rank - offset) % world
        if send[dst].numel() > 0:
            ops.append(dist.P2POp(dist.isend, send[dst].contiguous(), _global_rank(dst, group), group))
            peers.append(dst)
            per_peer[dst] += int(send[dst].numel())
        if recv[src].numel() > 0:
            ops.append(dist.P2POp(dist.irecv, recv[src], _global_rank(src, group), group))
            peers.append(src)
    if ops:
        try:
            works = dist.batch_isend_irecv(ops)
        except Exception as error:  # noqa: BLE001
            raise wrap_failure(phase, None, error, group) from error
        for i, work in enumerate(works):
            try:
                work.wait()
            except Exception as error:  # noqa: BLE001
                peer = peers[i] if len(works) == len(peers) else None
                raise wrap_failure(phase, peer, error, group) from error
    if stats is not None:
        stats.payload_bytes += sum(per_peer)
        stats.messages += sum(1 for b in per_peer if b)
        if len(stats.per_peer_bytes) < world:
            stats.per_peer_bytes += [0] * (world - len(stats.per_peer_bytes))
        for d in range(world):
            stats.per_peer_bytes[d] += per_peer[d]
    return recv


def _global_rank(group_rank: int, group) -> int:
    if group is None:
        return group_rank
    return dist.get_global_rank(group, group_rank)


# ---------------------------------------------------------------------------------------------
# Packing typed tensors into one byte message


def as_bytes(tensor: Tensor) -> Tensor:
    return tensor.contiguous().reshape(-1).view(torch.uint8)


def pack(tensors: Sequence[Tensor]) -> Tensor:
    """Concatenate tensors' raw bytes (in order) into one 1-D uint8 message."""
    parts = [as_bytes(t) for t in tensors if t.numel() > 0]
    if not parts:
        device = tensors[0].device if tensors else torch.device("cpu")
        return torch.empty(0, dtype=torch.uint8, device=device)
    return torch.cat(parts) if len(parts) > 1 else parts[0]


def unpack(message: Tensor, specs: Sequence[Tuple[torch.dtype, Tuple[int, ...]]]) -> List[Tensor]:
    """Split a message made by ``pack`` back into tensors of the given (dtype, shape)."""
    out: List[Tensor] = []
    offset = 0
    for dtype, shape in specs:
        item = torch.empty((), dtype=dtype).element_size()
        numel = 1
        for s in shape:
            numel *= int(s)
        nbytes = numel * item
        chunk = message[offset : offset + nbytes]
        if chunk.numel() != nbytes:
            raise ValueError(f"message too short: need {offset + nbytes} bytes, have {message.numel()}")
        if numel == 0:
            out.append(torch.empty(shape, dtype=dtype, device=message.device))
        else:
            if chunk.storage_offset() % item:
                chunk = chunk.clone()  # realign for the dtype view
            out.append(chunk.view(dtype).reshape(shape))
        offset += nbytes
    if offset != message.numel():
        raise ValueError(f"message has {message.numel() - offset} unexpected trailing bytes")
    return out


def nbytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()
