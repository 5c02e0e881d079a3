"""The sharded trainer: nerfstudio's Trainer for ``ShardedPipeline`` (distributed/pipeline.py).

``ShardedTrainer`` scales the Gaussian learning rates for the batch (``step.scale_adam_for_batch``:
lr and the scheduler's final lr times sqrt(B), Adam betas to the power B), writes checkpoints on
rank 0 only from the gathered copy (the same format as ``ns-train bytesplat``, so ``ns-viewer``,
``ns-export gaussian-splat`` and ``ns-eval`` load them in one process), and loads a checkpoint of
any rank count by slicing the full Gaussians and their Adam state into this run's shards; the
exchange re-partitions them where it owns Gaussians by cell (pixel).

``sharded_variant`` turns any bytesplat trainer config into the sharded one, and
``AutoShardedTrainerConfig`` (``ns-train bytesplat``'s config) hands over to it when nerfstudio's
launcher starts several processes (``--machine.num-devices N``).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass, field
from typing import Literal, Type

import torch
import torch.distributed as dist
from nerfstudio.pipelines.base_pipeline import VanillaPipelineConfig
from nerfstudio.utils.decorators import check_main_thread
from nerfstudio.utils.rich_utils import CONSOLE

from bytesplat_ns.distributed.pipeline import ADAM_ROW_KEYS, ShardedPipeline, ShardedPipelineConfig, strip_module
from bytesplat_ns.distributed.sharding import ShardLayout
from bytesplat_ns.distributed.step import PARAM_NAMES, scale_adam_for_batch
from bytesplat_ns.errors import BytesplatError
from bytesplat_ns.trainer import ByteSplatTrainer, ByteSplatTrainerConfig, resume_pipeline

TORCHRUN_HINT = (
    "On CPU (gloo), launch the ranks with torchrun instead: `torchrun --nproc-per-node N -m bytesplat_ns.train "
    "bytesplat --machine.device-type cpu [ns-train arguments]` (same arguments as ns-train; see docs/distributed.md)."
)


def check_nerfstudio_launch(machine) -> None:
    """Fail early and clearly where nerfstudio 1.1.5's own launcher (``ns-train ... --machine.num-devices
    N``, N > 1) cannot work: its spawned worker asserts CUDA and one GPU per process, so it never runs
    on CPU. Not called under torchrun / ``bytesplat_ns.train`` (the process group already exists)."""
    processes = int(machine.num_devices) * int(machine.num_machines)
    if processes <= 1 or (dist.is_available() and dist.is_initialized()):
        return
    if machine.device_type != "cuda":
        raise BytesplatError(
            f"ns-train cannot start {processes} processes with --machine.device-type {machine.device_type}: "
            "nerfstudio 1.1.5's multi-process launcher only runs on CUDA GPUs (one per process).",
            hint=TORCHRUN_HINT,
        )
    if not torch.cuda.is_available():
        raise BytesplatError(
            f"--machine.num-devices {machine.num_devices} needs {machine.num_devices} CUDA GPUs, but torch sees none.",
            hint=TORCHRUN_HINT,
        )
    if torch.cuda.device_count() < int(machine.num_devices):
        raise BytesplatError(
            f"--machine.num-devices {machine.num_devices} needs {machine.num_devices} CUDA GPUs on this host, "
            f"but torch sees {torch.cuda.device_count()}.",
            hint="Lower --machine.num-devices or make more GPUs visible (CUDA_VISIBLE_DEVICES).",
        )


@dataclass
class ShardedTrainerConfig(ByteSplatTrainerConfig):
    """The trainer of a sharded run (``ShardedPipelineConfig``): one per rank, no DDP."""

    _target: Type = field(default_factory=lambda: ShardedTrainer)

    def set_timestamp(self) -> None:
        # ns-train's main() calls this before it spawns processes: the earliest point where a
        # multi-process launch that cannot work is reported in one line instead of N tracebacks.
        check_nerfstudio_launch(self.machine)
        super().set_timestamp()


@dataclass
class AutoShardedTrainerConfig(ByteSplatTrainerConfig):
    """``ns-train bytesplat``'s trainer: ``ByteSplatTrainer`` in one process; several processes
    (``--machine.num-devices N``) shard the Gaussians instead of nerfstudio's DDP, which would
    replicate every Gaussian and all-reduce all their gradients."""

    def set_timestamp(self) -> None:
        check_nerfstudio_launch(self.machine)
        super().set_timestamp()

    def setup(self, **kwargs):
        if kwargs.get("world_size", 1) > 1:
            return sharded_variant(self).setup(**kwargs)
        return super().setup(**kwargs)


def sharded_variant(config: ByteSplatTrainerConfig, method_name: str | None = None) -> ShardedTrainerConfig:
    """The same trainer config with the sharded pipeline and trainer (a new object)."""
    pipeline = config.pipeline
    if not isinstance(pipeline, ShardedPipelineConfig):
        if not isinstance(pipeline, VanillaPipelineConfig):
            raise BytesplatError(f"{type(pipeline).__name__} cannot be sharded (needs a VanillaPipelineConfig).")
        pipeline = ShardedPipelineConfig(datamanager=pipeline.datamanager, model=pipeline.model)
    values = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.init and f.name != "_target"}
    values["pipeline"] = pipeline
    if method_name is not None:
        values["method_name"] = method_name
    return ShardedTrainerConfig(**values)


class ShardedTrainer(ByteSplatTrainer):
    pipeline: ShardedPipeline

    def setup(self, test_mode: Literal["test", "val", "inference"] = "val") -> None:
        super().setup(test_mode=test_mode)
        viewer = self.viewer_state
        if viewer is None or self.pipeline.world_size == 1:
            return
        if self.pipeline.rank == 0 and hasattr(viewer, "get_model"):
            # The viewer renders rank 0's full copy of the Gaussians (refreshed between steps), never
            # the shard and never through a collective.
            pipeline = self.pipeline
            viewer.get_model = lambda: pipeline.full_model()  # type: ignore[method-assign]
        elif self.pipeline.rank != 0:
            # nerfstudio starts a viewer on every node's local rank 0 (multi-node runs).
            CONSOLE.log(
                f"bytesplat: the viewer of rank {self.pipeline.rank} shows this rank's shard only; "
                "global rank 0's viewer shows the whole scene."
            )

    def setup_optimizers(self):
        """nerfstudio's optimizers on this rank's shard, with learning rates scaled for the batch."""
        from nerfstudio.engine.optimizers import Optimizers

        B = self.pipeline.views_per_step
        config = copy.deepcopy(self.config.optimizers)
        for name in PARAM_NAMES:
            if name not in config:
                continue
            opt_cfg = config[name]["optimizer"]
            betas = getattr(opt_cfg, "betas", (0.9, 0.999))
            lr, betas = scale_adam_for_batch(opt_cfg.lr, tuple(betas), B)
            opt_cfg.lr = lr
            opt_cfg.betas = betas  # AdamOptimizerConfig passes its attributes to torch.optim.Adam
            sched = config[name].get("scheduler")
            if sched is not None and getattr(sched, "lr_final", None) is not None:
                sched.lr_final = sched.lr_final * math.sqrt(B)
        return Optimizers(config, self.pipeline.get_param_groups())

    @check_main_thread
    def save_checkpoint(self, step: int) -> None:
        """Rank 0 writes the gathered full state (atomically; in the background unless configured off)."""
        try:
            gathered = self.pipeline.checkpoint_state(step)
        except BytesplatError as error:
            CONSOLE.print(f"[bold red]bytesplat: {error}")
            return
        state = self.checkpoint_contents(step)
        state["pipeline"] = gathered["pipeline"]
        state["optimizers"] = gathered["optimizers"] or state["optimizers"]
        self.checkpoint_writer.save(state, step)

    def _load_checkpoint(self) -> None:
        state, path = resume_pipeline(self)
        if state is None:
            return
        params = self.pipeline.model.gauss_params
        total = int(strip_module(state["pipeline"])["_model.gauss_params.means"].shape[0])
        start, end = ShardLayout.even(total, self.pipeline.world_size).range(self.pipeline.rank)
        for name, sd in state["optimizers"].items():
            opt = self.optimizers.optimizers.get(name)
            if opt is None:
                continue
            if name in PARAM_NAMES:
                # The model's load replaced the Parameter objects: point the optimizer at the new ones.
                opt.param_groups[0]["params"] = [params[name]]
                self.optimizers.parameters[name] = [params[name]]
                sd = copy.copy(sd)
                sd["state"] = {i: dict(s) for i, s in sd["state"].items()}
                for s in sd["state"].values():
                    for k in ADAM_ROW_KEYS:
                        if isinstance(s.get(k), torch.Tensor) and s[k].dim() > 0 and s[k].shape[0] == total:
                            s[k] = s[k][start:end].clone()
            opt.load_state_dict(sd)
        if "schedulers" in state and self.config.load_scheduler:
            self.optimizers.load_schedulers(state["schedulers"])
        self.grad_scaler.load_state_dict(state["scalers"])
        gaussian_opts = {n: self.optimizers.optimizers[n] for n in PARAM_NAMES if n in self.optimizers.optimizers}
        self.pipeline.exchange.after_load(gaussian_opts)
        self.pipeline.follow_replaced_parameters(self.optimizers)
        CONSOLE.print(f"Done loading checkpoint from {path} (rank {self.pipeline.rank}: Gaussians {start}..{end} of {total})")
