"""CRC-32C for tensorboard's event files, vectorised with numpy.

Without TensorFlow, tensorboard checksums every event record (``RecordWriter.write``) with a
pure-Python CRC-32C: about 0.25 s per MB. An eval image of a 1080p capture is a PNG of several MB, so
each one holds the interpreter lock for a second or more in tensorboard's writer thread, and the
training loop, which launches its kernels from Python, runs several times slower meanwhile.

``masked_crc32c`` gives the same checksums: the message is cut into equal chunks whose CRC registers
are advanced together (one numpy step per byte position, every chunk at once), then chained, since
the CRC is linear: the register after a chunk is ``shift(register before) ^ register(chunk from
0)``, with ``shift`` the effect of the chunk's length in zero bytes (four 256-entry tables).
:func:`install` points tensorboard's record writer at it; the bytes written are unchanged.
"""

from __future__ import annotations

import functools
from typing import Tuple

import numpy as np

_POLY = 0x82F63B78  # CRC-32C (Castagnoli), reflected
_MASK = 0xFFFFFFFF
CHUNK = 4096  # bytes per lane: long messages run ~len/CHUNK lanes side by side
_VECTOR_MIN = 64 * 1024  # shorter records (scalars, small images) take the plain loop


def _table() -> np.ndarray:
    table = np.zeros(256, dtype=np.uint32)
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ _POLY if c & 1 else c >> 1
        table[i] = c
    return table


TABLE = _table()
_TABLE_LIST = [int(v) for v in TABLE]


def _advance(register: int, data: bytes) -> int:
    """The raw (un-inverted) register after ``data``, one byte at a time."""
    table = _TABLE_LIST
    for b in data:
        register = table[(register ^ b) & 0xFF] ^ (register >> 8)
    return register


@functools.lru_cache(maxsize=4)
def _shift_tables(length: int) -> Tuple[np.ndarray, ...]:
    """Four tables T_b with shift(r) = T_0[r & 255] ^ T_1[r >> 8 & 255] ^ T_2[...] ^ T_3[r >> 24], where
    shift advances a register over ``length`` zero bytes (a linear map over GF(2))."""
    columns = []
    for bit in range(32):  # the image of each basis register
        columns.append(_advance(1 << bit, bytes(length)))
    values = np.arange(256)
    tables = []
    for byte in range(4):
        t = np.zeros(256, dtype=np.uint32)
        for k in range(8):
            t[(values >> k) & 1 == 1] ^= np.uint32(columns[8 * byte + k])
        tables.append(t)
    return tuple(tables)


def crc32c(data: bytes) -> int:
    """CRC-32C of ``data`` (init and final xor 0xFFFFFFFF, as tensorboard's ``crc32c``)."""
    data = bytes(data)
    lanes = len(data) // CHUNK if len(data) >= _VECTOR_MIN else 0
    head = len(data) - lanes * CHUNK
    register = _advance(_MASK, data[:head])
    if lanes:
        columns = np.frombuffer(data, dtype=np.uint8, offset=head).reshape(lanes, CHUNK).T.copy()
        chunk_registers = np.zeros(lanes, dtype=np.uint32)
        for column in columns:  # byte i of every chunk at once
            chunk_registers = TABLE[(chunk_registers ^ column) & 0xFF] ^ (chunk_registers >> 8)
        t0, t1, t2, t3 = (t.tolist() for t in _shift_tables(CHUNK))
        for value in chunk_registers.tolist():
            register = (t0[register & 0xFF] ^ t1[(register >> 8) & 0xFF] ^ t2[(register >> 16) & 0xFF]
                        ^ t3[register >> 24]) ^ value
    return register ^ _MASK


def masked_crc32c(data: bytes) -> int:
    """tensorboard's masked CRC of an event record (rotate right by 15, add a constant)."""
    x = crc32c(data)
    return (((x >> 15) | (x << 17)) + 0xA282EAD8) & _MASK


def install() -> None:
    """Make tensorboard's record writer use :func:`masked_crc32c` (same bytes, without the GIL-bound
    pure-Python loop); does nothing where tensorboard is absent."""
    try:
        from tensorboard.summary.writer import record_writer
    except ImportError:
        return
    record_writer.masked_crc32c = masked_crc32c
