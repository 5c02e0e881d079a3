"""The training step's tile-pair room (bytesplat_ns/pair_capacity.py): its sizing rules, the fixed lag of
its reads, the views it hands back for training again, and what a step that did not fit leaves alone
(the densification statistics here; the Adam step in tests/engine/test_adam_kernel.py). The kernels'
side is in tests/raster/test_binning_gpu.py and tests/engine/test_sync_free_binning_gpu.py."""

from __future__ import annotations

import copy

import pytest
import torch

from bytesplat_ns.pair_capacity import PairRoom


def _total(n: int) -> torch.Tensor:
    return torch.tensor([n], dtype=torch.int64)


def test_no_room_before_a_total_is_read_then_the_largest_recent_one_scaled():
    room = PairRoom(margin=1.5, window=3, lag=2)
    assert room.room(1000) is None
    assert room.send(0, _total(100), None, 1000) is None  # binned by the count read back: no flag
    room.send(1, _total(300), None, 1000)
    assert room.views_to_train_again(1) == [] and room.room(1000) is None  # step 0 is read at step 2
    assert room.views_to_train_again(2) == [] and room.room(1000) == 150 + 1024
    room.views_to_train_again(3)
    assert room.room(1000) == 450 + 1024
    assert room.room(2000) == 900 + 1024  # twice the Gaussians, twice the pairs
    for step, n in ((2, 10), (3, 10), (4, 10)):  # the window forgets the large one
        room.send(step, _total(n), None, 1000)
    room.views_to_train_again(6)
    assert room.room(1000) == 15 + 1024


def test_a_view_seen_before_gets_room_for_its_own_last_count():
    room = PairRoom(margin=1.25, lag=1)
    room.send(0, _total(4000), None, 100, key="big")
    room.send(1, _total(400), None, 100, key="small")
    room.views_to_train_again(2)
    assert room.room(100, "small") == 500 + 1024
    assert room.room(200, "small") == 1000 + 1024  # scaled by the Gaussian count
    assert room.room(100, "big") == 5000 + 1024
    assert room.room(100, "new") == 5000 + 1024  # unseen: the largest recent count
    room.send(2, _total(800), room.room(100, "small"), 100, key="small")
    room.views_to_train_again(3)
    assert room.room(100, "small") == 1000 + 1024  # its latest count


def test_a_step_past_its_room_is_flagged_and_its_view_comes_back_after_the_lag():
    room = PairRoom(margin=1.0, lag=2)
    fits = room.send(5, _total(100), 100, 10, view="fits")
    too_many = room.send(6, _total(101), 100, 10, view="again")
    assert bool(fits) and not bool(too_many)
    assert room.views_to_train_again(7) == []  # step 5 read: it fitted
    assert room.views_to_train_again(8) == ["again"]
    assert room.overflows == 1 and room.sized_steps == 2 and room.last_overflow_step == 6
    assert room.views_to_train_again(9) == []  # read once


def test_finish_reads_every_total_in_flight():
    room = PairRoom(lag=2)
    room.send(10, _total(5), 1, 10, view="a")
    room.send(11, _total(5), 10**6, 10, view="b")
    assert room.finish() == ["a"] and not room.sent


def test_the_margin_must_leave_room_for_the_largest_count():
    from nerfstudio.data.scene_box import SceneBox

    from bytesplat_ns.errors import SettingError
    from bytesplat_ns.model import ByteSplatModelConfig
    from bytesplat_ns.raster.options import FusedRasterConfig

    with pytest.raises(SettingError, match="pair-room-margin must be at least 1"):
        PairRoom(margin=0.9)
    with pytest.raises(SettingError, match="pair-room-margin"):  # at model set-up, before any training
        ByteSplatModelConfig(fused=FusedRasterConfig(sync_free_binning=True, pair_room_margin=0.5), num_random=10,
                             random_init=True).setup(
            scene_box=SceneBox(torch.tensor([[-1.0, -1, -1], [1, 1, 1]])), num_train_data=2, metadata={})


def test_a_step_that_did_not_fit_leaves_the_densification_statistics_alone():
    from bytesplat_ns.strategy import SyncFreeDefaultStrategy

    strategy = SyncFreeDefaultStrategy(refine_scale2d_stop_iter=100)
    n = 6
    params = {"means": torch.zeros(n, 3)}
    grads = torch.arange(12, dtype=torch.float32).reshape(1, n, 2)
    means2d = torch.zeros(1, n, 2, requires_grad=True)
    means2d.grad = grads
    info = {"width": 20, "height": 10, "n_cameras": 1, "means2d": means2d,
            "radii": torch.tensor([[3, 0, 2, 5, 0, 1]], dtype=torch.int32)}
    state = strategy.initialize_state()
    strategy._update_state(params, state, info)
    expected = {key: state[key].clone() for key in ("grad2d", "count", "radii")}
    strategy._update_state(params, state, {**info, "step_valid": torch.tensor(False)})
    for key, value in expected.items():
        assert torch.equal(state[key], value), key
    plain = copy.deepcopy(state)
    strategy._update_state(params, state, {**info, "step_valid": torch.tensor(True)})
    strategy._update_state(params, plain, info)
    for key in expected:
        assert torch.equal(state[key], plain[key]), key


def test_training_a_view_again_is_one_step_of_that_view(tmp_path):
    """ByteSplatTrainer.train_view_again: the view's render, loss, backward and one Adam step of every
    Gaussian parameter, and its render's densification statistics; no scheduler step or callbacks."""
    from bytesplat_ns.bench.train import setup_trainer
    from bytesplat_ns.data.scene import SceneSpec, ensure_scene
    from bytesplat_ns.method_configs.bytesplat import bytesplat_config
    from bytesplat_ns.model import GAUSSIAN_PARAM_NAMES

    scene = ensure_scene(SceneSpec(size="small", num_views=10, width=32), cache_dir=tmp_path / "scenes")
    trainer, _ = setup_trainer("again", copy.deepcopy(bytesplat_config), scene, 3, tmp_path / "out", seed=0,
                               device="cpu")
    trainer.train()
    model = trainer.pipeline.model
    camera, batch = trainer.pipeline.datamanager.next_train(3)
    optimizers = trainer.optimizers.optimizers
    before = {name: model.gauss_params[name].detach().clone() for name in GAUSSIAN_PARAM_NAMES}
    lrs = {name: optimizers[name].param_groups[0]["lr"] for name in GAUSSIAN_PARAM_NAMES}
    count = model.strategy_state["count"].clone()
    trainer.train_view_again(model, camera, batch, 3)
    for name in GAUSSIAN_PARAM_NAMES:
        state = optimizers[name].state[model.gauss_params[name]]
        assert float(state["step"]) == 4.0, name
        assert optimizers[name].param_groups[0]["lr"] == lrs[name]  # no scheduler step
    assert not torch.equal(model.gauss_params["means"].detach(), before["means"])
    visible = (model.info["radii"] > 0).reshape(1, count.numel(), -1).all(-1)[0]
    assert torch.equal(model.strategy_state["count"], count + visible)
    assert model.binning_exactly is False


def test_a_checkpoint_holds_the_update_of_a_view_still_waiting_to_be_trained_again(tmp_path, monkeypatch):
    """A view whose lists did not fit is trained before a checkpoint is written, not after: a run resumed from
    the checkpoint would otherwise never make that view's update."""
    from bytesplat_ns.bench.train import setup_trainer
    from bytesplat_ns.data.scene import SceneSpec, ensure_scene
    from bytesplat_ns.method_configs.bytesplat import bytesplat_config
    from bytesplat_ns.trainer import ByteSplatTrainer

    scene = ensure_scene(SceneSpec(size="small", num_views=10, width=32), cache_dir=tmp_path / "scenes")
    trainer, _ = setup_trainer("wait", copy.deepcopy(bytesplat_config), scene, 2, tmp_path / "out", seed=0,
                               device="cpu")
    trainer.train()
    model = trainer.pipeline.model
    room = model._pair_room = PairRoom(lag=2)
    camera, batch = trainer.pipeline.datamanager.next_train(2)
    room.send(2, _total(10), 5, model.num_points, view=(camera, batch))  # did not fit; due at step 4
    trained, order = [], []
    monkeypatch.setattr(ByteSplatTrainer, "train_view_again",
                        lambda self, m, c, b, step: (trained.append((c, step)), order.append("again")))
    real_save = trainer.checkpoint_writer.save
    monkeypatch.setattr(trainer.checkpoint_writer, "save",
                        lambda state, step: (order.append("save"), real_save(state, step)))
    trainer.save_checkpoint(3)
    trainer.checkpoint_writer.finish()
    assert trained == [(camera, 3)] and order == ["again", "save"] and not room.sent
