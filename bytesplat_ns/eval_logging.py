"""In-training eval images logged off the training thread.

nerfstudio's ``Trainer.eval_iteration`` renders one eval image every ``steps_per_eval_image``
steps and then, on the training thread, reads its metrics back from the GPU (a full wait for the
queued training work), converts the image to 8 bits, encodes it as PNG and writes it to
tensorboard. Here the training thread only queues the render; a worker thread computes the
metrics, waits for the GPU, encodes and writes, the same tags and values at the same steps.

nerfstudio's writer functions and its ``TensorboardWriter`` do nothing off the main thread, so the
worker writes to their ``SummaryWriter`` directly; with any other event writer (wandb, comet) the
trainer keeps nerfstudio's synchronous path. Not logged in this mode: nerfstudio's "Test Rays / Sec"
(a host timing of work that is now asynchronous).
"""

from __future__ import annotations

import io
import queue
import threading
from typing import Callable, Dict, List, Optional

import nerfstudio.configs.base_config  # noqa: F401 - imports nerfstudio's writer without its import cycle
import numpy as np
import torch
from nerfstudio.utils import writer
from PIL import Image
from tensorboard.compat.proto.summary_pb2 import Summary

EVAL_METRICS_GROUP = "Eval Images Metrics"  # nerfstudio's names, so dashboards stay the same
EVAL_IMAGES_GROUP = "Eval Images"


def tensorboard_writers() -> Optional[List]:
    """nerfstudio's tensorboard ``SummaryWriter`` s, or None when another event writer is active."""
    summaries = []
    for event_writer in writer.EVENT_WRITERS:
        if isinstance(event_writer, writer.TensorboardWriter):
            summaries.append(event_writer.tb_writer)
        elif not isinstance(event_writer, writer.LocalWriter):
            return None
    return summaries


class EvalImageLogger:
    """One worker thread that turns queued eval renders into tensorboard scalars and images.

    ``submit(step, metrics_and_images)`` queues a callable that returns (metrics, images) on the
    worker, under ``torch.no_grad``. A failure in the worker is raised on the training thread at the
    next ``submit`` or ``close``.
    """

    def __init__(self, summaries: List, png_compress_level: int = 1):
        self.summaries = summaries
        self.png_compress_level = png_compress_level
        self._queue: "queue.Queue" = queue.Queue()
        self._error: Optional[BaseException] = None
        # drain() waits for the metrics of everything submitted, not for the PNG encoding and writing
        self._metrics_done = threading.Condition()
        self._submitted = self._measured = 0
        self._thread = threading.Thread(target=self._work, daemon=True, name="bytesplat-eval-logging")
        self._thread.start()

    def submit(self, step: int, metrics_and_images: Callable[[], tuple]) -> None:
        self._raise_pending()
        with self._metrics_done:
            self._submitted += 1
        self._queue.put((step, metrics_and_images))

    def drain(self) -> None:
        """Wait until the metrics of everything queued are computed (before anything else uses the metric
        modules); their images may still be encoding and writing."""
        with self._metrics_done:
            self._metrics_done.wait_for(lambda: self._measured >= self._submitted)
        self._raise_pending()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()
        for summary in self.summaries:
            summary.flush()
        self._raise_pending()

    def _raise_pending(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError("in-training eval logging failed") from error

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                step, metrics_and_images = item
                try:
                    with torch.no_grad():
                        metrics, images = metrics_and_images()
                except BaseException as error:  # noqa: BLE001 - handed to the training thread
                    self._error = error  # before drain() can see this item measured
                    continue
                finally:
                    with self._metrics_done:
                        self._measured += 1
                        self._metrics_done.notify_all()
                self._write(step, metrics, images)
            except BaseException as error:  # noqa: BLE001 - handed to the training thread
                self._error = error
            finally:
                self._queue.task_done()

    def _write(self, step: int, metrics: Dict[str, float], images: Dict[str, torch.Tensor]) -> None:
        images_8bit = {name: writer.to8b(image).cpu().numpy() for name, image in images.items()}
        for summary in self.summaries:
            for key, value in metrics.items():
                summary.add_scalar(f"{EVAL_METRICS_GROUP}/{key}", float(value), step)
            for name, image in images_8bit.items():
                summary._get_file_writer().add_summary(
                    image_summary(f"{EVAL_IMAGES_GROUP}/{name}", image, self.png_compress_level), step)


def encode_png(array: np.ndarray, compress_level: int) -> bytes:
    """An HxWxC uint8 image (C = 3 or 4) as PNG bytes."""
    picture = Image.fromarray(array)
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG", compress_level=compress_level)
    return buffer.getvalue()


def image_summary(tag: str, array: np.ndarray, compress_level: int) -> Summary:
    """The event tensorboard's ``add_image(tag, array, dataformats="HWC")`` writes for a uint8 image,
    at the given zlib level: tensorboard's own level takes about 1.5 s for a 1080x1920 capture's eval
    images (ground truth beside the render, depth, accumulation); level 1 is several times faster,
    the same pixels in a larger file."""
    if array.ndim == 2:
        array = array[..., None]
    if array.shape[2] == 1:
        array = np.repeat(array, 3, axis=2)  # as add_image: a one-channel image becomes grey RGB
    height, width, channels = array.shape
    image = Summary.Image(height=height, width=width, colorspace=channels,
                          encoded_image_string=encode_png(np.ascontiguousarray(array), compress_level))
    return Summary(value=[Summary.Value(tag=tag, image=image)])
