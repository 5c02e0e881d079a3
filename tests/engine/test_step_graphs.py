"""--cuda-graph-steps without a GPU (bytesplat_ns/step_graphs.py): the setting's requirements, which steps a
graph may replay, and what makes a graph captured again. tests/engine/test_step_graphs_gpu.py trains with it."""

from __future__ import annotations

import copy
import functools

import pytest
import torch

from bytesplat_ns.bench.train import setup_trainer
from bytesplat_ns.data.datamanager import WORLD_TO_CAMERA_KEY
from bytesplat_ns.data.scene import SceneSpec, ensure_scene
from bytesplat_ns.method_configs.bytesplat import bytesplat_config
from bytesplat_ns.model import ByteSplatModel
from bytesplat_ns.step_graphs import graph_key


def _trainer(tmp_path, sync_free=False, label="run", graphs=True, mixed_precision=False):
    scene = ensure_scene(SceneSpec(size="small"), cache_dir=tmp_path / "scenes")
    config = copy.deepcopy(bytesplat_config)
    config.cuda_graph_steps = graphs
    config.mixed_precision = mixed_precision
    config.pipeline.model.fused.sync_free_binning = sync_free
    trainer, _ = setup_trainer(label, config, scene, 3, tmp_path / label, seed=0, device="cpu")
    return trainer


def _as_if_fused(monkeypatch):
    """The trainer's setup as on a GPU, where the model's steps use the fused rasterizer."""
    monkeypatch.setattr(ByteSplatModel, "rasterizer_backend", property(lambda self: "fused"))


def test_graph_steps_are_on_by_default_and_size_the_rooms_ahead(tmp_path, monkeypatch):
    assert bytesplat_config.cuda_graph_steps and not bytesplat_config.pipeline.model.fused.sync_free_binning
    _as_if_fused(monkeypatch)
    trainer = _trainer(tmp_path)
    assert trainer.step_graphs is not None and trainer.step_graphs.current is None
    assert trainer.pipeline.model.pair_room is not None  # the graph bins into a room sized ahead
    eager = _trainer(tmp_path, graphs=False, label="eager")
    assert eager.step_graphs is None and eager.pipeline.model.pair_room is None


def test_graph_steps_are_off_with_mixed_precision_with_one_console_line(tmp_path, monkeypatch, capsys):
    _as_if_fused(monkeypatch)
    trainer = _trainer(tmp_path, mixed_precision=True)
    assert trainer.step_graphs is None and trainer.pipeline.model.pair_room is None
    out = capsys.readouterr().out.replace("\n", " ")
    assert "--cuda-graph-steps off for this run (mixed precision or gradient accumulation)" in out


def test_without_a_gpu_the_steps_run_as_before_and_nothing_is_said(tmp_path, capsys):
    trainer = _trainer(tmp_path)
    assert trainer.step_graphs is None and trainer.pipeline.model.pair_room is None
    assert "--cuda-graph-steps" not in capsys.readouterr().out
    trainer.train()  # the reference rasterizer's steps, unchanged
    assert trainer.pipeline.model.step == 2


def test_which_steps_a_graph_may_replay(tmp_path, monkeypatch):
    trainer = _trainer(tmp_path, sync_free=True)
    model = trainer.pipeline.model
    assert model.graph_step_blocker(5) == "the fused rasterizer is not training"
    monkeypatch.setattr(ByteSplatModel, "rasterizer_backend", property(lambda self: "fused"))
    monkeypatch.setattr(ByteSplatModel, "_gaussian_steps_on_device", lambda self: True)
    model.train()
    object.__setattr__(model, "training_metrics_wanted", False)
    assert model.graph_step_blocker(5) is None
    object.__setattr__(model, "training_metrics_wanted", True)
    assert model.graph_step_blocker(5) is None  # a logged step replays too: graph_step_dicts
    object.__setattr__(model, "training_metrics_wanted", False)
    model.config.use_scale_regularization = True
    assert model.graph_step_blocker(10) == "a scale-regularisation step" and model.graph_step_blocker(11) is None
    model.config.fused.check_every = 7
    assert model.graph_step_blocker(14) == "a diagnostic or pruning-score step"
    model.config.fused.check_every = 0
    model.config.optimize_visible_only = True
    assert model.graph_step_blocker(11) == "Adam on the visible Gaussians only"
    model.config.optimize_visible_only = False
    model.sized_binning_allowed = False  # mixed precision or gradient accumulation
    assert model.graph_step_blocker(11).startswith("no sized binning")
    assert model.graph_view_blocker({"mask": None}, 64, 64) == "a mask"
    assert model.graph_view_blocker({}, 64, 8) == "an image smaller than the SSIM window"
    assert model.graph_view_blocker({}, 64, 64) is None


def test_a_graph_is_captured_again_for_new_gaussians_sh_degree_or_size():
    params = [torch.nn.Parameter(torch.zeros(10, 3)), torch.nn.Parameter(torch.zeros(10, 1))]
    image = torch.zeros(48, 64, 3, dtype=torch.uint8)
    key = graph_key(params, 1, 64, 48, image)
    assert graph_key(params, 1, 64, 48, image) == key
    assert graph_key(params, 2, 64, 48, image) != key  # a new SH degree
    assert graph_key(params, 1, 32, 24, image[::2, ::2]) != key  # a new resolution
    replaced = [torch.nn.Parameter(params[0].detach().clone()), params[1]]  # an opacity reset or densification
    assert graph_key(replaced, 1, 64, 48, image) != key
    grown = [torch.nn.Parameter(torch.zeros(12, 3)), params[1]]
    assert graph_key(grown, 1, 64, 48, image) != key


def test_a_graph_steps_view_is_the_eager_steps(tmp_path):
    trainer = _trainer(tmp_path)
    model = trainer.pipeline.model
    datamanager = trainer.pipeline.datamanager
    for step in range(3):
        camera, _ = datamanager.next_train(step)
        viewmat, intrinsics, width, height = model.graph_step_view(camera)
        eager_intrinsics, eager_width, eager_height = model._intrinsics_and_size(camera, model._get_downscale_factor())
        assert torch.equal(intrinsics, eager_intrinsics) and (width, height) == (eager_width, eager_height)
        assert viewmat is camera.metadata[WORLD_TO_CAMERA_KEY]  # the datamanager's, made once per image
        again = model.graph_step_view(camera)
        assert again[1] is intrinsics  # made once per view and resolution


@pytest.mark.parametrize("logged", [True, False])
def test_a_replayed_steps_dicts_are_the_eager_steps(tmp_path, logged):
    """A graph step's loss and metrics dicts, made from the graph's loss, render and background, hold what the
    eager step's hold: everything on a logged step (the tensorboard tags stay), the loss and count otherwise."""
    trainer = _trainer(tmp_path)
    model = trainer.pipeline.model
    model.train()
    object.__setattr__(model, "training_metrics_wanted", logged)
    model.step_cb(trainer.optimizers, 0)  # what the trainer's callback does before a step
    camera, batch = trainer.pipeline.datamanager.next_train(0)
    outputs = model(camera)
    metrics = model.get_metrics_dict(outputs, batch)
    losses = model.get_loss_dict(outputs, batch, metrics)
    loss = functools.reduce(torch.add, losses.values())
    loss_dict, metrics_dict = model.graph_step_dicts(loss, outputs["rgb"], outputs["background"], batch)
    if logged:
        assert loss_dict.keys() == losses.keys() and metrics_dict.keys() == metrics.keys() >= {"psnr", "gaussian_count"}
        for name, value in metrics.items():
            assert torch.equal(torch.as_tensor(metrics_dict[name]), torch.as_tensor(value)), name
        assert float(loss_dict["scale_reg"]) == float(losses["scale_reg"]) == 0.0
    else:
        assert loss_dict == {"main_loss": loss} and metrics_dict == {"gaussian_count": model.num_points}


def test_a_failed_capture_is_tried_again_into_a_fresh_pool_and_two_in_a_row_end_graph_steps(monkeypatch):
    """StepGraphs.run's bookkeeping around ``_capture`` (stood in for here: no CUDA graphs on a CPU): a failed
    capture is recorded and raised (the trainer runs the step eagerly), the next graph step captures again
    without the old graph's pool, a success resets the count, and two failures in a row turn graph steps off."""
    from types import SimpleNamespace

    from bytesplat_ns.step_graphs import CaptureFailed, StepGraphs

    outcomes = iter(["ok", "fail", "ok", "ok", "fail", "fail"])
    shared = []  # the old graph whose pool each capture was given (None: a fresh pool)

    def capture(self, model, key, views, width, height, room, previous=None):
        shared.append(previous)
        if next(outcomes) == "fail":
            raise CaptureFailed("the training step could not be captured") from RuntimeError("not capturable")
        return SimpleNamespace(key=key, graph=f"graph{model.step}", captured_at=model.step, grads=[],
                               replay=lambda *inputs: None)

    monkeypatch.setattr(StepGraphs, "_capture", capture)
    model = SimpleNamespace(step=0, pair_room=SimpleNamespace(last_overflow_step=-1), graph_step_room=lambda: 8,
                            gaussian_parameters=lambda: [])
    graphs = StepGraphs()

    def step(number, key):
        model.step = number
        return graphs.run(model, key, None, None, None, 64, 48)

    step(10, "a")
    step(11, "a")  # replayed: no capture
    with pytest.raises(CaptureFailed):
        step(12, "b")
    assert not graphs.off and graphs.failures == [(12, "not capturable")] and graphs.current is None
    step(13, "b")  # captured again, into a fresh pool
    step(14, "c")  # a new key: the old graph's pool
    with pytest.raises(CaptureFailed):
        step(15, "d")
    assert not graphs.off
    with pytest.raises(CaptureFailed):
        step(16, "d")
    assert graphs.off and [s for s, _ in graphs.failures] == [12, 15, 16]
    assert shared == [None, "graph10", None, "graph13", "graph14", None]
    assert graphs.capture_steps == [10, 13, 14] and graphs.replays == 4
