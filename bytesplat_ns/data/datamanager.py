"""nerfstudio's full-image datamanager without the per-step host-device synchronisations.

``FullImageDatamanager.next_train`` copies the step's camera to the GPU (``Cameras.to``: one blocking
copy per camera field, each a full stream synchronisation), and the model then reads the image size
back with ``.item()`` (two more). On a scene the GPU trains in a few milliseconds per step, those
stalls are a large share of the iteration (`bytesplat-bench profile`). Here the training cameras are
copied to the device once and sliced there, and each training camera carries its image size as
host integers (``HOST_SIZE_KEY`` in its metadata) so the model never has to ask the GPU, and its
world-to-camera matrix, made on the device once per training image (``WORLD_TO_CAMERA_KEY``: ten
small tensor operations the model would otherwise launch every step).

The images are decoded and undistorted once, when first cached, by ``cache_workers`` threads.
"""

from __future__ import annotations

import contextlib
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Dict, Iterator, Optional, Tuple, Type

import torch
from nerfstudio.cameras.cameras import Cameras
from nerfstudio.data.datamanagers import full_images_datamanager
from nerfstudio.data.datamanagers.full_images_datamanager import FullImageDatamanager, FullImageDatamanagerConfig

from bytesplat_ns.data.sanity import check_cameras, frames_without_pose
from bytesplat_ns.errors import BytesplatError

# metadata key of a training camera: its full-resolution (width, height) as Python ints
HOST_SIZE_KEY = "bytesplat_host_size"
WORLD_TO_CAMERA_KEY = "bytesplat_world_to_camera"


def host_image_size(camera: Cameras) -> Optional[Tuple[int, int]]:
    """(width, height) at full resolution when the camera carries them on the host, else None."""
    return (camera.metadata or {}).get(HOST_SIZE_KEY)


def viewmat_from_camera_to_world(camera_to_world: torch.Tensor) -> torch.Tensor:
    """[C,3,4] nerfstudio (OpenGL) camera-to-world -> [C,4,4] OpenCV world-to-camera.

    Plain torch on purpose: splatfacto ``torch.compile``s this, which costs a C++ toolchain and
    seconds of compile on CPU for a handful of multiplies.
    """
    # flip y, z (negating columns, not multiplying by a tensor built on the host: no device copy)
    rotation = torch.cat([camera_to_world[:, :3, :1], -camera_to_world[:, :3, 1:3]], dim=2)
    translation = camera_to_world[:, :3, 3:4]
    rotation_inv = rotation.transpose(1, 2)
    viewmat = torch.zeros(camera_to_world.shape[0], 4, 4, device=camera_to_world.device, dtype=camera_to_world.dtype)
    viewmat[:, :3, :3] = rotation_inv
    viewmat[:, :3, 3:4] = -rotation_inv @ translation
    viewmat[:, 3, 3] = 1.0
    return viewmat


def world_to_camera(camera: Cameras) -> Optional[torch.Tensor]:
    """A training camera's [1,4,4] world-to-camera matrix as the datamanager made it, once per training image
    (``viewmat_from_camera_to_world`` of its camera-to-world; ``next_train`` puts it in the camera's metadata);
    None for any other camera."""
    return (camera.metadata or {}).get(WORLD_TO_CAMERA_KEY)


@dataclass
class BytesplatDatamanagerConfig(FullImageDatamanagerConfig):
    _target: Type = field(default_factory=lambda: BytesplatDatamanager)
    cache_workers: Optional[int] = None
    """Threads that decode and undistort the images when they are cached (nerfstudio 1.1.5 uses 2;
    decoding and OpenCV's undistortion release the GIL). None: one per CPU core, at most 16."""

    def cache_threads(self) -> int:
        return max(1, self.cache_workers or min(16, os.cpu_count() or 1))


@contextlib.contextmanager
def _cache_executor_threads(workers: int) -> Iterator[None]:
    """nerfstudio's image cache with ``workers`` threads instead of its hard-coded two."""
    real = full_images_datamanager.ThreadPoolExecutor

    def executor(max_workers=None, **kwargs) -> ThreadPoolExecutor:  # nerfstudio's own count is ignored
        return ThreadPoolExecutor(max_workers=workers, **kwargs)

    full_images_datamanager.ThreadPoolExecutor = executor
    try:
        yield
    finally:
        full_images_datamanager.ThreadPoolExecutor = real


class BytesplatDatamanager(FullImageDatamanager):
    config: BytesplatDatamanagerConfig

    _device_cameras: Optional[Cameras] = None
    _device_cameras_of: Optional[Cameras] = None
    _host_sizes: Tuple[Tuple[int, int], ...] = ()
    _world_to_camera: Optional[Dict[int, torch.Tensor]] = None  # per training image, with the device cameras

    def __init__(self, *args, **kwargs):
        try:
            super().__init__(*args, **kwargs)
        except KeyError as error:
            missing = frames_without_pose(self.config.dataparser.data) if error.args == ("transform_matrix",) else []
            if not missing:
                raise
            raise BytesplatError(
                f"{len(missing)} frame(s) of the scene's transforms.json have no transform_matrix (no pose): "
                f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}.",
                hint="give every frame its camera-to-world transform_matrix, or remove the frames without one",
            ) from error
        except ZeroDivisionError as error:
            # nerfstudio's auto-scale divides by the largest camera offset from the poses' centre.
            raise BytesplatError(
                f"The dataparser's pose normalisation divided by zero ({error}): the cameras are probably all at one point.",
                hint="check the translations in the frames' transform_matrix (they must differ)",
            ) from error

    def create_train_dataset(self):
        # Right after the dataparser, before any image is read: whichever dataparser produced them.
        outputs = self.train_dataparser_outputs
        check_cameras(outputs.cameras, [p.name for p in outputs.image_filenames], split="train")
        return super().create_train_dataset()

    def _train_cameras_on_device(self) -> Cameras:
        # train_cameras can be replaced after construction (undistortion when the images are cached):
        # copy again whenever the object changes.
        if self._device_cameras_of is not self.train_cameras:
            cameras = self.train_cameras
            self._host_sizes = tuple(zip((int(w) for w in cameras.width.reshape(-1).tolist()),
                                         (int(h) for h in cameras.height.reshape(-1).tolist())))
            self._device_cameras = cameras.to(self.device)
            self._device_cameras_of = cameras
            self._world_to_camera = {}
        assert self._device_cameras is not None
        return self._device_cameras

    def _load_images(self, split, cache_images_device):
        with _cache_executor_threads(self.config.cache_threads()):
            return super()._load_images(split, cache_images_device)

    def next_train(self, step: int) -> Tuple[Cameras, Dict]:
        """As ``FullImageDatamanager.next_train`` (same order of images, same camera values), with
        the camera sliced from the device-resident copy."""
        image_idx = self.train_unseen_cameras.pop(0)
        if len(self.train_unseen_cameras) == 0:
            self.train_unseen_cameras = self.sample_train_cameras()
        data = self.cached_train[image_idx].copy()  # a copy: the cached dict must not change
        data["image"] = data["image"].to(self.device)
        assert len(self.train_cameras.shape) == 1, "Assumes single batch dimension"
        camera = self._train_cameras_on_device()[image_idx : image_idx + 1]
        camera.metadata = dict(camera.metadata or {})
        camera.metadata["cam_idx"] = image_idx
        camera.metadata[HOST_SIZE_KEY] = self._host_sizes[image_idx]
        # made once per image, by the same call the model would make every step (the same values)
        assert self._world_to_camera is not None  # made with the device cameras
        viewmat = self._world_to_camera.get(image_idx)
        if viewmat is None:
            viewmat = self._world_to_camera[image_idx] = viewmat_from_camera_to_world(camera.camera_to_worlds)
        camera.metadata[WORLD_TO_CAMERA_KEY] = viewmat
        return camera, data
