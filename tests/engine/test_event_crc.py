"""bytesplat's vectorised CRC-32C gives tensorboard's event checksums bit for bit, and the trainer
(``--fast-event-checksums``) makes tensorboard's writer use it."""

from __future__ import annotations

import copy
import os

import numpy as np
import pytest
import yaml
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c as tensorboard_masked_crc32c
from tensorboard.summary.writer import record_writer

from bytesplat_ns import event_crc
from bytesplat_ns.bench.train import setup_trainer
from bytesplat_ns.data.scene import SceneSpec, ensure_scene
from bytesplat_ns.method_configs.bytesplat import bytesplat_config


@pytest.mark.parametrize("length", [0, 1, 9, 4095, 4096, 65535, 65536, 65537, 3 * 4096 * 17 + 5, (1 << 20) + 123])
def test_same_checksums_as_tensorboard(length):
    data = np.random.default_rng(length).integers(0, 256, length, dtype=np.uint8).tobytes()
    assert event_crc.masked_crc32c(data) == tensorboard_masked_crc32c(data)


def test_the_standard_check_value():
    assert event_crc.crc32c(b"123456789") == 0xE3069283  # CRC-32C's published check value


@pytest.fixture()
def restore_record_writer(monkeypatch):
    # tensorboard's own function to start with (an earlier trainer in this process may have installed ours)
    monkeypatch.setattr(record_writer, "masked_crc32c", tensorboard_masked_crc32c)


def test_events_written_with_it_read_back_with_tensorboards_own_check(tmp_path, restore_record_writer):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    event_crc.install()
    assert record_writer.masked_crc32c is event_crc.masked_crc32c
    image = np.frombuffer(os.urandom(300 * 400 * 3), dtype=np.uint8).reshape(300, 400, 3)  # a ~360 kB PNG
    with SummaryWriter(str(tmp_path)) as summary:
        summary.add_image("img", image, 7, dataformats="HWC")
        summary.add_scalar("loss", 0.5, 7)
    events = EventAccumulator(str(tmp_path), size_guidance={"images": 0, "scalars": 0})
    events.Reload()  # tensorboard's reader recomputes every record's CRC with its own code
    assert [e.step for e in events.Images("img")] == [7] and events.Scalars("loss")[0].value == 0.5


@pytest.fixture(scope="module")
def scene(tmp_path_factory):
    return ensure_scene(SceneSpec(size="small", num_views=6, width=32), cache_dir=tmp_path_factory.mktemp("scenes"))


@pytest.mark.parametrize("fast", [True, False])
def test_the_trainer_installs_it_when_configured(scene, tmp_path, restore_record_writer, fast):
    original = record_writer.masked_crc32c
    assert original is tensorboard_masked_crc32c
    config = copy.deepcopy(bytesplat_config)
    config.fast_event_checksums = fast
    trainer, _ = setup_trainer("crc", config, scene, 1, tmp_path, seed=0, device="cpu")
    assert (record_writer.masked_crc32c is event_crc.masked_crc32c) == fast
    if not fast:
        assert record_writer.masked_crc32c is original
    trainer.config.save_config()
    saved = yaml.load((trainer.base_dir / "config.yml").read_text(), Loader=yaml.Loader)
    assert saved.fast_event_checksums is fast
