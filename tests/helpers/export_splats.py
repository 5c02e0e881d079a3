"""Helpers for the export tests: synthetic Gaussians with distinct SH, and decoders of the formats written
from their published layouts (independent of the writers in bytesplat_ns.export and of gsply)."""

from __future__ import annotations

import gzip
import math
import struct
from pathlib import Path

import numpy as np

from bytesplat_ns.export.splats import Splats, normalized_quats


def synthetic_splats(n: int = 300, sh_degree: int = 3, seed: int = 0) -> Splats:
    """Random Gaussians whose SH coefficients are all non-zero and differ by coefficient and channel, so a
    format that mixes up their order cannot read back the same values."""
    rng = np.random.default_rng(seed)
    k = (sh_degree + 1) ** 2 - 1
    # coefficient k, channel c: a distinct offset of sign (-1)^k, plus per-Gaussian noise
    offsets = np.array([[(-1) ** i * (0.05 + 0.02 * i + 0.007 * c) for c in range(3)] for i in range(k)])
    sh_rest = offsets[None] + rng.normal(0.0, 0.01, size=(n, k, 3))
    return Splats(
        means=rng.uniform(-2.0, 2.0, size=(n, 3)).astype(np.float32),
        log_scales=rng.uniform(-5.0, -1.5, size=(n, 3)).astype(np.float32),
        quats=normalized_quats(rng.normal(size=(n, 4))),
        logit_opacities=rng.uniform(-3.0, 4.0, size=n).astype(np.float32),
        sh0=rng.uniform(-1.5, 1.5, size=(n, 3)).astype(np.float32),
        sh_rest=sh_rest.astype(np.float32),
    )


def quat_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per row, max |a - b| of unit quaternions up to sign (q and -q are one rotation)."""
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return np.minimum(np.abs(a - b).max(axis=1), np.abs(a + b).max(axis=1))


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-np.asarray(x, dtype=np.float64)))


# --- antimatter15 .splat: 32 bytes a Gaussian ---------------------------------------------------------------

def read_splat(path: Path) -> dict:
    raw = np.frombuffer(Path(path).read_bytes(), dtype=np.uint8).reshape(-1, 32)
    return {
        "means": raw[:, 0:12].copy().view("<f4"),
        "scales": raw[:, 12:24].copy().view("<f4"),
        "rgba": raw[:, 24:28].astype(np.float64) / 255.0,
        "quats": (raw[:, 28:32].astype(np.float64) - 128.0) / 128.0,
    }


# --- Niantic SPZ v2/v3 (gzip) ------------------------------------------------------------------------------

def read_spz(path: Path) -> dict:
    data = gzip.decompress(Path(path).read_bytes())
    magic, version, n, degree, frac_bits, _flags, _reserved = struct.unpack_from("<IIIBBBB", data, 0)
    assert magic == 0x5053474E and version in (2, 3), (hex(magic), version)
    k = (degree + 1) ** 2 - 1
    off = 16
    pos = np.frombuffer(data, np.uint8, n * 9, off).reshape(n, 3, 3).astype(np.int32)
    off += n * 9
    fixed = pos[..., 0] | (pos[..., 1] << 8) | (pos[..., 2] << 16)
    fixed = np.where(fixed & 0x800000, fixed - (1 << 24), fixed)  # 24-bit two's complement
    alphas = np.frombuffer(data, np.uint8, n, off).astype(np.float64) / 255.0
    off += n
    colors = np.frombuffer(data, np.uint8, n * 3, off).reshape(n, 3).astype(np.float64)
    off += n * 3
    scales = np.frombuffer(data, np.uint8, n * 3, off).reshape(n, 3).astype(np.float64) / 16.0 - 10.0
    off += n * 3
    if version == 2:
        xyz = np.frombuffer(data, np.uint8, n * 3, off).reshape(n, 3).astype(np.float64) / 127.5 - 1.0
        off += n * 3
        xyzw = np.concatenate([xyz, np.sqrt(np.clip(1 - (xyz**2).sum(1, keepdims=True), 0, 1))], axis=1)
    else:
        words = np.frombuffer(data, "<u4", n, off).astype(np.int64)
        off += n * 4
        xyzw = np.zeros((n, 4))
        for row, word in enumerate(words):
            largest = int(word >> 30)
            for i in (3, 2, 1, 0):  # the last non-largest component sits in the lowest 10 bits
                if i == largest:
                    continue
                mag, neg = word & 511, (word >> 9) & 1
                word >>= 10
                xyzw[row, i] = (-1 if neg else 1) * math.sqrt(0.5) * mag / 511.0
            xyzw[row, largest] = math.sqrt(max(0.0, 1.0 - (xyzw[row] ** 2).sum()))
    sh = np.frombuffer(data, np.uint8, n * k * 3, off).reshape(n, k, 3).astype(np.float64)
    return {
        "means": fixed / float(1 << frac_bits),
        "opacities": alphas,
        "sh0": (colors / 255.0 - 0.5) / 0.15,
        "log_scales": scales,
        "quats": xyzw[:, [3, 0, 1, 2]],  # SPZ stores xyzw
        "sh_rest": (sh - 128.0) / 128.0,
    }


# --- PlayCanvas compressed PLY (read with plyfile) ---------------------------------------------------------

def _unorm(v, bits):
    return (v & ((1 << bits) - 1)).astype(np.float64) / ((1 << bits) - 1)


def read_compressed_ply(path: Path) -> dict:
    from plyfile import PlyData

    ply = PlyData.read(str(path))
    chunk, vertex = ply["chunk"].data, ply["vertex"].data
    n = len(vertex)
    c = np.arange(n) // 256

    def lerp(prefix, names, t):
        return np.stack([chunk[f"min_{prefix}{a}"][c] + (chunk[f"max_{prefix}{a}"][c] - chunk[f"min_{prefix}{a}"][c]) * t[i]
                         for i, a in enumerate(names)], axis=1)

    def p11_10_11(v):
        v = v.astype(np.int64)
        return [_unorm(v >> 21, 11), _unorm(v >> 11, 10), _unorm(v, 11)]

    means = lerp("", "xyz", p11_10_11(vertex["packed_position"]))
    log_scales = lerp("scale_", "xyz", p11_10_11(vertex["packed_scale"]))
    col = vertex["packed_color"].astype(np.int64)
    colors = lerp("", "rgb", [_unorm(col >> 24, 8), _unorm(col >> 16, 8), _unorm(col >> 8, 8)])
    opacities = _unorm(col, 8)
    rot = vertex["packed_rotation"].astype(np.int64)
    norm = 1.0 / (math.sqrt(2.0) * 0.5)
    abc = [(_unorm(rot >> s, 10) - 0.5) * norm for s in (20, 10, 0)]
    largest = rot >> 30
    d = np.sqrt(np.clip(1.0 - sum(x**2 for x in abc), 0.0, 1.0))
    quats = np.zeros((n, 4))
    for m in range(4):
        sel = largest == m
        others = [i for i in range(4) if i != m]
        quats[sel, m] = d[sel]
        for slot, i in enumerate(others):
            quats[sel, i] = abc[slot][sel]
    out = {"means": means, "log_scales": log_scales, "colors": colors, "opacities": opacities, "quats": quats}
    if "sh" in ply:
        sh = ply["sh"].data
        names = sh.dtype.names
        raw = np.stack([sh[f"f_rest_{i}"] for i in range(len(names))], axis=1).astype(np.float64)
        values = np.where(raw == 0, 0.0, (raw + 0.5) / 256.0) * 8.0 - 4.0
        k = len(names) // 3
        out["sh_rest"] = values.reshape(n, 3, k).transpose(0, 2, 1)  # channel-major on disk
    return out
