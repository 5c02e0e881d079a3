"""nerfstudio's Trainer with crash-safe checkpoints and clear errors when loading one.

The single-process base of both bytesplat trainers: ``ns-train bytesplat``'s config
(``distributed.trainer.AutoShardedTrainerConfig``) and the sharded one derive from it.
"""

from __future__ import annotations

import functools
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

from bytesplat_ns import event_crc, event_writers, heap, training_loop
from bytesplat_ns.checkpoints import (  # noqa: F401  (re-exported: the sharded trainer and the benches use them)
    CHECKPOINT_NAME,
    CheckpointWriter,
    checkpoint_to_load,
    latest_checkpoint,
    read_checkpoint,
    refuse_existing_run,
    require_checkpoint_file,
    write_checkpoint,
)
from bytesplat_ns.divergence import DivergenceGuard
from bytesplat_ns.errors import BytesplatError, SettingError
from bytesplat_ns.eval_logging import EVAL_METRICS_GROUP, EvalImageLogger, tensorboard_writers
from bytesplat_ns.model import ByteSplatModel
from bytesplat_ns.optim import OnePassOptimizers
from bytesplat_ns.step_graphs import CaptureFailed, StepGraphs, graph_key


@dataclass
class ByteSplatTrainerConfig(TrainerConfig):
    _target: Type = field(default_factory=lambda: ByteSplatTrainer)
    async_eval_images: bool = True
    """Read back, encode and write the in-training eval image (every steps_per_eval_image steps) on a
    worker thread instead of stalling the training loop; same schedule, tags and values. Needs
    tensorboard as the only event writer (otherwise nerfstudio's synchronous path is used)."""
    eval_image_png_level: int = 1
    """zlib level (0-9) of the eval images' PNG in tensorboard with async_eval_images: 1 writes the same
    pixels several times faster than tensorboard's default, in a larger file."""
    background_checkpoint_writes: bool = True
    """Write checkpoints in a background thread (after a host copy taken at the save step), off the
    training loop's critical path; every write is still atomic and finished before the next or exit."""
    steps_per_finite_check: int = 50
    """Read the device-side "loss is finite" flag and check every parameter for NaN/inf this often
    (and before every checkpoint): a diverged run stops within this many steps."""
    fast_event_checksums: bool = True
    """Checksum tensorboard's event records with bytesplat's vectorised CRC-32C (bytesplat_ns/event_crc.py;
    the same bytes) instead of tensorboard's pure-Python loop, which holds the interpreter lock for
    ~0.25 s per MB of eval image and slows the training loop meanwhile."""
    timing_scalars_every_step: bool = False
    """Write nerfstudio's per-step timing scalars (Train Iter (time), ETA (time), Train Rays / Sec) to
    tensorboard at every step, as nerfstudio does. False: only on logged steps (--logging.steps-per-log),
    as the console shows them; three tensorboard writes fewer on the training thread per step
    (bytesplat_ns/event_writers.py). Every other scalar and image is written as before."""
    learning_rates_every_step: bool = False
    """Write nerfstudio's per-step learning-rate scalars (learning_rate/<group>) to tensorboard at every
    step, as nerfstudio does. False: only on logged steps (--logging.steps-per-log), the same schedule
    sampled every steps_per_log steps: each event wakes tensorboard's writer thread, a thread switch
    that costs the training thread ~0.5 ms (bytesplat_ns/event_writers.py)."""
    batched_tensorboard_scalars: bool = True
    """Write a logged step's tensorboard scalars as one event, their tensors copied to the host in one
    non-blocking copy and written a few logged steps later (batched_scalars_steps_per_write; the last
    when training ends), instead of one add_scalar each (a GPU wait, a protobuf and a slot of
    tensorboard's 10-event queue each, ~5 ms a logged step on the H200 machine). Same tags, steps and
    values (bytesplat_ns/event_writers.py)."""
    batched_scalars_steps_per_write: int = 5
    """With batched_tensorboard_scalars, hand the logged steps' scalar events to tensorboard this many at a
    time: each hand-over wakes tensorboard's writer thread, a thread switch that costs the training thread
    ~0.5 ms on the H200 machine. Events reach the event file up to this many logged steps later
    (tensorboard itself flushes every 120 s); all of them are written when training ends. Keep it below
    tensorboard's queue of 10 events. 1: every logged step's event is handed over a logged step later."""
    optimizer_steps_in_one_pass: bool = True
    """Clear the gradients and step bytesplat's Adam optimizers in one pass per training step (one launch for
    every step count, one kernel per tensor) instead of nerfstudio's loop through each optimizer's GradScaler
    and torch step wrapper: the same updates with less host time. Gradient scaling (AMP), clipping
    (max_norm) and other optimizers take nerfstudio's way (bytesplat_ns/optim.py OnePassOptimizers)."""
    lean_training_loop: bool = True
    """Run nerfstudio's training loop (same steps, callbacks, logged values, evals and checkpoints, in the
    same order and on the same schedule) without the per-step host work whose result nobody reads:
    ``pipeline.train()`` when already in training mode, the timing and learning-rate events of steps that
    are not logged where no event writer keeps them, and the eval and event-writing calls on steps with
    nothing due (bytesplat_ns/training_loop.py). False: nerfstudio's ``Trainer.train``."""
    freeze_heap_after_setup: bool = True
    """When training starts, freeze every object the start-up created (torch, nerfstudio, the data), so
    that training's full garbage collections scan only what training creates (gc.freeze; under ns-train
    ~0.3 s of collections in a 5000-step run on the H200 machine; bytesplat-train freezes them already)."""
    cuda_graph_steps: bool = True
    """Replay the plain training steps' render, loss and backward as one CUDA graph, captured again when the
    Gaussians, the SH degree or the resolution change (bytesplat_ns/step_graphs.py): the host issues a few
    copies and one graph instead of ~80 launches a step. The graph bins into a room sized ahead, so the run's
    steps do (as with --pipeline.model.fused.sync-free-binning True); logged steps replay too, scale-regularisation
    and pruning-score steps run as before. On: ns-train on fox, one H100, 5000 iterations, seeds 0-2: median step
    1.46 against 3.34 ms, launch to exit 16.0 against 26.2 s (medians; suite cuda-graph-steps). Applies to the fused
    rasterizer on one GPU; elsewhere the steps run as before."""
    freeze_heap_at_exit: bool = True
    """After training, let the process exit without the interpreter's garbage-collector walk over its
    whole heap (gc.freeze at exit, ~2 s for a process holding torch and nerfstudio); the tensorboard
    writers are flushed and closed first (bytesplat_ns/heap.py)."""

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

    def check_inputs(self) -> None:
        """What can be wrong with the command line before anything is written or loaded: the device, the data
        the dataparser will read, the checkpoint to load, the settings. Run by set_timestamp (before ns-train
        writes config.yml) and by every rank of a torchrun launch (bytesplat_ns/train.py)."""
        from bytesplat_ns.data.dataparser import check_data_inputs

        check_rasterizer_device(self)
        check_data_inputs(getattr(self.pipeline, "datamanager", None))
        check_checkpoint_exists(self)
        if self.batched_scalars_steps_per_write < 1:
            raise SettingError(f"--batched-scalars-steps-per-write must be at least 1, got {self.batched_scalars_steps_per_write}")

    def set_timestamp(self) -> None:
        self.check_inputs()
        super().set_timestamp()
        # Before ns-train writes config.yml into the run directory.
        refuse_existing_run(self.get_checkpoint_dir(), self.load_dir, self.load_checkpoint)


def check_checkpoint_exists(config: TrainerConfig) -> None:
    """The checkpoint --load-dir/--load-step/--load-checkpoint name exists, checked before ns-train writes the run's
    config.yml and loads the data (it is read only when the trainer sets up)."""
    path = checkpoint_to_load(config)  # a --load-dir that does not exist or holds no checkpoint fails here
    if path is not None:
        require_checkpoint_file(path)


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
    _eval_logger: Optional[EvalImageLogger] = None
    step_graphs: Optional[StepGraphs] = None  # setup builds it where --cuda-graph-steps applies

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
        model = getattr(self.pipeline, "model", None)
        result = None
        if isinstance(model, ByteSplatModel):
            for camera, batch in model.views_to_train_again(step):
                self.train_view_again(model, camera, batch, step)
            # nerfstudio's loop writes the metrics dict only on these steps (Trainer.train)
            wanted = step_check(step, self.config.logging.steps_per_log, run_at_zero=True)
            object.__setattr__(model, "training_metrics_wanted", wanted)  # a plain attribute: not Module's slow path
            if self.step_graphs is not None and not self.step_graphs.off and model.graph_step_blocker(step) is None:
                result = self.graph_iteration(model, step)
        loss, loss_dict, metrics_dict = result if result is not None else super().train_iteration(step)
        if self.step_graphs is not None:
            # the loop holds these until the next step: detached, they keep no gradient accumulator alive
            # into a capture (step_graphs.py)
            loss, loss_dict = loss.detach(), {key: value.detach() for key, value in loss_dict.items()}
        self.divergence_guard.observe(step, loss)
        if self.divergence_guard.due(step):
            self.check_finite(step)
        return loss, loss_dict, metrics_dict

    def graph_iteration(self, model: ByteSplatModel, step: int):
        """``train_iteration`` with the render, loss and backward replayed as a CUDA graph (step_graphs.py);
        None where the step has no room to bin into yet (nothing was taken from the datamanager)."""
        if self.step_graphs.current is None and model.graph_step_room() is None:
            return None
        camera, batch = self.pipeline.datamanager.next_train(step)
        viewmat, intrinsics, width, height = model.graph_step_view(camera)
        if model.graph_view_blocker(batch, width, height) is not None:
            return self.iteration_on(step, camera, batch)
        image = batch["image"]
        key = graph_key(model.gaussian_parameters(), model.sh_degree_in_use(), width, height, image)
        try:
            graph = self.step_graphs.run(model, key, viewmat, intrinsics, image, width, height)
        except CaptureFailed as failure:
            if self.step_graphs.off:
                CONSOLE.log(f"bytesplat: --cuda-graph-steps off for the rest of this run: {failure}")
            else:
                CONSOLE.log(f"bytesplat: step {step} ran eagerly, the next graph step captures again: {failure}")
            return self.iteration_on(step, camera, batch)
        if graph is None:
            return self.iteration_on(step, camera, batch)
        model.graph_step_replayed(graph.info, graph.room, camera, batch)
        loss_dict, metrics_dict = model.graph_step_dicts(graph.loss, graph.rgb, graph.background, batch)
        self.optimizers.optimizer_scaler_step_all(self.grad_scaler)
        self.optimizers.scheduler_step_all(step)
        return graph.loss, loss_dict, metrics_dict

    def iteration_on(self, step: int, camera, batch: dict):
        """nerfstudio's ``train_iteration`` on a view already taken from the datamanager, where gradients are
        neither scaled nor accumulated (what graph steps need, ``setup``)."""
        result = self._train_on(self.pipeline.model, camera, batch)
        self.optimizers.scheduler_step_all(step)
        return result

    def _train_on(self, model: ByteSplatModel, camera, batch: dict):
        """What ``train_iteration`` does for one view: clear the gradients, render and score the view, backward,
        the optimizers' step. Returns (loss, loss_dict, metrics_dict)."""
        self.optimizers.zero_grad_all()
        outputs = model(camera)
        metrics_dict = model.get_metrics_dict(outputs, batch)
        loss_dict = model.get_loss_dict(outputs, batch, metrics_dict)
        loss = functools.reduce(torch.add, loss_dict.values())
        loss.backward()
        self.optimizers.optimizer_scaler_step_all(self.grad_scaler)
        return loss, loss_dict, metrics_dict

    def train_view_again(self, model: ByteSplatModel, camera, batch: dict, step: int) -> None:
        """Train an earlier step's view once more, its tile lists binned by the count read back: the step
        whose lists did not fit their room changed nothing (bytesplat_ns/pair_capacity.py). What
        ``train_iteration`` does for the view (clear, render and loss, backward, the optimizers' step) and the
        densification statistics of its render; no scheduler step, callbacks or logged values of its own."""
        model.binning_exactly, wanted = True, model.training_metrics_wanted
        object.__setattr__(model, "training_metrics_wanted", False)
        try:
            self._train_on(model, camera, batch)
        finally:
            model.binning_exactly = False
            object.__setattr__(model, "training_metrics_wanted", wanted)
        model.record_densification_statistics(step)

    def setup(self, test_mode="val") -> None:
        if self.config.fast_event_checksums:
            event_crc.install()
        event_writers.retire_event_writers()  # an earlier trainer's, in this process
        super().setup(test_mode=test_mode)
        config = self.config
        if config.optimizer_steps_in_one_pass:
            self.optimizers = OnePassOptimizers.adopt(self.optimizers)
        if not (config.timing_scalars_every_step and config.learning_rates_every_step) or config.batched_tensorboard_scalars:
            event_writers.adopt_tensorboard_writers(config.logging.steps_per_log, config.timing_scalars_every_step,
                                                    config.batched_tensorboard_scalars, config.learning_rates_every_step,
                                                    config.batched_scalars_steps_per_write)
        if (config.lean_training_loop and isinstance(self.optimizers, OnePassOptimizers)
                and not event_writers.read_between_logged_steps("learning_rates")):
            self.optimizers.learning_rate_events_every = max(1, config.logging.steps_per_log)
        model = getattr(self.pipeline, "model", None)
        if isinstance(model, ByteSplatModel):
            # a view trained again (pair_capacity.py) is one plain step: no scaled or accumulated gradients
            model.sized_binning_allowed = (not self.use_grad_scaler
                                           and all(n == 1 for n in self.gradient_accumulation_steps.values()))
        self.step_graphs = self._step_graphs(model)

    def _step_graphs(self, model) -> Optional[StepGraphs]:
        """The training step's CUDA graph (``cuda_graph_steps``), where this trainer's steps can take one: the
        fused rasterizer in one process on a GPU, nerfstudio's plain pipeline, no scaled, accumulated or logged
        gradients. The model's steps then bin into rooms sized ahead (pair_capacity.py), as the graph's do."""
        config = self.config
        if (not config.cuda_graph_steps or not isinstance(model, ByteSplatModel) or model.rasterizer_backend != "fused"
                or type(self.pipeline) is not VanillaPipeline):
            return None  # no GPU, another rasterizer or a sharded pipeline: nothing to replay, nothing to say
        reasons = [why for why, blocks in (
            ("mixed precision or gradient accumulation", not model.sized_binning_allowed),
            ("--logging.log-gradients", config.log_gradients),
            ("optimizers outside one pass", not isinstance(self.optimizers, OnePassOptimizers))) if blocks]
        if reasons:
            CONSOLE.log(f"bytesplat: --cuda-graph-steps off for this run ({', '.join(reasons)})")
            return None
        model.size_rooms_ahead()
        return StepGraphs()

    def train(self) -> None:
        if self.config.freeze_heap_after_setup:
            heap.freeze_set_up()
        try:
            if self.config.lean_training_loop:
                training_loop.run(self, timings_every_step=event_writers.read_between_logged_steps("timings"))
            else:
                super().train()
        finally:
            event_writers.flush_held_scalars()  # the last logged step's scalars
            self.checkpoint_writer.finish()  # the last write completes (or reports) before we return
        if self.config.freeze_heap_at_exit:
            heap.freeze_heap_at_exit()

    @check_main_thread
    def save_checkpoint(self, step: int) -> None:
        self.train_waiting_views(step)  # the checkpoint holds every view's update
        self.check_finite(step)  # never replace a finite checkpoint by a diverged one
        self.checkpoint_writer.save(self.checkpoint_contents(step), step)

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
            self._eval_logger = EvalImageLogger(summaries, self.config.eval_image_png_level)
        return self._eval_logger

    def _pair_room(self):
        """The model's tile-pair room (pair_capacity.py), or None where its steps bin by the count read back."""
        model = getattr(self.pipeline, "model", None)
        return model.pair_room if isinstance(model, ByteSplatModel) else None

    def train_waiting_views(self, step: int) -> None:
        """Train now the views of the last steps whose tile lists did not fit their room (pair_capacity.py),
        instead of ``lag`` steps later: before a checkpoint, so that it holds every view's update."""
        room = self._pair_room()
        if room is not None:
            for camera, batch in room.finish():
                self.train_view_again(self.pipeline.model, camera, batch, step)

    def _after_train(self) -> None:
        self.train_waiting_views(self.step)  # the last steps' views, before the final checkpoint and the count below
        if self.step_graphs is not None:
            graphs = self.step_graphs
            failed = f", {len(graphs.failures)} failed" if graphs.failures else ""
            CONSOLE.log(f"bytesplat: {graphs.replays} training steps replayed as CUDA graphs "
                        f"({graphs.captures} captures, {graphs.capture_seconds:.2f} s{failed})")
            graphs.current = None
        room = self._pair_room()
        if room is not None and room.overflows:
            CONSOLE.log(f"bytesplat: {room.overflows} of {room.sized_steps} steps binned into a room sized ahead "
                        "did not fit it and were trained again")
        if self._eval_logger is not None:
            self._eval_logger.close()  # every queued eval image is written before training reports done
            self._eval_logger = None
        super()._after_train()
