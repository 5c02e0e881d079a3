"""Worker processes for tests/distributed/test_pixel_exchange.py (run as ``python -m tests.helpers.pixel_worker``).

Started by ``bytesplat_ns.distributed.launch.launch_local`` with torchrun's environment variables;
writes its results (torch.save) into the output directory given on the command line. The scene
helpers are also imported by the test for the single-process oracle.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Dict

import torch

from bytesplat_ns.distributed import SPLATFACTO_LRS
from tests.helpers.distributed_worker import WireCounter, look_at  # shared by every distributed worker

SEED = 11
WIDTH, HEIGHT = 32, 24
NUM_VIEWS = 4
SH_DEGREE = 3
CELLS_PER_RANK = 2
BORDER_MARGIN = 0.3  # world units kept between a Gaussian's mean and its cell's faces (no crossing)
SCALE_COUNTS = (800, 3200, 12800)  # 1x, 4x, 16x
TRAIN_STEPS = 3
EYES = [(0.2, 0.4, -3.2), (2.9, -0.5, -1.8), (-2.8, 0.6, -1.5), (0.4, -2.6, -1.9)]


def raw_gaussians(n: int, seed: int, small: bool) -> Dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    u = lambda *shape: torch.rand(*shape, generator=g)  # noqa: E731
    lo, hi = (0.015, 0.035) if small else (0.04, 0.16)
    return {
        "means": (u(n, 3) * 2 - 1) * torch.tensor([1.2, 0.9, 0.9]),
        "scales": torch.log(lo + (hi - lo) * u(n, 3)),
        "quats": torch.randn(n, 4, generator=g),
        "features_dc": torch.randn(n, 3, generator=g) * 0.6,
        "features_rest": torch.randn(n, 15, 3, generator=g) * 0.05,
        "opacities": torch.logit(0.15 + 0.6 * u(n, 1)),
    }


def make_scene(n: int, num_cells: int, crossing: bool, seed: int = SEED):
    """(all Gaussians, kd cells). Without ``crossing``, Gaussians closer than BORDER_MARGIN to a face
    of their cell are dropped (the tree is built before, so it still partitions space)."""
    from bytesplat_ns.distributed.cells import KdCells

    g = raw_gaussians(n, seed, small=not crossing)
    tree = KdCells.build(g["means"], num_cells)
    if not crossing:
        from bytesplat_ns.distributed.cells import crossing_mask

        keep = ~crossing_mask(tree, g["means"], torch.full((n,), BORDER_MARGIN))
        g = {k: v[keep] for k, v in g.items()}
    return g, tree


def make_views():
    from bytesplat_ns.distributed import Views
    from bytesplat_ns.raster import rasterize

    viewmats = torch.stack([look_at(e) for e in EYES[:NUM_VIEWS]])
    K = torch.tensor([[30.0, 0.0, WIDTH / 2], [0.0, 30.0, HEIGHT / 2], [0.0, 0.0, 1.0]])
    Ks = K.expand(NUM_VIEWS, 3, 3).clone()
    backgrounds = torch.tensor([[0.1, 0.2, 0.3], [0.9, 0.8, 0.7], [0.0, 0.0, 0.0], [0.5, 0.5, 0.5]])[:NUM_VIEWS]
    t = raw_gaussians(200, SEED + 100, small=False)
    with torch.no_grad():
        render, alpha, _ = rasterize(
            t["means"], t["quats"], torch.exp(t["scales"]), torch.sigmoid(t["opacities"]).squeeze(-1),
            torch.cat([t["features_dc"][:, None], t["features_rest"]], 1), viewmats, Ks, WIDTH, HEIGHT,
            backend="reference", sh_degree=SH_DEGREE,
        )
        images = torch.clamp(render + (1 - alpha) * backgrounds[:, None, None, :], 0, 1)
    return Views(viewmats, Ks, WIDTH, HEIGHT, images, backgrounds)


def local_part(g: Dict[str, torch.Tensor], tree, rank: int, world: int, device="cpu"):
    """This rank's Gaussians (params, on ``device``), their global ids, and the CellState."""
    from bytesplat_ns.distributed.cells import cell_ranks
    from bytesplat_ns.distributed.pixel import CellState

    ranks = cell_ranks(tree.num_cells, world)
    cell = tree.locate(g["means"])
    rk = torch.tensor(ranks)[cell]
    gids = torch.nonzero(rk == rank).squeeze(1)
    params = {k: torch.nn.Parameter(v[gids].clone().to(device)) for k, v in g.items()}
    return params, gids, CellState(tree, ranks, cell[gids].to(device))


def only_rank0_cells(g, tree, world):
    from bytesplat_ns.distributed.cells import cell_ranks

    rk = torch.tensor(cell_ranks(tree.num_cells, world))[tree.locate(g["means"])]
    return {k: v[rk == 0] for k, v in g.items()}


def views_on(views, device):
    """``views`` with every tensor on ``device``."""
    from bytesplat_ns.distributed import Views

    return Views(views.viewmats.to(device), views.Ks.to(device), views.width, views.height,
                 torch.stack(list(views.images)).to(device), views.backgrounds.to(device))


def run_once(g, tree, rank, world, views, config, wire=None, device="cpu", renderer="auto") -> Dict:
    from bytesplat_ns.distributed.pixel import pixel_render_loss

    params, gids, cells = local_part(g, tree, rank, world, device)
    if wire is not None:
        wire.take()
    fwd = pixel_render_loss(params, cells, views, SH_DEGREE, config, renderer=renderer)
    fwd.local_loss.backward()
    out = {
        "gids": gids,
        "grads": {k: (p.grad.detach().cpu().clone() if p.grad is not None else torch.zeros(p.shape)) for k, p in params.items()},
        "renders": {v: img.cpu() for v, img in fwd.renders.items()},
        "stats": fwd.stats.as_dict(),
        "views_of_rank": fwd.schedule.views_of_rank,
        "schedule_line": fwd.schedule.log_line(),
        "log": fwd.stats.log_line(rank),
        "loss": float(fwd.local_loss.item()),
    }
    if wire is not None:
        out["wire"] = wire.take()
    return out


def main() -> None:
    scenario, out = sys.argv[1], Path(sys.argv[2])
    torch.set_num_threads(1)
    from bytesplat_ns.distributed import DistributedError, init_distributed
    from bytesplat_ns.distributed.pixel import PixelConfig

    # gloo unless told otherwise (PIXEL_TEST_BACKEND=nccl: tests/distributed/test_pixel_gpu.py), also on a GPU host.
    device = init_distributed(os.environ.get("PIXEL_TEST_BACKEND", "gloo"), timeout_s=float(os.environ.get("TEST_PG_TIMEOUT", "30")))
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    wire = WireCounter()
    n_cells = CELLS_PER_RANK * world
    views = make_views()
    rec: Dict = {}
    try:
        if scenario == "main":
            g, tree = make_scene(400, n_cells, crossing=False)
            rec["exact"] = run_once(g, tree, rank, world, views, PixelConfig(geometric=True), wire)
            rec["nogeo"] = run_once(g, tree, rank, world, views, PixelConfig(geometric=False), wire)
            rec["tprune"] = run_once(g, tree, rank, world, views, PixelConfig(geometric=True, transmittance=True), wire)
            rec["noschedule"] = run_once(g, tree, rank, world, views, PixelConfig(schedule=False), wire)
            gx, treex = make_scene(240, n_cells, crossing=True)
            rec["crossing"] = run_once(gx, treex, rank, world, views, PixelConfig(), wire)
            rec["crossing_t"] = run_once(gx, treex, rank, world, views, PixelConfig(transmittance=True), wire)
            rec["crossing_t05"] = run_once(gx, treex, rank, world, views, PixelConfig(transmittance=True, threshold=0.05), wire)
            # A rank without any Gaussian (all of them in rank 0's cells) still takes part.
            ge = only_rank0_cells(g, tree, world)
            rec["empty_rank"] = run_once(ge, tree, rank, world, views, PixelConfig(transmittance=True), wire)
        elif scenario == "scale":
            # Fewer views than ranks at 4 processes: a rank composites nothing but still renders and exchanges.
            from bytesplat_ns.distributed import Views

            g, tree = make_scene(400, n_cells, crossing=False)
            v3 = Views(views.viewmats[:3], views.Ks[:3], WIDTH, HEIGHT, views.images[:3], views.backgrounds[:3])
            rec["three_views"] = run_once(g, tree, rank, world, v3, PixelConfig(transmittance=True), wire)
            for n in SCALE_COUNTS:
                g, tree = make_scene(n, n_cells, crossing=False, seed=SEED + 1)
                rec[f"n{n}"] = run_once(g, tree, rank, world, views, PixelConfig(), wire)
                rec[f"n{n}"]["count"] = int(g["means"].shape[0])
        elif scenario == "migrate":
            from bytesplat_ns.distributed import make_adam_optimizers
            from bytesplat_ns.distributed.cells import migrate
            from bytesplat_ns.distributed.pixel import pixel_step

            # K training steps on a scene without border crossings (compared with one process).
            ge, treee = make_scene(400, n_cells, crossing=False)
            params, gids, cells = local_part(ge, treee, rank, world)
            opts = make_adam_optimizers(params, SPLATFACTO_LRS, NUM_VIEWS)
            losses = [pixel_step(params, opts, cells, views, SH_DEGREE).loss for _ in range(TRAIN_STEPS)]
            rec["train"] = {"gids": gids, "params": {k: v.detach().clone() for k, v in params.items()}, "losses": losses}

            g, tree = make_scene(240, n_cells, crossing=True)
            params, gids, cells = local_part(g, tree, rank, world)
            lrs = {"means": 0.05, "features_dc": 0.0025, "features_rest": 0.000125, "opacities": 0.05, "scales": 0.005, "quats": 0.001}
            opts = make_adam_optimizers(params, lrs, NUM_VIEWS)
            pixel_step(params, opts, cells, views, SH_DEGREE)
            # Shift every mean along x so that some leave their cell; migrate them.
            with torch.no_grad():
                params["means"][:, 0] += 0.25
            before = {"means": params["means"].detach().clone(), "gids": gids.clone(),
                      "exp_avg": opts["means"].state[params["means"]]["exp_avg"].clone()}
            extra = {"gids": gids.to(torch.float64)}
            cell_of, sent = migrate(params, opts, tree, cells.ranks_of_cells, extra=extra)
            cells.cell_of = cell_of
            after_gids = extra["gids"].to(torch.int64)
            rec["migrate"] = {
                "before": before, "sent": sent, "gids": after_gids, "means": params["means"].detach().clone(),
                "cells": cell_of, "ranks": cells.ranks_of_cells,
                "exp_avg": opts["means"].state[params["means"]]["exp_avg"].clone(),
                "in_opt": all(opts[k].param_groups[0]["params"][0] is params[k] for k in params),
            }
            # Training continues on the migrated Gaussians.
            res = pixel_step(params, opts, cells, views, SH_DEGREE)
            rec["migrate"]["loss_after"] = res.loss
            # Rebalancing: within 10% nothing is rebuilt; a drift beyond it rebuilds a balanced tree and migrates.
            from bytesplat_ns.distributed.cells import rebalance_cells

            extra = {"gids": after_gids.to(torch.float64)}
            _, _, rebuilt_near, _ = rebalance_cells(params, opts, tree, cells.ranks_of_cells, threshold=10.0, extra=extra)
            with torch.no_grad():  # squeeze rank 0's Gaussians towards the origin: counts drift
                if rank == 0:
                    params["means"][:] = params["means"] * 0.2
            tree2, cell_of2, rebuilt, sent2 = rebalance_cells(params, opts, tree, cells.ranks_of_cells, threshold=0.1, force=True, extra=extra)
            rec["rebalance"] = {"rebuilt_near": rebuilt_near, "rebuilt": rebuilt, "sent": sent2, "n": int(params["means"].shape[0]),
                                "cells": cell_of2, "ranks": cells.ranks_of_cells, "gids": extra["gids"].to(torch.int64),
                                "tree_split": tree2.split, "old_split": tree.split,
                                "in_opt": all(opts[k].param_groups[0]["params"][0] is params[k] for k in params)}
            cells.tree, cells.cell_of = tree2, cell_of2
            rec["rebalance"]["loss_after"] = pixel_step(params, opts, cells, views, SH_DEGREE).loss
        elif scenario == "nccl":
            # tests/distributed/test_pixel_gpu.py: every rank on its GPU, NCCL; both cell renderers, the pruning
            # modes, training steps and a migration, all with the tensors on the GPU.
            from bytesplat_ns.distributed import make_adam_optimizers
            from bytesplat_ns.distributed.cells import migrate
            from bytesplat_ns.distributed.pixel import pixel_step

            assert device.type == "cuda", device
            dv = views_on(views, device)
            g, tree = make_scene(400, n_cells, crossing=False)
            for renderer in ("reference", "fused"):
                rec[renderer] = run_once(g, tree, rank, world, dv, PixelConfig(), wire, device, renderer)
                rec[f"{renderer}_nogeo"] = run_once(g, tree, rank, world, dv, PixelConfig(geometric=False), wire, device, renderer)
                rec[f"{renderer}_t"] = run_once(g, tree, rank, world, dv, PixelConfig(transmittance=True), wire, device, renderer)
            ge = only_rank0_cells(g, tree, world)
            rec["empty_rank"] = run_once(ge, tree, rank, world, dv, PixelConfig(transmittance=True), wire, device, "fused")
            params, gids, cells = local_part(g, tree, rank, world, device)
            opts = make_adam_optimizers(params, SPLATFACTO_LRS, NUM_VIEWS)
            losses = [pixel_step(params, opts, cells, dv, SH_DEGREE, renderer="fused").loss for _ in range(TRAIN_STEPS)]
            with torch.no_grad():  # beyond the margin this scene keeps from every face: some must migrate
                params["means"][:, 0] += 2 * BORDER_MARGIN
            extra = {"gids": gids.to(torch.float64).to(device)}
            cell_of, sent = migrate(params, opts, tree, cells.ranks_of_cells, extra=extra)
            cells.cell_of = cell_of
            losses.append(pixel_step(params, opts, cells, dv, SH_DEGREE, renderer="fused").loss)
            rec["train"] = {"losses": losses, "sent": sent, "n": int(params["means"].shape[0]),
                            "device": str(params["means"].device), "cells": cell_of.cpu(),
                            "ranks": cells.ranks_of_cells, "gids": extra["gids"].cpu().to(torch.int64),
                            "finite": all(bool(torch.isfinite(p).all()) for p in params.values())}
        else:
            raise SystemExit(f"unknown scenario {scenario}")
    except DistributedError as error:
        sys.stderr.write(f"bytesplat: error: {error}\n")
        sys.stderr.flush()
        os._exit(1)
    torch.save(rec, out / f"{scenario}-rank{rank}.pt")
    # Everyone has saved; leave without tearing the process group down. Once (1 of ~20 runs) rank 0,
    # which hosts the TCP store, aborted inside the teardown ("terminate called without an active
    # exception") after every collective had completed; skipping the destructors avoids that race.
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
