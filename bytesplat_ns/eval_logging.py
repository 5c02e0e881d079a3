"""In-training eval images logged off the training thread.

nerfstudio's ``Trainer.eval_iteration`` renders one eval image every ``steps_per_eval_image``
steps and then, on the training thread, reads its metrics back from the GPU (a full wait for the
queued training work), converts the image to 8 bits, encodes it as PNG and writes it to
tensorboard. Here the training thread only queues the render; worker threads compute the
metrics (waiting for the GPU), encode and write, the same tags and values at the same steps.

nerfstudio's writer functions and its ``TensorboardWriter`` do nothing off the main thread, so the
writer thread writes to their ``SummaryWriter`` directly; with any other event writer (wandb, comet) the
trainer keeps nerfstudio's synchronous path. Not logged in this mode: nerfstudio's "Test Rays / Sec"
(a host timing of work that is now asynchronous).
"""

from __future__ import annotations

import io
import queue
import threading
from concurrent.futures import ThreadPoolExecutor
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
    """Worker threads that turn queued eval renders into tensorboard scalars and images.

    ``submit(step, metrics_and_images)`` queues a callable that returns (metrics, images) on the
    metrics thread, under ``torch.no_grad``. The images' PNG encodings then run on a small pool
    (the encoder releases the interpreter lock) and a writer thread writes each step's scalars and
    images in submission order, so ``drain`` waits for the metrics only, never behind an earlier
    image's encoding: a 1080x1920 capture's eval images take about half a second to encode, longer
    than the steps between two eval images. At most ``max_pending_writes`` steps wait for their write
    (each holds its 8-bit images in host memory); the metrics thread waits beyond that. A failure in
    any worker is raised on the training thread at the next ``submit``, ``drain`` or ``close``.
    """

    def __init__(self, summaries: List, png_compress_level: int = 1, encoders: int = 4, max_pending_writes: int = 8):
        self.summaries = summaries
        self.png_compress_level = png_compress_level
        self._queue: "queue.Queue" = queue.Queue()
        self._writes: "queue.Queue" = queue.Queue()
        self._write_slots = threading.BoundedSemaphore(max_pending_writes)
        self._encoders = ThreadPoolExecutor(max_workers=encoders, thread_name_prefix="bytesplat-eval-png")
        self._error: Optional[BaseException] = None
        self._metrics_done = threading.Condition()
        self._submitted = self._measured = 0
        self._threads = [threading.Thread(target=target, daemon=True, name=f"bytesplat-eval-{name}")
                         for name, target in (("metrics", self._measure), ("writes", self._write_in_order))]
        for thread in self._threads:
            thread.start()

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
        for thread in self._threads:
            thread.join()
        self._encoders.shutdown()
        for summary in self.summaries:
            summary.flush()
        self._raise_pending()

    def _raise_pending(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError("in-training eval logging failed") from error

    def _measure(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                self._writes.put(None)
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
            try:
                images_8bit = {name: writer.to8b(image).cpu().numpy() for name, image in images.items()}
            except BaseException as error:  # noqa: BLE001 - handed to the training thread
                self._error = error
                continue
            self._write_slots.acquire()  # released by the writer thread once this step is written
            encoded = {name: self._encoders.submit(image_summary, f"{EVAL_IMAGES_GROUP}/{name}", image,
                                                   self.png_compress_level) for name, image in images_8bit.items()}
            self._writes.put((step, metrics, encoded))

    def _write_in_order(self) -> None:
        while True:
            item = self._writes.get()
            if item is None:
                return
            step, metrics, encoded = item
            try:
                self._write(step, metrics, {name: future.result() for name, future in encoded.items()})
            except BaseException as error:  # noqa: BLE001 - handed to the training thread
                self._error = error
            finally:
                self._write_slots.release()

    def _write(self, step: int, metrics: Dict[str, float], images: Dict[str, Summary]) -> None:
        """Write one step's scalars and its encoded images (``image_summary`` events) to every writer."""
        for summary in self.summaries:
            for key, value in metrics.items():
                summary.add_scalar(f"{EVAL_METRICS_GROUP}/{key}", float(value), step)
            for image in images.values():
                summary._get_file_writer().add_summary(image, step)


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
