"""PlayCanvas SOG ("spatially ordered Gaussians", meta version 2), written by hand: no maintained Python
library writes it (gsply 0.4.6 only reads it; the tests use that reader).

A .sog file is a zip of ``meta.json`` and lossless WebP images, one pixel per Gaussian (row-major):
- ``means_l.webp`` / ``means_u.webp``: low / high bytes of 16-bit positions, quantised between
  ``means.mins`` and ``means.maxs`` after the log transform sign(x) ln(|x| + 1) (finer near the centre);
- ``quats.webp``: smallest-three quaternion, RGB = the three other components scaled from
  [-1/sqrt2, 1/sqrt2] to 0..255, A = 252 + index (wxyz) of the largest, which is made positive;
- ``scales.webp``: RGB = indices into the 256-entry ``scales.codebook`` of log-scales;
- ``sh0.webp``: RGB = indices into ``sh0.codebook`` of DC coefficients, A = sigmoid(opacity) * 255;
- ``shN_centroids.webp`` / ``shN_labels.webp`` (SH degree > 0): a palette of ``shN.count`` SH vectors,
  64 entries a row, one pixel per coefficient with RGB = indices into ``shN.codebook``; the labels'
  R + 256 G is each Gaussian's palette entry.
Codebooks are 1D k-means of the values they encode. The palette has one entry per Gaussian up to
``MAX_PALETTE`` Gaussians (then only the codebook quantises SH) and is a k-means of the SH vectors beyond.
"""

from __future__ import annotations

import io
import json
import math
import zipfile
from pathlib import Path

import numpy as np

from bytesplat_ns.export.splats import Splats

MAX_PALETTE = 65536  # 16-bit labels
CODEBOOK_SIZE = 256
PALETTE_ROW = 64
_KMEANS_ITERATIONS = 10
_ASSIGN_CHUNK = 1024  # rows per distance block: 1024 x 65536 float32 = 256 MiB


def _webp(rgba: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    # exact: keep RGB under alpha 0 (those bytes are data here, not colour)
    Image.fromarray(rgba, "RGBA").save(buf, format="WEBP", lossless=True, quality=100, exact=True)
    return buf.getvalue()


def _texture_size(count: int):
    width = max(4, int(math.ceil(math.sqrt(count) / 4.0)) * 4)
    height = max(4, int(math.ceil(count / width / 4.0)) * 4)
    return width, height


def _image(channels: np.ndarray, size) -> bytes:
    """One pixel per row of ``channels`` [N, 4] uint8, row-major in a width x height image."""
    width, height = size
    img = np.zeros((width * height, 4), np.uint8)
    img[: len(channels)] = channels
    return _webp(img.reshape(height, width, 4))


def codebook_1d(values: np.ndarray, size: int = CODEBOOK_SIZE):
    """(sorted codebook [<= size] float32, index of each value's nearest entry) by 1D k-means."""
    values = values.astype(np.float64).reshape(-1)
    centres = np.unique(np.quantile(values, (np.arange(size) + 0.5) / size))
    for _ in range(_KMEANS_ITERATIONS):
        labels = _nearest_sorted(values, centres)
        sums = np.bincount(labels, weights=values, minlength=len(centres))
        counts = np.bincount(labels, minlength=len(centres))
        used = counts > 0
        centres = np.unique(np.where(used, sums / np.maximum(counts, 1), centres))
    centres = centres.astype(np.float32)
    return centres, _nearest_sorted(values, centres.astype(np.float64))


def _nearest_sorted(values: np.ndarray, centres: np.ndarray) -> np.ndarray:
    mids = (centres[1:] + centres[:-1]) / 2.0
    return np.searchsorted(mids, values).astype(np.int64)


def _palette(sh: np.ndarray):
    """(palette [P, D], label of each Gaussian) for SH vectors [N, D]."""
    n = len(sh)
    if n <= MAX_PALETTE:
        return sh, np.arange(n)
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    data = torch.from_numpy(sh).float().to(device)
    gen = torch.Generator(device="cpu").manual_seed(0)
    centres = data[torch.randperm(n, generator=gen)[:MAX_PALETTE].to(device)].clone()
    for _ in range(_KMEANS_ITERATIONS):
        labels = _nearest_rows(data, centres)
        sums = torch.zeros_like(centres).index_add_(0, labels, data)
        counts = torch.bincount(labels, minlength=MAX_PALETTE).unsqueeze(1)
        centres = torch.where(counts > 0, sums / counts.clamp(min=1), centres)
    labels = _nearest_rows(data, centres)
    return centres.cpu().numpy(), labels.cpu().numpy()


def _nearest_rows(data, centres):
    import torch

    return torch.cat([torch.cdist(chunk, centres).argmin(dim=1) for chunk in data.split(_ASSIGN_CHUNK)])


def _smallest_three(quats: np.ndarray) -> np.ndarray:
    q = quats / np.linalg.norm(quats, axis=1, keepdims=True)
    largest = np.abs(q).argmax(axis=1)
    q = np.where(np.take_along_axis(q, largest[:, None], 1) < 0, -q, q)
    others = q[np.arange(4)[None, :] != largest[:, None]].reshape(-1, 3)  # the three, in wxyz order
    out = np.empty((len(q), 4), np.uint8)
    out[:, :3] = np.clip(np.round((others * math.sqrt(2.0) * 0.5 + 0.5) * 255.0), 0, 255)
    out[:, 3] = 252 + largest
    return out


def sog_entries(splats: Splats) -> dict:
    """The files of the SOG bundle: name -> bytes."""
    n = len(splats)
    size = _texture_size(n)
    rgba = np.full((n, 4), 255, np.uint8)

    logged = np.sign(splats.means) * np.log1p(np.abs(splats.means.astype(np.float64)))
    mins, maxs = logged.min(axis=0), logged.max(axis=0)
    q16 = np.round((logged - mins) / np.where(maxs > mins, maxs - mins, 1.0) * 65535.0).astype(np.uint32)
    low, high = rgba.copy(), rgba.copy()
    low[:, :3], high[:, :3] = q16 & 0xFF, q16 >> 8

    scale_book, scale_idx = codebook_1d(splats.log_scales)
    scales = rgba.copy()
    scales[:, :3] = scale_idx.reshape(n, 3)

    dc_book, dc_idx = codebook_1d(splats.sh0)
    sh0 = np.empty((n, 4), np.uint8)
    sh0[:, :3] = dc_idx.reshape(n, 3)
    sh0[:, 3] = np.clip(np.round(splats.opacities() * 255.0), 0, 255)

    meta = {
        "version": 2,
        "count": n,
        "means": {"mins": mins.tolist(), "maxs": maxs.tolist(), "files": ["means_l.webp", "means_u.webp"]},
        "scales": {"codebook": scale_book.tolist(), "files": ["scales.webp"]},
        "quats": {"files": ["quats.webp"]},
        "sh0": {"codebook": dc_book.tolist(), "files": ["sh0.webp"]},
    }
    entries = {
        "means_l.webp": _image(low, size), "means_u.webp": _image(high, size),
        "scales.webp": _image(scales, size), "quats.webp": _image(_smallest_three(splats.quats), size),
        "sh0.webp": _image(sh0, size),
    }
    k = splats.sh_rest.shape[1]
    if k:
        palette, labels = _palette(splats.sh_rest.reshape(n, k * 3))
        sh_book, sh_idx = codebook_1d(palette)
        p = len(palette)
        rows = int(math.ceil(p / PALETTE_ROW))
        centroids = np.zeros((rows * PALETTE_ROW * k, 4), np.uint8)
        centroids[: p * k, :3] = sh_idx.reshape(p * k, 3)  # entry-major, then coefficient, then channel
        centroids[:, 3] = 255
        label_px = rgba.copy()
        label_px[:, 0], label_px[:, 1], label_px[:, 2] = labels & 0xFF, labels >> 8, 0
        meta["shN"] = {"count": p, "bands": splats.sh_degree, "codebook": sh_book.tolist(),
                       "files": ["shN_centroids.webp", "shN_labels.webp"]}
        entries["shN_centroids.webp"] = _webp(centroids.reshape(rows, PALETTE_ROW * k, 4))
        entries["shN_labels.webp"] = _image(label_px, size)
    entries["meta.json"] = json.dumps(meta).encode()
    return entries


def write_sog(path: Path, splats: Splats) -> None:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as bundle:  # WebP is compressed already
        for name, data in sog_entries(splats).items():
            bundle.writestr(name, data)
