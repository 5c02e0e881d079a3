"""Eval images written by worker threads: the same pixels in the same tensorboard event, and the
training thread does not wait for the encode."""

import io
import threading

import numpy as np
import pytest
import torch

from bytesplat_ns import image_logging  # first: it imports nerfstudio's writer in a working order
from nerfstudio.utils import writer as ns_writer  # noqa: E402
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator



def _read_images(log_dir):
    events = EventAccumulator(str(log_dir), size_guidance={"images": 0})
    events.Reload()
    out = {}
    for tag in events.Tags()["images"]:
        for record in events.Images(tag):
            out[(tag, record.step)] = np.asarray(Image.open(io.BytesIO(record.encoded_image_string)))
    return out


@pytest.fixture
def tensorboard_writer(tmp_path, monkeypatch):
    writer = ns_writer.TensorboardWriter(log_dir=tmp_path)
    monkeypatch.setattr(ns_writer, "EVENT_WRITERS", [writer])
    yield writer
    writer.tb_writer.close()


def test_background_images_equal_tensorboards_own(tmp_path, tensorboard_writer):
    torch.manual_seed(0)
    rgb = torch.rand(37, 53, 3) * 1.2 - 0.1  # out-of-range values are clamped as to8b does
    depth = torch.rand(37, 53, 1)
    installed = image_logging.install_background_image_writers(workers=2, compress_level=1)
    assert len(installed) == 1
    assert image_logging.install_background_image_writers(workers=2, compress_level=1) == []  # once only
    tensorboard_writer.write_image("Eval Images/img", rgb, step=100)
    tensorboard_writer.write_image("Eval Images/depth", depth, step=100)
    installed[0].drain()
    tensorboard_writer.tb_writer.flush()
    images = _read_images(tmp_path)
    expected_rgb = ns_writer.to8b(rgb).numpy()
    np.testing.assert_array_equal(images[("Eval Images/img", 100)], expected_rgb)
    np.testing.assert_array_equal(images[("Eval Images/depth", 100)], ns_writer.to8b(depth).numpy()[..., 0])


def test_write_image_returns_before_the_encode(tmp_path, tensorboard_writer, monkeypatch):
    started, release = threading.Event(), threading.Event()
    real_encode = image_logging.encode_png

    def slow_encode(array, level):
        started.set()
        assert release.wait(10)
        return real_encode(array, level)

    monkeypatch.setattr(image_logging, "encode_png", slow_encode)
    (background,) = image_logging.install_background_image_writers(workers=1, compress_level=1)
    tensorboard_writer.write_image("Eval Images/img", torch.rand(8, 8, 3), step=1)
    assert started.wait(10)  # the worker is encoding while the caller already returned
    assert not background._pending[0].done()
    release.set()
    background.drain()
    tensorboard_writer.tb_writer.flush()
    assert ("Eval Images/img", 1) in _read_images(tmp_path)


def test_an_encode_error_surfaces_on_the_training_thread(tensorboard_writer, monkeypatch):
    def broken(array, level):
        raise OSError("disk full")

    monkeypatch.setattr(image_logging, "encode_png", broken)
    (background,) = image_logging.install_background_image_writers(workers=1, compress_level=1)
    tensorboard_writer.write_image("Eval Images/img", torch.rand(8, 8, 3), step=1)
    with pytest.raises(OSError, match="disk full"):
        background.drain()
