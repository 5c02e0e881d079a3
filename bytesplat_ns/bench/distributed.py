r"""``bytesplat-bench distributed``: side-by-side multi-GPU benchmark in one job.

One synthetic scene (N random Gaussians in a camera frustum, ``synthetic_scene``'s distribution)
and one batch of B views at W x H, the same for every configuration. Measured, one configuration
after the other in the same processes:

- ``bytesplat`` at 1 rank (rank 0 alone, a one-rank process group: no exchange) and at R ranks
  (every process) for each communicator (``dense``, ``sparse-grad``; ``pixel`` on request): the
  pieces ``ShardedPipeline`` runs per step: ``sharded_render_loss`` (projection of the shard into
  every view, forward exchange, compositing, splatfacto's loss) + ``backward`` (gradient exchange,
  owner's backward) + Adam on the shard + the batch-loss all_reduce;
- ``gsplat`` 1.4.0 ``rasterization(..., packed=True)`` on the same Gaussians and views: at 1 rank
  plain, at R ranks ``distributed=True`` (each rank passes its contiguous shard of the Gaussians
  and its own block of the B cameras, which gsplat requires to be the same count on every rank),
  then the same loss (mean over the B views of ``0.8 L1 + 0.2 (1 - SSIM)``), backward and Adam.
  gsplat's CUDA kernels need a GPU: on the CPU these rows are skipped with the reason recorded.

Per configuration: median (min, max) step time over ``--repeats`` steps after ``--warmup``
(each step: synchronize + barrier, wall clock until every device finished; the step's time is the
slowest rank's), views/s = B / median step time, bytes sent to OTHER ranks per step summed over
ranks (forward, backward, meta: the communicators' ``CommStats`` exactly, every step and every rank
kept in the JSON; gsplat: estimated from its wire format, see ``_gsplat_bytes``), peak memory per
rank, and the loss. The JSON also holds the GPU names, versions, the command and the ratios the
issue targets (2 ranks vs 1 views/s, sparse-grad vs dense backward bytes, bytesplat vs gsplat
distributed views/s).

Launch:

    NCCL_NVLS_ENABLE=0 torchrun --nproc-per-node 2 -m bytesplat_ns.bench.cli distributed \
        --num-gaussians 1000000 4000000 --views 8 --width 1920 --height 1080 --out distributed.json
        # NCCL, one GPU per process (the distributed suites run this)
    bytesplat-bench distributed --spawn 2 --device cpu --num-gaussians 2000 --width 64 --height 48
        # runs the ranks itself (torch.multiprocessing, gloo): CPU smoke test

On a trained scene (``--trained RUN_DIR``: a finished ``ns-train bytesplat``/splatfacto run, e.g. the
``run_dir`` of ``bytesplat-bench train``) the Gaussians are the run's (split into even contiguous
shards by index, as the random ones) and the B views its train cameras with their real images
(``--trained-views`` picks them, default B spread evenly over the train split; ``--trained-scale``
changes the resolution); rows say ``"scene": "trained:<run dir>"``. Occlusion in a real scene is what
lets sparse-grad send fewer gradient records than dense: on the random scenes nearly every record
sent forward gets a non-zero gradient back.

    bytesplat-bench distributed --trained outputs/bench/bytesplat-fused/bytesplat/bench --views 8 --trained-scale 2

Without a launcher (one process) only the 1-rank rows run. ``--communicators ... pixel`` adds the
pixel exchange (each rank renders its cell with ``--compositor``'s renderer: fused on CUDA, the
reference rasterizer on the CPU, where only small images are practical).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import statistics
import sys
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Union

import torch
import torch.distributed as dist
from torch import Tensor

STAT_KEYS = ("forward_bytes", "backward_bytes", "meta_bytes", "forward_records", "backward_records")
GSPLAT_CPU_REASON = "gsplat's rasterization runs CUDA kernels only; this run has no GPU"


# ---------------------------------------------------------------------------------------------
# Scene


def make_scene(n: int, width: int, height: int, num_views: int, sh_degree: int = 3, seed: int = 0) -> Dict:
    """N Gaussians in splatfacto's parameterisation (log scales, logit opacities, SH split into
    features_dc/features_rest) filling the frustum of a reference camera, and ``num_views`` cameras
    around it (small yaw and sideways shifts, all looking into the same volume), with smooth random
    ground-truth images and backgrounds. CPU tensors; deterministic in ``seed``."""
    from bytesplat_ns.bench.synthetic import synthetic_scene

    s = synthetic_scene(n, width, height, sh_degree=sh_degree, seed=seed, device="cpu")
    g = torch.Generator().manual_seed(seed + 1)
    params = {
        "means": s["means"],
        "scales": torch.log(s["scales"]),
        "quats": s["quats"],
        "features_dc": s["colors"][:, 0, :].contiguous(),
        "features_rest": s["colors"][:, 1:, :].contiguous(),
        "opacities": torch.logit(s["opacities"].clamp(1e-4, 1 - 1e-4))[:, None],
    }
    viewmats = []
    for b in range(num_views):
        yaw = (b / max(num_views - 1, 1) - 0.5) * 0.12 if num_views > 1 else 0.0  # +-3.4 degrees
        c, si = math.cos(yaw), math.sin(yaw)
        m = torch.eye(4)
        m[:3, :3] = torch.tensor([[c, 0.0, si], [0.0, 1.0, 0.0], [-si, 0.0, c]])
        m[:3, 3] = torch.tensor([-0.3 * math.sin(2 * math.pi * b / max(num_views, 1)), 0.1 * math.cos(2 * math.pi * b / max(num_views, 1)), 0.0])
        viewmats.append(m)
    Ks = s["Ks"].expand(num_views, 3, 3).clone()
    images = torch.rand(num_views, height, width, 3, generator=g)
    images = torch.nn.functional.avg_pool2d(images.permute(0, 3, 1, 2), 5, 1, 2).permute(0, 2, 3, 1).contiguous()
    backgrounds = torch.rand(num_views, 3, generator=g)
    return {"params": params, "viewmats": torch.stack(viewmats), "Ks": Ks, "images": images,
            "backgrounds": backgrounds, "width": width, "height": height, "sh_degree": sh_degree}


def _views(scene: Dict, device: torch.device, keep: Optional[Sequence[int]] = None):
    """``Views`` on ``device``; ground truth only for the views in ``keep`` (the rest stay None)."""
    from bytesplat_ns.distributed import Views

    B = scene["viewmats"].shape[0]
    keep = set(range(B) if keep is None else keep)
    images = [scene["images"][b].to(device) if b in keep else None for b in range(B)]
    return Views(scene["viewmats"].to(device), scene["Ks"].to(device), scene["width"], scene["height"], images,
                 scene["backgrounds"].to(device))


def _leaves(params: Mapping[str, Tensor], rows: Union[None, slice, Tensor], device: torch.device) -> Dict[str, Tensor]:
    """Fresh leaf copies on ``device`` of ``rows`` (all, a contiguous slice, or indices) of ``params``."""
    out = {}
    for k, v in params.items():
        t = v if rows is None else v[rows] if isinstance(rows, slice) else v.index_select(0, rows)
        out[k] = torch.nn.Parameter(t.to(device, copy=True).contiguous())
    return out


def _adam(params: Mapping[str, Tensor], batch: int) -> Dict[str, torch.optim.Optimizer]:
    from bytesplat_ns.distributed import SPLATFACTO_LRS, make_adam_optimizers

    return make_adam_optimizers(params, SPLATFACTO_LRS, batch)


def _opt_step(params: Mapping[str, Tensor], opts: Mapping[str, torch.optim.Optimizer]) -> None:
    for p in params.values():
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    for o in opts.values():
        o.step()
        o.zero_grad(set_to_none=True)


# ---------------------------------------------------------------------------------------------
# Process-group helpers


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _gather_rows(vec: Sequence[float], group=None) -> List[List[float]]:
    """Every rank's equal-length float vector (a collective on ``group``)."""
    from bytesplat_ns.distributed.exchange import comm_device

    local = torch.tensor(list(vec), dtype=torch.float64, device=comm_device(group))
    world = dist.get_world_size(group) if dist.is_initialized() else 1
    if world == 1:
        return [local.cpu().tolist()]
    out = [torch.empty_like(local) for _ in range(world)]
    dist.all_gather(out, local, group=group)
    return [t.cpu().tolist() for t in out]


def _barrier(group=None) -> None:
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        from bytesplat_ns.distributed.exchange import comm_device

        t = torch.zeros(1, device=comm_device(group))
        dist.all_reduce(t, group=group)  # a device-side barrier on NCCL (no device_ids warning)
        _sync(t.device)


def _peak_reset(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def _peak_mb(device: torch.device) -> float:
    return torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else float("nan")


def _time_steps(step: Callable[[], Dict[str, float]], warmup: int, repeats: int, device: torch.device, group) -> Dict:
    """Run ``warmup`` + ``repeats`` steps; per timed step: this rank's seconds and its stats."""
    for _ in range(warmup):
        step()
    seconds, stats, losses = [], [], []
    for _ in range(repeats):
        _sync(device)
        _barrier(group)
        t0 = time.perf_counter()
        info = step()
        _sync(device)
        seconds.append(time.perf_counter() - t0)
        stats.append([float(info.get(k, 0)) for k in STAT_KEYS])
        losses.append(float(info.get("loss", float("nan"))))
    return {"seconds": seconds, "stats": stats, "losses": losses}


def _summarise(label: Dict, timed_by_rank: List[Dict], peaks: List[float], batch: int, exact_bytes: bool) -> Dict:
    """One configuration's record: step time = slowest rank per step, stats summed over ranks."""
    R = len(timed_by_rank)
    repeats = len(timed_by_rank[0]["seconds"])
    step_s = [max(t["seconds"][i] for t in timed_by_rank) for i in range(repeats)]
    per_step = [{k: int(sum(t["stats"][i][j] for t in timed_by_rank)) for j, k in enumerate(STAT_KEYS)} for i in range(repeats)]
    med = statistics.median(step_s)
    rec = dict(label)
    rec.update(
        status="ok",
        ranks=R,
        median_step_ms=1000 * med,
        min_step_ms=1000 * min(step_s),
        max_step_ms=1000 * max(step_s),
        views_per_second=batch / med,
        step_ms=[1000 * s for s in step_s],
        bytes_per_step={k: statistics.mean(s[k] for s in per_step) for k in STAT_KEYS},
        bytes_exact=exact_bytes,
        per_step_stats=per_step,
        per_rank_step_stats=[[dict(zip(STAT_KEYS, (int(x) for x in row))) for row in t["stats"]] for t in timed_by_rank],
        peak_memory_mb=[None if math.isnan(p) else p for p in peaks],
        loss_last=timed_by_rank[0]["losses"][-1] if timed_by_rank[0]["losses"] else None,
    )
    return rec


# ---------------------------------------------------------------------------------------------
# The measured steps


def _bytesplat_step(params, opts, views, communicator, sh_degree, absgrad, compositor):
    from bytesplat_ns.distributed import sharded_render_loss
    from bytesplat_ns.distributed.exchange import all_reduce_, comm_device

    def step() -> Dict[str, float]:
        fwd = sharded_render_loss(params, views, communicator, sh_degree, absgrad=absgrad, compositor=compositor)
        fwd.local_loss.backward()
        _opt_step(params, opts)
        total = fwd.local_loss.detach().reshape(1).to(comm_device(communicator.group), torch.float64)
        all_reduce_(total, group=communicator.group, phase="summing the batch loss")
        out = {k: float(v) for k, v in fwd.stats.as_dict().items()}
        out["loss"] = float(total.item())
        return out

    return step


def _pixel_step(params, opts, cells, views, sh_degree, group, renderer="auto"):
    from bytesplat_ns.distributed.pixel import pixel_render_loss
    from bytesplat_ns.distributed.exchange import all_reduce_, comm_device

    def step() -> Dict[str, float]:
        fwd = pixel_render_loss(params, cells, views, sh_degree, group=group, renderer=renderer)
        fwd.local_loss.backward()
        _opt_step(params, opts)
        total = fwd.local_loss.detach().reshape(1).to(comm_device(group), torch.float64)
        all_reduce_(total, group=group, phase="summing the batch loss")
        s = fwd.stats
        return {"forward_bytes": s.forward_bytes, "backward_bytes": s.backward_bytes, "meta_bytes": s.meta_bytes,
                "loss": float(total.item())}

    return step


def _gsplat_bytes(meta: Dict, rank: int, cameras_per_rank: int, B: int, world: int) -> Dict[str, float]:
    """Estimate of what gsplat's distributed packed mode put on the wire to OTHER ranks, counted at
    the sender from ``meta`` (which holds the projection's packed records BEFORE gsplat's
    all_to_all: ``camera_ids`` over all ranks' cameras, rank r rendering cameras
    [r C, (r+1) C)): records whose camera belongs to another rank are sent there. Forward per
    record: radii + the float block (means2d 2, depths 1, conics 3, opacities 1, colors D) + camera
    and Gaussian ids (gsplat's dtypes); backward: the float block's gradient (the all_to_all's
    autograd returns every forwarded float). Meta: its all_gather of Gaussian counts and cameras
    (16 + 9 floats per camera) and its all_to_all of counts."""
    cams = meta["camera_ids"]
    rows = int(cams.shape[0])
    remote = int((torch.div(cams, cameras_per_rank, rounding_mode="floor") != rank).sum().item()) if rows else 0
    radii_b = meta["radii"].element_size() * meta["radii"].numel() // rows if rows else 4
    D = 3
    floats = (2 + 1 + 3 + 1 + D) * meta["means2d"].element_size()
    ids = cams.element_size() + meta["gaussian_ids"].element_size()
    return {
        "forward_bytes": remote * (radii_b + floats + ids),
        "backward_bytes": remote * floats,
        "forward_records": remote,
        "backward_records": remote,
        "meta_bytes": 4 * world + cameras_per_rank * (16 + 9) * 4 * (world - 1) + 4 * world,
    }


def _gsplat_step(params, opts, views, mine: List[int], sh_degree, distributed: bool, rank: int, world: int):
    from gsplat import rasterization

    from bytesplat_ns.distributed.exchange import all_reduce_, comm_device
    from bytesplat_ns.distributed.step import gaussian_colors, rgb_with_background, splatfacto_loss

    idx = torch.tensor(mine, dtype=torch.long, device=views.viewmats.device)
    viewmats, Ks = views.viewmats.index_select(0, idx), views.Ks.index_select(0, idx)
    B = views.num_views

    def step() -> Dict[str, float]:
        render, alpha, meta = rasterization(
            params["means"], params["quats"], torch.exp(params["scales"]), torch.sigmoid(params["opacities"]).squeeze(-1),
            gaussian_colors(params, sh_degree), viewmats, Ks, views.width, views.height,
            sh_degree=sh_degree, packed=True, distributed=distributed,
        )
        loss = render.new_zeros(())
        for i, v in enumerate(mine):
            rgb = rgb_with_background(render[i], alpha[i], views.backgrounds[v])
            loss = loss + splatfacto_loss(rgb, views.images[v]) / B
        loss.backward()
        _opt_step(params, opts)
        total = loss.detach().reshape(1).to(comm_device(None), torch.float64)
        if distributed:
            all_reduce_(total, phase="summing the batch loss")
        out = _gsplat_bytes(meta, rank, len(mine), B, world) if distributed else {}
        out["loss"] = float(total.item())
        return out

    return step


# ---------------------------------------------------------------------------------------------
# Driver (every rank)


def _run_config(label: Dict, participants: int, make_step: Callable[[], Callable], rank: int, device: torch.device,
                group, args, exact_bytes: bool) -> Optional[Dict]:
    """Run one configuration on ranks [0, participants); return its record on rank 0 (others: None).
    A failure inside becomes a record with status "error" (every participant must fail alike, e.g. a
    build error; a one-sided failure inside a collective ends the job at the process-group timeout)."""
    result: Optional[Dict] = None
    if rank < participants:
        _peak_reset(device)
        err = ""
        try:
            step = make_step()
            timed = _time_steps(step, args.warmup, args.repeats, device, group)
        except Exception as error:  # noqa: BLE001 - recorded, the other configurations still run
            err = f"{type(error).__name__}: {' '.join(str(error).split())[:600]}"
            traceback.print_exc()
            timed = {"seconds": [float("nan")] * args.repeats, "stats": [[0.0] * len(STAT_KEYS)] * args.repeats,
                     "losses": [float("nan")] * args.repeats}
        peak = _peak_mb(device)
        flat = timed["seconds"] + [x for row in timed["stats"] for x in row] + timed["losses"] + [peak, 1.0 if err else 0.0]
        rows = _gather_rows(flat, group) if participants > 1 else [flat]
        errors = _gather_errors(err, group) if participants > 1 else [err]
        if rank == 0:
            K, S = args.repeats, len(STAT_KEYS)
            timed_by_rank = []
            for row in rows:
                stats = [row[K + i * S: K + (i + 1) * S] for i in range(K)]
                timed_by_rank.append({"seconds": row[:K], "stats": stats, "losses": row[K + K * S: K + K * S + K]})
            failed = [f"rank {r}: {e}" for r, e in enumerate(errors) if e]
            if failed:
                result = dict(label, status="error", ranks=participants, reason="; ".join(failed))
            else:
                result = _summarise(label, timed_by_rank, [row[-2] for row in rows], args.views, exact_bytes)
        del timed
    if device.type == "cuda":
        torch.cuda.empty_cache()
    _barrier(None)
    if rank == 0 and result is not None:
        _print_row(result)
    return result


def _gather_errors(err: str, group) -> List[str]:
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return [err]
    out: List = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, err, group=group)  # NCCL: through the current device (set at start)
    return [str(e or "") for e in out]


def _print_row(r: Dict) -> None:
    if r["status"] != "ok":
        print(f"  N={r['num_gaussians']} {r['impl']:<9} {r['communicator']:<12} R={r.get('ranks', '?')}: {r['status']}: {r.get('reason', '')}", flush=True)
        return
    b = r["bytes_per_step"]
    mem = max((m for m in r["peak_memory_mb"] if m is not None), default=None)
    print(f"  N={r['num_gaussians']} {r['impl']:<9} {r['communicator']:<12} R={r['ranks']}  {r['median_step_ms']:9.2f} ms  {r['views_per_second']:9.2f} views/s  "
          f"fwd {b['forward_bytes'] / 1e6:9.3f} MB  bwd {b['backward_bytes'] / 1e6:9.3f} MB"
          + (f"  peak {mem:8.0f} MiB" if mem is not None else ""), flush=True)


def environment(device: torch.device) -> Dict:
    from importlib.metadata import PackageNotFoundError, version

    def ver(name: str) -> Optional[str]:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    info = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "host": platform.node(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gsplat": ver("gsplat"),
        "nerfstudio": ver("nerfstudio"),
        "bytesplat_ns": ver("bytesplat-ns"),
        "backend": dist.get_backend() if dist.is_initialized() else None,
        "nccl": _nccl_version() if device.type == "cuda" else None,
        "NCCL_NVLS_ENABLE": os.environ.get("NCCL_NVLS_ENABLE"),
        "device_type": device.type,
    }
    return info


def _nccl_version() -> Optional[str]:
    try:
        v = torch.cuda.nccl.version()
    except Exception:  # noqa: BLE001 - informational only
        return None
    return ".".join(str(x) for x in v) if isinstance(v, (tuple, list)) else str(v)


def run_rank(args, rank: int, world: int, device: torch.device, command: str) -> Optional[Dict]:
    """The whole benchmark on one rank (inside an initialised process group). Rank 0 returns the
    report, and writes it (``args.out``) after each Gaussian count: a job cut short keeps what it measured."""
    B = args.views
    compositor = args.compositor
    if compositor == "auto":
        compositor = "fused" if device.type == "cuda" else "reference"
    names = (torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu")
    gpus = _gather_errors(names, None) if world > 1 else [names]
    scenes: List = [(N, None) for N in args.num_gaussians]  # (N, scene): None = make_scene's random one
    source, distribution, trained_info = "synthetic", ("bench.synthetic.synthetic_scene: frustum of the reference camera, "
                                                       "depth 2..20; views: yaw within +-3.4 deg, shifts <= 0.3"), None
    if args.trained is not None:
        from bytesplat_ns.bench.trained import load_run, spread_views, views_scene

        run_ = load_run(args.trained)  # every rank: the same deterministic load
        picks = list(args.trained_views) if args.trained_views else spread_views(run_, B)
        scene = views_scene(run_, picks, args.trained_scale, args.sh_degree)
        scenes = [(run_.num_gaussians, scene)]
        args.width, args.height, args.sh_degree = scene["width"], scene["height"], scene["sh_degree"]
        source = f"trained:{run_.run_dir}"
        distribution = f"{source}: its Gaussians, train views {picks} (real images) at {args.trained_scale} x resolution"
        trained_info = dict(run_.describe(), views=picks, scale=args.trained_scale,
                            images=[str(run_.dataset.image_filenames[i]) for i in picks])
        run_ = scene = None
    sh = args.sh_degree
    report = {
        "benchmark": "bytesplat-bench distributed",
        "command": command,
        "complete": False,
        "environment": dict(environment(device), devices=gpus, world_size=world),
        "scene": {"num_gaussians": [N for N, _ in scenes], "width": args.width, "height": args.height, "views_per_step": B,
                  "sh_degree": sh, "seed": args.seed, "source": source, "distribution": distribution},
        "settings": {"warmup": args.warmup, "repeats": args.repeats, "compositor": compositor, "absgrad": args.absgrad,
                     "loss": "mean over views of 0.8 L1 + 0.2 (1 - SSIM) (splatfacto)", "optimizer": "Adam per parameter, scaled for B",
                     "timing": "per step: synchronize + barrier, wall clock until all devices finished; slowest rank; median",
                     "bytes": "sent to other ranks per step, summed over ranks"},
        "results": [],
        "comparison": {},
    }
    if trained_info is not None:
        report["scene"]["trained"] = trained_info
    one = dist.new_group([0]) if world > 1 else None  # the 1-rank configurations: rank 0 alone
    for i in range(len(scenes)):
        N, scene = scenes[i]
        scenes[i] = (N, None)  # _run_scene's frame holds the only reference
        if rank == 0:
            print(f"bytesplat-bench distributed: N={N} B={B} {args.width}x{args.height} SH {sh}, world {world} ({device.type}), "
                  f"{source}, compositor {compositor}, {args.warmup}+{args.repeats} steps", flush=True)
        rows = _run_scene(args, N, rank, world, device, one, compositor, scene, source)
        scene = None
        if rank == 0:
            report["results"] += rows
            report["comparison"][str(N)] = compare(rows, world)
            if i == len(scenes) - 1:
                report["complete"] = True
            _write(report, args.out)
    if rank == 0:
        print_table(report)
    return report if rank == 0 else None


def _run_scene(args, N: int, rank: int, world: int, device: torch.device, one, compositor: str,
               scene: Optional[Dict] = None, source: str = "synthetic") -> List[Dict]:
    """Every configuration on one scene: ``scene`` (make_scene's form, e.g. a trained one), or
    make_scene's random one of N Gaussians."""
    from bytesplat_ns.distributed import assign_views, make_communicator
    from bytesplat_ns.distributed.sharding import ShardLayout

    torch.manual_seed(args.seed)
    sh, B = args.sh_degree, args.views
    if scene is None:
        scene = make_scene(N, args.width, args.height, B, sh, args.seed)
    results: List[Dict] = []
    rank_groups = ([] if args.skip_one_rank and world > 1 else [(1, one)]) + ([(world, None)] if world > 1 else [])
    layouts = {R: ShardLayout.even(N, R) for R, _ in rank_groups}

    def shard_rows(R: int) -> slice:
        return slice(*layouts[R].range(rank))

    for R, group in rank_groups:
        comms = ["dense"] if R == 1 else list(args.communicators)
        for name in comms:
            label = {"scene": source, "num_gaussians": N, "impl": "bytesplat", "communicator": name if R > 1 else "none (1 rank)",
                     "compositor": compositor}
            if name == "pixel":
                label["compositor"] = f"{compositor} (cell renderer; partials composited in PyTorch)"

                def make(R=R, group=group):
                    return _make_pixel(scene, rank, R, device, sh, B, group, compositor)
            else:

                def make(R=R, group=group, name=name):
                    params = _leaves(scene["params"], shard_rows(R), device)
                    views = _views(scene, device, assign_views(B, R)[rank])
                    return _bytesplat_step(params, _adam(params, B), views, make_communicator(name, group), sh,
                                           args.absgrad, compositor)

            rec = _run_config(label, R, make, rank, device, group, args, exact_bytes=True)
            if rank == 0:
                results.append(rec)
        if args.skip_gsplat:
            continue
        label = {"scene": source, "num_gaussians": N, "impl": "gsplat",
                 "communicator": "gsplat distributed=True, packed" if R > 1 else "none (1 rank), packed"}
        reason = None
        if device.type != "cuda":
            reason = GSPLAT_CPU_REASON
        elif B % R:
            reason = f"gsplat's distributed mode needs the same number of cameras on every rank ({B} views, {R} ranks)"
        if reason is not None:
            if rank == 0:
                results.append(dict(label, status="skipped", ranks=R, reason=reason))
                _print_row(results[-1])
            continue

        def make_g(R=R):
            params = _leaves(scene["params"], shard_rows(R), device)
            views = _views(scene, device, assign_views(B, R)[rank])
            return _gsplat_step(params, _adam(params, B), views, assign_views(B, R)[rank], sh, R > 1, rank, R)

        rec = _run_config(label, R, make_g, rank, device, None if R > 1 else one, args, exact_bytes=False)
        if rank == 0:
            results.append(rec)
    return results  # the scene's tensors go with this frame


def _make_pixel(scene, rank, R, device, sh, B, group, compositor="auto"):
    from bytesplat_ns.distributed.cells import KdCells, cell_ranks
    from bytesplat_ns.distributed.pixel import CellState

    means = scene["params"]["means"]
    tree = KdCells.build(means, R)
    ranks = cell_ranks(tree.num_cells, R)
    cell = tree.locate(means)
    rows = torch.nonzero(torch.tensor(ranks)[cell] == rank).squeeze(1)
    params = _leaves(scene["params"], rows, device)
    cells = CellState(tree, ranks, cell[rows].to(device))
    views = _views(scene, device)  # the schedule decides which rank composites which view
    return _pixel_step(params, _adam(params, B), cells, views, sh, group, compositor)


def _find(results: List[Dict], impl: str, ranks: int, comm_prefix: str) -> Optional[Dict]:
    for r in results:
        if r.get("impl") == impl and r.get("ranks") == ranks and r.get("status") == "ok" and r["communicator"].startswith(comm_prefix):
            return r
    return None


def compare(results: List[Dict], world: int) -> Dict:
    """The headline ratios of bytesplat against gsplat and their targets (None where a side is missing)."""
    out: Dict = {"targets": {"views_per_second_R_vs_1": 1.9, "sparse_vs_dense_backward_bytes_max": 0.35,
                             "bytesplat_vs_gsplat_distributed_views_per_second": 1.5}}
    one = _find(results, "bytesplat", 1, "none")
    g1 = _find(results, "gsplat", 1, "none")
    dense, sparse = _find(results, "bytesplat", world, "dense"), _find(results, "bytesplat", world, "sparse-grad")
    gdist = _find(results, "gsplat", world, "gsplat distributed")
    for name, r in (("dense", dense), ("sparse-grad", sparse), ("pixel", _find(results, "bytesplat", world, "pixel"))):
        if r is not None and one is not None and world > 1:
            out[f"{name}_views_per_second_{world}_vs_1"] = r["views_per_second"] / one["views_per_second"]
        if r is not None and gdist is not None:
            out[f"{name}_vs_gsplat_distributed_views_per_second"] = r["views_per_second"] / gdist["views_per_second"]
    if dense is not None and sparse is not None and dense["bytes_per_step"]["backward_bytes"] > 0:
        out["sparse_vs_dense_backward_bytes"] = sparse["bytes_per_step"]["backward_bytes"] / dense["bytes_per_step"]["backward_bytes"]
        out["sparse_vs_dense_step_time"] = sparse["median_step_ms"] / dense["median_step_ms"]
        if sparse["bytes_per_step"]["forward_records"] > 0:
            # records whose gradient is not all zero (what sparse-grad sends back), of those sent forward
            out["sparse_nonzero_record_fraction"] = sparse["bytes_per_step"]["backward_records"] / sparse["bytes_per_step"]["forward_records"]
    if gdist is not None and g1 is not None:
        out[f"gsplat_views_per_second_{world}_vs_1"] = gdist["views_per_second"] / g1["views_per_second"]
    if one is not None and g1 is not None:
        out["bytesplat_vs_gsplat_1_rank_views_per_second"] = one["views_per_second"] / g1["views_per_second"]
    return out


def print_table(report: Dict) -> None:
    s = report["scene"]
    print(f"\nB={s['views_per_step']}  {s['width']}x{s['height']}  SH {s['sh_degree']}  devices: {', '.join(report['environment']['devices'])}")
    print(f"{'N':>9} {'impl':<10}{'communicator':<34}{'R':>3}{'step ms':>11}{'views/s':>10}{'fwd MB':>10}{'bwd MB':>10}{'peak MiB':>10}")
    for r in report["results"]:
        head = f"{r['num_gaussians']:>9} {r['impl']:<10}{r['communicator']:<34}{r.get('ranks', ''):>3}"
        if r["status"] != "ok":
            print(f"{head}  {r['status']}: {r.get('reason', '')[:120]}")
            continue
        b = r["bytes_per_step"]
        mem = max((m for m in r["peak_memory_mb"] if m is not None), default=float("nan"))
        est = "" if r["bytes_exact"] else " (bytes est.)"
        print(f"{head}{r['median_step_ms']:>11.2f}{r['views_per_second']:>10.2f}"
              f"{b['forward_bytes'] / 1e6:>10.3f}{b['backward_bytes'] / 1e6:>10.3f}{mem:>10.0f}{est}")
    targets = None
    for n, comp in report.get("comparison", {}).items():
        for k, v in comp.items():
            if k == "targets":
                targets = v
            else:
                print(f"  N={n} {k}: {v:.3f}")
    print(f"  targets: {targets}", flush=True)


# ---------------------------------------------------------------------------------------------
# Entry points


def parser() -> argparse.ArgumentParser:
    """``bytesplat-bench distributed``'s options (also how a suite's distributed steps are checked)."""
    from bytesplat_ns.bench.trained import add_scene_options

    p = argparse.ArgumentParser(prog="bytesplat-bench distributed", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_scene_options(p, "its train cameras and images are the views")
    p.add_argument("--views", type=int, default=None,
                   help="B: views per step (the batch), spread over the ranks (default 8, or len(--trained-views))")
    p.add_argument("--trained-views", type=int, nargs="+", default=None, metavar="INDEX",
                   help="--trained: these train views (indices in the train split; same image size) as the batch "
                   "(default: --views of them spread evenly over the split)")
    p.add_argument("--trained-scale", type=float, default=1.0,
                   help="--trained: render at this multiple of the views' resolution (intrinsics scaled, images resized)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--communicators", nargs="+", default=["dense", "sparse-grad"], choices=["dense", "sparse-grad", "pixel"])
    p.add_argument("--compositor", choices=["auto", "reference", "fused"], default="auto",
                   help="bytesplat's compositor (auto: fused on CUDA, reference on the CPU)")
    p.add_argument("--absgrad", action="store_true",
                   help="also return |dL/dmeans2d| (splatfacto's densification statistic; gsplat's distributed mode cannot)")
    p.add_argument("--skip-gsplat", action="store_true")
    p.add_argument("--skip-one-rank", action="store_true",
                   help="only the all-ranks rows (capacity runs: the one-rank rows cannot fit what all ranks hold)")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    p.add_argument("--spawn", type=int, default=0,
                   help="run this many ranks here with torch.multiprocessing (gloo on the CPU, NCCL on GPUs) instead of torchrun")
    p.add_argument("--out", type=Path, default=None, help="JSON output path (written by rank 0)")
    return p


def parse_args(argv: Optional[List[str]] = None):
    from bytesplat_ns.bench.trained import reject_random_scene_options

    p = parser()
    args = p.parse_args(argv)
    if args.trained is not None:
        reject_random_scene_options(p, args)
        if args.trained_views is not None:
            if args.views is not None and args.views != len(args.trained_views):
                p.error(f"--views {args.views} but {len(args.trained_views)} --trained-views")
            args.views = len(args.trained_views)
    elif args.trained_views is not None or args.trained_scale != 1.0:
        p.error("--trained-views and --trained-scale need --trained")
    args.num_gaussians = args.num_gaussians or [1_000_000]
    args.views = 8 if args.views is None else args.views
    args.width = 1920 if args.width is None else args.width
    args.height = 1080 if args.height is None else args.height
    args.sh_degree = 3 if args.sh_degree is None and args.trained is None else args.sh_degree
    return args


def _write(report: Dict, out: Optional[Path]) -> None:
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(out.suffix + ".tmp")
        tmp.write_text(json.dumps(report, indent=1))
        tmp.replace(out)
        print(f"wrote {out}", flush=True)


def _device_for(args, local_rank: int) -> torch.device:
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if use_cuda:
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def _worker(local_rank: int, world: int, args, command: str, port: int) -> None:
    os.environ.update(RANK=str(local_rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    _main_in_group(args, command)
    _leave()


def _leave() -> None:
    """After the final barrier (results on disk): leave without gloo's teardown, which now and then
    aborts a finished process ("terminate called without an active exception")."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _main_in_group(args, command: str) -> Optional[Dict]:
    from bytesplat_ns.distributed.runtime import init_distributed

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = _device_for(args, local_rank)
    init_distributed("nccl" if device.type == "cuda" else "gloo")
    rank = dist.get_rank()
    report = run_rank(args, rank, dist.get_world_size(), device, command)
    if rank == 0:
        _write(report, args.out)
    _barrier(None)
    if device.type == "cuda":
        dist.destroy_process_group()
    return report


def main(argv: Optional[List[str]] = None) -> Optional[Dict]:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.trained is not None:
        from bytesplat_ns.bench.trained import run_paths

        run_paths(args.trained)  # a bad directory: one clear error line, before any rank starts
    launcher = "torchrun ... -m bytesplat_ns.bench.cli distributed " if "WORLD_SIZE" in os.environ else "bytesplat-bench distributed "
    command = launcher + " ".join(shlex.quote(a) for a in argv)
    if args.spawn and args.spawn > 0 and "WORLD_SIZE" not in os.environ:
        import torch.multiprocessing as mp

        from bytesplat_ns.distributed.launch import free_port

        mp.start_processes(_worker, args=(args.spawn, args, command, free_port()), nprocs=args.spawn, join=True,
                           start_method="spawn")
        return json.loads(args.out.read_text()) if args.out is not None and args.out.exists() else None
    if "WORLD_SIZE" in os.environ:
        report = _main_in_group(args, command)
        if dist.is_initialized():  # gloo (CPU) under torchrun: see _leave
            _leave()
        return report
    # One process, no launcher: a one-rank group of our own (the 1-rank rows only).
    from bytesplat_ns.distributed.launch import free_port

    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    return _main_in_group(args, command)


if __name__ == "__main__":
    main()
