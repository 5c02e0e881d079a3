"""--pipeline.model.optimize-visible-only inside ns-train's loop (CPU, reference backend): each step
updates exactly the Gaussians its view shows; the optimizer-level arithmetic is tested in
tests/engine/test_adam_kernel.py (CPU) and tests/engine/test_adam_kernel_gpu.py (the kernel)."""

from __future__ import annotations

import copy

import pytest
import torch

from bytesplat_ns.bench.train import setup_trainer
from bytesplat_ns.data.scene import SceneSpec, ensure_scene
from bytesplat_ns.errors import BytesplatError
from bytesplat_ns.method_configs.bytesplat import bytesplat_config

NAMES = ("means", "scales", "quats", "features_dc", "features_rest", "opacities")


def _trainer(tmp_path, iterations, visible_only=True):
    scene = ensure_scene(SceneSpec(size="small", num_views=10, width=32), cache_dir=tmp_path / "scenes")
    config = copy.deepcopy(bytesplat_config)
    config.pipeline.model.optimize_visible_only = visible_only
    trainer, _ = setup_trainer("visible", config, scene, iterations, tmp_path / "out", seed=0, device="cpu")
    return trainer


def test_each_step_updates_exactly_the_gaussians_its_view_shows(tmp_path, monkeypatch):
    trainer = _trainer(tmp_path, 4)
    model = trainer.pipeline.model
    seen = []
    real_iteration = type(trainer).train_iteration

    def train_iteration(self, step):
        before = {name: model.gauss_params[name].detach().clone() for name in NAMES}
        result = real_iteration(self, step)
        radii = model.info["radii"]
        visible = (radii > 0).reshape(radii.shape[0], radii.shape[1], -1).all(-1).any(0)
        changed = torch.zeros_like(visible)
        for name in NAMES:
            after = model.gauss_params[name].detach()
            assert after.shape == before[name].shape  # no densification this early
            changed |= (after != before[name]).reshape(after.shape[0], -1).any(1)
        seen.append((int(visible.sum()), visible.numel()))
        assert not changed[~visible].any(), f"step {step}: a Gaussian the view does not show was updated"
        # (a visible Gaussian no pixel takes anything from has no gradient yet: Adam leaves it too)
        assert changed[visible].float().mean() > 0.9, f"step {step}: visible Gaussians were not updated"
        return result

    monkeypatch.setattr(type(trainer), "train_iteration", train_iteration)
    trainer.train()
    assert len(seen) == 4 and all(0 < shown < total for shown, total in seen)  # views show part of the scene


def test_needs_bytesplats_adam(tmp_path):
    trainer = _trainer(tmp_path, 1)
    optimizers = trainer.optimizers.optimizers
    means = trainer.pipeline.model.gauss_params["means"]
    optimizers["means"] = torch.optim.Adam([means], lr=1e-3)
    with pytest.raises(BytesplatError, match="needs bytesplat's Adam"):
        trainer.train()
