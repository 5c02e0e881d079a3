"""Training with the tile pairs binned into a room sized ahead (--pipeline.model.fused.sync-free-binning,
bytesplat_ns/pair_capacity.py) on the GPU: the same training as with the count read back while no step
waits for the GPU; a step whose lists did not fit changes nothing and its view is trained again two steps
later, the same steps on every run. Two GPU runs of the same training differ in the last bits (the
backward kernel's float atomics add in any order), so whole runs are compared within a tolerance; the
lists themselves are the same bit for bit (tests/raster/test_binning_gpu.py)."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.same_training import GAUSSIAN_NAMES, assert_same_training, fused_trainer

pytestmark = pytest.mark.gpu

NAMES = GAUSSIAN_NAMES


def _trainer(tmp_path, iterations, sync_free=True, label="run", margin=1.2):
    return fused_trainer(tmp_path, iterations, label, sync_free=sync_free, margin=margin)


def test_room_sized_ahead_trains_the_same_gaussians_as_the_count_read_back(tmp_path):
    # room to spare: the first steps' few views say little about the next one's pairs
    sized = _trainer(tmp_path, 90, label="sized", margin=4.0)
    sized.train()
    room = sized.pipeline.model.pair_room
    read_back = _trainer(tmp_path, 90, sync_free=False, label="read_back")
    read_back.train()
    assert read_back.pipeline.model.pair_room is None
    assert room.sized_steps >= 80 and room.overflows == 0
    assert_same_training(sized, read_back)


def test_a_step_past_its_room_is_trained_again_after_two_steps_the_same_on_every_run(tmp_path, monkeypatch):
    from bytesplat_ns.model import ByteSplatModel
    from bytesplat_ns.trainer import ByteSplatTrainer

    forced = {41, 42, 67}  # steps given room for one pair
    real_room = ByteSplatModel._room_for_pairs

    def room_for_pairs(self, contribution, view_key=None):
        room = real_room(self, contribution, view_key)
        return 1 if room is not None and self.step in forced else room

    monkeypatch.setattr(ByteSplatModel, "_room_for_pairs", room_for_pairs)
    again = []
    real_again = ByteSplatTrainer.train_view_again

    def train_view_again(self, model, camera, batch, step):
        again.append(step)
        real_again(self, model, camera, batch, step)

    monkeypatch.setattr(ByteSplatTrainer, "train_view_again", train_view_again)
    runs = []
    for label in ("first", "second"):
        again.clear()
        trainer = _trainer(tmp_path, 80, label=label, margin=4.0)
        model = trainer.pipeline.model
        trainer.train()
        assert again == [43, 44, 69]
        assert model.pair_room.overflows == 3
        # every view's update made once: the step counts are the run's steps
        for name in NAMES:
            state = model.optimizers[name].state[model.gauss_params[name]]
            assert float(state["step"]) == 80.0, name
        runs.append(trainer)
    assert_same_training(*runs)


def test_steps_binned_into_a_room_never_wait_for_the_gpu(tmp_path):
    from torch.profiler import ProfilerActivity, profile

    from bytesplat_ns.bench.profile_train import loop_body

    counts = {}
    for sync_free in (True, False):
        trainer = _trainer(tmp_path, 22, sync_free=sync_free, label=f"sync_free_{sync_free}")
        trainer.train()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for step in range(23, 33):  # no refine (every 20), divergence check (50) or logged step among them
                if step % 10 == 0:
                    continue
                loop_body(trainer, step)
        counts[sync_free] = sum(e.count for e in prof.key_averages()
                                if e.key in ("cudaStreamSynchronize", "cudaDeviceSynchronize"))
    assert counts[True] == 0 and counts[False] >= 9, counts
