"""nerfstudio's Trainer with crash-safe checkpoints and clear errors when loading one."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Tuple, Type

import torch
from nerfstudio.engine.trainer import Trainer, TrainerConfig
from nerfstudio.utils.decorators import check_main_thread
from nerfstudio.utils.rich_utils import CONSOLE

from bytesplat_ns.checkpoints import (  # noqa: F401  (re-exported: the sharded trainer and the benches use them)
    CHECKPOINT_NAME,
    CheckpointWriter,
    checkpoint_to_load,
    latest_checkpoint,
    read_checkpoint,
    refuse_existing_run,
    write_checkpoint,
)
from bytesplat_ns.divergence import DivergenceGuard
from bytesplat_ns.errors import BytesplatError


@dataclass
class ByteSplatTrainerConfig(TrainerConfig):
    _target: Type = field(default_factory=lambda: ByteSplatTrainer)
    background_checkpoint_writes: bool = True
    """Write checkpoints in a background thread (after a host copy taken at the save step), off the
    training loop's critical path; every write is still atomic and finished before the next or exit."""
    steps_per_finite_check: int = 50
    """Read the device-side "loss is finite" flag and check every parameter for NaN/inf this often
    (and before every checkpoint): a diverged run stops within this many steps."""

    def __setstate__(self, state: dict) -> None:
        # yaml.Loader (eval_setup reading config.yml) restores the config here, before any checkpoint is loaded.
        self.__dict__.update(state)
        from bytesplat_ns.compat import install_checkpoint_loader

        install_checkpoint_loader()

    def set_experiment_name(self) -> None:
        # With no --data we train on the built-in scene: name the run after it, not "unnamed".
        no_data = self.pipeline.datamanager.data is None and getattr(self.pipeline.datamanager.dataparser, "data", None) is None
        if self.experiment_name is None and no_data:
            self.experiment_name = "bytesplat-scene"
        super().set_experiment_name()

    def set_timestamp(self) -> None:
        # ns-train's main() calls this before it spawns processes: the earliest point where a
        # multi-process launch that cannot work is reported in one line instead of N tracebacks.
        if int(self.machine.num_devices) * int(self.machine.num_machines) > 1:
            from bytesplat_ns.distributed.pipeline import check_nerfstudio_launch

            check_nerfstudio_launch(self.machine)
        check_rasterizer_device(self)
        super().set_timestamp()
        # Before ns-train writes config.yml into the run directory.
        refuse_existing_run(self.get_checkpoint_dir(), self.load_dir, self.load_checkpoint)

    def setup(self, **kwargs):
        # Several processes (ns-train --machine.num-devices N): shard the Gaussians instead of
        # nerfstudio's DDP, which would replicate every Gaussian and all-reduce all their gradients.
        if kwargs.get("world_size", 1) > 1 and type(self) is ByteSplatTrainerConfig:
            from bytesplat_ns.train import sharded_variant

            return sharded_variant(self).setup(**kwargs)
        return super().setup(**kwargs)


def check_rasterizer_device(config: TrainerConfig) -> None:
    """A GPU-only rasterizer with --machine.device-type cpu fails here, before any data is loaded."""
    rasterizer = getattr(getattr(config.pipeline, "model", None), "rasterizer", None)
    if rasterizer in ("fused", "gsplat") and config.machine.device_type == "cpu":
        raise BytesplatError(
            f"--pipeline.model.rasterizer {rasterizer} needs a CUDA device, but --machine.device-type is cpu.",
            hint="use --pipeline.model.rasterizer reference (or auto) on CPU",
        )


def resume_pipeline(trainer) -> Tuple[Optional[dict], Optional[Path]]:
    """The first half of every resume: read the checkpoint the config names, set the start step and
    load the pipeline. Returns the checkpoint (its optimizer states are the caller's) and its path,
    or (None, None) when there is nothing to load."""
    path = checkpoint_to_load(trainer.config)
    if path is None:
        CONSOLE.print("No Nerfstudio checkpoint to load, so training from scratch.")
        return None, None
    state = read_checkpoint(path)
    trainer._start_step = state["step"] + 1
    trainer.pipeline.load_pipeline(state["pipeline"], state["step"])
    return state, path


class ByteSplatTrainer(Trainer):
    config: ByteSplatTrainerConfig

    def _load_checkpoint(self) -> None:
        state, path = resume_pipeline(self)
        if state is None:
            return
        self._follow_replaced_parameters()
        self.optimizers.load_optimizers(state["optimizers"])
        if "schedulers" in state and self.config.load_scheduler:
            self.optimizers.load_schedulers(state["schedulers"])
        self.grad_scaler.load_state_dict(state["scalers"])
        self._apply_configured_learning_rates()
        CONSOLE.print(f"Done loading checkpoint from {path}")

    def _apply_configured_learning_rates(self) -> None:
        """Loading optimizer and scheduler states restores the old run's learning rates: put the
        configured ones back (at the schedule's current point), so flags given on resume take effect."""
        for name, optimizer in self.optimizers.optimizers.items():
            configured = self.config.optimizers.get(name, {}).get("optimizer")
            if configured is None:
                continue
            scheduler = self.optimizers.schedulers.get(name)
            for i, group in enumerate(optimizer.param_groups):
                progress = 1.0
                if scheduler is not None and scheduler.base_lrs[i] > 0:
                    progress = group["lr"] / scheduler.base_lrs[i]
                    scheduler.base_lrs[i] = configured.lr
                group["initial_lr"] = configured.lr
                group["lr"] = configured.lr * progress

    def _follow_replaced_parameters(self) -> None:
        """Point the optimizers at the model's current parameters.

        splatfacto's ``load_state_dict`` replaces every Gaussian parameter with a new tensor sized
        to the checkpoint, after the optimizers were built on the old ones; without this, resumed
        training would step tensors the model no longer uses.
        """
        for name, params in self.pipeline.get_param_groups().items():
            optimizer = self.optimizers.optimizers.get(name)
            if optimizer is None:
                continue
            optimizer.param_groups[0]["params"] = list(params)
            self.optimizers.parameters[name] = list(params)

    def checkpoint_contents(self, step: int) -> dict:
        """Everything a checkpoint holds (nerfstudio's layout, so its tools load it)."""
        pipeline = self.pipeline.module if hasattr(self.pipeline, "module") else self.pipeline
        return {
            "step": step,
            "pipeline": pipeline.state_dict(),
            "optimizers": {k: v.state_dict() for k, v in self.optimizers.optimizers.items()},
            "schedulers": {k: v.state_dict() for k, v in self.optimizers.schedulers.items()},
            "scalers": self.grad_scaler.state_dict(),
        }

    # ---- checkpoints and divergence (bytesplat_ns.checkpoints, bytesplat_ns.divergence) ----

    @property
    def checkpoint_writer(self) -> CheckpointWriter:
        if getattr(self, "_checkpoint_writer", None) is None:
            self._checkpoint_writer = CheckpointWriter(
                self.checkpoint_dir, self.config.save_only_latest_checkpoint, self.config.background_checkpoint_writes
            )
        return self._checkpoint_writer

    @property
    def divergence_guard(self) -> DivergenceGuard:
        if getattr(self, "_divergence_guard", None) is None:
            self._divergence_guard = DivergenceGuard(self.config.steps_per_finite_check)
        return self._divergence_guard

    def check_finite(self, step: int) -> None:
        self.divergence_guard.check(step, self.pipeline.get_param_groups())

    def train_iteration(self, step: int):
        loss, loss_dict, metrics_dict = super().train_iteration(step)
        self.divergence_guard.observe(step, loss)
        if self.divergence_guard.due(step):
            self.check_finite(step)
        return loss, loss_dict, metrics_dict

    def train(self) -> None:
        try:
            super().train()
        finally:
            self.checkpoint_writer.finish()  # the last write completes (or reports) before we return

    @check_main_thread
    def save_checkpoint(self, step: int) -> None:
        self.check_finite(step)  # never replace a finite checkpoint by a diverged one
        self.checkpoint_writer.save(self.checkpoint_contents(step), step)
