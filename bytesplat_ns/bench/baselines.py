r"""The baselines of ``bytesplat-bench raster``: gsplat's rasterizer with splatfacto's loss, its SSIM
from pytorch_msssim (what splatfacto uses) or from fussim (a fused SSIM kernel, what fast 3DGS
trainers use), for any installed gsplat version.

The gsplat importable in the benchmark's process (nerfstudio's, 1.4.0) is timed in process; each
``--gsplat-site DIR`` (a ``pip install --target DIR`` of another version, e.g. 1.5.3) is timed in a
child process that has DIR first on its path, on the same scene (a random one: ``synthetic_scene`` is
deterministic for a seed in any process; a trained one: handed over in a file, ``bench.scene_file``)
and binned the same way, so that the rows differ only in the rasterizer and the SSIM. Every row
carries its loss value: the pairs compute one loss.

    python -m bytesplat_ns.bench.baseline_child --num-gaussians 1000000 --width 1920 --height 1080 \
        --ssim pytorch_msssim fussim --out baselines.json     (the child's command line)
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from bytesplat_ns.bench.timing import QUEUE_MS, record_or_error, time_ms
from bytesplat_ns.raster.loss import (
    SSIM_WIN_SIGMA,
    SSIM_WIN_SIZE,
    SsimFunction,
    pytorch_msssim_ssim,
    splatfacto_loss_torch,
)

SSIM_IMPLEMENTATIONS = ("pytorch_msssim", "fussim")


def ssim_function(implementation: str) -> SsimFunction:
    """``ssim(pred, gt)`` with splatfacto's settings (11-tap window, sigma 1.5, valid region, mean):
    the gradient flows to ``pred``, the first argument."""
    if implementation == "pytorch_msssim":
        return pytorch_msssim_ssim
    if implementation == "fussim":
        from fussim import ssim  # its pytorch_msssim-compatible entry point: valid padding, like pytorch_msssim

        return lambda pred, gt: ssim(pred, gt, data_range=1.0, size_average=True, win_size=SSIM_WIN_SIZE,
                                     win_sigma=SSIM_WIN_SIGMA)
    raise ValueError(f"unknown SSIM implementation {implementation!r} (choose from {SSIM_IMPLEMENTATIONS})")


def baseline_loss(render, gt, ssim: SsimFunction):
    """splatfacto's loss of a rasterizer's [C,H,W,3] output (background included) against ``gt``."""
    return splatfacto_loss_torch(render, None, gt, None, ssim=ssim)


def gsplat_version() -> str:
    import gsplat

    return gsplat.__version__


def site_gsplat_version(site: Optional[str]) -> str:
    """The version of the gsplat a child imports: the one installed in ``site`` (a ``pip install --target``
    folder), or this process's. A folder without one is an error, before anything is timed: a child would
    import this process's gsplat and time it under the site's name."""
    from bytesplat_ns.errors import BytesplatError

    if site is None:
        return gsplat_version()
    found = sorted(Path(site).glob("gsplat-*.dist-info"))
    if not found:
        raise BytesplatError(f"--gsplat-site {site}: no gsplat installed there (no gsplat-*.dist-info)",
                             hint="give the folder another gsplat was pip-installed into with --target "
                                  "(scripts/gpu_setup.sh puts 1.5.3 at /tmp/gsplat-1.5.3; the suites that "
                                  "time it take that folder as --data)")
    return found[-1].name[len("gsplat-"):-len(".dist-info")]


def per_axis_radii(version: str) -> bool:
    major, minor = (int(x) for x in version.split(".")[:2])
    return (major, minor) >= (1, 5)  # gsplat 1.5 bins with [..., N, 2] radii (x and y extents)


def gsplat_bins(inputs, version: str, opacity_aware: bool = False):
    """gsplat's tile lists of ``inputs``' projected Gaussians (``raster.StageInputs``), with the same
    isotropic radii whatever the version, so that every version rasterizes the same lists; with
    ``opacity_aware`` (gsplat >= 1.5, which bins per axis) the per-axis reach our
    ``FusedOptions.opacity_aware_tiles`` bins with (``raster.tile_reach``): the same shorter lists."""
    import torch
    from gsplat.cuda._wrapper import isect_offset_encode, isect_tiles

    radii = inputs.radii
    if opacity_aware:
        from bytesplat_ns.raster.tile_reach import opacity_aware_radii

        radii = opacity_aware_radii(inputs.radii, inputs.con, inputs.op)
    elif per_axis_radii(version) and radii.dim() == 2:
        radii = torch.stack([radii, radii], dim=-1)
    tw, th = math.ceil(inputs.W / 16), math.ceil(inputs.H / 16)
    _, isect_ids, flatten_ids = isect_tiles(inputs.m2, radii, inputs.depths, 16, tw, th)
    return isect_offset_encode(isect_ids, 1, tw, th), flatten_ids


def gsplat_raster_loss_pass(inputs, offsets, flatten_ids, ssim: SsimFunction) -> Callable[[], "torch.Tensor"]:
    """One pass from the shared 2D inputs (``raster.StageInputs``): gsplat's ``rasterize_to_pixels``, the
    loss with ``ssim``, the backward; returns the loss."""
    from gsplat.cuda._wrapper import rasterize_to_pixels

    scene = inputs.scene

    def raster_loss():
        render, _ = rasterize_to_pixels(*inputs.leaves(), inputs.W, inputs.H, 16, offsets, flatten_ids,
                                        backgrounds=scene["backgrounds"])
        loss = baseline_loss(render, scene["gt"], ssim)
        loss.backward()
        return loss

    return raster_loss


def measure(inputs, implementations: Sequence[str], warmup: int, repeats: int, raster_only: bool,
            queue_ms: float = QUEUE_MS) -> List[Dict]:
    """One row per SSIM implementation for the gsplat of this process: ``raster_loss`` (from the
    shared 2D inputs: rasterize_to_pixels + loss + backward), for a gsplat that bins per axis also
    ``raster_loss_opacity_tiles`` (the same on the opacity-aware lists, :func:`gsplat_bins`) and,
    unless ``raster_only``, ``full`` (gsplat's ``rasterization`` from the 3D Gaussians + loss + backward);
    timed as ``raster.bench_one`` times ours (inputs cloned untimed, launches queued ``queue_ms`` ahead)."""
    from gsplat.rendering import rasterization

    version = gsplat_version()
    scene = inputs.scene
    offsets, flatten_ids = gsplat_bins(inputs, version)
    tight = gsplat_bins(inputs, version, opacity_aware=True) if per_axis_radii(version) else None
    rows = []
    for implementation in implementations:
        row: Dict = {"gsplat": version, "ssim": implementation}
        try:
            ssim = ssim_function(implementation)
        except Exception as e:  # noqa: BLE001  (an SSIM package that does not import: its rows say why)
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            rows.append(row)
            continue

        raster_loss = gsplat_raster_loss_pass(inputs, offsets, flatten_ids, ssim)

        def full():
            render, _, _ = rasterization(*inputs.args3d(), sh_degree=inputs.sh_degree,
                                         backgrounds=scene["backgrounds"], packed=False)
            baseline_loss(render, scene["gt"], ssim).backward()

        record_or_error(row, "loss_value", lambda: raster_loss().item())
        def timed(fn):
            return time_ms(fn, warmup, repeats, prepare=inputs.stage_leaves, queue_ms=queue_ms)

        record_or_error(row, "raster_loss", lambda: timed(raster_loss))
        if tight is not None:
            tight_pass = gsplat_raster_loss_pass(inputs, *tight, ssim)
            record_or_error(row, "loss_value_opacity_tiles", lambda: tight_pass().item())
            record_or_error(row, "raster_loss_opacity_tiles", lambda: timed(tight_pass))
        if not raster_only:
            record_or_error(row, "full", lambda: timed(full))
        rows.append(row)
    return rows


def child_command(site: str, n: int, width: int, height: int, sh_degree: int, warmup: int, repeats: int,
                  implementations: Sequence[str], raster_only: bool, projection: str, out: Path,
                  scene_file: Optional[Path] = None, queue_ms: float = QUEUE_MS) -> Dict:
    """The command and environment that time the gsplat installed in ``site`` on the same scene: the
    random one of ``n`` Gaussians, or the one in ``scene_file`` (``bench.scene_file``)."""
    scene = ["--scene-file", str(scene_file)] if scene_file is not None else ["--num-gaussians", str(n)]
    command = [sys.executable, "-m", "bytesplat_ns.bench.baseline_child", *scene, "--width", str(width),
               "--height", str(height), "--sh-degree", str(sh_degree), "--warmup", str(warmup),
               "--repeats", str(repeats), "--queue-ms", str(queue_ms), "--projection", projection,
               "--ssim", *implementations, "--out", str(out)]
    if raster_only:
        command.append("--raster-only")
    return {"command": command, "env": site_env(site)}


def site_env(site: str) -> Dict[str, str]:
    """This process's environment with ``site`` (a ``pip install --target`` folder) first on the path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH", "")) if p)
    return env


def child_failure(done: "subprocess.CompletedProcess") -> str:
    """One line saying why a benchmark child failed: its exit status and last output line."""
    tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]
    return f"child exited with {done.returncode}: {tail[0][:300]}"


def measure_in_child(site: str, n: int, width: int, height: int, sh_degree: int, warmup: int, repeats: int,
                     implementations: Sequence[str], raster_only: bool, projection: str,
                     scene: Optional[Dict] = None, queue_ms: float = QUEUE_MS) -> List[Dict]:
    """``measure`` for the gsplat in ``site``, in a child process, on the random scene of ``n``
    Gaussians or on ``scene`` (handed over in a file); rows carry ``site``, or one row with the error
    when the child fails."""
    from bytesplat_ns.bench.scene_file import save_scene

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.json"
        scene_file = save_scene(scene, Path(tmp) / "scene.pt") if scene is not None else None
        spec = child_command(site, n, width, height, sh_degree, warmup, repeats, implementations, raster_only,
                             projection, out, scene_file, queue_ms)
        done = subprocess.run(spec["command"], env=spec["env"], capture_output=True, text=True)
        if done.returncode != 0 or not out.is_file():
            return [{"site": site, "error": child_failure(done)}]
        rows = json.loads(out.read_text())
    return [dict(row, site=site) for row in rows]


def baseline_rows(inp, scene_label: str, gsplat_ok: bool, baseline_ssim: Sequence[str],
                  gsplat_sites: Sequence[str], warmup: int, repeats: int, raster_only: bool,
                  fused_loss: Optional[float], queue_ms: float = QUEUE_MS) -> List[Dict]:
    """gsplat + each SSIM: this process's gsplat on ``inp`` (``raster.StageInputs``), and the gsplat
    of each site in a child on the same scene (a trained one is handed over in a file); each row's
    loss against the fused one."""
    rows: List[Dict] = []
    if gsplat_ok and baseline_ssim:
        rows += measure(inp, baseline_ssim, warmup, repeats, raster_only, queue_ms)
    for site in gsplat_sites:
        rows += measure_in_child(site, int(inp.scene["means"].shape[0]), inp.W, inp.H, inp.sh_degree, warmup, repeats,
                                 baseline_ssim, raster_only, projection="torch",
                                 scene=None if scene_label == "synthetic" else inp.scene, queue_ms=queue_ms)
    for row in rows:
        if isinstance(row.get("loss_value"), float) and isinstance(fused_loss, float):
            row["loss_rel_diff_vs_fused"] = abs(row["loss_value"] - fused_loss) / abs(fused_loss)
    return rows
