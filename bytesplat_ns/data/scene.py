"""The built-in synthetic scene: ray-cast textured geometry written in nerfstudio's data format.

The scene is NOT made of Gaussians (so a splatting model cannot represent it trivially): a textured
ground disc, spheres and boxes with procedural textures (checker, stripes, smooth colour noise), Lambertian
shading under one fixed directional light with hard shadows, a small ambient term and a sky gradient
behind. Everything is pure numpy, vectorised over rays, and deterministic: the same :class:`SceneSpec`
gives byte-identical files (on the same numpy build; see ``GENERATOR_VERSION``).

Layout written by :func:`generate_scene` (nerfstudio format, read by ``NerfstudioDataParser``)::

    <scene>/transforms.json        intrinsics (OPENCV, zero distortion), frames, explicit splits,
                                   ply_file_path, and a "bytesplat_scene" provenance block
    <scene>/images/frame_00000.png one PNG per view: RGBA (alpha 0: no geometry) or RGB with a sky
    <scene>/sparse_pc.ply          seed point cloud (binary PLY: float x,y,z + uchar red,green,blue)
    <scene>/.bytesplat_scene.json  completion marker (spec, hash, file sizes), written last

Cameras use nerfstudio's (OpenGL) convention: camera-to-world matrices whose columns are right, up,
back (the camera looks along -z) and the position; world +z is up. Views sit on a spiral over a
hemispherical cap looking at the centre; every ``eval_every``-th view (index ``i % eval_every ==
eval_every // 2``) is held out for evaluation (``val_filenames`` == ``test_filenames``).

:func:`ensure_scene` caches scenes under ``$BYTESPLAT_CACHE/scenes`` (default
``~/.cache/bytesplat_ns/scenes``) as ``<size>-<hash>``: it generates into a temporary directory next
to the target and renames it into place, under a file lock, so concurrent ranks and interrupted runs
never see a half-written scene.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Literal, Optional, Tuple, Union

import numpy as np
from PIL import Image

from bytesplat_ns.errors import BytesplatError

GENERATOR_VERSION = 1
"""Bump whenever the generator's output changes: it is part of the cache key."""

MARKER_NAME = ".bytesplat_scene.json"
TRANSFORMS_NAME = "transforms.json"
PLY_NAME = "sparse_pc.ply"
IMAGES_DIR = "images"

SceneSize = Literal["small", "medium", "large"]
SkyMode = Literal["transparent", "gradient"]

PRESETS: Dict[str, Dict[str, int]] = {
    # small: trains visibly on a laptop CPU in minutes; generates in about a second.
    "small": dict(width=128, height=96, num_views=64, num_points=4000),
    "medium": dict(width=256, height=192, num_views=100, num_points=10000),
    "large": dict(width=800, height=600, num_views=200, num_points=30000),
}

PRESET_SKY: Dict[str, SkyMode] = {
    # The quick start's scene has no sky to learn (RGBA images, alpha 0 there): Gaussians that model a
    # sky can sit anywhere along its rays, also right in front of held-out cameras, and make the eval
    # score swing by dB between runs. medium and large keep the gradient their benchmark figures had.
    "small": "transparent",
    "medium": "gradient",
    "large": "gradient",
}

_EPS = 1e-6
_CHUNK = 1 << 15  # rays per vectorised batch: bounds memory, and keeps temporaries off fresh pages


# ----------------------------------------------------------------------------------------------------
# Spec and cache locations
# ----------------------------------------------------------------------------------------------------


def preset_size(width, height, preset_width: int, preset_height: int, aspect: Tuple[int, int]):
    """(width, height): the preset's when neither is given, the other side from ``aspect`` (width,
    height ratio as two integers) when one is."""
    if width is None and height is None:
        return preset_width, preset_height
    if height is None:
        return width, max(1, int(round(int(width) * aspect[1] / aspect[0])))
    if width is None:
        return max(1, int(round(int(height) * aspect[0] / aspect[1]))), height
    return width, height


def set_integers(spec, what: str, values: Dict[str, object], minimum: Dict[str, int]) -> None:
    """Set each of ``values`` on the frozen ``spec`` as an int, or stop with one error naming the
    field (``minimum``: its least value, 1 unless listed)."""
    for name, value in values.items():
        least = minimum.get(name, 1)
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or int(value) < least:
            kind = "a positive integer" if least == 1 else f"an integer >= {least}"
            raise BytesplatError(f"{what} {name} must be {kind}, got {value!r}")
        object.__setattr__(spec, name, int(value))


def check_views_and_camera(spec, what: str) -> None:
    """The checks both generators share: at least two views, an integer seed, a held-out rate,
    supersampling and a field of view in range; the fields normalised to their types."""
    if spec.num_views < 2:
        raise BytesplatError(f"{what} needs at least 2 views, got num_views={spec.num_views}")
    if not isinstance(spec.seed, (int, np.integer)) or isinstance(spec.seed, bool):
        raise BytesplatError(f"{what} seed must be an integer, got {spec.seed!r}")
    if int(spec.eval_every) < 0 or int(spec.supersample) < 1 or not 1.0 <= float(spec.fov_deg) <= 170.0:
        raise BytesplatError(f"Invalid {what[0].lower() + what[1:]} spec: eval_every={spec.eval_every}, "
                             f"supersample={spec.supersample}, fov_deg={spec.fov_deg}")
    for name, kind in (("seed", int), ("eval_every", int), ("supersample", int), ("fov_deg", float)):
        object.__setattr__(spec, name, kind(getattr(spec, name)))


def held_out_indices(num_views: int, eval_every: int) -> List[int]:
    """Every ``eval_every``-th view (index % eval_every == eval_every // 2); none for 0 or 1."""
    if eval_every <= 1:
        return []
    return [i for i in range(num_views) if i % eval_every == eval_every // 2]


def spec_hash(version_key: str, version: int, fields: Dict) -> str:
    """Cache key: a spec's concrete fields plus its generator's version."""
    key = json.dumps({version_key: version, **fields}, sort_keys=True)
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def cache_path(dirname: str, cache_dir: Optional[Union[str, Path]] = None) -> Path:
    """``cache_dir`` (default :func:`default_cache_dir`) / ``dirname``."""
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    return root / dirname


@dataclass(frozen=True)
class SceneSpec:
    """What to generate. ``None`` fields take the value of the ``size`` preset (see ``PRESETS``).

    Width given without height (or the reverse) keeps the 4:3 aspect ratio. After construction every
    field is concrete, so equal specs compare (and hash) equal however they were written.
    """

    size: SceneSize = "small"
    seed: int = 0
    num_views: Optional[int] = None
    width: Optional[int] = None
    height: Optional[int] = None
    num_points: Optional[int] = None
    eval_every: int = 8
    """Every eval_every-th view is held out for evaluation (0 or 1: no held-out views)."""
    supersample: int = 2
    """Rays per pixel along each axis (anti-aliasing); 1 is faster and aliased."""
    fov_deg: float = 55.0
    """Horizontal field of view."""
    sky: Optional[SkyMode] = None
    """"transparent": RGBA images, alpha 0 where no geometry is hit (as in Blender-style synthetic
    scenes); "gradient": RGB with a sky gradient behind the geometry. None: the size preset's (see
    ``PRESET_SKY``)."""

    def __post_init__(self):
        if self.size not in PRESETS:
            raise BytesplatError(
                f"Unknown built-in scene size '{self.size}'", hint=f"choose one of {', '.join(PRESETS)}"
            )
        preset = PRESETS[self.size]
        width, height = preset_size(self.width, self.height, preset["width"], preset["height"], (4, 3))
        set_integers(self, "Built-in scene", dict(
            width=width,
            height=height,
            num_views=preset["num_views"] if self.num_views is None else self.num_views,
            num_points=preset["num_points"] if self.num_points is None else self.num_points,
        ), {})
        check_views_and_camera(self, "Built-in scene")
        sky = PRESET_SKY[self.size] if self.sky is None else self.sky
        if sky not in PRESET_SKY.values():
            raise BytesplatError(f"Unknown built-in scene sky '{sky}'", hint="choose transparent or gradient")
        object.__setattr__(self, "sky", sky)

    def to_dict(self) -> Dict[str, Union[str, int, float]]:
        return asdict(self)

    @property
    def hash(self) -> str:
        return spec_hash("generator_version", GENERATOR_VERSION, self.to_dict())

    @property
    def dirname(self) -> str:
        return f"{self.size}-{self.hash}"

    def eval_indices(self) -> List[int]:
        return held_out_indices(self.num_views, self.eval_every)


def default_cache_dir() -> Path:
    """``$BYTESPLAT_CACHE/scenes`` if set, else ``$XDG_CACHE_HOME/bytesplat_ns/scenes`` (``~/.cache``)."""
    env = os.environ.get("BYTESPLAT_CACHE")
    if env:
        return Path(env).expanduser() / "scenes"
    xdg = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(xdg).expanduser() / "bytesplat_ns" / "scenes"


def scene_dir(spec: SceneSpec, cache_dir: Optional[Union[str, Path]] = None) -> Path:
    """Where :func:`ensure_scene` keeps ``spec`` (whether or not it exists yet)."""
    return cache_path(spec.dirname, cache_dir)


# ----------------------------------------------------------------------------------------------------
# Scene description
# ----------------------------------------------------------------------------------------------------


def _hsv_to_rgb(h: float, s: float, v: float) -> np.ndarray:
    i = int(h * 6.0) % 6
    f = h * 6.0 - math.floor(h * 6.0)
    p, q, t = v * (1 - s), v * (1 - f * s), v * (1 - (1 - f) * s)
    return np.array([(v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q)][i], dtype=np.float64)


class _ValueNoise:
    """Smooth 3D value noise (smoothstep-interpolated random lattice, periodic), ``channels`` outputs."""

    def __init__(self, rng: np.random.Generator, channels: int, period: int = 32):
        self.period = period
        self.table = rng.random((period, period, period, channels))

    def __call__(self, p: np.ndarray) -> np.ndarray:
        """Noise at points ``p`` (M, 3), or (M, 2) for the z = 0 plane (4 lattice reads instead of 8)."""
        P = self.period
        dims = p.shape[1]
        base = np.floor(p)
        f = p - base
        w = f * f * (3.0 - 2.0 * f)
        i0 = base.astype(np.int64) % P
        i1 = (i0 + 1) % P
        flat = self.table.reshape(P * P * P, -1)
        out = 0.0
        for cx in (0, 1):
            ix = (i1[:, 0] if cx else i0[:, 0]) * (P * P)
            wx = w[:, 0] if cx else 1.0 - w[:, 0]
            for cy in (0, 1):
                ixy = ix + (i1[:, 1] if cy else i0[:, 1]) * P
                wxy = wx * (w[:, 1] if cy else 1.0 - w[:, 1])
                if dims == 2:
                    out = out + wxy[:, None] * flat[ixy]
                    continue
                for cz in (0, 1):
                    idx = ixy + (i1[:, 2] if cz else i0[:, 2])
                    wxyz = wxy * (w[:, 2] if cz else 1.0 - w[:, 2])
                    out = out + wxyz[:, None] * flat[idx]
        return out

    def fbm(self, p: np.ndarray, octaves: int = 3) -> np.ndarray:
        total, amp, norm = 0.0, 1.0, 0.0
        for o in range(octaves):
            total = total + amp * self(p * (2.0**o) + 17.3 * o)
            norm += amp
            amp *= 0.5
        return total / norm


@dataclass
class _Object:
    kind: Literal["sphere", "box"]
    center: np.ndarray
    texture: Literal["checker", "stripes", "noise"]
    colors: np.ndarray  # (2, 3) albedos
    freq: float
    radius: float = 0.0  # sphere
    half: np.ndarray = field(default_factory=lambda: np.zeros(3))  # box half extents (local frame)
    angle: float = 0.0  # box rotation about world z
    axis: np.ndarray = field(default_factory=lambda: np.array([0.0, 0.0, 1.0]))  # stripe axis

    def to_local(self, v: np.ndarray) -> np.ndarray:
        """World vectors (already relative to the centre) -> box frame (rotation about z by -angle)."""
        c, s = math.cos(self.angle), math.sin(self.angle)
        return np.stack([c * v[:, 0] + s * v[:, 1], -s * v[:, 0] + c * v[:, 1], v[:, 2]], axis=1)

    def to_world(self, v: np.ndarray) -> np.ndarray:
        c, s = math.cos(self.angle), math.sin(self.angle)
        return np.stack([c * v[:, 0] - s * v[:, 1], s * v[:, 0] + c * v[:, 1], v[:, 2]], axis=1)


@dataclass
class Scene:
    """The geometry, textures and lighting of one built-in scene (from :func:`build_scene`)."""

    objects: List[_Object]
    ground_radius: float
    ground_colors: np.ndarray  # (3, 3): checker A, checker B, patch colour
    light_dir: np.ndarray
    light_color: np.ndarray
    ambient: float
    sky_horizon: np.ndarray
    sky_zenith: np.ndarray
    sky_below: np.ndarray
    noise1: _ValueNoise
    noise3: _ValueNoise
    look_at: np.ndarray
    camera_radius: float


def build_scene(seed: int = 0) -> Scene:
    """Lay out the objects, palette and noise tables for ``seed`` (independent of image size and views)."""
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, 0x5CE7E])
    noise_rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, 0x7E47])
    hue0 = rng.random()
    golden = 0.618033988749895

    def color(k: int, s: float, v: float) -> np.ndarray:
        return _hsv_to_rgb((hue0 + golden * k) % 1.0, s, v)

    objects: List[_Object] = []
    textures = ("stripes", "checker", "noise")
    # Footprints (x, y, r) of what is already placed, to avoid overlaps.
    placed: List[Tuple[float, float, float]] = []

    def place(r: float) -> np.ndarray:
        for _ in range(200):
            rad = 2.1 * math.sqrt(rng.random())
            phi = 2 * math.pi * rng.random()
            x, y = rad * math.cos(phi), rad * math.sin(phi)
            if all((x - px) ** 2 + (y - py) ** 2 > (r + pr + 0.15) ** 2 for px, py, pr in placed):
                placed.append((x, y, r))
                return np.array([x, y])
        placed.append((0.0, 0.0, r))  # crowded: overlap is harmless for a ray caster
        return np.zeros(2)

    k = 1
    for i in range(3):  # boxes
        half = np.array([rng.uniform(0.22, 0.5), rng.uniform(0.22, 0.5), rng.uniform(0.3, 0.85)])
        xy = place(float(np.hypot(half[0], half[1])))
        objects.append(
            _Object(
                kind="box",
                center=np.array([xy[0], xy[1], half[2]]),
                half=half,
                angle=float(rng.uniform(0, math.pi / 2)),
                texture=textures[(i + 1) % 3],
                colors=np.stack([color(k, 0.75, 0.9), color(k + 3, 0.35, 0.55)]),
                freq=float(rng.uniform(4.0, 7.0)),
            )
        )
        k += 1
    for i in range(4):  # spheres; the last one floats
        r = float(rng.uniform(0.3, 0.6))
        xy = place(r)
        lift = float(rng.uniform(0.5, 0.9)) if i == 3 else 0.0
        axis = rng.normal(size=3)
        objects.append(
            _Object(
                kind="sphere",
                center=np.array([xy[0], xy[1], r + lift]),
                radius=r,
                texture=textures[i % 3],
                colors=np.stack([color(k, 0.8, 0.95), color(k + 2, 0.4, 0.35)]),
                freq=float(rng.uniform(3.0, 6.0)),
                axis=axis / np.linalg.norm(axis),
            )
        )
        k += 1

    light = np.array([0.45, -0.35, 0.82])
    return Scene(
        objects=objects,
        ground_radius=6.0,
        ground_colors=np.stack([color(0, 0.25, 0.8), color(0, 0.45, 0.45), color(5, 0.5, 0.6)]),
        light_dir=light / np.linalg.norm(light),
        light_color=np.array([1.0, 0.96, 0.88]),
        ambient=0.32,
        sky_horizon=np.array([0.86, 0.9, 0.95]),
        sky_zenith=np.array([0.3, 0.5, 0.85]),
        sky_below=np.array([0.55, 0.55, 0.5]),
        noise1=_ValueNoise(noise_rng, 1),
        noise3=_ValueNoise(noise_rng, 3),
        look_at=np.array([0.0, 0.0, 0.35]),
        camera_radius=5.0,
    )


# ----------------------------------------------------------------------------------------------------
# Ray casting
# ----------------------------------------------------------------------------------------------------


def _dot3(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a[..., 0] * b[..., 0] + a[..., 1] * b[..., 1] + a[..., 2] * b[..., 2]


def _sphere_t(o: np.ndarray, d: np.ndarray, center: np.ndarray, radius: float) -> np.ndarray:
    """Nearest positive hit distance along unit ``d`` (inf when missed); ``o`` (1, 3) or (M, 3)."""
    oc = o - center
    b = _dot3(oc, d)
    c = _dot3(oc, oc) - radius * radius
    disc = b * b - c
    sq = np.sqrt(np.maximum(disc, 0.0))
    t0, t1 = -b - sq, -b + sq
    t = np.where(t0 > _EPS, t0, t1)
    return np.where((disc > 0.0) & (t > _EPS), t, np.inf)


def _box_t(o: np.ndarray, d: np.ndarray, obj: _Object) -> np.ndarray:
    """Slab test in the box frame, only for rays that hit the bounding sphere."""
    t_out = _sphere_t(o, d, obj.center, float(np.linalg.norm(obj.half)))
    cand = np.flatnonzero(np.isfinite(t_out))
    if len(cand) == 0:
        return t_out
    oc = o - obj.center
    ol = obj.to_local(oc[cand] if oc.shape[0] > 1 else oc)
    dl = obj.to_local(d[cand])
    dl = np.where(np.abs(dl) < 1e-12, 1e-12, dl)
    inv = 1.0 / dl
    ta = (-obj.half - ol) * inv
    tb = (obj.half - ol) * inv
    lo = np.minimum(ta, tb)
    hi = np.maximum(ta, tb)
    tmin = np.maximum(np.maximum(lo[:, 0], lo[:, 1]), lo[:, 2])
    tmax = np.minimum(np.minimum(hi[:, 0], hi[:, 1]), hi[:, 2])
    t = np.where(tmin > _EPS, tmin, tmax)
    t_out[:] = np.inf
    t_out[cand] = np.where((tmax >= tmin) & (t > _EPS), t, np.inf)
    return t_out


def _ground_t(o: np.ndarray, d: np.ndarray, radius: float) -> np.ndarray:
    oz = o[..., 2]
    down = d[:, 2] < -1e-9
    t = -oz / np.where(down, d[:, 2], -1e-9)
    px = o[..., 0] + t * d[:, 0]
    py = o[..., 1] + t * d[:, 1]
    ok = down & (t > _EPS) & (px * px + py * py < radius * radius)
    return np.where(ok, t, np.inf)


def _nearest(scene: Scene, o: np.ndarray, d: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Nearest hit distance and id per ray: -1 sky, 0 ground, 1+k object k."""
    t = _ground_t(o, d, scene.ground_radius)
    ids = np.where(np.isfinite(t), 0, -1)
    for k, obj in enumerate(scene.objects):
        tk = _sphere_t(o, d, obj.center, obj.radius) if obj.kind == "sphere" else _box_t(o, d, obj)
        closer = tk < t
        t[closer] = tk[closer]
        ids[closer] = k + 1
    return t, ids


def _in_shadow(scene: Scene, p: np.ndarray) -> np.ndarray:
    d = np.broadcast_to(scene.light_dir, p.shape)
    blocked = np.zeros(len(p), dtype=bool)
    for obj in scene.objects:
        tk = _sphere_t(p, d, obj.center, obj.radius) if obj.kind == "sphere" else _box_t(p, d, obj)
        blocked |= np.isfinite(tk)
    return blocked


def _mix(a: np.ndarray, b: np.ndarray, w: np.ndarray) -> np.ndarray:
    return a * (1.0 - w[:, None]) + b * w[:, None]


def _smoothstep(e0: float, e1: float, x: np.ndarray) -> np.ndarray:
    t = np.clip((x - e0) / (e1 - e0), 0.0, 1.0)
    return t * t * (3.0 - 2.0 * t)


def _ground_albedo(scene: Scene, p: np.ndarray) -> np.ndarray:
    a, b, patch = scene.ground_colors
    checker = (np.floor(p[:, 0] / 0.5) + np.floor(p[:, 1] / 0.5)) % 2.0
    col = _mix(np.broadcast_to(a, p.shape), np.broadcast_to(b, p.shape), checker)
    xy = p[:, :2]
    big = scene.noise1.fbm(xy * 0.9 + 3.1, octaves=2)[:, 0]
    col = _mix(col, np.broadcast_to(patch, p.shape), 0.7 * _smoothstep(0.5, 0.62, big))
    grain = scene.noise1(xy * 9.0 + 41.0)[:, 0]
    return col * (0.8 + 0.35 * grain)[:, None]


def _object_albedo(scene: Scene, obj: _Object, p: np.ndarray) -> np.ndarray:
    rel = p - obj.center
    local = obj.to_local(rel) if obj.kind == "box" else rel
    c0 = np.broadcast_to(obj.colors[0], p.shape)
    c1 = np.broadcast_to(obj.colors[1], p.shape)
    if obj.texture == "checker":
        if obj.kind == "sphere":
            n = rel / obj.radius
            u = np.arctan2(n[:, 1], n[:, 0]) / (2 * math.pi) * round(obj.freq * 2)
            v = np.arccos(np.clip(n[:, 2], -1.0, 1.0)) / math.pi * round(obj.freq)
            w = (np.floor(u) + np.floor(v)) % 2.0
        else:
            q = np.floor(local * obj.freq / 2.0 + 1e-4)
            w = q.sum(axis=1) % 2.0
    elif obj.texture == "stripes":
        if obj.kind == "sphere":
            s = (rel / obj.radius) @ obj.axis * obj.freq
        else:
            s = local[:, 2] * obj.freq * 1.5
        w = _smoothstep(-0.25, 0.25, np.sin(2 * math.pi * s))
    else:  # smooth colour noise
        n3 = scene.noise3.fbm(local * obj.freq * 0.6 + obj.freq * 7.0, octaves=2)
        base = _mix(c0, c1, _smoothstep(0.3, 0.7, n3[:, 0]))
        return np.clip(base * (0.6 + 0.8 * n3[:, [1]]) + 0.15 * (n3 - 0.5), 0.0, 1.0)
    return _mix(c0, c1, w)


def _normals(scene: Scene, ids: np.ndarray, p: np.ndarray) -> np.ndarray:
    n = np.zeros_like(p)
    n[:, 2] = 1.0  # ground (and sky, unused)
    for k, obj in enumerate(scene.objects):
        m = ids == k + 1
        if not m.any():
            continue
        rel = p[m] - obj.center
        if obj.kind == "sphere":
            n[m] = rel / np.linalg.norm(rel, axis=1, keepdims=True)
        else:
            local = obj.to_local(rel) / obj.half
            axis = np.abs(local).argmax(axis=1)
            nl = np.zeros_like(local)
            nl[np.arange(len(local)), axis] = np.sign(local[np.arange(len(local)), axis])
            n[m] = obj.to_world(nl)
    return n


def _sky(scene: Scene, d: np.ndarray) -> np.ndarray:
    up = np.clip(d[:, 2], 0.0, 1.0) ** 0.6
    down = _smoothstep(0.0, 0.25, -d[:, 2])
    col = _mix(np.broadcast_to(scene.sky_horizon, d.shape), np.broadcast_to(scene.sky_zenith, d.shape), up)
    return _mix(col, np.broadcast_to(scene.sky_below, d.shape), down)


def shade_rays(scene: Scene, o: np.ndarray, d: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Trace rays from ``o`` ((3,) or (M, 3)) along unit ``d`` (M, 3).

    Returns ``(rgb (M, 3) in [0, 1], t (M,) hit distance (inf: sky), ids (M,) -1 sky / 0 ground / 1+k)``.
    """
    out = np.empty_like(d)
    t_all = np.empty(len(d))
    ids_all = np.empty(len(d), dtype=np.int64)
    for s in range(0, len(d), _CHUNK):
        dd = d[s : s + _CHUNK]
        oo = o[s : s + _CHUNK] if o.ndim == 2 else o.reshape(1, 3)
        t, ids = _nearest(scene, oo, dd)
        col = _sky(scene, dd)
        hit = ids >= 0
        if hit.any():
            dh = dd[hit]
            p = (oo[hit] if oo.shape[0] > 1 else oo) + t[hit, None] * dh
            idh = ids[hit]
            n = _normals(scene, idh, p)
            alb = np.empty_like(p)
            g = idh == 0
            if g.any():
                alb[g] = _ground_albedo(scene, p[g])
            for k, obj in enumerate(scene.objects):
                m = idh == k + 1
                if m.any():
                    alb[m] = _object_albedo(scene, obj, p[m])
            ndotl = np.clip(n @ scene.light_dir, 0.0, None)
            lit = ndotl > 0
            shadow = np.zeros(len(p), dtype=bool)
            if lit.any():
                shadow[lit] = _in_shadow(scene, p[lit] + 1e-4 * n[lit])
            direct = np.where(shadow, 0.0, ndotl)
            amb = scene.ambient * (0.75 + 0.25 * n[:, 2])
            col[hit] = alb * (amb[:, None] + 0.85 * direct[:, None] * scene.light_color)
        out[s : s + _CHUNK] = col
        t_all[s : s + _CHUNK] = t
        ids_all[s : s + _CHUNK] = ids
    return np.clip(out, 0.0, 1.0), t_all, ids_all


# ----------------------------------------------------------------------------------------------------
# Cameras and rendering
# ----------------------------------------------------------------------------------------------------


def intrinsics(spec: SceneSpec) -> Tuple[float, float, float, float]:
    """(fx, fy, cx, cy) in pixels for the spec's image size and field of view (square pixels)."""
    fx = 0.5 * spec.width / math.tan(math.radians(spec.fov_deg) / 2.0)
    return fx, fx, spec.width / 2.0, spec.height / 2.0


def camera_poses(spec: SceneSpec, scene: Optional[Scene] = None) -> np.ndarray:
    """(num_views, 4, 4) camera-to-world matrices, nerfstudio/OpenGL convention, world z up.

    A Fibonacci spiral over a cap (elevation 15..60 degrees), with a small seeded jitter in distance
    and aim, so held-out views (every eval_every-th) fall between training views.
    """
    scene = scene or build_scene(spec.seed)
    rng = np.random.default_rng([spec.seed & 0xFFFFFFFF, 0xCA3])
    n = spec.num_views
    poses = np.zeros((n, 4, 4))
    golden_angle = math.pi * (3.0 - math.sqrt(5.0))
    for i in range(n):
        frac = (i + 0.5) / n
        elev = math.radians(15.0 + 45.0 * frac)
        azim = i * golden_angle
        radius = scene.camera_radius * (1.0 + rng.uniform(-0.08, 0.08))
        pos = scene.look_at + radius * np.array(
            [math.cos(elev) * math.cos(azim), math.cos(elev) * math.sin(azim), math.sin(elev)]
        )
        target = scene.look_at + rng.uniform(-0.12, 0.12, size=3)
        fwd = target - pos
        fwd /= np.linalg.norm(fwd)
        right = np.cross(fwd, [0.0, 0.0, 1.0])
        right /= np.linalg.norm(right)
        up = np.cross(right, fwd)
        poses[i, :3, 0], poses[i, :3, 1], poses[i, :3, 2], poses[i, :3, 3] = right, up, -fwd, pos
        poses[i, 3, 3] = 1.0
    return poses


def render_view(
    scene: Scene, c2w: np.ndarray, spec: SceneSpec, supersample: Optional[int] = None
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Render one view: ``(rgb float (H, W, 3) in [0, 1], depth (H, W), alpha (H, W))``.

    Depth is the camera-space z distance of the nearest sub-pixel hit (inf where only sky is seen);
    alpha is the fraction of sub-pixel rays that hit geometry. With ``spec.sky == "transparent"`` rgb
    is the mean colour of the rays that hit (the sky where none does), to be composited with alpha;
    otherwise the mean of all rays, sky included. Pixel centres are at ``+0.5`` (nerfstudio and
    gsplat's convention).
    """
    ss = spec.supersample if supersample is None else int(supersample)
    fx, fy, cx, cy = intrinsics(spec)
    H, W = spec.height, spec.width
    offs = (np.arange(ss) + 0.5) / ss
    ys = (np.arange(H)[:, None] + offs[None, :]).reshape(-1)
    xs = (np.arange(W)[:, None] + offs[None, :]).reshape(-1)
    X, Y = np.meshgrid((xs - cx) / fx, -(ys - cy) / fy)  # (H*ss, W*ss)
    dirs_cam = np.stack([X, Y, -np.ones_like(X)], axis=-1).reshape(-1, 3)
    dirs = dirs_cam @ c2w[:3, :3].T
    norm = np.linalg.norm(dirs, axis=1, keepdims=True)
    rgb, t, ids = shade_rays(scene, c2w[:3, 3].copy(), dirs / norm)
    zdepth = t / norm[:, 0]  # camera-space z: dir_cam has z = -1, so z = t / |dir_cam|
    hit = (ids >= 0).reshape(H, ss, W, ss, 1).astype(np.float64)
    rgb = rgb.reshape(H, ss, W, ss, 3)
    alpha = hit.mean(axis=(1, 3))
    if spec.sky == "transparent":
        # un-premultiplied: alpha * rgb + (1 - alpha) * background reproduces a coverage-weighted edge
        rgb_hit = (rgb * hit).sum(axis=(1, 3)) / np.maximum(hit.sum(axis=(1, 3)), 1.0)
        rgb = np.where(alpha > 0, rgb_hit, rgb.mean(axis=(1, 3)))
    else:
        rgb = rgb.mean(axis=(1, 3))
    depth = zdepth.reshape(H, ss, W, ss).min(axis=(1, 3))
    return rgb, depth, alpha[..., 0]


def _to_uint8(rgb: np.ndarray) -> np.ndarray:
    return np.clip(np.floor(rgb * 255.0 + 0.5), 0, 255).astype(np.uint8)


def sample_points(
    scene: Scene, spec: SceneSpec, poses: np.ndarray, train_indices: List[int]
) -> Tuple[np.ndarray, np.ndarray]:
    """Seed point cloud like a sparse SfM one: surface points seen from training views, with the colour
    they are seen with, jittered (position sigma 0.01, colour sigma 3/255). Returns (xyz float32 (N, 3),
    rgb uint8 (N, 3)), N = spec.num_points."""
    rng = np.random.default_rng([spec.seed & 0xFFFFFFFF, 0x9C5])
    fx, fy, cx, cy = intrinsics(spec)
    xyz_parts, rgb_parts, have = [], [], 0
    for _ in range(64):
        m = max(256, 2 * (spec.num_points - have))
        views = np.asarray(train_indices)[rng.integers(0, len(train_indices), size=m)]
        px = rng.random(m) * spec.width
        py = rng.random(m) * spec.height
        dc = np.stack([(px - cx) / fx, -(py - cy) / fy, -np.ones(m)], axis=1)
        R = poses[views, :3, :3]
        d = np.einsum("mij,mj->mi", R, dc)
        d /= np.linalg.norm(d, axis=1, keepdims=True)
        o = poses[views, :3, 3]
        rgb, t, ids = shade_rays(scene, o, d)
        hit = ids >= 0
        xyz_parts.append(o[hit] + t[hit, None] * d[hit])
        rgb_parts.append(rgb[hit])
        have += int(hit.sum())
        if have >= spec.num_points:
            break
    xyz = np.concatenate(xyz_parts)[: spec.num_points]
    rgb = np.concatenate(rgb_parts)[: spec.num_points]
    xyz = xyz + rng.normal(scale=0.01, size=xyz.shape)
    rgb = rgb + rng.normal(scale=3.0 / 255.0, size=rgb.shape)
    return xyz.astype(np.float32), _to_uint8(rgb)


def write_ply(path: Union[str, Path], xyz: np.ndarray, rgb: np.ndarray) -> None:
    """Binary little-endian PLY with float x, y, z and uchar red, green, blue (read by open3d/plyfile)."""
    xyz = np.asarray(xyz, dtype="<f4")
    rgb = np.asarray(rgb, dtype=np.uint8)
    n = len(xyz)
    header = (
        "ply\nformat binary_little_endian 1.0\n"
        f"element vertex {n}\n"
        "property float x\nproperty float y\nproperty float z\n"
        "property uchar red\nproperty uchar green\nproperty uchar blue\n"
        "end_header\n"
    )
    rec = np.empty(n, dtype=[("x", "<f4"), ("y", "<f4"), ("z", "<f4"), ("r", "u1"), ("g", "u1"), ("b", "u1")])
    rec["x"], rec["y"], rec["z"] = xyz[:, 0], xyz[:, 1], xyz[:, 2]
    rec["r"], rec["g"], rec["b"] = rgb[:, 0], rgb[:, 1], rgb[:, 2]
    with open(path, "wb") as f:
        f.write(header.encode("ascii"))
        f.write(rec.tobytes())


def read_ply(path: Union[str, Path]) -> Tuple[np.ndarray, Optional[np.ndarray]]:
    """Read a PLY's vertex positions (float64 (N, 3)) and colours (uint8 (N, 3), or None if absent).

    Uses plyfile (ASCII and binary PLY). Raises ValueError if there is no vertex element with x, y, z.
    """
    from plyfile import PlyData

    ply = PlyData.read(str(path))
    try:
        vertex = ply["vertex"]
    except KeyError as e:
        raise ValueError("no 'vertex' element") from e
    names = vertex.data.dtype.names or ()
    if not all(c in names for c in ("x", "y", "z")):
        raise ValueError("vertex element has no x, y, z properties")
    xyz = np.stack([np.asarray(vertex[c], dtype=np.float64) for c in ("x", "y", "z")], axis=1)
    rgb = None
    for keys in (("red", "green", "blue"), ("r", "g", "b"), ("diffuse_red", "diffuse_green", "diffuse_blue")):
        if all(c in names for c in keys):
            cols = np.stack([np.asarray(vertex[c]) for c in keys], axis=1)
            if np.issubdtype(cols.dtype, np.floating):
                cols = np.clip(np.floor(cols * 255.0 + 0.5), 0, 255)  # float colours are in [0, 1]
            elif cols.dtype.itemsize > 1:
                cols = cols * (255.0 / float(np.iinfo(cols.dtype).max))  # e.g. ushort colours
            rgb = np.asarray(cols).round().astype(np.uint8)
            break
    return xyz, rgb


# ----------------------------------------------------------------------------------------------------
# Generation and cache
# ----------------------------------------------------------------------------------------------------


def _console():
    from nerfstudio.utils.rich_utils import CONSOLE

    return CONSOLE


def _round(x: float) -> float:
    return float(round(float(x), 10)) + 0.0  # +0.0 turns -0.0 into 0.0


_LAST_SCENE: List[Tuple[SceneSpec, Scene, np.ndarray]] = []  # one-entry cache per process


def _render_and_save(spec: SceneSpec, index: int, path: str) -> None:
    """Render view ``index`` of ``spec`` and write it as PNG (also the worker-process entry point)."""
    if not _LAST_SCENE or _LAST_SCENE[0][0] != spec:
        scene = build_scene(spec.seed)
        _LAST_SCENE[:] = [(spec, scene, camera_poses(spec, scene))]
    _, scene, poses = _LAST_SCENE[0]
    rgb, _, alpha = render_view(scene, poses[index], spec)
    if spec.sky == "transparent":
        pixels = np.concatenate([_to_uint8(rgb), _to_uint8(alpha[..., None])], axis=-1)
        Image.fromarray(pixels, mode="RGBA").save(path, format="PNG", compress_level=6)
    else:
        Image.fromarray(_to_uint8(rgb), mode="RGB").save(path, format="PNG", compress_level=6)


def _num_workers(spec: SceneSpec, workers: Optional[int] = None) -> int:
    """Processes for rendering: ``workers`` when given (the dataparser's ``scene_workers``), else 1
    for small scenes (process start-up would dominate) and up to 16 for large ones."""
    if workers is not None:
        return max(1, int(workers))
    rays = spec.num_views * spec.width * spec.height * spec.supersample**2
    if rays < 12_000_000:
        return 1
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if cpus < 4:  # process start-up would eat what two cores gain
        return 1
    return max(1, min(16, cpus, spec.num_views))


def generate_scene(spec: Optional[SceneSpec] = None, out_dir: Union[str, Path] = ".", progress: bool = True,
                   workers: Optional[int] = None) -> Path:
    """Write the scene for ``spec`` into ``out_dir`` (created if needed; existing files are overwritten),
    rendering in ``workers`` processes (None: as :func:`_num_workers` chooses; same bytes either way).

    No caching or atomicity here: :func:`ensure_scene` wraps this. Returns ``out_dir``.
    """
    spec = spec or SceneSpec()
    out = Path(out_dir)
    (out / IMAGES_DIR).mkdir(parents=True, exist_ok=True)
    scene = build_scene(spec.seed)
    poses = camera_poses(spec, scene)
    eval_set = set(spec.eval_indices())
    train_indices = [i for i in range(spec.num_views) if i not in eval_set]
    names = [f"{IMAGES_DIR}/frame_{i:05d}.png" for i in range(spec.num_views)]

    workers = _num_workers(spec, workers)

    def render_all(update) -> None:
        if workers <= 1:
            for i in range(spec.num_views):
                _render_and_save(spec, i, str(out / names[i]))
                update()
            return
        # Views are independent, so rendering them in other processes changes no byte of the output.
        # spawn (not fork): the caller may hold CUDA or threads (ns-train).
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as ex:
            futures = [ex.submit(_render_and_save, spec, i, str(out / names[i])) for i in range(spec.num_views)]
            for fut in as_completed(futures):
                fut.result()
                update()

    if progress:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        console = _console()
        with Progress(
            TextColumn(f"[bold]Generating built-in scene '{spec.size}' ({spec.width}x{spec.height})"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("views"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        ) as bar:
            task = bar.add_task("render", total=spec.num_views)
            render_all(lambda: bar.advance(task))
    else:
        render_all(lambda: None)

    xyz, rgb = sample_points(scene, spec, poses, train_indices)
    write_ply(out / PLY_NAME, xyz, rgb)

    fx, fy, cx, cy = intrinsics(spec)
    transforms = {
        "camera_model": "OPENCV",
        "fl_x": _round(fx),
        "fl_y": _round(fy),
        "cx": _round(cx),
        "cy": _round(cy),
        "w": spec.width,
        "h": spec.height,
        "k1": 0.0,
        "k2": 0.0,
        "p1": 0.0,
        "p2": 0.0,
        "frames": [
            {"file_path": names[i], "transform_matrix": [[_round(v) for v in row] for row in poses[i].tolist()]}
            for i in range(spec.num_views)
        ],
        "ply_file_path": PLY_NAME,
        "train_filenames": [names[i] for i in train_indices],
        "val_filenames": [names[i] for i in sorted(eval_set)],
        "test_filenames": [names[i] for i in sorted(eval_set)],
        "bytesplat_scene": {"generator_version": GENERATOR_VERSION, "hash": spec.hash, "spec": spec.to_dict()},
    }
    (out / TRANSFORMS_NAME).write_text(json.dumps(transforms, indent=2) + "\n", encoding="utf-8")
    return out


def _file_sizes(root: Path) -> Dict[str, int]:
    sizes = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.name != MARKER_NAME:
            sizes[p.relative_to(root).as_posix()] = p.stat().st_size
    return sizes


def _write_marker(root: Path, spec: SceneSpec) -> None:
    marker = {
        "generator_version": GENERATOR_VERSION,
        "hash": spec.hash,
        "spec": spec.to_dict(),
        "files": _file_sizes(root),
    }
    (root / MARKER_NAME).write_text(json.dumps(marker, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def is_complete(path: Union[str, Path], spec: Optional[SceneSpec] = None) -> bool:
    """True if ``path`` holds a complete generated scene (of ``spec``, if given): its marker is valid
    and every file it lists exists with the recorded size."""
    path = Path(path)
    try:
        marker = json.loads((path / MARKER_NAME).read_text(encoding="utf-8"))
        if marker.get("generator_version") != GENERATOR_VERSION:
            return False
        if spec is not None and marker.get("hash") != spec.hash:
            return False
        files = marker["files"]
        if TRANSFORMS_NAME not in files or PLY_NAME not in files:
            return False
        return all((path / rel).stat().st_size == size for rel, size in files.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Exclusive advisory lock (POSIX flock); a no-op where flock is unavailable."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - non-POSIX
        yield
        return
    with open(path, "a+b") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        except OSError:  # e.g. some network filesystems: the rename below is still atomic
            yield
            return
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _remove_tree(path: Path) -> None:
    """Move ``path`` aside, then delete it, so a crash never leaves a half-deleted scene at ``path``."""
    if path.is_symlink() or path.is_file():
        path.unlink()
        return
    trash = path.with_name(f".{path.name}.trash-{os.getpid()}-{time.monotonic_ns()}")
    os.rename(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


def ensure_scene(spec: Optional[SceneSpec] = None, cache_dir: Optional[Union[str, Path]] = None,
                 workers: Optional[int] = None) -> Path:
    """Path of the generated scene for ``spec`` (default: small), generating it on first use (in
    ``workers`` processes, see :func:`generate_scene`).

    ``cache_dir`` is the directory holding the scenes (default :func:`default_cache_dir`). An existing
    complete scene is returned as is; an incomplete or broken one is replaced. Safe to call from several
    processes at once (one generates, the others wait and reuse it).
    """
    spec = spec or SceneSpec()
    target = scene_dir(spec, cache_dir)
    if is_complete(target, spec):
        return target
    root = target.parent
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BytesplatError(
            f"Cannot create the scene cache directory {root}: {e.strerror or e}",
            hint="set BYTESPLAT_CACHE to a writable directory",
        ) from e
    console = _console()
    try:
        with _file_lock(root / f".{spec.dirname}.lock"):
            if is_complete(target, spec):  # another process finished it while we waited
                return target
            # We hold the lock: leftovers of this scene are from interrupted runs.
            for stale in root.glob(f".{spec.dirname}.tmp-*"):
                shutil.rmtree(stale, ignore_errors=True)
            if target.exists() or target.is_symlink():
                console.print(f"[yellow]Cached scene {target} is incomplete or stale; regenerating it.")
                _remove_tree(target)
            tmp = Path(tempfile.mkdtemp(prefix=f".{spec.dirname}.tmp-", dir=root))
            try:
                os.chmod(tmp, 0o755)
                start = time.perf_counter()
                generate_scene(spec, tmp, workers=workers)
                _write_marker(tmp, spec)
                os.rename(tmp, target)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                if is_complete(target, spec):  # lost a race on a filesystem without flock
                    return target
                raise
    except OSError as e:
        raise BytesplatError(
            f"Could not write the built-in scene to {root}: {e.strerror or e}",
            hint="check free disk space, or set BYTESPLAT_CACHE to another writable directory",
        ) from e
    console.log(
        f"[green]Built-in scene '{spec.size}' ready[/green] ({spec.num_views} views at {spec.width}x{spec.height}, "
        f"{spec.num_points} seed points, {time.perf_counter() - start:.1f} s): {target}"
    )
    return target
