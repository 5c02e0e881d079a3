"""``bytesplat-large`` and ``bytesplat-distributed-large``: the same methods for scenes whose images do
not fit in memory. Identical to ``bytesplat`` / ``bytesplat-distributed`` except the
datamanager: ``LazyImageDatamanagerConfig`` decodes each image when a step needs it and keeps a small
LRU cache per process (``--pipeline.datamanager.lazy-cache-size``, ``--pipeline.datamanager.prefetch``),
where nerfstudio's FullImageDatamanager decodes every image of the scene into every process at
start. See docs/large_scenes.md.

    ns-train bytesplat-large --data /data/city
    ns-train bytesplat-distributed-large --machine.num-devices 2 bytesplat-scene --scene-size city-large
"""

from __future__ import annotations

import dataclasses

from nerfstudio.plugins.types import MethodSpecification

from bytesplat_ns.data.lazy_images import LazyImageDatamanagerConfig
from bytesplat_ns.method_configs.bytesplat import bytesplat_config
from bytesplat_ns.distributed.trainer import sharded_variant


def with_lazy_images(config, method_name: str):
    """A copy of ``config`` whose datamanager loads images on demand (same dataparser)."""
    pipeline = config.pipeline
    lazy = LazyImageDatamanagerConfig(dataparser=pipeline.datamanager.dataparser)
    return dataclasses.replace(config, method_name=method_name,
                               pipeline=dataclasses.replace(pipeline, datamanager=lazy))


bytesplat_large_config = with_lazy_images(bytesplat_config, "bytesplat-large")
bytesplat_distributed_large_config = sharded_variant(bytesplat_large_config, method_name="bytesplat-distributed-large")

bytesplat_large = MethodSpecification(
    config=bytesplat_large_config,
    description="bytesplat for scenes too large to cache: images decoded on demand (small LRU cache).",
)
bytesplat_distributed_large = MethodSpecification(
    config=bytesplat_distributed_large_config,
    description="bytesplat-distributed with images decoded on demand: each rank holds only the views it renders.",
)
