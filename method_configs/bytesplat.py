"""The ``bytesplat`` method: splatfacto's schedule and hyper-parameters with our rasterizer backends.

Registered through the ``nerfstudio.method_configs`` entry point (see pyproject.toml), so
``ns-train bytesplat`` lists and runs it. With no ``--data`` it trains on the built-in scene.
"""

from __future__ import annotations

import torch
from nerfstudio.configs.base_config import MachineConfig, ViewerConfig
from nerfstudio.engine.schedulers import ExponentialDecaySchedulerConfig
from nerfstudio.pipelines.base_pipeline import VanillaPipelineConfig
from nerfstudio.plugins.types import MethodSpecification

from bytesplat_ns.data.datamanager import BytesplatDatamanagerConfig
from bytesplat_ns.data.dataparser import BytesplatSceneDataParserConfig
from bytesplat_ns.model import ByteSplatModelConfig
from bytesplat_ns.optim import DeviceAdamOptimizerConfig
from bytesplat_ns.distributed.trainer import AutoShardedTrainerConfig


def adam(lr: float, final_lr: float | None = None, max_steps: int = 30000, warmup_steps: int = 0) -> dict:
    """One optimizer group as nerfstudio expects it: Adam (eps 1e-15, as splatfacto; fused on a GPU,
    bytesplat_ns/optim.py) plus schedule."""
    scheduler = None
    if final_lr is not None:
        scheduler = ExponentialDecaySchedulerConfig(
            lr_final=final_lr, max_steps=max_steps, warmup_steps=warmup_steps, lr_pre_warmup=0
        )
    return {"optimizer": DeviceAdamOptimizerConfig(lr=lr, eps=1e-15), "scheduler": scheduler}


def gaussian_optimizers() -> dict:
    """splatfacto 1.1.5's learning rates, so A/B runs against it differ only in the renderer."""
    return {
        "means": adam(1.6e-4, final_lr=1.6e-6),
        "features_dc": adam(0.0025),
        "features_rest": adam(0.0025 / 20),
        "opacities": adam(0.05),
        "scales": adam(0.005),
        "quats": adam(0.001),
        "camera_opt": adam(1e-4, final_lr=5e-7, warmup_steps=1000),
        "bilateral_grid": adam(2e-3, final_lr=1e-4, warmup_steps=1000),
    }


def default_device_type() -> str:
    # ns-train's own default is cuda; a CPU-only machine should still train out of the box.
    return "cuda" if torch.cuda.is_available() else "cpu"


bytesplat_config = AutoShardedTrainerConfig(
    method_name="bytesplat",
    steps_per_eval_image=100,
    steps_per_eval_batch=0,
    steps_per_save=2000,
    steps_per_eval_all_images=1000,
    max_num_iterations=30000,
    mixed_precision=False,
    machine=MachineConfig(device_type=default_device_type()),
    pipeline=VanillaPipelineConfig(
        datamanager=BytesplatDatamanagerConfig(
            dataparser=BytesplatSceneDataParserConfig(),
            cache_images_type="uint8",
        ),
        model=ByteSplatModelConfig(),
    ),
    optimizers=gaussian_optimizers(),
    viewer=ViewerConfig(num_rays_per_chunk=1 << 15),
    vis="viewer",
)

bytesplat = MethodSpecification(
    config=bytesplat_config,
    description="Fast 3D Gaussian Splatting (splatfacto-compatible) with fused CUDA rasterization; runs on CPU too.",
)
