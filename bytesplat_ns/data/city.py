"""City-scale synthetic scene for scale benchmarks: a grid of textured buildings, aerial and street views.

Built on :mod:`bytesplat_ns.data.scene` (same ray casting, shading, noise, PLY writer, nerfstudio layout):

- a ``blocks x blocks`` grid of city blocks separated by streets (asphalt, dashed centre lines,
  sidewalks); each block is a park with trees (sphere canopies on box trunks) or holds 1, 2 or 4
  buildings (boxes of varied heights, taller towards the centre) with procedural facades: window
  grids with per-window variation, glass bands (stripes) or noisy concrete, and roofs, some with a
  dome (sphere). Fields around the city, sky gradient, one sun with hard shadows.
- cameras: ``aerial_views`` (alternately orbits around the whole city and closer views over a
  jittered grid of targets, pitched down 45-70 degrees) and ``street_views`` (eye height along the
  street centre lines, looking along the street or at the facades). Thousands of views and up to 4K
  (3840x2160) are a matter of the spec; rendering is tiled (bounded memory) and each tile only tests
  the objects in its view cone (and, for shadows, those that can lie between its points and the sun).

Generation is RESUMABLE: images are rendered one by one (in parallel worker processes for big specs,
as scene.py does), each written atomically (temporary file, then rename) and recorded in a journal
(``.bytesplat_city_progress.jsonl``: file, size, sha256). A restart in the same directory verifies
the journal's images (size and hash) and renders only what is missing or damaged. The seed point
cloud, transforms.json and finally the completion marker are written after the last image; only
the marker makes the directory count as complete. Output is deterministic: the same
:class:`CitySpec` gives byte-identical files whether generated in one go, resumed, serially or in
parallel.

Pre-generate on a CPU machine (then point ``--data`` at the printed directory, or use
``--pipeline.datamanager.dataparser.scene-size city``)::

    python -m bytesplat_ns.data.city --preset large --cache-dir /data/bytesplat
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import io
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, List, Literal, Optional, Tuple, Union

import numpy as np
from PIL import Image

from bytesplat_ns.data import scene as S
from bytesplat_ns.errors import BytesplatError

CITY_GENERATOR_VERSION = 1
"""Bump whenever the city generator's output changes: it is part of the cache key."""

CITY_MARKER_NAME = ".bytesplat_city.json"
JOURNAL_NAME = ".bytesplat_city_progress.jsonl"
TRANSFORMS_NAME = S.TRANSFORMS_NAME
PLY_NAME = S.PLY_NAME
IMAGES_DIR = S.IMAGES_DIR

CityPreset = Literal["tiny", "small", "medium", "large", "4k"]

CITY_PRESETS: Dict[str, Dict[str, int]] = {
    # tiny: tests (a fraction of a second).
    "tiny": dict(blocks=2, aerial_views=8, street_views=4, width=64, height=36, num_points=500),
    "small": dict(blocks=4, aerial_views=96, street_views=32, width=320, height=180, num_points=20_000),
    "medium": dict(blocks=8, aerial_views=600, street_views=200, width=960, height=540, num_points=100_000),
    "large": dict(blocks=16, aerial_views=3000, street_views=1000, width=1920, height=1080, num_points=500_000),
    "4k": dict(blocks=24, aerial_views=4000, street_views=1000, width=3840, height=2160, num_points=1_000_000),
}

PITCH = 4.0  # block + street, scene units (1 unit ~ 10 m)
STREET = 1.0  # street width
SIDEWALK = 0.25
EYE_HEIGHT = 0.17
_TILE = 64  # pixels per tile side when rendering


# ----------------------------------------------------------------------------------------------------
# Spec
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CitySpec:
    """What to generate. ``None`` fields take the ``preset``'s value (see ``CITY_PRESETS``).

    Width without height (or the reverse) keeps 16:9. After construction every field is concrete.
    """

    preset: CityPreset = "small"
    seed: int = 0
    blocks: Optional[int] = None
    """City blocks per side (blocks x blocks)."""
    aerial_views: Optional[int] = None
    street_views: Optional[int] = None
    width: Optional[int] = None
    height: Optional[int] = None
    num_points: Optional[int] = None
    eval_every: int = 8
    """Every eval_every-th view (index % eval_every == eval_every // 2) is held out (0/1: none)."""
    supersample: int = 1
    """Rays per pixel along each axis (anti-aliasing)."""
    fov_deg: float = 60.0
    """Horizontal field of view."""
    aerial_pitch_deg: Tuple[float, float] = (45.0, 70.0)
    """Range of the aerial views' downward pitch."""

    def __post_init__(self):
        if self.preset not in CITY_PRESETS:
            raise BytesplatError(
                f"Unknown city preset '{self.preset}'", hint=f"choose one of {', '.join(CITY_PRESETS)}"
            )
        p = CITY_PRESETS[self.preset]
        width, height = S.preset_size(self.width, self.height, p["width"], p["height"], (16, 9))
        S.set_integers(self, "City scene", dict(
            blocks=p["blocks"] if self.blocks is None else self.blocks,
            aerial_views=p["aerial_views"] if self.aerial_views is None else self.aerial_views,
            street_views=p["street_views"] if self.street_views is None else self.street_views,
            width=width,
            height=height,
            num_points=p["num_points"] if self.num_points is None else self.num_points,
        ), {"aerial_views": 0, "street_views": 0})
        if self.width > 8192 or self.height > 8192:
            raise BytesplatError(f"City scene resolution {self.width}x{self.height} is above 8192 pixels a side")
        S.check_views_and_camera(self, "City scene")
        lo, hi = (float(x) for x in self.aerial_pitch_deg)
        if not 5.0 <= lo <= hi <= 89.0:
            raise BytesplatError(f"aerial_pitch_deg must satisfy 5 <= low <= high <= 89, got {self.aerial_pitch_deg}")
        object.__setattr__(self, "aerial_pitch_deg", (lo, hi))

    @property
    def num_views(self) -> int:
        return self.aerial_views + self.street_views

    def to_dict(self) -> Dict[str, object]:
        d = asdict(self)
        d["aerial_pitch_deg"] = list(self.aerial_pitch_deg)
        return d

    @property
    def hash(self) -> str:
        return S.spec_hash("city_generator_version", CITY_GENERATOR_VERSION, self.to_dict())

    @property
    def dirname(self) -> str:
        return f"city-{self.preset}-{self.hash}"

    def eval_indices(self) -> List[int]:
        return S.held_out_indices(self.num_views, self.eval_every)

    def image_name(self, i: int) -> str:
        return f"{IMAGES_DIR}/frame_{i:05d}.png"


def city_dir(spec: CitySpec, cache_dir: Optional[Union[str, Path]] = None) -> Path:
    return S.cache_path(spec.dirname, cache_dir)


# ----------------------------------------------------------------------------------------------------
# Scene description
# ----------------------------------------------------------------------------------------------------


@dataclass
class _Building(S._Object):
    """A box with a facade: style 'windows' | 'stripes' | 'noise'; colors = (wall, glass, roof)."""

    style: str = "windows"
    floor_h: float = 0.3
    bay_w: float = 0.25
    tag: float = 0.0  # per-building offset into the noise table (window variation)


@dataclass
class CityScene(S.Scene):
    blocks: int = 1
    half_extent: float = 1.0
    centers: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0, 3)))
    radii: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))


def _bounding_spheres(objects: List[S._Object]) -> Tuple[np.ndarray, np.ndarray]:
    centers = np.array([o.center for o in objects]).reshape(-1, 3)
    radii = np.array([o.radius if o.kind == "sphere" else float(np.linalg.norm(o.half)) for o in objects])
    return centers, radii


def build_city(spec: CitySpec) -> CityScene:
    """Lay out blocks, buildings, trees and palette (depends on seed and blocks only)."""
    rng = np.random.default_rng([spec.seed & 0xFFFFFFFF, 0xC17E])
    noise_rng = np.random.default_rng([spec.seed & 0xFFFFFFFF, 0x7E47C])
    G = spec.blocks
    H = G * PITCH / 2.0
    inner = PITCH - STREET - 2 * SIDEWALK  # buildable side of a block
    objects: List[S._Object] = []
    styles = ("windows", "windows", "stripes", "noise")

    def tree(x: float, y: float) -> None:
        trunk_h = float(rng.uniform(0.12, 0.22))
        r = float(rng.uniform(0.16, 0.3))
        objects.append(
            S._Object(
                kind="box", center=np.array([x, y, trunk_h / 2]), half=np.array([0.03, 0.03, trunk_h / 2]),
                texture="stripes", colors=np.array([[0.36, 0.25, 0.15], [0.25, 0.17, 0.1]]), freq=8.0,
            )
        )
        g = float(rng.uniform(0.0, 0.08))
        objects.append(
            S._Object(
                kind="sphere", center=np.array([x, y, trunk_h + 0.8 * r]), radius=r, texture="noise",
                colors=np.array([[0.2 + g, 0.45 + g, 0.15], [0.1, 0.28, 0.08]]), freq=float(rng.uniform(5, 9)),
            )
        )

    for i in range(G):
        for j in range(G):
            cx, cy = (i - (G - 1) / 2) * PITCH, (j - (G - 1) / 2) * PITCH
            centrality = math.exp(-((cx * cx + cy * cy) / (0.6 * H * H + 1e-9)))
            if rng.random() < 0.12:  # park
                for _ in range(int(rng.integers(3, 7))):
                    tree(cx + rng.uniform(-inner / 2 + 0.3, inner / 2 - 0.3), cy + rng.uniform(-inner / 2 + 0.3, inner / 2 - 0.3))
                continue
            split = int(rng.choice([1, 2, 2, 4]))
            nx, ny = {1: (1, 1), 2: (2, 1) if rng.random() < 0.5 else (1, 2), 4: (2, 2)}[split]
            lw, lh = inner / nx, inner / ny
            for a in range(nx):
                for b in range(ny):
                    lx = cx - inner / 2 + (a + 0.5) * lw
                    ly = cy - inner / 2 + (b + 0.5) * lh
                    hx = lw / 2 * float(rng.uniform(0.7, 0.95))
                    hy = lh / 2 * float(rng.uniform(0.7, 0.95))
                    height = 0.6 + (1.5 + 5.0 * centrality) * float(rng.random()) ** 1.5
                    if rng.random() < 0.05:
                        height *= 2.0  # a tower
                    hue = float(rng.random())
                    wall = S._hsv_to_rgb(hue, float(rng.uniform(0.05, 0.35)), float(rng.uniform(0.55, 0.9)))
                    glass = S._hsv_to_rgb(0.58 + 0.05 * float(rng.random()), 0.35, float(rng.uniform(0.2, 0.4)))
                    roof = S._hsv_to_rgb(hue, 0.1, float(rng.uniform(0.35, 0.55)))
                    objects.append(
                        _Building(
                            kind="box", center=np.array([lx, ly, height / 2]), half=np.array([hx, hy, height / 2]),
                            texture="noise", colors=np.stack([wall, glass, roof]), freq=1.0,
                            style=styles[int(rng.integers(0, len(styles)))],
                            floor_h=float(rng.uniform(0.22, 0.34)), bay_w=float(rng.uniform(0.16, 0.3)),
                            tag=float(rng.uniform(0, 1000)),
                        )
                    )
                    if rng.random() < 0.06:  # a dome on the roof
                        r = 0.8 * min(hx, hy)
                        objects.append(
                            S._Object(
                                kind="sphere", center=np.array([lx, ly, height]), radius=r, texture="checker",
                                colors=np.stack([roof * 1.3, glass]).clip(0, 1), freq=4.0,
                                axis=np.array([0.0, 0.0, 1.0]),
                            )
                        )
            # street trees on the block's sidewalk corners
            for sx in (-1, 1):
                for sy in (-1, 1):
                    if rng.random() < 0.35:
                        tree(cx + sx * (PITCH - STREET) / 2 * 0.93, cy + sy * (PITCH - STREET) / 2 * 0.93)

    centers, radii = _bounding_spheres(objects)
    light = np.array([0.4, -0.3, 0.78])
    return CityScene(
        objects=objects,
        ground_radius=3.0 * H + 20.0,
        ground_colors=np.array([[0.22, 0.22, 0.23], [0.62, 0.6, 0.57], [0.3, 0.45, 0.2]]),  # asphalt, pavement, grass
        light_dir=light / np.linalg.norm(light),
        light_color=np.array([1.0, 0.96, 0.88]),
        ambient=0.32,
        sky_horizon=np.array([0.86, 0.9, 0.95]),
        sky_zenith=np.array([0.3, 0.5, 0.85]),
        sky_below=np.array([0.55, 0.55, 0.5]),
        noise1=S._ValueNoise(noise_rng, 1),
        noise3=S._ValueNoise(noise_rng, 3),
        look_at=np.zeros(3),
        camera_radius=2.0 * H,
        blocks=G,
        half_extent=H,
        centers=centers,
        radii=radii,
    )


# ----------------------------------------------------------------------------------------------------
# Textures
# ----------------------------------------------------------------------------------------------------


def _ground_albedo(scene: CityScene, p: np.ndarray) -> np.ndarray:
    asphalt, pavement, grass = scene.ground_colors
    H = scene.half_extent
    x, y = p[:, 0], p[:, 1]
    lx = np.mod(x + H, PITCH) - PITCH / 2  # relative to the block centre
    ly = np.mod(y + H, PITCH) - PITCH / 2
    in_city = (np.abs(x) < H) & (np.abs(y) < H)
    half_block = (PITCH - STREET) / 2
    in_block = in_city & (np.abs(lx) < half_block) & (np.abs(ly) < half_block)
    grain = scene.noise1(p[:, :2] * 11.0 + 5.0)[:, 0]
    big = scene.noise1.fbm(p[:, :2] * 0.35 + 9.0, octaves=2)[:, 0]
    col = np.broadcast_to(grass, p.shape) * (0.7 + 0.6 * big)[:, None]  # fields outside the city
    street = in_city & ~in_block
    col = np.where(street[:, None], asphalt, col)
    # dashed centre lines: distance to the nearest street centre line (|l| = PITCH / 2)
    dx, dy = PITCH / 2 - np.abs(lx), PITCH / 2 - np.abs(ly)
    dash_y = (dx < 0.035) & (np.mod(y, 0.6) < 0.3) & (dy > STREET / 2)
    dash_x = (dy < 0.035) & (np.mod(x, 0.6) < 0.3) & (dx > STREET / 2)
    col = np.where((street & (dash_x | dash_y))[:, None], np.array([0.85, 0.78, 0.35]), col)
    tiles = (np.floor(x / 0.12) + np.floor(y / 0.12)) % 2.0
    col = np.where(in_block[:, None], pavement * (0.92 + 0.08 * tiles)[:, None], col)
    return col * (0.8 + 0.35 * grain)[:, None]


def _facade_albedo(scene: CityScene, b: _Building, p: np.ndarray) -> np.ndarray:
    wall, glass, roof = b.colors
    local = b.to_local(p - b.center) / b.half
    axis = np.abs(local).argmax(axis=1)
    pos = local * b.half + b.half  # 0 .. 2 half along each axis
    u = np.where(axis == 0, pos[:, 1], pos[:, 0])  # along the face
    v = pos[:, 2]  # height above ground
    face = axis * 2 + (local[np.arange(len(p)), axis] > 0)
    cu, cv = u / b.bay_w, v / b.floor_h
    fu, fv = cu - np.floor(cu), cv - np.floor(cv)
    cell = np.stack([np.floor(cu) * 1.37 + b.tag, np.floor(cv) * 2.11 + face * 7.3], axis=1)
    vary = scene.noise1(cell)[:, 0]  # constant per window (lattice points of the value noise)
    grain = scene.noise1(np.stack([u * 9.0 + b.tag, v * 9.0], axis=1))[:, 0]
    walls = np.broadcast_to(wall, p.shape) * (0.85 + 0.3 * grain)[:, None]
    panes = np.broadcast_to(glass, p.shape) * (0.6 + 0.9 * vary)[:, None]
    panes = np.where((vary > 0.8)[:, None], np.array([0.95, 0.85, 0.55]) * vary[:, None], panes)  # lit
    if b.style == "windows":
        win = (fu > 0.2) & (fu < 0.8) & (fv > 0.3) & (fv < 0.8)
        shop = (v < b.floor_h) & (fu > 0.08) & (fu < 0.92) & (fv > 0.1) & (fv < 0.85)
        win = np.where(v < b.floor_h, shop, win)
    elif b.style == "stripes":
        win = fv < 0.5
    else:  # concrete with sparse small windows
        n = scene.noise1.fbm(np.stack([u * 2.0 + b.tag, v * 2.0], axis=1), octaves=3)[:, 0]
        walls = walls * (0.7 + 0.6 * n)[:, None]
        win = (fu > 0.35) & (fu < 0.65) & (fv > 0.35) & (fv < 0.7) & (vary > 0.4)
    col = np.where(win[:, None], panes, walls)
    # roof: gravel grain and a lighter parapet
    roofs = np.broadcast_to(roof, p.shape) * (0.8 + 0.4 * grain)[:, None]
    edge = np.minimum(b.half[0] - np.abs(local[:, 0] * b.half[0]), b.half[1] - np.abs(local[:, 1] * b.half[1]))
    roofs = np.where((edge < 0.04)[:, None], np.clip(roof * 1.4, 0, 1), roofs)
    return np.clip(np.where((axis == 2)[:, None], roofs, col), 0.0, 1.0)


# ----------------------------------------------------------------------------------------------------
# Ray casting with culling
# ----------------------------------------------------------------------------------------------------


def _cone_candidates(scene: CityScene, o: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Indices of objects whose bounding sphere meets the cone of rays ``d`` from one origin ``o``."""
    if len(scene.objects) == 0:
        return np.zeros(0, dtype=np.int64)
    axis = d.mean(axis=0)
    axis /= max(np.linalg.norm(axis), 1e-12)
    half = math.acos(float(np.clip((d @ axis).min(), -1.0, 1.0)))
    v = scene.centers - o
    dist = np.linalg.norm(v, axis=1)
    safe = np.maximum(dist, 1e-12)
    ang = np.arccos(np.clip((v @ axis) / safe, -1.0, 1.0))
    extra = np.arcsin(np.clip(scene.radii / safe, 0.0, 1.0))
    return np.flatnonzero((dist <= scene.radii) | (ang <= half + extra + 1e-6))


def _shadow_candidates(scene: CityScene, p: np.ndarray) -> np.ndarray:
    """Indices of objects that can lie on a ray from some point of ``p`` towards the sun."""
    if len(scene.objects) == 0 or len(p) == 0:
        return np.zeros(0, dtype=np.int64)
    L = scene.light_dir
    e1 = np.cross(L, [0.0, 0.0, 1.0] if abs(L[2]) < 0.9 else [1.0, 0.0, 0.0])
    e1 /= np.linalg.norm(e1)
    e2 = np.cross(L, e1)
    basis = np.stack([e1, e2], axis=1)
    p2, c2 = p @ basis, scene.centers @ basis
    r = scene.radii[:, None]
    inside = np.all((c2 + r >= p2.min(axis=0)) & (c2 - r <= p2.max(axis=0)), axis=1)
    ahead = scene.centers @ L + scene.radii >= float((p @ L).min())
    return np.flatnonzero(inside & ahead)


def shade_city_rays(scene: CityScene, o: np.ndarray, d: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Trace rays from ONE origin ``o`` (3,) along unit ``d`` (M, 3); best for a compact bundle (a tile).

    Returns ``(rgb (M, 3) in [0, 1], t (M,) (inf: sky), ids (M,) -1 sky / 0 ground / 1+k object k)``,
    the same contract as :func:`bytesplat_ns.data.scene.shade_rays`.
    """
    o = np.asarray(o, dtype=np.float64).reshape(1, 3)
    cand = _cone_candidates(scene, o[0], d)
    sub = dataclasses.replace(scene, objects=[scene.objects[k] for k in cand])
    t, ids_sub = S._nearest(sub, o, d)
    ids = ids_sub.copy()
    if len(cand):
        obj = ids_sub > 0
        ids[obj] = cand[ids_sub[obj] - 1] + 1
    col = S._sky(scene, d)
    hit = ids >= 0
    if hit.any():
        p = o + t[hit, None] * d[hit]
        idh = ids[hit]
        n = S._normals(sub, ids_sub[hit], p)  # loops over the tile's candidates only
        alb = np.empty_like(p)
        g = idh == 0
        if g.any():
            alb[g] = _ground_albedo(scene, p[g])
        for k in np.unique(idh[idh > 0]):
            obj = scene.objects[k - 1]
            m = idh == k
            alb[m] = _facade_albedo(scene, obj, p[m]) if isinstance(obj, _Building) else S._object_albedo(scene, obj, p[m])
        ndotl = np.clip(n @ scene.light_dir, 0.0, None)
        lit = ndotl > 0
        shadow = np.zeros(len(p), dtype=bool)
        if lit.any():
            q = p[lit] + 1e-4 * n[lit]
            blockers = _shadow_candidates(scene, q)
            if len(blockers):
                shadow[lit] = S._in_shadow(dataclasses.replace(scene, objects=[scene.objects[k] for k in blockers]), q)
        direct = np.where(shadow, 0.0, ndotl)
        amb = scene.ambient * (0.75 + 0.25 * n[:, 2])
        col[hit] = alb * (amb[:, None] + 0.85 * direct[:, None] * scene.light_color)
    return np.clip(col, 0.0, 1.0), t, ids


# ----------------------------------------------------------------------------------------------------
# Cameras and rendering
# ----------------------------------------------------------------------------------------------------


def _look(pos: np.ndarray, fwd: np.ndarray) -> np.ndarray:
    """Camera-to-world (nerfstudio/OpenGL: columns right, up, back, position) looking along ``fwd``."""
    fwd = fwd / np.linalg.norm(fwd)
    right = np.cross(fwd, [0.0, 0.0, 1.0])
    right /= np.linalg.norm(right)
    up = np.cross(right, fwd)
    m = np.eye(4)
    m[:3, 0], m[:3, 1], m[:3, 2], m[:3, 3] = right, up, -fwd, pos
    return m


def city_camera_poses(spec: CitySpec, scene: Optional[CityScene] = None) -> np.ndarray:
    """(num_views, 4, 4) poses: ``aerial_views`` first, then ``street_views``.

    Aerial: even views orbit the whole city (distance 1.5-2x its half extent), odd views look at
    targets on a jittered grid from closer; yaw follows the golden angle, pitch is uniform in
    ``aerial_pitch_deg``. Street: at eye height on the street centre lines (lateral jitter inside the
    street; interior streets only), looking along the street (+-25 degrees, 80% towards the centre)
    or, every third view, obliquely at the facades (35-75 degrees off the street); pitched up 0-15 degrees.
    """
    scene = scene or build_city(spec)
    rng = np.random.default_rng([spec.seed & 0xFFFFFFFF, 0xCA3C])
    H = scene.half_extent
    G = spec.blocks
    golden = math.pi * (3.0 - math.sqrt(5.0))
    lo, hi = (math.radians(a) for a in spec.aerial_pitch_deg)
    poses = []
    na = spec.aerial_views
    ng = max(1, int(math.ceil(math.sqrt(max(1, na // 2)))))
    for i in range(na):
        pitch = float(rng.uniform(lo, hi))
        yaw = i * golden
        fwd = np.array([math.cos(pitch) * math.cos(yaw), math.cos(pitch) * math.sin(yaw), -math.sin(pitch)])
        if i % 2 == 0:
            target = np.array([*(rng.uniform(-0.1, 0.1, 2) * H), 0.0])
            dist = H * float(rng.uniform(1.5, 2.0)) + 2.0
        else:
            k = i // 2
            gx, gy = k % ng, (k // ng) % ng
            if gy % 2:
                gx = ng - 1 - gx  # lawnmower order
            jitter = rng.uniform(-0.5, 0.5, 2)
            target = np.array([(gx + 0.5 + jitter[0]) / ng * 2 - 1, (gy + 0.5 + jitter[1]) / ng * 2 - 1, 0.0]) * 0.85 * H
            dist = H * float(rng.uniform(0.35, 0.6)) + 3.0
        poses.append(_look(target - dist * fwd, fwd))
    # interior streets (the outer ring looks out onto fields); a 1-block city has only the ring
    lines = [(-H + k * PITCH) for k in (range(1, G) if G > 1 else range(G + 1))]
    for j in range(spec.street_views):
        along_x = j % 2 == 0  # street running along x (fixed y), else along y
        c = lines[(j // 2) % len(lines)] + float(rng.uniform(-0.3, 0.3)) * STREET
        s = float(rng.uniform(-H, H))
        pos = np.array([s, c, EYE_HEIGHT] if along_x else [c, s, EYE_HEIGHT])
        base = 0.0 if along_x else math.pi / 2
        if j % 3 == 2:
            yaw = base + math.copysign(1.0, rng.uniform(-1, 1)) * float(rng.uniform(0.6, 1.3)) + (math.pi if rng.random() < 0.5 else 0.0)
        else:
            inward = (s > 0) == (rng.random() < 0.8)  # mostly towards the centre, not out to the fields
            yaw = base + (math.pi if inward else 0.0) + float(rng.uniform(-0.45, 0.45))
        pitch = float(rng.uniform(0.0, math.radians(15.0)))
        fwd = np.array([math.cos(pitch) * math.cos(yaw), math.cos(pitch) * math.sin(yaw), math.sin(pitch)])
        poses.append(_look(pos, fwd))
    return np.stack(poses)


def render_city_view(scene: CityScene, c2w: np.ndarray, spec: CitySpec) -> np.ndarray:
    """Render one view as float RGB (H, W, 3) in [0, 1], tile by tile (pixel centres at +0.5)."""
    ss = spec.supersample
    fx, fy, cx, cy = S.intrinsics(spec)  # type: ignore[arg-type]  # width, height, fov_deg
    H, W = spec.height, spec.width
    out = np.empty((H, W, 3))
    offs = (np.arange(ss) + 0.5) / ss
    R, o = c2w[:3, :3], c2w[:3, 3]
    for y0 in range(0, H, _TILE):
        for x0 in range(0, W, _TILE):
            h, w = min(_TILE, H - y0), min(_TILE, W - x0)
            ys = ((np.arange(y0, y0 + h)[:, None] + offs[None, :]).reshape(-1) - cy) / fy
            xs = ((np.arange(x0, x0 + w)[:, None] + offs[None, :]).reshape(-1) - cx) / fx
            X, Y = np.meshgrid(xs, -ys)
            dirs = np.stack([X, Y, -np.ones_like(X)], axis=-1).reshape(-1, 3) @ R.T
            dirs /= np.linalg.norm(dirs, axis=1, keepdims=True)
            rgb, _, _ = shade_city_rays(scene, o, dirs)
            out[y0 : y0 + h, x0 : x0 + w] = rgb.reshape(h, ss, w, ss, 3).mean(axis=(1, 3))
    return out


def sample_city_points(spec: CitySpec, scene: CityScene, poses: np.ndarray, train: List[int]) -> Tuple[np.ndarray, np.ndarray]:
    """Seed point cloud like a sparse SfM one: surface points seen from training views, with the colour
    they are seen with, jittered (position sigma 0.01, colour sigma 3/255). (xyz float32, rgb uint8)."""
    rng = np.random.default_rng([spec.seed & 0xFFFFFFFF, 0x9C5C])
    fx, fy, cx, cy = S.intrinsics(spec)  # type: ignore[arg-type]
    per_view = max(16, int(math.ceil(1.6 * spec.num_points / len(train))))
    xyz_parts, rgb_parts, have = [], [], 0
    for _ in range(64):
        for v in rng.permutation(np.asarray(train)):
            px, py = rng.random(per_view) * spec.width, rng.random(per_view) * spec.height
            dc = np.stack([(px - cx) / fx, -(py - cy) / fy, -np.ones(per_view)], axis=1)
            d = dc @ poses[v, :3, :3].T
            d /= np.linalg.norm(d, axis=1, keepdims=True)
            o = poses[v, :3, 3]
            rgb, t, ids = shade_city_rays(scene, o, d)
            hit = ids >= 0
            xyz_parts.append(o + t[hit, None] * d[hit])
            rgb_parts.append(rgb[hit])
            have += int(hit.sum())
            if have >= spec.num_points:
                break
        if have >= spec.num_points:
            break
    xyz = np.concatenate(xyz_parts)[: spec.num_points]
    rgb = np.concatenate(rgb_parts)[: spec.num_points]
    xyz = xyz + rng.normal(scale=0.01, size=xyz.shape)
    rgb = rgb + rng.normal(scale=3.0 / 255.0, size=rgb.shape)
    return xyz.astype(np.float32), S._to_uint8(rgb)


# ----------------------------------------------------------------------------------------------------
# Resumable generation
# ----------------------------------------------------------------------------------------------------

_LAST: List[Tuple[CitySpec, CityScene, np.ndarray]] = []  # one-entry cache per process


def _render_city_and_save(spec: CitySpec, index: int, path: str) -> Tuple[int, int, str]:
    """Render view ``index``, write it atomically as PNG; returns (index, size, sha256). Worker entry point."""
    if not _LAST or _LAST[0][0] != spec:
        scene = build_city(spec)
        _LAST[:] = [(spec, scene, city_camera_poses(spec, scene))]
    _, scene, poses = _LAST[0]
    buf = io.BytesIO()
    Image.fromarray(S._to_uint8(render_city_view(scene, poses[index], spec)), mode="RGB").save(
        buf, format="PNG", compress_level=6
    )
    data = buf.getvalue()
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    return index, len(data), hashlib.sha256(data).hexdigest()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _verified_images(out: Path, spec: CitySpec) -> Dict[int, Tuple[int, str]]:
    """Journal entries whose image is present with the recorded size and sha256 (later entries win)."""
    journal = out / JOURNAL_NAME
    entries: Dict[int, Tuple[int, str]] = {}
    try:
        lines = journal.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return {}
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a line cut short by a crash
        if "spec_hash" in rec:
            if rec["spec_hash"] != spec.hash:
                raise BytesplatError(
                    f"{out} holds a different city scene (spec hash {rec['spec_hash']}, wanted {spec.hash})",
                    hint="generate into an empty directory, or delete this one",
                )
            continue
        if isinstance(rec, dict) and isinstance(rec.get("i"), int) and 0 <= rec["i"] < spec.num_views:
            entries[rec["i"]] = (int(rec["size"]), str(rec["sha256"]))
    ok = {}
    for i, (size, sha) in entries.items():
        p = out / spec.image_name(i)
        try:
            if p.stat().st_size == size and _sha256(p) == sha:
                ok[i] = (size, sha)
        except OSError:
            pass
    return ok


def generate_city(
    spec: Optional[CitySpec] = None,
    out_dir: Union[str, Path] = ".",
    progress: bool = True,
    workers: Optional[int] = None,
) -> Path:
    """Generate (or resume generating) the city for ``spec`` in ``out_dir``; returns ``out_dir``.

    Images already recorded in the journal and intact are kept; the rest are rendered (in ``workers``
    processes; default as scene.py chooses). Then the seed
    point cloud, transforms.json and, last, the completion marker are written.
    """
    spec = spec or CitySpec()
    out = Path(out_dir)
    (out / IMAGES_DIR).mkdir(parents=True, exist_ok=True)
    (out / CITY_MARKER_NAME).unlink(missing_ok=True)
    done = _verified_images(out, spec)
    journal_path = out / JOURNAL_NAME
    if not journal_path.exists():
        journal_path.write_text(json.dumps({"spec_hash": spec.hash, "spec": spec.to_dict()}) + "\n", encoding="utf-8")
    todo = [i for i in range(spec.num_views) if i not in done]
    n_workers = int(workers) if workers is not None else S._num_workers(spec)  # type: ignore[arg-type]
    n_workers = max(1, min(n_workers, len(todo) or 1))

    with open(journal_path, "a", encoding="utf-8") as journal:

        def record(res: Tuple[int, int, str]) -> None:
            i, size, sha = res
            journal.write(json.dumps({"i": i, "file": spec.image_name(i), "size": size, "sha256": sha}) + "\n")
            journal.flush()

        def render_all(update) -> None:
            if n_workers <= 1:
                for i in todo:
                    record(_render_city_and_save(spec, i, str(out / spec.image_name(i))))
                    update()
                return
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor, as_completed

            with ProcessPoolExecutor(n_workers, mp_context=multiprocessing.get_context("spawn")) as ex:
                futures = [ex.submit(_render_city_and_save, spec, i, str(out / spec.image_name(i))) for i in todo]
                try:
                    for fut in as_completed(futures):
                        record(fut.result())
                        update()
                except BaseException:  # Ctrl-C or a failed view: do not render the queued rest first
                    for fut in futures:
                        fut.cancel()
                    raise

        if progress and todo:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

            with Progress(
                TextColumn(f"[bold]Generating city '{spec.preset}' ({spec.width}x{spec.height})"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("views"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=S._console(),
            ) as bar:
                if done:
                    bar.console.print(f"Resuming: {len(done)} of {spec.num_views} views already complete")
                task = bar.add_task("render", total=spec.num_views, completed=len(done))
                render_all(lambda: bar.advance(task))
        else:
            render_all(lambda: None)

    scene = build_city(spec)
    poses = city_camera_poses(spec, scene)
    eval_set = set(spec.eval_indices())
    train = [i for i in range(spec.num_views) if i not in eval_set]
    xyz, rgb = sample_city_points(spec, scene, poses, train)
    S.write_ply(out / PLY_NAME, xyz, rgb)
    fx, fy, cx, cy = S.intrinsics(spec)  # type: ignore[arg-type]
    names = [spec.image_name(i) for i in range(spec.num_views)]
    transforms = {
        "camera_model": "OPENCV",
        "fl_x": S._round(fx), "fl_y": S._round(fy), "cx": S._round(cx), "cy": S._round(cy),
        "w": spec.width, "h": spec.height, "k1": 0.0, "k2": 0.0, "p1": 0.0, "p2": 0.0,
        "frames": [
            {"file_path": names[i], "transform_matrix": [[S._round(v) for v in row] for row in poses[i].tolist()]}
            for i in range(spec.num_views)
        ],
        "ply_file_path": PLY_NAME,
        "train_filenames": [names[i] for i in train],
        "val_filenames": [names[i] for i in sorted(eval_set)],
        "test_filenames": [names[i] for i in sorted(eval_set)],
        "bytesplat_scene": {"city_generator_version": CITY_GENERATOR_VERSION, "hash": spec.hash, "spec": spec.to_dict()},
    }
    tmp = out / (TRANSFORMS_NAME + ".tmp")
    tmp.write_text(json.dumps(transforms, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, out / TRANSFORMS_NAME)
    files = {n: (out / n).stat().st_size for n in names + [PLY_NAME, TRANSFORMS_NAME]}
    marker = {"city_generator_version": CITY_GENERATOR_VERSION, "hash": spec.hash, "spec": spec.to_dict(), "files": files}
    (out / CITY_MARKER_NAME).write_text(json.dumps(marker, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return out


def is_city_complete(path: Union[str, Path], spec: Optional[CitySpec] = None) -> bool:
    """True if ``path`` holds a complete city (of ``spec`` if given): valid marker, every file at its size."""
    path = Path(path)
    try:
        marker = json.loads((path / CITY_MARKER_NAME).read_text(encoding="utf-8"))
        if marker.get("city_generator_version") != CITY_GENERATOR_VERSION:
            return False
        if spec is not None and marker.get("hash") != spec.hash:
            return False
        return all((path / rel).stat().st_size == size for rel, size in marker["files"].items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def ensure_city(
    spec: Optional[CitySpec] = None, cache_dir: Optional[Union[str, Path]] = None, workers: Optional[int] = None
) -> Path:
    """Path of the generated city for ``spec`` under the cache, generating or resuming it as needed.

    Generation happens in place (``<cache>/city-<preset>-<hash>``) so an interrupted run resumes; a file
    lock makes concurrent callers (ranks) wait for one generator.
    """
    spec = spec or CitySpec()
    target = city_dir(spec, cache_dir)
    if is_city_complete(target, spec):
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with S._file_lock(target.parent / f".{spec.dirname}.lock"):
            if not is_city_complete(target, spec):
                start = time.perf_counter()
                generate_city(spec, target, workers=workers)
                S._console().log(
                    f"[green]City scene '{spec.preset}' ready[/green] ({spec.num_views} views at "
                    f"{spec.width}x{spec.height}, {len(spec.eval_indices())} held out, "
                    f"{time.perf_counter() - start:.1f} s): {target}"
                )
    except OSError as e:
        raise BytesplatError(
            f"Could not write the city scene to {target}: {e.strerror or e}",
            hint="check free disk space, or set BYTESPLAT_CACHE / --cache-dir to another writable directory",
        ) from e
    return target


def ensure_city_for_dataparser(config) -> Path:
    """The city for a ``BytesplatSceneDataParserConfig`` with ``scene_size="city-<preset>"`` (data None):
    its ``scene_seed``, ``width`` / ``height`` and ``num_views`` (split 3:1 aerial:street) override the
    preset; cached like the built-in scene (``scene_cache_dir``)."""
    kw: Dict[str, object] = dict(preset=config.scene_size[len("city-") :], seed=config.scene_seed)
    if config.width is not None or config.height is not None:
        kw.update(width=config.width, height=config.height)
    if config.num_views is not None:
        aerial = int(round(0.75 * int(config.num_views)))
        kw.update(aerial_views=aerial, street_views=int(config.num_views) - aerial)
    return ensure_city(CitySpec(**kw), cache_dir=config.scene_cache_dir,  # type: ignore[arg-type]
                       workers=config.scene_workers)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bytesplat_ns.data.city", description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="small", choices=list(CITY_PRESETS))
    ap.add_argument("--seed", type=int, default=0)
    for name in ("blocks", "aerial-views", "street-views", "width", "height", "num-points", "supersample"):
        ap.add_argument(f"--{name}", type=int, default=None)
    ap.add_argument("--cache-dir", type=Path, default=None, help="default: $BYTESPLAT_CACHE/scenes")
    ap.add_argument("--out", type=Path, default=None, help="write here instead of the cache")
    ap.add_argument("--workers", type=int, default=None)
    a = ap.parse_args(argv)
    kw = {k: getattr(a, k) for k in ("blocks", "aerial_views", "street_views", "width", "height", "num_points")}
    if a.supersample is not None:
        kw["supersample"] = a.supersample
    try:
        spec = CitySpec(preset=a.preset, seed=a.seed, **kw)
        path = generate_city(spec, a.out, workers=a.workers) if a.out else ensure_city(spec, a.cache_dir, a.workers)
    except BytesplatError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
