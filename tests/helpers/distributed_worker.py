"""Worker processes for tests/distributed/test_distributed_core.py (run as ``python -m tests.helpers.distributed_worker``).

Started by ``bytesplat_ns.distributed.launch.launch_local`` with torchrun's environment variables;
writes its results (torch.save) into the output directory given on the command line.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Dict

import torch

from bytesplat_ns.distributed import SPLATFACTO_LRS

SEED = 7
N_GAUSSIANS = 240
NUM_VIEWS = 4
WIDTH, HEIGHT = 40, 32
SH_DEGREE = 3
STEPS = 3


def look_at(eye, target=(0.0, 0.0, 0.0), up=(0.0, -1.0, 0.0)) -> torch.Tensor:
    """OpenCV world-to-camera matrix (x right, y down, z forward)."""
    eye = torch.tensor(eye, dtype=torch.float64)
    z = torch.tensor(target, dtype=torch.float64) - eye
    z = z / z.norm()
    x = torch.linalg.cross(z, torch.tensor(up, dtype=torch.float64))
    x = x / x.norm()
    y = torch.linalg.cross(z, x)
    R = torch.stack([x, y, z])
    m = torch.eye(4, dtype=torch.float64)
    m[:3, :3] = R
    m[:3, 3] = -R @ eye
    return m.float()


def make_gaussians(n: int, seed: int) -> Dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    u = lambda *shape: torch.rand(*shape, generator=g)  # noqa: E731
    return {
        "means": (u(n, 3) * 2 - 1) * torch.tensor([1.2, 0.9, 0.9]),
        "scales": torch.log(0.03 + 0.12 * u(n, 3)),
        "quats": torch.randn(n, 4, generator=g),
        "features_dc": torch.randn(n, 3, generator=g) * 0.6,
        "features_rest": torch.randn(n, 15, 3, generator=g) * 0.05,
        # A third are nearly transparent (alpha < 1/255 everywhere): sent forward, zero gradient back.
        "opacities": torch.where(u(n, 1) < 0.33, torch.logit(torch.tensor(0.003)), torch.logit(0.2 + 0.6 * u(n, 1))),
    }


def make_views():
    from bytesplat_ns.distributed import Views
    from bytesplat_ns.raster import rasterize

    eyes = [(0.0, 0.3, -3.0), (2.4, -0.4, -2.0), (-2.6, 0.5, -1.2), (0.3, 0.2, -1.6)]  # the last is close: culls
    viewmats = torch.stack([look_at(e) for e in eyes[:NUM_VIEWS]])
    K = torch.tensor([[34.0, 0.0, WIDTH / 2], [0.0, 34.0, HEIGHT / 2], [0.0, 0.0, 1.0]])
    Ks = K.expand(NUM_VIEWS, 3, 3).clone()
    backgrounds = torch.tensor([[0.1, 0.2, 0.3], [0.9, 0.8, 0.7], [0.0, 0.0, 0.0], [0.5, 0.5, 0.5]])[:NUM_VIEWS]
    target = make_gaussians(300, seed=SEED + 100)
    with torch.no_grad():
        render, alpha, _ = rasterize(
            target["means"], target["quats"], torch.exp(target["scales"]), torch.sigmoid(target["opacities"]).squeeze(-1),
            torch.cat([target["features_dc"][:, None], target["features_rest"]], 1), viewmats, Ks, WIDTH, HEIGHT,
            backend="reference", sh_degree=SH_DEGREE,
        )
        images = torch.clamp(render + (1 - alpha) * backgrounds[:, None, None, :], 0, 1)
    return Views(viewmats, Ks, WIDTH, HEIGHT, images, backgrounds)


def to_params(tensors: Dict[str, torch.Tensor]) -> Dict[str, torch.nn.Parameter]:
    return {k: torch.nn.Parameter(v.clone()) for k, v in tensors.items()}


def single_process_run(steps: int = STEPS):
    """The oracle: one process, all Gaussians, the public reference rasterizer."""
    from bytesplat_ns.distributed import make_adam_optimizers, single_process_step

    views = make_views()
    params = to_params(make_gaussians(N_GAUSSIANS, SEED))
    opts = make_adam_optimizers(params, SPLATFACTO_LRS, NUM_VIEWS)
    losses = []
    states = []
    for _ in range(steps):
        losses.append(single_process_step(params, opts, views, SH_DEGREE))
        states.append({k: opts[k].state[params[k]]["exp_avg"].clone() for k in params})
    return {k: v.detach() for k, v in params.items()}, losses, states


class WireCounter:
    """Counts the bytes handed to isend (what actually goes on the wire), per phase."""

    def __init__(self):
        import torch.distributed as dist

        self.bytes = 0
        real = dist.batch_isend_irecv

        def counting(ops):
            for op in ops:
                if op.op is dist.isend:
                    self.bytes += op.tensor.numel() * op.tensor.element_size()
            return real(ops)

        dist.batch_isend_irecv = counting

    def take(self) -> int:
        out, self.bytes = self.bytes, 0
        return out


def run_training(name: str, communicator_name: str, counts, out: Path, rank: int, world: int, wire: WireCounter,
                 rebalance_after: int = 0):
    from bytesplat_ns.distributed import (
        ShardLayout, distributed_step, gather_to_rank0, make_adam_optimizers, make_communicator, rebalance, shard_of,
    )

    views = make_views()
    layout = ShardLayout(tuple(counts))
    params = to_params(shard_of(make_gaussians(N_GAUSSIANS, SEED), layout, rank))
    opts = make_adam_optimizers(params, SPLATFACTO_LRS, NUM_VIEWS)
    comm = make_communicator(communicator_name)
    record = {"steps": [], "rebalance": None}
    for step in range(STEPS):
        wire.take()
        result = distributed_step(params, opts, views, comm, SH_DEGREE)
        record["steps"].append({"loss": result.loss, "stats": result.stats.as_dict(), "wire": wire.take(),
                                "layout": result.layout.counts})
        if rebalance_after and step + 1 == rebalance_after:
            from bytesplat_ns.distributed import ExchangeStats

            ex = ExchangeStats()
            before = int(params["means"].shape[0])
            wire.take()
            moved, new_layout = rebalance(params, opts, stats=ex)
            record["rebalance"] = {"moved": moved, "before": before, "after": int(params["means"].shape[0]),
                                   "layout": new_layout.counts, "payload": ex.payload_bytes, "wire": wire.take(),
                                   "same_param_in_opt": all(opts[k].param_groups[0]["params"][0] is params[k] for k in params)}
            # Adam state after the move, gathered in global order, must equal the single-process state.
            avg = {k: opts[k].state[params[k]]["exp_avg"] for k in params}
            full_avg = gather_to_rank0(avg)
            if rank == 0:
                record["rebalance"]["exp_avg"] = full_avg
    full = gather_to_rank0({k: v.detach() for k, v in params.items()})
    record["params"] = full
    torch.save(record, out / f"{name}-rank{rank}.pt")


def dump_after_training(trainer, out: Path) -> None:
    """Each rank's shard; on rank 0 also the full copy (params, step), whether the viewer renders it,
    and a render of eval camera 0 from it (in one process: from the model itself)."""
    from bytesplat_ns.distributed.pipeline import PARAM_NAMES

    pipeline = trainer.pipeline
    rank = getattr(pipeline, "rank", 0)
    torch.save({n: pipeline.model.gauss_params[n].detach().cpu() for n in PARAM_NAMES}, out / f"shard-rank{rank}.pt")
    full = pipeline.full_model()
    if rank != 0:
        assert full is None
        return
    camera = pipeline.datamanager.eval_dataset.cameras[0:1].to(pipeline.device)
    full.eval()
    with torch.no_grad():
        rgb = full.get_outputs_for_camera(camera)["rgb"].cpu()
    viewer = trainer.viewer_state
    torch.save(
        {
            "params": {n: full.gauss_params[n].detach().cpu() for n in PARAM_NAMES},
            "step": getattr(pipeline, "full_copy_step", None),
            "render": rgb,
            "viewer_renders_copy": None if viewer is None else viewer.get_model() is full,
            "copy_in_state_dict": any(k.startswith("_full_copy") for k in pipeline.state_dict()),
        },
        out / "full-copy.pt",
    )


def train_and_dump(out: Path, argv) -> None:
    """``python -m bytesplat_ns.train <argv>`` on this rank, then ``dump_after_training``."""
    import bytesplat_ns  # noqa: F401
    from bytesplat_ns.errors import BytesplatError
    from bytesplat_ns.train import parse, run, teardown

    config = parse(argv)
    try:
        trainer = run(config)
        dump_after_training(trainer, out)
        teardown()
    except BytesplatError as error:
        sys.stderr.write(f"bytesplat: error: {error}\n")
        sys.stderr.flush()
        os._exit(1)
    if trainer.viewer_state is not None:
        os._exit(0)  # viser's server threads would keep the process alive


class _TorchAsSeenByNerfstudioLauncher:
    """``torch`` for nerfstudio.scripts.train only, with CUDA reported present: its worker asserts CUDA
    and one GPU per process even for gloo, so this is how its own worker and train_loop run on CPU."""

    def __init__(self, devices: int):
        import types

        self.cuda = types.SimpleNamespace(is_available=lambda: True, device_count=lambda: devices)

    def __getattr__(self, name):
        return getattr(torch, name)


def nerfstudio_launcher(argv) -> None:
    """One rank of ``ns-train <argv>``'s multi-process launch, as nerfstudio 1.1.5 runs it: the config
    parsed by ns-train's CLI, handed to its own ``_distributed_worker`` (process group, per-machine
    groups) with its own ``train_loop`` (seed, config.setup -> trainer.setup -> trainer.train).
    The only difference from ``mp.spawn``: this process is started by the test's launcher."""
    import tyro
    from nerfstudio.configs.method_configs import AnnotatedBaseConfigUnion
    from nerfstudio.scripts import train as ns_train

    import bytesplat_ns  # noqa: F401

    config = tyro.cli(AnnotatedBaseConfigUnion, args=argv)
    if config.data:
        config.pipeline.datamanager.data = config.data
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if rank == 0:
        config.save_config()
    ns_train.torch = _TorchAsSeenByNerfstudioLauncher(world)
    ns_train._distributed_worker(
        rank, ns_train.train_loop, world, world, 0, f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
        config, device_type=config.machine.device_type,
    )


def main() -> None:
    scenario, out = sys.argv[1], Path(sys.argv[2])
    if scenario == "train-and-dump":
        return train_and_dump(out, sys.argv[3:])
    if scenario == "nerfstudio-launcher":
        return nerfstudio_launcher(sys.argv[3:])
    torch.set_num_threads(1)
    from bytesplat_ns.distributed import DistributedError, init_distributed

    init_distributed(timeout_s=float(os.environ.get("TEST_PG_TIMEOUT", "30")))
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    wire = WireCounter()
    try:
        if scenario == "core":
            even = [N_GAUSSIANS // world + (1 if r < N_GAUSSIANS % world else 0) for r in range(world)]
            run_training("dense", "dense", even, out, rank, world, wire)
            run_training("sparse", "sparse-grad", even, out, rank, world, wire)
            # Densification statistics reach the owner: means2d.grad and absgrad of the first step.
            from bytesplat_ns.distributed import ShardLayout, make_communicator, shard_of, sharded_render_loss

            layout = ShardLayout(tuple(even))
            params = to_params(shard_of(make_gaussians(N_GAUSSIANS, SEED), layout, rank))
            fwd = sharded_render_loss(params, make_views(), make_communicator("dense"), SH_DEGREE, absgrad=True)
            fwd.local_loss.backward()
            torch.save({"grad": fwd.info["means2d"].grad, "absgrad": fwd.info["means2d"].absgrad, "radii": fwd.info["radii"]},
                       out / f"stats-rank{rank}.pt")
            if world == 2:
                # Uneven shards (70/30): rebalanced after step 1, then two more steps.
                uneven = [int(N_GAUSSIANS * 0.7), N_GAUSSIANS - int(N_GAUSSIANS * 0.7)]
                run_training("rebalance", "sparse-grad", uneven, out, rank, world, wire, rebalance_after=1)
                # Within 10%: no move.
                from bytesplat_ns.distributed import rebalance

                near = [int(N_GAUSSIANS * 0.53), N_GAUSSIANS - int(N_GAUSSIANS * 0.53)]
                p = to_params({"means": torch.zeros(near[rank], 3)})
                moved, _ = rebalance(p, None)
                torch.save({"moved": moved}, out / f"norebalance-rank{rank}.pt")
        elif scenario == "fused-nccl":
            # One GPU per rank: the record exchange with the fused compositor (each rank's views
            # padded and scored in one call), both communicators, absgrad on.
            from bytesplat_ns.distributed import ShardLayout, make_communicator, shard_of, sharded_render_loss

            device = torch.device("cuda", torch.cuda.current_device())
            views = make_views()
            views.viewmats, views.Ks, views.backgrounds = views.viewmats.to(device), views.Ks.to(device), views.backgrounds.to(device)
            views.images = views.images.to(device)
            shard = shard_of(make_gaussians(N_GAUSSIANS, SEED), ShardLayout.even(N_GAUSSIANS, world), rank)
            res = {}
            for name in ("dense", "sparse-grad"):
                params = {k: torch.nn.Parameter(v.to(device)) for k, v in shard.items()}
                fwd = sharded_render_loss(params, views, make_communicator(name), SH_DEGREE, absgrad=True, compositor="fused")
                fwd.local_loss.backward()
                res[name] = {"loss": fwd.local_loss.item(), "grads": {k: p.grad.cpu() for k, p in params.items()},
                             "absgrad": fwd.info["means2d"].absgrad.cpu(), "renders": {v: r.cpu() for v, r in fwd.renders.items()}}
            torch.save(res, out / f"fused-rank{rank}.pt")
        elif scenario in ("die", "stall"):
            from bytesplat_ns.distributed import (
                ShardLayout, StepWatchdog, distributed_step, make_adam_optimizers, make_communicator, shard_of,
                splatfacto_loss,
            )

            watchdog = StepWatchdog(float(os.environ["TEST_WATCHDOG"]))
            views = make_views()
            layout = ShardLayout.even(N_GAUSSIANS, world)
            params = to_params(shard_of(make_gaussians(N_GAUSSIANS, SEED), layout, rank))
            opts = make_adam_optimizers(params, SPLATFACTO_LRS, NUM_VIEWS)
            comm = make_communicator("sparse-grad")
            state = {"step": 0}

            def faulty_loss(pred, gt):
                if rank == 1 and state["step"] == 1:
                    if scenario == "die":
                        os._exit(9)
                    time.sleep(3600)
                return splatfacto_loss(pred, gt)

            for step in range(3):
                state["step"] = step
                with watchdog.step(f"training step {step}"):
                    distributed_step(params, opts, views, comm, SH_DEGREE, loss_fn=faulty_loss)
                print(f"rank {rank} finished step {step}", flush=True)
        else:
            raise SystemExit(f"unknown scenario {scenario}")
    except DistributedError as error:
        sys.stderr.write(f"bytesplat: error: {error}\n")
        sys.stderr.flush()
        os._exit(1)
    # Results are on disk: meet once more, then leave without gloo's teardown, which now and then
    # aborts a process ("terminate called without an active exception") after all work is done.
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
