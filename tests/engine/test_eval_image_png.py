"""The eval images' fast PNG: the same pixels in the same tensorboard event as tensorboard's own add_image."""

import io

import numpy as np
import torch
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.tensorboard import SummaryWriter

from bytesplat_ns import eval_logging
from nerfstudio.utils import writer as ns_writer  # after bytesplat_ns: nerfstudio's writer has an import cycle


def _images(log_dir):
    events = EventAccumulator(str(log_dir), size_guidance={"images": 0})
    events.Reload()
    return {(tag, record.step): (record.width, record.height, np.asarray(Image.open(io.BytesIO(record.encoded_image_string))))
            for tag in events.Tags()["images"] for record in events.Images(tag)}


def test_fast_png_event_equals_tensorboards_own(tmp_path):
    torch.manual_seed(0)
    rgb = ns_writer.to8b(torch.rand(37, 53, 3) * 1.2 - 0.1).numpy()  # out-of-range values clamped as nerfstudio does
    depth = ns_writer.to8b(torch.rand(37, 53, 1)).numpy()
    ours, theirs = SummaryWriter(tmp_path / "ours"), SummaryWriter(tmp_path / "theirs")
    for name, image in (("img", rgb), ("depth", depth)):
        ours._get_file_writer().add_summary(eval_logging.image_summary(f"Eval Images/{name}", image, 1), 7)
        theirs.add_image(f"Eval Images/{name}", image, 7, dataformats="HWC")
    ours.close()
    theirs.close()
    got, expected = _images(tmp_path / "ours"), _images(tmp_path / "theirs")
    assert got.keys() == expected.keys() == {("Eval Images/img", 7), ("Eval Images/depth", 7)}
    for key in got:
        assert got[key][:2] == expected[key][:2]
        np.testing.assert_array_equal(got[key][2], expected[key][2])
    np.testing.assert_array_equal(got[("Eval Images/img", 7)][2], rgb)
