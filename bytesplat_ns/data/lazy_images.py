"""Full-image datamanager that reads images from disk on demand, for scenes too big to cache.

nerfstudio 1.1.5's ``FullImageDatamanager`` decodes EVERY train (and eval) image at setup into
``cached_train`` / ``cached_eval``: with ``cache_images="gpu"`` on the device of every process (it
falls back to pinned CPU memory above 500 training images), with ``"cpu"`` in pinned host memory of
every process, as float32 unless ``cache_images_type="uint8"``. It has no on-demand mode (no
``"disk"`` option in 1.1.5; its ``ParallelDatamanager`` is for ray batches, not full images). A city
of 4000 views at 1920x1080 is 25 GB as uint8 (100 GB as float32) per process, and each rank of a
sharded run needs only the views it renders.

:class:`LazyImageDatamanagerConfig` keeps the whole interface (``cached_train[i]``,
``cached_eval[i]``, ``next_train``, ``next_eval``, ``fixed_indices_eval_dataloader``,
``train_cameras``) but ``cached_train`` / ``cached_eval`` are sequences that decode an image when it
is indexed, keep the last ``lazy_cache_size`` decoded images (LRU, per process, on the CPU) and, in
``next_train``, decode the next ``prefetch`` training views in background threads. Images travel to
the device only for the step that uses them. Use ``cache_images_type="uint8"`` (the default here).

Limitation: cameras with non-zero distortion are refused (nerfstudio undistorts while caching and
rewrites the intrinsics then; do that once offline, or use ``FullImageDatamanagerConfig``).

The ``bytesplat-large`` and ``bytesplat-distributed-large`` methods use it
(``method_configs/bytesplat_large.py``); from Python, on any config::

    config.pipeline.datamanager = LazyImageDatamanagerConfig(
        dataparser=BytesplatSceneDataParserConfig(data=Path("/data/city")), lazy_cache_size=64)
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property
from typing import Dict, Iterator, List, Literal, Sequence, Tuple, Type

import torch
from nerfstudio.cameras.cameras import Cameras
from nerfstudio.data.datasets.base_dataset import InputDataset

from bytesplat_ns.data.datamanager import BytesplatDatamanager, BytesplatDatamanagerConfig
from bytesplat_ns.errors import BytesplatError


@dataclass
class LazyImageDatamanagerConfig(BytesplatDatamanagerConfig):
    """FullImageDatamanager that decodes images on demand with a small LRU cache (large scenes)."""

    _target: Type = field(default_factory=lambda: LazyImageDatamanager)
    cache_images: Literal["cpu", "gpu"] = "cpu"
    """Unused by the lazy loader (images stay on disk; the LRU cache is on the CPU)."""
    cache_images_type: Literal["uint8", "float32"] = "uint8"
    """Decoded image type (uint8: 4x less memory; the model converts)."""
    lazy_cache_size: int = 64
    """Decoded images kept per process and split (least recently used evicted)."""
    prefetch: int = 4
    """Upcoming training views decoded ahead in background threads (0: none)."""
    prefetch_threads: int = 2


class LazyImages(Sequence):
    """``dataset.get_data(i)`` on demand, the last ``capacity`` results kept (thread-safe)."""

    def __init__(self, dataset: InputDataset, image_type: str, capacity: int):
        self.dataset = dataset
        self.image_type = image_type
        self.capacity = max(1, int(capacity))
        self._cache: "OrderedDict[int, Dict[str, torch.Tensor]]" = OrderedDict()
        self._lock = threading.Lock()
        self.loads = 0
        self.hits = 0

    def __len__(self) -> int:
        return len(self.dataset)

    def __contains__(self, idx: object) -> bool:
        with self._lock:
            return idx in self._cache

    def _decode(self, idx: int) -> Dict[str, torch.Tensor]:
        data = self.dataset.get_data(idx, image_type=self.image_type)  # type: ignore[arg-type]
        camera = self.dataset.cameras[idx].reshape(())
        h, w = data["image"].shape[:2]
        if (w, h) != (int(camera.width.item()), int(camera.height.item())):
            raise BytesplatError(
                f"Image {self.dataset.image_filenames[idx]} is {w}x{h} but its camera says "
                f"{int(camera.width.item())}x{int(camera.height.item())}"
            )
        return data

    def __getitem__(self, idx):  # type: ignore[override]
        if isinstance(idx, slice):
            return [self[i] for i in range(*idx.indices(len(self)))]
        idx = int(idx)
        if idx < 0:
            idx += len(self)
        if not 0 <= idx < len(self):
            raise IndexError(idx)
        with self._lock:
            if idx in self._cache:
                self._cache.move_to_end(idx)
                self.hits += 1
                return self._cache[idx]
        data = self._decode(idx)  # outside the lock: threads decode in parallel
        with self._lock:
            self.loads += 1
            self._cache[idx] = data
            self._cache.move_to_end(idx)
            while len(self._cache) > self.capacity:
                self._cache.popitem(last=False)
        return data

    def __iter__(self) -> Iterator[Dict[str, torch.Tensor]]:
        for i in range(len(self)):
            yield self[i]


class _EvalViews(Sequence):
    """(camera, data) per eval view, loaded when indexed (nerfstudio's list holds them all)."""

    def __init__(self, manager: "LazyImageDatamanager"):
        self.manager = manager

    def __len__(self) -> int:
        return len(self.manager.eval_dataset)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        m = self.manager
        data = dict(m.cached_eval[int(i)])
        data["image"] = data["image"].to(m.device)
        return m.eval_dataset.cameras[int(i) : int(i) + 1].to(m.device), data

    def __iter__(self) -> Iterator[Tuple[Cameras, Dict[str, torch.Tensor]]]:
        for i in range(len(self)):
            yield self[i]


class LazyImageDatamanager(BytesplatDatamanager):
    config: LazyImageDatamanagerConfig

    def __init__(self, config: LazyImageDatamanagerConfig, *args, **kwargs):
        super().__init__(config, *args, **kwargs)
        for name, dataset in (("train", self.train_dataset), ("eval", self.eval_dataset)):
            dist = dataset.cameras.distortion_params
            if dist is not None and bool(torch.any(dist != 0)):
                raise BytesplatError(
                    f"The lazy image datamanager needs undistorted images; the {name} cameras have distortion",
                    hint="undistort the images once offline, or use nerfstudio's FullImageDatamanager (caches all)",
                )
        self.train_cameras = self.train_dataset.cameras
        self._prefetcher = ThreadPoolExecutor(max(1, self.config.prefetch_threads), thread_name_prefix="lazy-images")
        self._pending: Dict[int, Future] = {}

    @cached_property
    def cached_train(self) -> LazyImages:  # type: ignore[override]
        return LazyImages(self.train_dataset, self.config.cache_images_type, self.config.lazy_cache_size)

    @cached_property
    def cached_eval(self) -> LazyImages:  # type: ignore[override]
        return LazyImages(self.eval_dataset, self.config.cache_images_type, self.config.lazy_cache_size)

    @property
    def fixed_indices_eval_dataloader(self) -> _EvalViews:  # type: ignore[override]
        return _EvalViews(self)

    def _prefetch(self, upcoming: List[int]) -> None:
        for idx in list(self._pending):
            if self._pending[idx].done():
                self._pending.pop(idx).result()  # re-raise decoding errors here
        cache = self.cached_train
        for idx in upcoming[: max(0, self.config.prefetch)]:
            if idx not in cache and idx not in self._pending:
                self._pending[idx] = self._prefetcher.submit(cache.__getitem__, idx)

    def next_train(self, step: int) -> Tuple[Cameras, Dict]:
        camera, data = super().next_train(step)
        if self.config.prefetch > 0:
            self._prefetch(self.train_unseen_cameras)
        return camera, data
