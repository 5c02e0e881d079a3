"""nerfstudio's Trainer with crash-safe checkpoints and clear errors when loading one.

The single-process base of both bytesplat trainers: ``ns-train bytesplat``'s config
(``distributed.trainer.AutoShardedTrainerConfig``) and the sharded one derive from it.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Tuple, Type

import torch
from nerfstudio.engine.trainer import Trainer, TrainerConfig
from nerfstudio.pipelines.base_pipeline import VanillaPipeline
from nerfstudio.utils import writer
from nerfstudio.utils.decorators import check_eval_enabled, check_main_thread
from nerfstudio.utils.misc import step_check
from nerfstudio.utils.rich_utils import CONSOLE

from bytesplat_ns.errors import BytesplatError
from bytesplat_ns.eval_logging import EVAL_METRICS_GROUP, EvalImageLogger, tensorboard_writers

CHECKPOINT_NAME = re.compile(r"^step-(\d{9})\.ckpt$")


@dataclass
class ByteSplatTrainerConfig(TrainerConfig):
    _target: Type = field(default_factory=lambda: ByteSplatTrainer)
    async_eval_images: bool = True
    """Read back, encode and write the in-training eval image (every steps_per_eval_image steps) on a
    worker thread instead of stalling the training loop; same schedule, tags and values. Needs
    tensorboard as the only event writer (otherwise nerfstudio's synchronous path is used)."""

    def set_experiment_name(self) -> None:
        # With no --data we train on the built-in scene: name the run after it, not "unnamed".
        no_data = self.pipeline.datamanager.data is None and getattr(self.pipeline.datamanager.dataparser, "data", None) is None
        if self.experiment_name is None and no_data:
            self.experiment_name = "bytesplat-scene"
        super().set_experiment_name()


def latest_checkpoint(load_dir: Path) -> Path:
    """The newest ``step-*.ckpt`` in ``load_dir``; a clear error if there is none."""
    if not load_dir.is_dir():
        raise BytesplatError(f"Checkpoint directory {load_dir} does not exist.")
    steps = sorted(int(m.group(1)) for m in map(CHECKPOINT_NAME.match, os.listdir(load_dir)) if m)
    if not steps:
        raise BytesplatError(f"No checkpoint (step-XXXXXXXXX.ckpt) in {load_dir}.")
    return load_dir / f"step-{steps[-1]:09d}.ckpt"


def checkpoint_to_load(config: TrainerConfig) -> Optional[Path]:
    """The checkpoint that ``--load-dir``/``--load-step``/``--load-checkpoint`` name, or None."""
    if config.load_dir is not None:
        if config.load_step is None:
            return latest_checkpoint(config.load_dir)
        return config.load_dir / f"step-{config.load_step:09d}.ckpt"
    return config.load_checkpoint


def write_checkpoint(state: dict, checkpoint_dir: Path, step: int, keep_only_latest: bool) -> Path:
    """Write to a temporary file, then rename: a crash mid-write never leaves a broken checkpoint."""
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    path = checkpoint_dir / f"step-{step:09d}.ckpt"
    partial = path.with_name(path.name + ".partial")
    torch.save(state, partial)
    os.replace(partial, path)
    if keep_only_latest:
        for old in checkpoint_dir.glob("step-*.ckpt"):
            if old != path:
                old.unlink()
    return path


def read_checkpoint(path: Path) -> dict:
    """torch.load a nerfstudio checkpoint, turning the usual failures into one clear message."""
    if not path.is_file():
        raise BytesplatError(f"Checkpoint {path} does not exist.")
    try:
        state = torch.load(path, map_location="cpu")
    except Exception as error:  # noqa: BLE001 - corrupt/truncated/foreign files all end here
        raise BytesplatError(f"Cannot read checkpoint {path}: {type(error).__name__}: {error}") from error
    if not isinstance(state, dict) or "pipeline" not in state or "step" not in state:
        raise BytesplatError(f"{path} is not a nerfstudio checkpoint (no 'pipeline'/'step' entries).")
    return state


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
    _eval_logger: Optional[EvalImageLogger] = None

    def _load_checkpoint(self) -> None:
        state, path = resume_pipeline(self)
        if state is None:
            return
        self._follow_replaced_parameters()
        self.optimizers.load_optimizers(state["optimizers"])
        if "schedulers" in state and self.config.load_scheduler:
            self.optimizers.load_schedulers(state["schedulers"])
        self.grad_scaler.load_state_dict(state["scalers"])
        CONSOLE.print(f"Done loading checkpoint from {path}")

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

    @check_main_thread
    def save_checkpoint(self, step: int) -> None:
        write_checkpoint(self.checkpoint_contents(step), self.checkpoint_dir, step, self.config.save_only_latest_checkpoint)

    # -- in-training evaluation off the training thread (bytesplat_ns/eval_logging.py) --------------

    @check_eval_enabled
    def eval_iteration(self, step: int) -> None:
        """nerfstudio's eval schedule; the single eval image's metrics and PNG on a worker thread."""
        logger = self._eval_image_logger()
        if logger is None:
            return super().eval_iteration(step)
        if step_check(step, self.config.steps_per_eval_batch):
            _, loss_dict, metrics_dict = self.pipeline.get_eval_loss_dict(step=step)
            writer.put_scalar(name="Eval Loss", scalar=functools.reduce(torch.add, loss_dict.values()), step=step)
            writer.put_dict(name="Eval Loss Dict", scalar_dict=loss_dict, step=step)
            writer.put_dict(name="Eval Metrics Dict", scalar_dict=metrics_dict, step=step)
        if step_check(step, self.config.steps_per_eval_image):
            logger.submit(step, self._queue_eval_image(step))
        if step_check(step, self.config.steps_per_eval_all_images):
            logger.drain()  # the all-images pass uses the same metric modules, on this thread
            metrics_dict = self.pipeline.get_average_eval_image_metrics(step=step)
            writer.put_dict(name=f"{EVAL_METRICS_GROUP} Dict (all images)", scalar_dict=metrics_dict, step=step)

    def _queue_eval_image(self, step: int):
        """Queue the render of the next eval image here (the model as of this step); return what the
        worker runs: the metrics and images, as ``pipeline.get_eval_image_metrics_and_images``."""
        pipeline = self.pipeline
        pipeline.eval()
        try:
            camera, batch = pipeline.datamanager.next_eval_image(step)
            outputs = pipeline.model.get_outputs_for_camera(camera)
        finally:
            pipeline.train()

        def metrics_and_images():
            metrics, images = pipeline.model.get_image_metrics_and_images(outputs, batch)
            metrics["num_rays"] = (camera.height * camera.width * camera.size).item()
            return metrics, images

        return metrics_and_images

    def _eval_image_logger(self) -> Optional[EvalImageLogger]:
        # A pipeline with its own eval image path (the sharded one renders rank 0's full copy) keeps it.
        own_eval = type(self.pipeline).get_eval_image_metrics_and_images is not VanillaPipeline.get_eval_image_metrics_and_images
        if not self.config.async_eval_images or own_eval:
            return None
        if self._eval_logger is None:
            summaries = tensorboard_writers()
            if not summaries:
                return None
            self._eval_logger = EvalImageLogger(summaries)
        return self._eval_logger

    def _after_train(self) -> None:
        if self._eval_logger is not None:
            self._eval_logger.close()  # every queued eval image is written before training reports done
            self._eval_logger = None
        super()._after_train()
