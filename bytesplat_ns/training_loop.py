"""nerfstudio's training loop (``Trainer.train``) without the per-step host work whose result nobody reads.

The steps, callbacks, logged values, evals and checkpoints are nerfstudio's, in its order and on its
schedule. What a step no longer does on the training thread (together about half of the loop's own host
time per step: ``bytesplat-bench loop``, suite ``loop-overhead-cpu``):

- ``pipeline.train()`` when the pipeline and its model are already in training mode: a recursive
  ``Module.train`` (one ``Module.__setattr__`` per submodule) at every step. The evals and the viewer
  switch the pipeline or the model to eval mode and back; the loop checks both flags.
- the timing events between logged steps (``Train Iter (time)``, ``ETA (time)``, ``Train Rays / Sec``)
  where no event writer keeps them (the console and bytesplat's tensorboard writer read them on logged
  steps only, ``--timing-scalars-every-step False``): the durations go to a ring buffer instead, and on
  each logged step nerfstudio's ``put_time`` runs on the same window of the last ``max_buffer_size``
  steps, so the logged averages and ETA are the same. Between logged steps the viewer's rays-per-second
  estimate is the one of the last logged step.
- the ``learning_rate/<group>`` events of steps that are not logged, where no event writer keeps them
  (``OnePassOptimizers.learning_rate_events_every``, which the trainer sets).
- ``eval_iteration`` (a lock and two decorators) on steps where none of the three eval schedules is due,
  and ``write_out_storage`` when nothing was put.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Callable, Deque, List

import nerfstudio.configs.base_config  # noqa: F401 - imports nerfstudio's writer without its import cycle
import torch
from nerfstudio.engine.callbacks import TrainingCallbackLocation
from nerfstudio.utils import writer
from nerfstudio.utils.misc import step_check
from nerfstudio.utils.writer import EventName


def in_training_mode(pipeline) -> bool:
    """Whether ``pipeline.train()`` would change nothing that nerfstudio's code switches: the pipeline's
    and its model's flags (the evals switch the pipeline, the viewer the model)."""
    model = getattr(pipeline, "model", None)
    return pipeline.training and (model is None or model.training)


class StepTimings:
    """nerfstudio's per-step timing events (``Trainer.train``'s ``TimeWriter`` and rays per second): put at
    every step (``every_step``), or only on logged steps, then from the same windows of the last
    ``max_buffer_size`` steps that nerfstudio's ``put_time`` would have averaged."""

    def __init__(self, every_step: bool, rays_per_batch: Callable[[], int], world_size: int = 1):
        self.every_step = every_step
        self.rays_per_batch = rays_per_batch  # read on the steps whose rays per second are put
        self.world_size = world_size
        self.step_seconds: Deque[float] = deque(maxlen=int(writer.GLOBAL_BUFFER.get("max_buffer_size", 20)))
        self.steps_with_rays = 0  # recorded steps after the first two (nerfstudio skips their rays per second)

    def record(self, step: int, seconds: float, logged: bool) -> None:
        """``logged``: the events are put at this step (and at the first step recorded: the console's
        first table, on a resumed run, reads them)."""
        self.step_seconds.append(seconds)
        self.steps_with_rays += step > 1
        if not (self.every_step or logged or len(self.step_seconds) == 1):
            writer.GLOBAL_BUFFER["step"] = step  # as put_time sets it: the console table's step
            return
        window = list(self.step_seconds) if not self.every_step else [seconds]
        # nerfstudio's buffer as it would hold before this step's put_time appends the step
        if not self.every_step:
            _set_window(EventName.ITER_TRAIN_TIME, window[:-1])
        writer.put_time(name=EventName.ITER_TRAIN_TIME, duration=seconds, step=step, avg_over_steps=True,
                        update_eta=True)
        if step > 1:
            rays = self.world_size * self.rays_per_batch()
            per_second = [rays / max(0.001, s) for s in window[-min(len(window), self.steps_with_rays):]]
            if not self.every_step:
                _set_window(EventName.TRAIN_RAYS_PER_SEC, per_second[:-1])
            writer.put_time(name=EventName.TRAIN_RAYS_PER_SEC, duration=per_second[-1], step=step, avg_over_steps=True)


def _set_window(name: EventName, durations: List[float]) -> None:
    writer.GLOBAL_BUFFER["events"][name.value] = {
        "buffer": durations, "avg": sum(durations) / len(durations) if durations else 0}


def run(trainer, timings_every_step: bool) -> None:
    """``trainer.train()``'s loop as nerfstudio's ``Trainer.train`` runs it, from ``trainer._start_step``
    for ``max_num_iterations`` steps, then ``trainer._after_train()``."""
    config = trainer.config
    pipeline = trainer.pipeline
    datamanager = pipeline.datamanager
    assert datamanager.train_dataset is not None, "Missing DatsetInputs"
    if hasattr(datamanager, "train_dataparser_outputs"):
        datamanager.train_dataparser_outputs.save_dataparser_transform(trainer.base_dir / "dataparser_transforms.json")
    trainer._init_viewer_state()
    viewer_on = trainer.viewer_state is not None
    has_eval = bool(datamanager.eval_dataset)
    eval_every = (config.steps_per_eval_batch, config.steps_per_eval_image, config.steps_per_eval_all_images)
    steps_per_log = config.logging.steps_per_log
    timings = StepTimings(timings_every_step, datamanager.get_train_rays_per_batch, trainer.world_size)
    before, after = TrainingCallbackLocation.BEFORE_TRAIN_ITERATION, TrainingCallbackLocation.AFTER_TRAIN_ITERATION
    lock = trainer.train_lock
    with writer.TimeWriter(writer, EventName.TOTAL_TRAIN_TIME):
        trainer.stop_training = False
        for step in range(trainer._start_step, trainer._start_step + config.max_num_iterations):
            trainer.step = step
            if trainer.stop_training:
                break
            while trainer.training_state == "paused":
                if trainer.stop_training:
                    trainer._after_train()
                    return
                time.sleep(0.01)
            with lock:
                start = time.perf_counter()
                if not in_training_mode(pipeline):
                    pipeline.train()
                for callback in trainer.callbacks:
                    callback.run_callback_at_location(step, location=before)
                loss, loss_dict, metrics_dict = trainer.train_iteration(step)
                for callback in trainer.callbacks:
                    callback.run_callback_at_location(step, location=after)
                seconds = time.perf_counter() - start
            logged = step_check(step, steps_per_log, run_at_zero=True)
            timings.record(step, seconds, logged)
            if viewer_on:
                trainer._update_viewer_state(step)
            if logged:
                writer.put_scalar(name="Train Loss", scalar=loss, step=step)
                writer.put_dict(name="Train Loss Dict", scalar_dict=loss_dict, step=step)
                writer.put_dict(name="Train Metrics Dict", scalar_dict=metrics_dict, step=step)
                writer.put_scalar(name="GPU Memory (MB)", scalar=torch.cuda.max_memory_allocated() / (1024**2), step=step)
            if has_eval and any(step_check(step, every) for every in eval_every):
                with lock:
                    trainer.eval_iteration(step)
            if step_check(step, config.steps_per_save):
                trainer.save_checkpoint(step)
            if writer.EVENT_STORAGE:
                writer.write_out_storage()
    trainer._after_train()
