r"""``ns-train`` with timers around nerfstudio's trainer phases, for ``bytesplat-bench wallclock``.

    python -m bytesplat_ns.bench.timed_ns_train --timings TIMINGS.json [--launcher bytesplat-train] \
        -- METHOD [ns-train arguments]

runs exactly what ``ns-train METHOD ...`` runs (nerfstudio's own ``scripts.train.entrypoint``, the
method's defaults, the same config.yml; with ``--launcher bytesplat-train``, bytesplat's launcher
``bytesplat_ns.launcher.entrypoint`` instead), with the trainer's methods wrapped by timers. Each
timer is exclusive: time spent in a nested timed call counts only for the inner phase (a
tensorboard write inside an eval iteration is log time, not eval time). The timers read the host
clock and do not synchronise the GPU, so asynchronous GPU work is counted by whichever phase next
waits for it, with one exception: on the steps nerfstudio logs (every ``steps_per_log``), where an
event writer reads the logged tensors as it writes them (nerfstudio's do, so it waits for the GPU
anyway), the train iteration's timer ends with the GPU drained, so the steps' queued GPU work counts
as step time, not as the logger's. bytesplat's batched tensorboard writer reads nothing there, and
then no wait is added. Single-process runs only:
processes that ``--machine.num-devices`` spawns are not timed.

TIMINGS.json holds host clock stamps (``time.time()``, comparable with the launcher's) and the
summed seconds per phase: ``data`` (dataparser, datasets, image caching/undistortion; ``detail_s`` has the
caching of each split's images), ``setup``
(the rest of ``Trainer.setup``: model, optimizers, writers), ``steps`` (train iterations with
their before/after callbacks, i.e. densification), ``eval`` (in-training eval iterations), ``log``
(nerfstudio writer calls and ``write_out_storage``; ``detail_s`` splits it by writer function, and
``write_out_storage`` into ``gpu_wait``, ``tensorboard_scalar``, ``tensorboard_image``, ``console`` and,
for bytesplat's batched writer, ``tensorboard_held_scalars`` and ``held_scalars_wait``), ``save``
(checkpoints), ``step_ms`` (each train iteration's milliseconds as nerfstudio's own iteration timer
measures it, from the first), ``eval_curve`` (the PSNR and SSIM of each all-images eval the trainer
logs, with its step and each image's PSNR), plus the final Gaussian count, the peak GPU memory and
the model's and evals' schedules (``schedule``, which steps refine, change the SH degree or the
training resolution, or follow an eval). ``gc`` counts the garbage
collector's collections while ``Trainer.train`` runs, per generation, with their seconds (inside
whatever phase they interrupt: a full collection that stalls a step is step time).

``--profile-steps START:STOP`` adds ``step_profile``: torch.profiler over those train iterations of
the run itself (``StepWindowProfile``).

``--skip-image-writes`` (quality-only runs): the trainer still renders its eval images on its
schedule, so the training and its random stream are unchanged, but tensorboard does not encode
them (a PNG of the full-resolution image each time: 465 of splatfacto's 1071 s at 30000 iterations
on the fox capture). The run's wall clock then no longer measures what a user waits for.
"""

from __future__ import annotations

import time

PROCESS_START = time.time()  # before the heavy imports: they belong to start-up

import contextlib  # noqa: E402
import functools  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Callable, Dict, List, Optional, Tuple  # noqa: E402

PHASES = ("data", "setup", "steps", "eval", "log", "save")
WRITER_FUNCTIONS = ("put_image", "put_scalar", "put_dict", "put_config", "put_time", "write_out_storage")
STEP_LOCATIONS = ("BEFORE_TRAIN_ITERATION", "AFTER_TRAIN_ITERATION")
EVAL_ALL_IMAGES = "Eval Images Metrics Dict (all images)"  # the tag both trainers log the all-images eval under
LAUNCHERS = ("ns-train", "bytesplat-train")


class PhaseTimers:
    """Exclusive wall-clock timers: nested phases subtract from the phase that encloses them."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.clock = clock
        self.seconds: Dict[str, float] = {phase: 0.0 for phase in PHASES}
        self.calls: Dict[str, int] = {phase: 0 for phase in PHASES}
        self.detail: Dict[str, float] = {}  # exclusive seconds per "phase:function", where wrap() named one
        self._stack: List[List] = []  # [phase, start, time spent in nested phases]

    def wrap(self, phase: str, function: Callable, detail: Optional[str] = None) -> Callable:
        key = f"{phase}:{detail}" if detail else None

        @functools.wraps(function)
        def timed(*args, **kwargs):
            if threading.current_thread() is not threading.main_thread():
                return function(*args, **kwargs)  # the phases are the training thread's
            self._stack.append([phase, self.clock(), 0.0])
            try:
                return function(*args, **kwargs)
            finally:
                _, start, nested = self._stack.pop()
                elapsed = self.clock() - start
                self.seconds[phase] += elapsed - nested
                self.calls[phase] += 1
                if key is not None:
                    self.detail[key] = self.detail.get(key, 0.0) + elapsed - nested
                if self._stack:
                    self._stack[-1][2] += elapsed

        return timed


class CollectionTimer:
    """Count and time the garbage collector's collections per generation while ``active``."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.clock = clock
        self.active = False
        self.counts = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self._started: Optional[float] = None

    def __call__(self, phase: str, info: Dict) -> None:
        if phase == "start":
            self._started = self.clock() if self.active else None
        elif self._started is not None:
            generation = info["generation"]
            self.counts[generation] += 1
            self.seconds[generation] += self.clock() - self._started
            self._started = None

    def summary(self) -> Dict[str, List]:
        return {"collections": list(self.counts), "seconds": list(self.seconds)}


def images_cached_by_split(timers: PhaseTimers, load_images: Callable) -> Callable:
    """``FullImageDatamanager._load_images`` timed as ``data``, its seconds also kept per split in ``detail_s``
    (``data:load_train_images``, ``data:load_eval_images``): nerfstudio caches each split's images when it is
    first read, the training images inside the first step, which ``first_step_ms`` then holds."""
    by_split = {split: timers.wrap("data", load_images, detail=f"load_{split}_images") for split in ("train", "eval")}
    other_split = timers.wrap("data", load_images)

    @functools.wraps(load_images)
    def timed(self, split, *args, **kwargs):
        return by_split.get(split, other_split)(self, split, *args, **kwargs)

    return timed


def install(timers: PhaseTimers, record: Dict, collections: Optional[CollectionTimer] = None) -> None:
    """Wrap nerfstudio's trainer, datamanager and writer with ``timers``; ``record`` receives stamps
    and the trainer's final state."""
    from nerfstudio.data.datamanagers.full_images_datamanager import FullImageDatamanager
    from nerfstudio.engine import callbacks
    from nerfstudio.engine.trainer import Trainer
    from nerfstudio.utils import writer

    FullImageDatamanager.__init__ = timers.wrap("data", FullImageDatamanager.__init__)
    FullImageDatamanager._load_images = images_cached_by_split(timers, FullImageDatamanager._load_images)
    # Subclasses (bytesplat's) override some methods; wrapping the base class's attribute reaches
    # them all only where they call super(): wrap each class that defines the method itself.
    for cls in _with_subclasses(Trainer):
        for name, phase in (("setup", "setup"), ("train_iteration", "steps"), ("eval_iteration", "eval"),
                            ("save_checkpoint", "save")):
            if name in vars(cls):
                method = vars(cls)[name]
                setattr(cls, name, timers.wrap(phase, drained_on_logged_steps(method) if phase == "steps" else method))
        if "_after_train" in vars(cls):
            setattr(cls, "_after_train", stamped_loop_end(vars(cls)["_after_train"], timers, record))
        if "_queue_eval_image" in vars(cls):  # bytesplat's eval image render, queued for its worker
            setattr(cls, "_queue_eval_image", timers.wrap("eval", vars(cls)["_queue_eval_image"], detail="queue_image"))
    real_run = callbacks.TrainingCallback.run_callback_at_location

    def run_callback_at_location(self, step, location):
        if location.name in STEP_LOCATIONS:
            return timed_callback(self, step, location)
        return real_run(self, step, location)

    timed_callback = timers.wrap("steps", real_run)
    callbacks.TrainingCallback.run_callback_at_location = run_callback_at_location
    step_ms = record.setdefault("step_ms", [])
    real_put_time = writer.put_time

    def put_time(name, duration, step, *args, **kwargs):
        # nerfstudio times every train iteration for its ETA (the first included): keep each one
        if name in (writer.EventName.ITER_TRAIN_TIME, writer.EventName.ITER_TRAIN_TIME.value) and not inside_recorder:
            step_ms.append(round(duration * 1000.0, 4))
        return real_put_time(name, duration, step, *args, **kwargs)

    writer.put_time = put_time
    # bytesplat's lean training loop (bytesplat_ns/training_loop.py) puts the iteration time on logged
    # steps only: take every step's from its recorder, and none twice where the recorder calls put_time
    from bytesplat_ns.training_loop import StepTimings

    real_record = StepTimings.record

    def record_step(self, step, seconds, *args, **kwargs):
        step_ms.append(round(seconds * 1000.0, 4))
        inside_recorder.append(True)
        try:
            return real_record(self, step, seconds, *args, **kwargs)
        finally:
            inside_recorder.pop()

    inside_recorder: List[bool] = []
    StepTimings.record = functools.wraps(real_record)(record_step)
    curve_images = EvalImagesByStep()
    record_eval_curve(record.setdefault("eval_curve", []), curve_images)
    split_write_out_storage(timers)
    split_eval(timers)
    for name in WRITER_FUNCTIONS:
        setattr(writer, name, timers.wrap("log", getattr(writer, name), detail=name))

    real_setup = Trainer.setup

    def setup(self, *args, **kwargs):
        record.setdefault("setup_start", time.time())
        record["trainer"] = self
        done = real_setup(self, *args, **kwargs)
        curve_images.install(self.pipeline)
        return done

    Trainer.setup = setup
    # bytesplat's trainers run their own loop (bytesplat_ns/training_loop.py) or nerfstudio's through
    # super(): wrap each class's train, and time the outermost call only
    depth = [0]
    for cls in _with_subclasses(Trainer):
        if "train" in vars(cls):
            setattr(cls, "train", timed_train(vars(cls)["train"], timers, record, collections, depth))


def timed_train(real_train: Callable, timers: PhaseTimers, record: Dict, collections: Optional["CollectionTimer"],
                depth: List[int]) -> Callable:
    """``Trainer.train`` that stamps its start and end and the time no phase timer covers (outermost call)."""

    @functools.wraps(real_train)
    def train(self, *args, **kwargs):
        depth[0] += 1
        if depth[0] > 1:
            try:
                return real_train(self, *args, **kwargs)
            finally:
                depth[0] -= 1
        record["train_start"] = time.time()
        timed_before = sum(timers.seconds.values())
        if collections is not None:
            collections.active = True
        try:
            return real_train(self, *args, **kwargs)
        finally:
            depth[0] -= 1
            if collections is not None:
                collections.active = False
            record["train_end"] = time.time()
            # Trainer.train's wall time that no phase timer covers: the loop's own work per step
            # (the iteration timer, schedule checks, the timers' own cost) and what it does before and
            # after the loop; the loop's part alone where its end was stamped (the first _after_train call)
            record["train_untimed_s"] = record["train_end"] - record["train_start"] - (
                sum(timers.seconds.values()) - timed_before)
            if "loop_end" in record:
                record["loop_untimed_s"] = record["loop_end"] - record["train_start"] - (
                    record.pop("timed_at_loop_end") - timed_before)

    return train


class EvalImagesByStep:
    """Each eval image's PSNR in the trainer's all-images evals, by step: the pipeline's
    ``get_average_eval_image_metrics`` is wrapped (the instance only) so that the model's per-image
    metrics are kept while it runs, in its own thread only (the single-image eval may run beside it)."""

    def __init__(self):
        self.by_step: Dict[int, List[Dict]] = {}
        self._local = threading.local()

    def install(self, pipeline) -> None:
        from bytesplat_ns.bench.eval_images import record_image_metrics

        seen: List[Dict] = []  # every image of every all-images eval, in order
        record_image_metrics(pipeline, seen, active=lambda: getattr(self._local, "evaluating", False))
        real = pipeline.get_average_eval_image_metrics

        @functools.wraps(real)
        def get_average_eval_image_metrics(*args, **kwargs):
            step = kwargs.get("step", args[0] if args else None)
            first = len(seen)
            self._local.evaluating = True
            try:
                return real(*args, **kwargs)
            finally:
                self._local.evaluating = False
                if step is not None:
                    self.by_step[int(step)] = seen[first:]

        pipeline.get_average_eval_image_metrics = get_average_eval_image_metrics

    def fields(self, step: int) -> Dict:
        """``psnr_by_image`` (eval order) and ``worst_image`` of the eval at ``step``, when it was kept."""
        images = self.by_step.pop(step, None)
        scored = [image for image in images or [] if image.get("psnr") is not None]
        if not scored:
            return {}
        worst = min(scored, key=lambda image: image["psnr"])
        return {"psnr_by_image": [round(image["psnr"], 3) for image in scored],
                "worst_image": {key: worst.get(key) for key in ("index", "file", "psnr")}}


def record_eval_curve(curve: List[Dict], images: Optional[EvalImagesByStep] = None) -> None:
    """Append to ``curve`` the PSNR and SSIM of each all-images eval the trainer logs (nerfstudio's and
    bytesplat's trainers log it under the same name, every ``steps_per_eval_all_images``), with each
    eval image's PSNR where ``images`` kept them."""
    from nerfstudio.utils import writer

    real_put_dict = writer.put_dict

    def put_dict(name, scalar_dict, step, *args, **kwargs):
        if name == EVAL_ALL_IMAGES:
            curve.append({"step": int(step), **{key: float(scalar_dict[key]) for key in ("psnr", "ssim")
                                                  if key in scalar_dict},
                          **(images.fields(int(step)) if images is not None else {})})
        return real_put_dict(name, scalar_dict, step, *args, **kwargs)

    writer.put_dict = put_dict


def split_eval(timers: PhaseTimers) -> None:
    """Time the in-training eval's parts separately (nested details of the eval phase): the single eval
    image where nerfstudio computes it on the training thread (``image``), the all-images eval
    (``all_images``), and with bytesplat's eval-image worker the hand-over (``submit``) and the wait for
    its metrics before an all-images eval (``drain_eval_images``); ``queue_image`` (the trainer's
    render, above) and the rest of ``eval_iteration`` (undetailed) make up the remainder."""
    from nerfstudio.pipelines.base_pipeline import VanillaPipeline

    from bytesplat_ns.eval_logging import EvalImageLogger

    for cls in _with_subclasses(VanillaPipeline):
        for name, detail in (("get_eval_image_metrics_and_images", "image"), ("get_average_eval_image_metrics", "all_images")):
            if name in vars(cls):
                setattr(cls, name, timers.wrap("eval", vars(cls)[name], detail=detail))
    EvalImageLogger.submit = timers.wrap("eval", EvalImageLogger.submit, detail="submit")
    EvalImageLogger.drain = timers.wrap("eval", EvalImageLogger.drain, detail="drain_eval_images")


def split_write_out_storage(timers: PhaseTimers) -> None:
    """Time ``write_out_storage``'s parts separately (nested details of the log phase): the wait for the
    GPU before logged tensors can be read (``gpu_wait``: one synchronise, ahead of the writers' own
    reads), tensorboard's scalar and image writes (nerfstudio's writer and bytesplat's, which overrides
    them), the console table, and bytesplat's batched writer's hand-over of its held steps
    (``tensorboard_held_scalars``) with its wait for their copies to reach the host
    (``held_scalars_wait``: the GPU has to have run the logged step)."""
    import torch
    from nerfstudio.utils import writer

    from bytesplat_ns.event_writers import HostValues, TrainingLoopTensorboardWriter

    wraps = [(cls, name, detail) for cls in _with_subclasses(writer.TensorboardWriter)
             for name, detail in (("write_scalar", "tensorboard_scalar"), ("write_image", "tensorboard_image"))
             if name in vars(cls)]
    wraps += [(writer.LocalWriter, "write_stats_log", "console"),
              (TrainingLoopTensorboardWriter, "write_held", "tensorboard_held_scalars"),
              (HostValues, "values", "held_scalars_wait")]
    for cls, name, detail in wraps:
        setattr(cls, name, timers.wrap("log", vars(cls)[name], detail=detail))
    gpu_wait = timers.wrap("log", torch.cuda.synchronize, detail="gpu_wait")
    real_write_out_storage = writer.write_out_storage

    def write_out_storage():
        if torch.cuda.is_available() and torch.cuda.is_initialized() and any(
                holds_cuda_tensor(event["event"]) for event in writer.EVENT_STORAGE) and logging_waits_for_gpu():
            gpu_wait()
        return real_write_out_storage()

    writer.write_out_storage = functools.wraps(real_write_out_storage)(write_out_storage)


def skip_image_writes() -> None:
    """Tensorboard's image writes become no-ops (``--skip-image-writes``); every other write stays."""
    import nerfstudio.configs.base_config  # noqa: F401 - nerfstudio's writer module needs it imported first
    from nerfstudio.utils import writer

    def write_image(self, name, image, step) -> None:
        return None

    writer.TensorboardWriter.write_image = write_image


def holds_cuda_tensor(value) -> bool:
    values = value.values() if isinstance(value, dict) else (value,)
    return any(getattr(v, "is_cuda", False) for v in values)


def stamped_loop_end(after_train: Callable, timers: PhaseTimers, record: Dict) -> Callable:
    """``_after_train`` that stamps, on the first call only (nerfstudio calls it once the loop ends;
    a subclass's calls its parent's), the time and the timers' total so far."""

    @functools.wraps(after_train)
    def stamped(self, *args, **kwargs):
        if "loop_end" not in record:
            record["loop_end"] = time.time()
            record["timed_at_loop_end"] = sum(timers.seconds.values())
        return after_train(self, *args, **kwargs)

    return stamped


def logging_waits_for_gpu() -> bool:
    """Whether an event writer reads a logged step's tensors as it writes them (nerfstudio's writers:
    ``float()`` per value, a wait for the GPU); bytesplat's batched tensorboard writer copies them
    without a wait (bytesplat_ns/event_writers.py), and the console reads no tensors."""
    from nerfstudio.utils import writer

    from bytesplat_ns.event_writers import TrainingLoopTensorboardWriter

    return any(not isinstance(w, writer.LocalWriter)
               and not (isinstance(w, TrainingLoopTensorboardWriter) and w.batch_scalars)
               for w in writer.EVENT_WRITERS)


def drained_on_logged_steps(train_iteration: Callable) -> Callable:
    """``train_iteration`` that waits for the GPU before it returns on the steps nerfstudio logs, where
    the writers would wait there a moment later, inside the log timer (``logging_waits_for_gpu``).
    Where they do not, no wait is added: the timed run waits where the plain one does."""
    from nerfstudio.utils.misc import step_check

    @functools.wraps(train_iteration)
    def drained(self, step, *args, **kwargs):
        out = train_iteration(self, step, *args, **kwargs)
        if step_check(step, self.config.logging.steps_per_log, run_at_zero=True):
            import torch

            if torch.cuda.is_available() and torch.cuda.is_initialized() and logging_waits_for_gpu():
                torch.cuda.synchronize()
        return out

    return drained


def _with_subclasses(cls) -> List[type]:
    # bytesplat's trainers are imported with the method configs, which ns-train loads before it runs.
    import bytesplat_ns.trainer  # noqa: F401

    found, todo = [], [cls]
    while todo:
        c = todo.pop()
        found.append(c)
        todo.extend(c.__subclasses__())
    return found


def peak_host_memory_mb() -> Optional[float]:
    """This process's peak resident memory so far (Linux reports ru_maxrss in KiB); None elsewhere."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 if sys.platform.startswith("linux") else None


def train_image_size(trainer) -> Optional[List[int]]:
    """[width, height] of the largest training camera as the dataparser loaded it (before the model's
    own coarse-to-fine downscales): nerfstudio-data picks a lower resolution by itself whenever an
    ``images_2/`` folder sits beside ``images/``, and runs at two resolutions do not compare."""
    datamanager = getattr(getattr(trainer, "pipeline", None), "datamanager", None)
    cameras = getattr(getattr(datamanager, "train_dataset", None), "cameras", None)
    if cameras is None or not hasattr(cameras, "width"):
        return None
    return [int(cameras.width.max()), int(cameras.height.max())]


def final_state(trainer) -> Dict[str, Optional[float]]:
    """Gaussian count, peak GPU memory and training resolution at the end of training (None where not
    applicable)."""
    import torch

    num_gaussians = None
    model = getattr(getattr(trainer, "pipeline", None), "model", None)
    if model is not None and hasattr(model, "num_points"):
        num_gaussians = int(model.num_points)
    peak = torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    return {"num_gaussians": num_gaussians, "peak_gpu_memory_mb": peak, "train_image_size": train_image_size(trainer),
            "budget_removed": budget_removed(model), "schedule": training_schedule(trainer), **graph_step_fields(trainer)}


def graph_step_fields(trainer) -> Dict:
    """The training steps replayed as CUDA graphs (bytesplat's trainer, --cuda-graph-steps; nothing for others or
    where graph steps were off): the replays, the steps that captured a graph, the captures' host seconds and
    the captures that failed (step and error)."""
    graphs = getattr(trainer, "step_graphs", None)
    if graphs is None:
        return {}
    return {"graph_replays": graphs.replays, "graph_capture_steps": list(graphs.capture_steps),
            "graph_capture_s": graphs.capture_seconds, "graph_capture_failures": [list(f) for f in graphs.failures]}


SPLAT_SCHEDULE = ("sh_degree", "sh_degree_interval", "resolution_schedule", "num_downscales")
EVAL_SCHEDULE = ("steps_per_eval_image", "steps_per_eval_all_images", "steps_per_eval_batch")


def training_schedule(trainer) -> Optional[Dict[str, int]]:
    """The schedules that make some steps cost more than others (densification, the SH degree and the
    training resolution growing, evals), for ``wallclock``'s steps by kind; None for a model without
    splatfacto's schedule."""
    from bytesplat_ns.strategy import REFINE_SCHEDULE

    model = getattr(getattr(trainer, "pipeline", None), "model", None)
    model_config, strategy = getattr(model, "config", None), getattr(model, "strategy", None)
    if not all(hasattr(model_config, key) for key in SPLAT_SCHEDULE) or not all(
            hasattr(strategy, key) for key in REFINE_SCHEDULE):
        return None
    schedule = {key: int(getattr(model_config, key)) for key in SPLAT_SCHEDULE}
    capped = getattr(model, "_max_downscales", None)  # bytesplat may start at a finer resolution than asked
    if capped is not None:
        schedule["num_downscales"] = int(capped)
    schedule.update({key: int(getattr(strategy, key)) for key in REFINE_SCHEDULE})  # gsplat's densification
    schedule.update({key: int(getattr(trainer.config, key)) for key in EVAL_SCHEDULE})
    schedule["start_step"] = int(getattr(trainer, "_start_step", 0))
    return schedule


def budget_removed(model) -> Optional[int]:
    """Gaussians the Gaussian budget removed in the run (bytesplat's model; None for others): the
    results page tells runs that pruned from runs that did not, whatever the default was."""
    if not hasattr(model, "_budget"):  # the attribute, not the property: that would build one
        return None
    return 0 if model._budget is None else int(sum(stats["removed"] for stats in model._budget.history))


class StepWindowProfile:
    """torch.profiler over train iterations ``start`` to ``stop - 1`` of the run itself, with all the loop
    does between them (callbacks, logging, evals, writers, other threads): the GPU's kernel time, the
    kernel launches and the host-device synchronisations per step. Against the unprofiled steps' median
    (``step_ms``) the kernel time tells a step bound by the GPU from one bound by its host; the
    profiler's own overhead lengthens the window's steps (kept in ``step_ms``: ``stop - start`` steps of a
    run). The window opens and closes with the GPU drained."""

    def __init__(self, start: int, stop: int):
        self.start, self.stop = start, stop
        self.result: Optional[Dict] = None
        self._profiler = None
        self._began = 0.0

    def at_iteration(self, step: int) -> None:
        if step == self.start and self._profiler is None and self.result is None:
            import torch
            from torch.profiler import ProfilerActivity, profile

            cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
            if cuda:
                torch.cuda.synchronize()
            self._profiler = profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else []))
            self._profiler.__enter__()
            self._began = time.perf_counter()
        elif step == self.stop and self._profiler is not None:
            self.close()

    def close(self) -> None:
        import torch

        from bytesplat_ns.bench.profile_train import LAUNCH_EVENTS, kernel_busy_ms, sync_calls

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
        wall_ms = 1e3 * (time.perf_counter() - self._began)
        profiler, self._profiler = self._profiler, None
        profiler.__exit__(None, None, None)
        events = profiler.key_averages()
        steps = self.stop - self.start
        self.result = {"steps": [self.start, self.stop], "wall_ms_per_step": wall_ms / steps,
                       "device_busy_ms_per_step": kernel_busy_ms(events) / steps,
                       "kernel_launches_per_step": sum(e.count for e in events if e.key in LAUNCH_EVENTS) / steps,
                       "syncs_per_step": {key: count / steps for key, count in sync_calls(events).items()},
                       "host_top_ops_ms_per_step": host_top_ops(events, steps)}


def host_top_ops(events, steps: int, top: int = 12) -> Dict[str, float]:
    """The profiled ops (aten ops, CUDA runtime calls) that took the most of the host's own time, in ms
    per step: where a host-bound step spends its issue time."""
    from bytesplat_ns.bench.profile_train import top_events

    return {e.key: round(e.self_cpu_time_total / 1e3 / steps, 4)
            for e in top_events(events, "self_cpu_time_total", top) if e.self_cpu_time_total > 0}


def profile_step_window(window: StepWindowProfile) -> None:
    """Open and close ``window`` at the train iterations it names: each Trainer class's own
    ``train_iteration`` calls it (a nested super() call finds the window already moved on)."""
    from nerfstudio.engine.trainer import Trainer

    for cls in _with_subclasses(Trainer):
        if "train_iteration" in vars(cls):
            real = vars(cls)["train_iteration"]

            def train_iteration(self, step, *args, _real=real, **kwargs):
                window.at_iteration(step)
                return _real(self, step, *args, **kwargs)

            setattr(cls, "train_iteration", functools.wraps(real)(train_iteration))


def write_timings(path: Path, timers: PhaseTimers, record: Dict, collections: Optional[CollectionTimer] = None) -> None:
    trainer = record.pop("trainer", None)
    out = {
        "process_start": PROCESS_START,
        **{k: v for k, v in record.items()},
        "process_end": time.time(),
        "seconds": {f"{phase}_s": timers.seconds[phase] for phase in PHASES},
        "calls": timers.calls,
        "detail_s": timers.detail,
        **({"gc": collections.summary()} if collections is not None else {}),
        **(final_state(trainer) if trainer is not None else {}),
        "peak_host_memory_mb": peak_host_memory_mb(),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2))


def step_window(text: str) -> Tuple[int, int]:
    """``START:STOP`` (train iterations, 0 < START < STOP) as a pair."""
    import argparse

    try:
        start, stop = (int(part) for part in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected START:STOP, got {text!r}") from None
    if not 0 < start < stop:
        raise argparse.ArgumentTypeError(f"expected 0 < START < STOP, got {text!r}")
    return start, stop


def parse_own_arguments(argv: List[str]):
    """This module's options (before ``--``) and the launcher's arguments (after it)."""
    import argparse

    if "--" not in argv:
        argv = [*argv, "--"]
    cut = argv.index("--")
    p = argparse.ArgumentParser(prog="python -m bytesplat_ns.bench.timed_ns_train",
                                usage="%(prog)s --timings PATH [--offline-lpips] [--skip-image-writes] [--launcher L] "
                                      "[--profile-steps START:STOP] -- METHOD [ns-train args]")
    p.add_argument("--timings", type=Path, required=True)
    p.add_argument("--offline-lpips", action="store_true")
    p.add_argument("--skip-image-writes", action="store_true")
    p.add_argument("--launcher", choices=LAUNCHERS, default="ns-train")
    p.add_argument("--profile-steps", type=step_window, default=None, metavar="START:STOP",
                   help="torch.profiler over train iterations START to STOP-1 (StepWindowProfile)")
    own = p.parse_args(argv[:cut])
    if not argv[cut + 1:]:
        p.error("no METHOD after --")
    return own, argv[cut + 1:]


def main(argv: Optional[List[str]] = None) -> None:
    own, launcher_args = parse_own_arguments(list(sys.argv[1:] if argv is None else argv))
    timers, record, collections = PhaseTimers(), {}, CollectionTimer()
    gc.callbacks.append(collections)
    # the launcher's module before the timers' own nerfstudio imports, as the command imports it first:
    # ns-train builds its method table before the rest of nerfstudio, and the plugin's discovery hooks
    # (heap.py, deferred_compile.py) act on that order
    if own.launcher == "bytesplat-train":
        from bytesplat_ns.launcher import entrypoint
    else:
        from nerfstudio.scripts.train import entrypoint
    install(timers, record, collections)
    window = StepWindowProfile(*own.profile_steps) if own.profile_steps is not None else None
    if window is not None:
        profile_step_window(window)
    if own.skip_image_writes:
        skip_image_writes()

    from bytesplat_ns.compat import offline_safe_lpips

    sys.argv = [own.launcher, *launcher_args]
    try:
        with offline_safe_lpips() if own.offline_lpips else contextlib.nullcontext():
            entrypoint()
    finally:
        gc.callbacks.remove(collections)
        if window is not None and window.result is not None:
            record["step_profile"] = window.result
        write_timings(own.timings, timers, record, collections)


if __name__ == "__main__":
    main()
