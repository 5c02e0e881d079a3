"""Eval images reach tensorboard without stalling the training loop.

nerfstudio writes the eval image of every ``steps_per_eval_image`` steps on the training thread, and
tensorboard's ``add_image`` PNG-encodes it there: on a 1080x1920 capture (ground truth beside the
render, plus depth and accumulation) that is about 1.5 s per eval step, more than 100 training steps
of the fused backend. Here the encode and the write run on worker threads (Pillow's encoder releases
the GIL), at a fast zlib level: the same pixels in the same tensorboard event, a larger file.
"""

from __future__ import annotations

import io
from concurrent.futures import Future, ThreadPoolExecutor
from typing import List

import numpy as np
import nerfstudio.configs.base_config  # noqa: F401  (nerfstudio.utils.writer imported first is a circular import)
import torch
from nerfstudio.utils import writer as ns_writer
from PIL import Image
from tensorboard.compat.proto.summary_pb2 import Summary


def encode_png(array: np.ndarray, compress_level: int) -> bytes:
    """An HxWxC uint8 image as PNG bytes (C = 1, 3 or 4)."""
    channels = array.shape[2]
    picture = Image.fromarray(array[..., 0] if channels == 1 else array)
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG", compress_level=compress_level)
    return buffer.getvalue()


class BackgroundImageWriter:
    """Stands in for a ``TensorboardWriter.write_image``: converts on the caller's thread (the image
    is already on the host: ``writer.put_image`` copied it), encodes and writes on a worker."""

    def __init__(self, tensorboard_writer: ns_writer.TensorboardWriter, workers: int, compress_level: int):
        self._summary_writer = tensorboard_writer.tb_writer
        self._compress_level = compress_level
        self._pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="bytesplat-image-log")
        self._pending: List[Future] = []

    def write_image(self, name: str, image: torch.Tensor, step: int) -> None:
        array = np.ascontiguousarray(ns_writer.to8b(image.detach().cpu()).numpy())
        if array.ndim == 2:
            array = array[..., None]
        self._raise_finished_errors()
        self._pending.append(self._pool.submit(self._encode_and_write, name, array, step))

    def _encode_and_write(self, name: str, array: np.ndarray, step: int) -> None:
        height, width, channels = array.shape
        image = Summary.Image(height=height, width=width, colorspace=channels,
                              encoded_image_string=encode_png(array, self._compress_level))
        self._summary_writer._get_file_writer().add_summary(Summary(value=[Summary.Value(tag=name, image=image)]), step)

    def _raise_finished_errors(self) -> None:
        still_running = []
        for future in self._pending:
            if future.done():
                future.result()  # an encode/write error surfaces on the training thread
            else:
                still_running.append(future)
        self._pending = still_running

    def drain(self) -> None:
        """Wait for every queued image; raise the first error."""
        pending, self._pending = self._pending, []
        try:
            for future in pending:
                future.result()
        finally:
            self._pool.shutdown(wait=True)


def install_background_image_writers(workers: int, compress_level: int) -> List[BackgroundImageWriter]:
    """Route every tensorboard writer's images through a :class:`BackgroundImageWriter`; returns
    them, to be drained before the process exits."""
    installed = []
    for event_writer in ns_writer.EVENT_WRITERS:
        already = isinstance(getattr(event_writer.write_image, "__self__", None), BackgroundImageWriter)
        if isinstance(event_writer, ns_writer.TensorboardWriter) and not already:
            background = BackgroundImageWriter(event_writer, workers, compress_level)
            event_writer.write_image = background.write_image  # type: ignore[method-assign]
            installed.append(background)
    return installed
