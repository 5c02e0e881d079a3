"""In-training eval images logged off the training thread (issue 21): same tags, steps and values
as nerfstudio's synchronous path, and the loop does not wait for the write."""

from __future__ import annotations

import copy
import threading

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from bytesplat_ns import eval_logging
from bytesplat_ns.bench.train import setup_trainer
from bytesplat_ns.data.scene import SceneSpec, ensure_scene
from bytesplat_ns.method_configs.bytesplat import bytesplat_config

ITERATIONS, EVAL_EVERY = 5, 2  # eval images at steps 2 and 4


@pytest.fixture(scope="module")
def scene(tmp_path_factory):
    return ensure_scene(SceneSpec(size="small", num_views=10, width=32), cache_dir=tmp_path_factory.mktemp("scenes"))


def trainer_for(scene, out_dir, async_eval_images: bool):
    config = copy.deepcopy(bytesplat_config)
    config.async_eval_images = async_eval_images
    trainer, _ = setup_trainer("eval-logging", config, scene, ITERATIONS, out_dir, seed=0, device="cpu")
    trainer.config.steps_per_eval_image = EVAL_EVERY
    return trainer


def logged(trainer):
    events = EventAccumulator(str(trainer.base_dir), size_guidance={"images": 0, "scalars": 0})
    events.Reload()
    scalars = {tag: [(e.step, e.value) for e in events.Scalars(tag)]
               for tag in events.Tags()["scalars"] if tag.startswith("Eval Images Metrics/")}
    images = {tag: [e.step for e in events.Images(tag)] for tag in events.Tags()["images"]}
    return scalars, images


def test_same_tags_steps_and_values_as_nerfstudio(scene, tmp_path):
    runs = {}
    for mode in (False, True):
        trainer = trainer_for(scene, tmp_path / str(mode), async_eval_images=mode)
        trainer.train()
        runs[mode] = logged(trainer)
    (sync_scalars, sync_images), (async_scalars, async_images) = runs[False], runs[True]
    assert async_images == sync_images == {"Eval Images/img": [2, 4]}
    assert set(async_scalars) == set(sync_scalars) and {"Eval Images Metrics/psnr", "Eval Images Metrics/ssim"} <= set(sync_scalars)
    for tag, values in sync_scalars.items():
        assert [s for s, _ in async_scalars[tag]] == [s for s, _ in values] == [2, 4]
        assert [v for _, v in async_scalars[tag]] == pytest.approx([v for _, v in values], rel=1e-5)


def test_training_does_not_wait_for_the_write(scene, tmp_path, monkeypatch):
    trainer = trainer_for(scene, tmp_path, async_eval_images=True)
    release, written, pending_at_step = threading.Event(), [], {}
    real_write = eval_logging.EvalImageLogger._write

    def slow_write(self, step, metrics, images):
        release.wait(timeout=120)
        written.append(step)
        real_write(self, step, metrics, images)

    monkeypatch.setattr(eval_logging.EvalImageLogger, "_write", slow_write)
    real_iteration = type(trainer).train_iteration

    def train_iteration(self, step):
        if step == ITERATIONS - 1:  # two steps after the first eval image was queued
            pending_at_step[step] = list(written)
            release.set()
        return real_iteration(self, step)

    monkeypatch.setattr(type(trainer), "train_iteration", train_iteration)
    trainer.train()
    assert pending_at_step == {ITERATIONS - 1: []}  # the loop ran on while the write was held
    assert written == [2, 4]  # and everything was written before training finished
    assert trainer._eval_logger is None


def test_a_pipeline_with_its_own_eval_image_path_keeps_it(monkeypatch):
    from types import SimpleNamespace

    import bytesplat_ns.trainer

    from bytesplat_ns.distributed.pipeline import ShardedPipeline
    from bytesplat_ns.trainer import ByteSplatTrainer

    sharded = SimpleNamespace(config=SimpleNamespace(async_eval_images=True), _eval_logger=None,
                              pipeline=object.__new__(ShardedPipeline))
    monkeypatch.setattr(bytesplat_ns.trainer, "tensorboard_writers", lambda: [object()])  # tensorboard is on
    assert ByteSplatTrainer._eval_image_logger(sharded) is None  # it renders rank 0's full copy itself


def test_eval_images_during_the_coarse_start(tmp_path_factory, tmp_path):
    """While training still runs on downscaled images (splatfacto's num_downscales), the eval image
    is scored at full resolution on the worker too, as nerfstudio's eval mode does (the model is back
    in training mode when the worker runs)."""
    scene = ensure_scene(SceneSpec(size="small", num_views=10, width=64), cache_dir=tmp_path_factory.mktemp("scenes64"))
    runs = {}
    for mode in (False, True):
        config = copy.deepcopy(bytesplat_config)
        config.async_eval_images = mode
        config.pipeline.model.num_downscales = 2
        config.pipeline.model.min_train_resolution = 0
        trainer, _ = setup_trainer("eval-coarse", config, scene, ITERATIONS, tmp_path / str(mode), seed=0, device="cpu")
        trainer.config.steps_per_eval_image = EVAL_EVERY
        assert trainer.pipeline.model._get_downscale_factor() == 4  # training is at a quarter resolution
        trainer.train()
        runs[mode] = logged(trainer)
    assert runs[True][1] == runs[False][1] == {"Eval Images/img": [2, 4]}
    for tag, values in runs[False][0].items():
        assert [v for _, v in runs[True][0][tag]] == pytest.approx([v for _, v in values], rel=1e-5)


def test_drain_waits_for_the_metrics_not_for_the_image_write(monkeypatch):
    """The all-images pass (after ``drain``) shares the metric modules with the worker, so it waits for
    the queued metrics; the PNG encoding and writing after them go on beside it."""
    metrics_release, write_release, written = threading.Event(), threading.Event(), []

    def held_write(self, step, metrics, images):
        write_release.wait(timeout=120)
        written.append(step)

    monkeypatch.setattr(eval_logging.EvalImageLogger, "_write", held_write)
    logger = eval_logging.EvalImageLogger([])

    def metrics_and_images():
        metrics_release.wait(timeout=120)
        return {"psnr": 1.0}, {}

    logger.submit(100, metrics_and_images)
    drained = threading.Thread(target=logger.drain, daemon=True)
    drained.start()
    drained.join(timeout=0.5)
    assert drained.is_alive()  # the metrics are not computed yet
    metrics_release.set()
    drained.join(timeout=60)
    assert not drained.is_alive() and written == []  # drained while the write is still held
    write_release.set()
    logger.close()
    assert written == [100]


def test_drain_does_not_wait_behind_an_earlier_images_encoding(monkeypatch):
    """The metrics of a later eval image are not queued behind an earlier one's PNG encoding (slower
    than the steps between two eval images on a 1080x1920 capture), and the writes keep their order."""
    encode_release, written = threading.Event(), []
    real_summary = eval_logging.image_summary

    def held_encoding(tag, array, level):
        if array.shape[0] == 1:  # step 100's image
            encode_release.wait(timeout=120)
        return real_summary(tag, array, level)

    monkeypatch.setattr(eval_logging, "image_summary", held_encoding)
    monkeypatch.setattr(eval_logging.EvalImageLogger, "_write",
                        lambda self, step, metrics, images: written.append((step, sorted(images))))
    logger = eval_logging.EvalImageLogger([])
    for step, rows in ((100, 1), (200, 2)):
        logger.submit(step, lambda rows=rows: ({"psnr": float(rows)}, {"img": torch.zeros(rows, 4, 3)}))
    drained = threading.Thread(target=logger.drain, daemon=True)
    drained.start()
    drained.join(timeout=60)
    assert not drained.is_alive() and written == []  # both measured while the first image still encodes
    encode_release.set()
    logger.close()
    assert written == [(100, ["img"]), (200, ["img"])]


def test_the_images_in_writing_are_bounded(monkeypatch):
    """Writes slower than the eval images hold the metrics thread, not host memory without bound."""
    write_release, written = threading.Event(), []

    def held_write(self, step, metrics, images):
        write_release.wait(timeout=120)
        written.append(step)

    monkeypatch.setattr(eval_logging.EvalImageLogger, "_write", held_write)
    logger = eval_logging.EvalImageLogger([], max_pending_writes=2)
    for step in (1, 2, 3, 4):
        logger.submit(step, lambda: ({"psnr": 1.0}, {"img": torch.zeros(2, 2, 3)}))
    drained = threading.Thread(target=logger.drain, daemon=True)
    drained.start()
    drained.join(timeout=1.0)
    assert drained.is_alive()  # steps 1 and 2 wait for their write; step 3's hand-over waits for a slot
    write_release.set()
    drained.join(timeout=60)
    logger.close()
    assert written == [1, 2, 3, 4]


def test_drain_reports_a_failed_metric():
    logger = eval_logging.EvalImageLogger([])

    def failing():
        raise ValueError("no metrics")

    logger.submit(1, failing)
    with pytest.raises(RuntimeError, match="eval logging failed"):
        logger.drain()
    logger.close()
