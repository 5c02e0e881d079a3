"""The training step's pieces that replace nerfstudio/gsplat code to avoid host-device waits give
exactly the replaced code's results: the statistics update (strategy.py), the device-resident
training cameras with host-side sizes (data/datamanager.py) and the model's intrinsics and image
size at any downscale (model._intrinsics_and_size), and the world-to-camera matrix."""

from __future__ import annotations

import copy

import pytest
import torch
from gsplat.strategy import DefaultStrategy
from nerfstudio.cameras.cameras import Cameras, CameraType
from nerfstudio.data.datamanagers.full_images_datamanager import FullImageDatamanager

from bytesplat_ns.data.datamanager import (
    HOST_SIZE_KEY,
    BytesplatDatamanagerConfig,
    host_image_size,
    viewmat_from_camera_to_world,
    world_to_camera,
)
from bytesplat_ns.data.scene import SceneSpec, generate_scene
from bytesplat_ns.strategy import SyncFreeDefaultStrategy

SPEC = SceneSpec(num_views=10, width=37, height=29, num_points=200)


def _info(C: int, N: int, seed: int, absgrad: bool):
    g = torch.Generator().manual_seed(seed)
    radii = torch.randint(0, 4, (C, N), generator=g, dtype=torch.int32) * (torch.rand(C, N, generator=g) < 0.6)
    means2d = torch.zeros(C, N, 2, requires_grad=True)
    grad = torch.randn(C, N, 2, generator=g) * (radii > 0)[..., None]
    means2d.grad = grad
    if absgrad:
        means2d.absgrad = grad.abs() * 1.5
    return {"width": 37, "height": 29, "n_cameras": C, "radii": radii, "gaussian_ids": None, "means2d": means2d}


@pytest.mark.parametrize("absgrad", [False, True])
def test_statistics_update_is_gsplats_bit_for_bit_with_one_camera(absgrad):
    N = 500
    params = {"means": torch.zeros(N, 3)}
    ref = DefaultStrategy(absgrad=absgrad, refine_scale2d_stop_iter=4000, verbose=False)
    ours = SyncFreeDefaultStrategy.like(ref)
    assert isinstance(ours, DefaultStrategy) and ours.absgrad == absgrad and ours.refine_scale2d_stop_iter == 4000
    s_ref, s_ours = ref.initialize_state(), ours.initialize_state()
    for step in range(4):  # the running sums over several steps, from the lazily created state on
        info = _info(1, N, seed=step, absgrad=absgrad)
        ref._update_state(params, s_ref, info)
        ours._update_state(params, s_ours, info)
    for key in ("grad2d", "count", "radii"):
        assert torch.equal(s_ours[key], s_ref[key]), key
    assert int((s_ref["count"] > 0).sum()) > 0 and int((s_ref["count"] == 0).sum()) > 0  # both kinds present


def test_statistics_update_with_several_cameras_sums_and_takes_the_exact_maximum():
    N = 300
    params = {"means": torch.zeros(N, 3)}
    ref = DefaultStrategy(refine_scale2d_stop_iter=4000, verbose=False)
    ours = SyncFreeDefaultStrategy.like(ref)
    s_ref, s_ours = ref.initialize_state(), ours.initialize_state()
    info = _info(3, N, seed=9, absgrad=False)
    ref._update_state(params, s_ref, info)
    ours._update_state(params, s_ours, info)
    assert torch.allclose(s_ours["grad2d"], s_ref["grad2d"], rtol=1e-6, atol=0) and torch.equal(s_ours["count"], s_ref["count"])
    want = (info["radii"] / 37.0).amax(0)  # the maximum over the cameras (gsplat's scatter keeps the last write)
    assert torch.equal(s_ours["radii"], want)


def test_packed_records_use_gsplats_update():
    ours = SyncFreeDefaultStrategy(verbose=False)
    state = ours.initialize_state()
    means2d = torch.zeros(4, 2, requires_grad=True)
    means2d.grad = torch.ones(4, 2)
    info = {"width": 10, "height": 10, "n_cameras": 1, "radii": torch.ones(4, dtype=torch.int32),
            "gaussian_ids": torch.tensor([0, 2, 2, 5]), "means2d": means2d}
    ours._update_state({"means": torch.zeros(6, 3)}, state, info, packed=True)
    assert state["count"].tolist() == [1, 0, 2, 0, 0, 1]


@pytest.fixture(scope="module")
def scene(tmp_path_factory):
    return generate_scene(SPEC, tmp_path_factory.mktemp("sync") / "scene", progress=False)


def _datamanager(scene, cls=None):
    from bytesplat_ns.data.dataparser import BytesplatSceneDataParserConfig

    config = BytesplatDatamanagerConfig(dataparser=BytesplatSceneDataParserConfig(data=scene), cache_images_type="uint8")
    config.data = scene
    if cls is not None:
        config = copy.copy(config)
        config._target = cls
    return config.setup(device="cpu", test_mode="val", world_size=1, local_rank=0)


def test_training_cameras_equal_nerfstudios_and_carry_their_size(scene):
    ours = _datamanager(scene)
    theirs = _datamanager(scene, FullImageDatamanager)
    assert type(theirs) is FullImageDatamanager
    theirs.train_unseen_cameras = list(ours.train_unseen_cameras)  # the same (seeded) order
    seen = {}
    for step in range(len(ours.train_unseen_cameras) + 2):  # across the re-shuffle at the end of an epoch
        cam, data = ours.next_train(step)
        ref_cam, ref_data = theirs.next_train(step)
        theirs.train_unseen_cameras = list(ours.train_unseen_cameras)
        assert cam.metadata["cam_idx"] == ref_cam.metadata["cam_idx"]
        assert torch.equal(data["image"], ref_data["image"])
        for name in ("camera_to_worlds", "fx", "fy", "cx", "cy", "width", "height", "camera_type"):
            assert torch.equal(getattr(cam, name), getattr(ref_cam, name)), name
        assert host_image_size(cam) == (int(ref_cam.width), int(ref_cam.height)) == (SPEC.width, SPEC.height)
        # the world-to-camera matrix: what the model computed from the camera every step, made once per image
        viewmat = world_to_camera(cam)
        assert torch.equal(viewmat, viewmat_from_camera_to_world(ref_cam.camera_to_worlds))
        assert viewmat is seen.setdefault(cam.metadata["cam_idx"], viewmat)
    assert len(seen) == len(ours.train_dataset)  # one matrix per training image, each made once
    assert host_image_size(ours.train_cameras[0:1]) is None  # the dataset's cameras are left as they are
    assert world_to_camera(ours.train_cameras[0:1]) is None


@pytest.mark.parametrize("scale_factor", [1, 2, 3, 4.0])
def test_model_intrinsics_and_size_match_rescale_output_resolution(scale_factor):
    from bytesplat_ns.model import ByteSplatModel

    camera = Cameras(camera_to_worlds=torch.eye(4)[None, :3], fx=301.7, fy=299.3, cx=188.9, cy=143.2,
                     width=377, height=287, camera_type=CameraType.PERSPECTIVE)
    model = ByteSplatModel.__new__(ByteSplatModel)  # only _intrinsics_and_size and the model's device are used
    torch.nn.Module.__init__(model)
    model.device_indicator_param = torch.nn.Parameter(torch.empty(0))
    plain = model._intrinsics_and_size(copy.deepcopy(camera), scale_factor)
    tagged = copy.deepcopy(camera)
    tagged.metadata = {HOST_SIZE_KEY: (377, 287)}
    fast = model._intrinsics_and_size(tagged, scale_factor)
    assert plain[1:] == fast[1:] and torch.equal(plain[0], fast[0]), (plain, fast)
    ref = copy.deepcopy(camera)
    ref.rescale_output_resolution(1 / scale_factor)
    assert torch.equal(fast[0], ref.get_intrinsics_matrices()) and fast[1:] == (int(ref.width), int(ref.height))


def test_viewmat_equals_the_flip_by_multiplication():
    from bytesplat_ns.data.datamanager import viewmat_from_camera_to_world

    c2w = torch.randn(3, 3, 4)
    rotation = c2w[:, :3, :3] * torch.tensor([1.0, -1.0, -1.0])
    want = torch.eye(4).repeat(3, 1, 1)
    want[:, :3, :3] = rotation.transpose(1, 2)
    want[:, :3, 3:4] = -rotation.transpose(1, 2) @ c2w[:, :3, 3:4]
    assert torch.equal(viewmat_from_camera_to_world(c2w), want)


def test_rigid_camera_centers_equal_the_inverse():
    from bytesplat_ns.data.datamanager import viewmat_from_camera_to_world
    from bytesplat_ns.raster.projection import camera_centers, rigid_camera_centers

    q, _ = torch.linalg.qr(torch.randn(4, 3, 3, dtype=torch.float64))
    c2w = torch.cat([q, 5 * torch.randn(4, 3, 1, dtype=torch.float64)], dim=2)
    viewmats = viewmat_from_camera_to_world(c2w)
    torch.testing.assert_close(rigid_camera_centers(viewmats), camera_centers(viewmats), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(rigid_camera_centers(viewmats), c2w[:, :, 3], rtol=1e-12, atol=1e-12)


def test_training_psnr_equals_torchmetrics():
    from torchmetrics.image import PeakSignalNoiseRatio

    from bytesplat_ns.model import training_psnr

    a, b = torch.rand(31, 17, 3), torch.rand(31, 17, 3)
    torch.testing.assert_close(training_psnr(a, b), PeakSignalNoiseRatio(data_range=1.0)(a, b))


def test_training_metrics_are_splatfactos():
    """The model's training metrics (PSNR computed on the device) have splatfacto's keys and values."""
    from nerfstudio.data.scene_box import SceneBox
    from nerfstudio.models.splatfacto import SplatfactoModel

    from bytesplat_ns.model import ByteSplatModel, ByteSplatModelConfig

    model = ByteSplatModelConfig(rasterizer="reference", num_random=300, num_downscales=0).setup(
        scene_box=SceneBox(torch.tensor([[-1.0] * 3, [1.0] * 3])), num_train_data=4, metadata={})
    assert isinstance(model, ByteSplatModel)
    model.train()
    outputs = {"rgb": torch.rand(20, 30, 3), "background": torch.rand(3)}
    batch = {"image": torch.rand(20, 30, 3)}
    ours = model.get_metrics_dict(outputs, batch)
    theirs = SplatfactoModel.get_metrics_dict(model, outputs, batch)
    assert ours.keys() == theirs.keys()
    for key in ours:
        torch.testing.assert_close(torch.as_tensor(ours[key]).float(), torch.as_tensor(theirs[key]).float())
