"""The trainer freezes the start-up objects out of the garbage collector's full collections while
it trains (``--gc-freeze-at-train-start``), and gives them back afterwards."""

from __future__ import annotations

import copy
import gc

import pytest
import yaml

from bytesplat_ns.bench.train import setup_trainer
from bytesplat_ns.data.scene import SceneSpec, ensure_scene
from bytesplat_ns.method_configs.bytesplat import bytesplat_config


@pytest.fixture(scope="module")
def scene(tmp_path_factory):
    return ensure_scene(SceneSpec(size="small", num_views=6, width=32), cache_dir=tmp_path_factory.mktemp("scenes"))


@pytest.mark.parametrize("freeze", [True, False])
def test_training_runs_with_the_start_up_objects_frozen(scene, tmp_path, freeze):
    config = copy.deepcopy(bytesplat_config)
    config.gc_freeze_at_train_start = freeze
    trainer, _ = setup_trainer("gc", config, scene, 3, tmp_path, seed=0, device="cpu")
    frozen_during_steps = []
    real_iteration = trainer.train_iteration

    def train_iteration(step):
        frozen_during_steps.append(gc.get_freeze_count())
        return real_iteration(step)

    trainer.train_iteration = train_iteration
    assert gc.get_freeze_count() == 0
    trainer.train()
    assert len(frozen_during_steps) == 3
    if freeze:  # everything alive at the start: at least the modules' objects, far more than a few
        assert min(frozen_during_steps) > 10_000
    else:
        assert frozen_during_steps == [0, 0, 0]
    assert gc.get_freeze_count() == 0  # unfrozen when training ends


def test_the_switch_is_recorded_in_config_yml(scene, tmp_path):
    config = copy.deepcopy(bytesplat_config)
    config.gc_freeze_at_train_start = False
    trainer, _ = setup_trainer("gc-config", config, scene, 1, tmp_path, seed=0, device="cpu")
    trainer.config.save_config()
    saved = yaml.load((trainer.base_dir / "config.yml").read_text(), Loader=yaml.Loader)
    assert saved.gc_freeze_at_train_start is False
