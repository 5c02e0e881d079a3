"""Image caching with ``cache_workers`` threads (issue 21): same images, more threads than nerfstudio's 2."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from bytesplat_ns.data.datamanager import BytesplatDatamanagerConfig
from bytesplat_ns.data.dataparser import BytesplatSceneDataParserConfig
from bytesplat_ns.data.scene import SceneSpec, ensure_scene


@pytest.fixture(scope="module")
def scene(tmp_path_factory):
    return ensure_scene(SceneSpec(size="small", num_views=10, width=32), cache_dir=tmp_path_factory.mktemp("scenes"))


def cached(scene, workers):
    config = BytesplatDatamanagerConfig(dataparser=BytesplatSceneDataParserConfig(data=scene), cache_images="gpu",  # "gpu" is the device: cpu here
                                        cache_images_type="uint8", cache_workers=workers)
    manager = config.setup(device="cpu")
    threads = set()
    real_get_data = manager.train_dataset.get_data

    def get_data(*args, **kwargs):
        threads.add(threading.current_thread().name)
        return real_get_data(*args, **kwargs)

    manager.train_dataset.get_data = get_data
    return manager.cached_train, threads


def test_more_threads_same_images(scene, monkeypatch):
    sizes = []
    real_init = ThreadPoolExecutor.__init__

    def init(self, max_workers=None, *args, **kwargs):
        sizes.append(max_workers)
        real_init(self, max_workers, *args, **kwargs)

    monkeypatch.setattr(ThreadPoolExecutor, "__init__", init)
    two, _ = cached(scene, 2)
    six, threads = cached(scene, 6)
    assert sizes[-1] == 6 and 2 in sizes
    assert len(threads) > 1 and all(name != threading.main_thread().name for name in threads)
    assert len(two) == len(six) > 0
    for a, b in zip(two, six):
        assert torch.equal(a["image"], b["image"])


def test_default_is_one_thread_per_core_up_to_16():
    assert BytesplatDatamanagerConfig().cache_threads() == min(16, os.cpu_count() or 1)
    assert BytesplatDatamanagerConfig(cache_workers=3).cache_threads() == 3
