"""bytesplat's lean training loop (bytesplat_ns/training_loop.py) trains, logs, evaluates and saves as
nerfstudio's ``Trainer.train`` does, with less host work per step."""

from __future__ import annotations

import copy
from collections import Counter

import pytest
import torch
from nerfstudio.engine.callbacks import TrainingCallback, TrainingCallbackLocation
from nerfstudio.utils import writer
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from bytesplat_ns import event_writers, training_loop
from bytesplat_ns.bench.train import setup_trainer
from bytesplat_ns.data.scene import SceneSpec, ensure_scene
from bytesplat_ns.method_configs.bytesplat import bytesplat_config

ITERATIONS, STEPS_PER_LOG = 13, 5

def is_timing(tag: str) -> bool:  # values measured in wall time
    return tag.endswith("(time)") or tag.endswith("Rays / Sec") or tag.endswith("per_sec") or tag.endswith("/fps")


@pytest.fixture(scope="module")
def scene(tmp_path_factory):
    return ensure_scene(SceneSpec(size="small", num_views=8, width=32), cache_dir=tmp_path_factory.mktemp("scenes"))


def trained(scene, out_dir, lean: bool, monkeypatch):
    """A 13-step CPU run with evals and checkpoints on their schedules; returns the trainer and what the
    loop did: callback calls, eval_iteration steps, pipeline.train() calls, the training flags each
    train_iteration saw."""
    config = copy.deepcopy(bytesplat_config)
    config.lean_training_loop = lean
    config.logging.steps_per_log = STEPS_PER_LOG
    trainer, _ = setup_trainer("loop", config, scene, ITERATIONS, out_dir, seed=0, device="cpu")
    config.steps_per_eval_image, config.steps_per_eval_all_images, config.steps_per_save = 4, 8, 6
    seen = {"callbacks": [], "evals": [], "train_calls": 0, "modes": [], "puts": Counter()}
    pipeline = trainer.pipeline
    for callback in trainer.callbacks:
        real_run = callback.run_callback

        def run(step, real_run=real_run, where=tuple(callback.where_to_run)):
            seen["callbacks"].append((step, [w.name for w in where]))
            return real_run(step=step)

        callback.run_callback = run

    def viewer_like(step):  # the viewer renders with the model in eval mode and switches it back
        if step == 2:
            pipeline.model.eval()

    trainer.callbacks.append(TrainingCallback([TrainingCallbackLocation.AFTER_TRAIN_ITERATION], viewer_like))
    real_iteration, real_eval, real_train = trainer.train_iteration, trainer.eval_iteration, pipeline.train

    def train_iteration(step):
        seen["modes"].append(all(m.training for m in pipeline.modules() if type(m).train is torch.nn.Module.train))
        return real_iteration(step)

    def eval_iteration(step):
        seen["evals"].append(step)
        return real_eval(step)

    def pipeline_train(mode=True):
        seen["train_calls"] += 1
        return real_train(mode)

    real_put_scalar = writer.put_scalar
    monkeypatch.setattr(writer, "put_scalar", lambda name, scalar, step: (
        seen["puts"].update([name.value if hasattr(name, "value") else name]), real_put_scalar(name, scalar, step))[1])
    monkeypatch.setattr(trainer, "train_iteration", train_iteration)
    monkeypatch.setattr(trainer, "eval_iteration", eval_iteration)
    monkeypatch.setattr(pipeline, "train", pipeline_train)
    trainer.train()
    monkeypatch.undo()
    event_writers.close_tensorboard_writers()
    return trainer, seen


def scalars(trainer):
    events = EventAccumulator(str(trainer.base_dir), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


@pytest.fixture
def one_thread():
    """Bit-identical CPU training: the reference rasterizer's multithreaded reductions are not."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_the_lean_loop_trains_logs_evaluates_and_saves_as_nerfstudios(scene, tmp_path, monkeypatch, one_thread):
    lean, lean_seen = trained(scene, tmp_path / "lean", True, monkeypatch)
    theirs, their_seen = trained(scene, tmp_path / "nerfstudio", False, monkeypatch)
    # the same training: every parameter bit for bit
    ours_params, their_params = lean.pipeline.model.state_dict(), theirs.pipeline.model.state_dict()
    assert ours_params.keys() == their_params.keys()
    assert all(torch.equal(ours_params[k], their_params[k]) for k in ours_params)
    # the same callbacks at the same steps and places; evals on the due steps; checkpoints at 6, 12 and the end
    assert lean_seen["callbacks"] == their_seen["callbacks"] and lean_seen["callbacks"]
    assert lean_seen["evals"] == [4, 8, 12] and set(range(1, ITERATIONS)) <= set(their_seen["evals"])
    checkpoints = sorted(p.name for p in lean.checkpoint_dir.iterdir())
    assert checkpoints == sorted(p.name for p in theirs.checkpoint_dir.iterdir()) == ["step-000000012.ckpt"]
    # every train_iteration ran in training mode, the step after the "viewer" switched the model too
    assert all(lean_seen["modes"]) and all(their_seen["modes"]) and len(lean_seen["modes"]) == ITERATIONS
    # (the evals switch modes and back themselves): nerfstudio's loop calls train() at every step, ours once
    assert their_seen["train_calls"] - lean_seen["train_calls"] == ITERATIONS - 1
    # the same tensorboard scalars: tags, steps, values (timings aside: their values are wall time)
    ours, nerfstudio = scalars(lean), scalars(theirs)
    assert ours.keys() == nerfstudio.keys() and "Eval Images Metrics Dict (all images)/psnr" in ours
    for tag in ours:
        if is_timing(tag):
            assert [s for s, _ in ours[tag]] == [s for s, _ in nerfstudio[tag]], tag
        else:
            assert ours[tag] == nerfstudio[tag], tag
    # fewer events put: timings and learning rates on logged steps only, where no writer keeps the rest
    logged = len(range(0, ITERATIONS, STEPS_PER_LOG))
    assert lean_seen["puts"]["learning_rate/means"] == logged and their_seen["puts"]["learning_rate/means"] == ITERATIONS
    assert lean_seen["puts"]["Train Iter (time)"] == logged and their_seen["puts"]["Train Iter (time)"] == ITERATIONS


def test_a_writer_that_keeps_every_step_gets_every_step(scene, tmp_path, monkeypatch):
    config = copy.deepcopy(bytesplat_config)
    config.timing_scalars_every_step = config.learning_rates_every_step = True
    config.logging.steps_per_log = STEPS_PER_LOG
    trainer, _ = setup_trainer("every", config, scene, 7, tmp_path, seed=0, device="cpu")
    assert event_writers.read_between_logged_steps("timings") and event_writers.read_between_logged_steps("learning_rates")
    trainer.train()
    event_writers.close_tensorboard_writers()
    written = scalars(trainer)
    assert [s for s, _ in written["Train Iter (time)"]] == list(range(7))
    assert [s for s, _ in written["learning_rate/means"]] == list(range(7))


def nerfstudio_timings(durations, start, steps_per_log, rays):
    """GLOBAL_BUFFER and the put values of nerfstudio's put_time at every step, on the logged steps."""
    reset_buffer()
    out = {}
    for step, seconds in enumerate(durations, start):
        writer.put_time(name=writer.EventName.ITER_TRAIN_TIME, duration=seconds, step=step, avg_over_steps=True,
                        update_eta=True)
        if step > 1:
            writer.put_time(name=writer.EventName.TRAIN_RAYS_PER_SEC, duration=rays / max(0.001, seconds), step=step,
                            avg_over_steps=True)
        if step == start or step % steps_per_log == 0:
            out[step] = snapshot()
        writer.EVENT_STORAGE.clear()
    return out


def reset_buffer():
    writer.EVENT_STORAGE.clear()
    writer.GLOBAL_BUFFER.update(max_buffer_size=4, max_iter=40, steps_per_log=5, events={})
    writer.GLOBAL_BUFFER.pop("step", None)


def snapshot():
    events = writer.GLOBAL_BUFFER["events"]
    return {"step": writer.GLOBAL_BUFFER["step"],
            "buffers": {k: (list(v["buffer"]), v["avg"]) for k, v in events.items() if isinstance(v, dict)},
            "eta": events.get(writer.EventName.ETA.value),
            "puts": [(e["name"], e["event"], e["step"]) for e in writer.EVENT_STORAGE]}


@pytest.mark.parametrize("start", [0, 7])
def test_logged_averages_and_eta_are_nerfstudios(monkeypatch, start):
    """The running averages, ETA and put values on logged steps (and the first step, also of a resumed
    run) are those of nerfstudio's put_time at every step."""
    monkeypatch.setattr(writer, "GLOBAL_BUFFER", {})
    monkeypatch.setattr(writer, "EVENT_STORAGE", [])
    durations = [0.010 + 0.001 * ((7 * i) % 5) for i in range(23)]
    expected = nerfstudio_timings(durations, start, 5, rays=1000)
    reset_buffer()
    timings = training_loop.StepTimings(every_step=False, rays_per_batch=lambda: 500, world_size=2)
    got = {}
    for step, seconds in enumerate(durations, start):
        logged = step % 5 == 0
        timings.record(step, seconds, logged)
        assert writer.GLOBAL_BUFFER["step"] == step
        if step == start or logged:
            got[step] = snapshot()
        else:
            assert not writer.EVENT_STORAGE
        writer.EVENT_STORAGE.clear()
    assert got == expected


@pytest.mark.parametrize("lean", [True, False])
def test_a_pause_then_stop_ends_training_as_nerfstudios(scene, tmp_path, lean):
    """The viewer pauses training, then the user stops it: no step runs while paused, and the run ends
    through _after_train once (its final checkpoint at the last step run)."""
    import threading

    config = copy.deepcopy(bytesplat_config)
    config.lean_training_loop = lean
    trainer, _ = setup_trainer("pause", config, scene, 10, tmp_path, seed=0, device="cpu")
    ran, ended = [], []

    def pause_after(step):
        ran.append(step)
        if step == 3:
            trainer.training_state = "paused"
            threading.Timer(0.2, lambda: setattr(trainer, "stop_training", True)).start()

    trainer.callbacks.append(TrainingCallback([TrainingCallbackLocation.AFTER_TRAIN_ITERATION], pause_after))
    real_after_train = trainer._after_train
    trainer._after_train = lambda: (ended.append(trainer.step), real_after_train())
    trainer.train()
    assert ran == [0, 1, 2, 3] and ended == [4]
    assert [p.name for p in trainer.checkpoint_dir.iterdir()] == ["step-000000004.ckpt"]
