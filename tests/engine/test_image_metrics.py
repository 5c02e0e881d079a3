"""Eval metrics without torchmetrics (image_metrics.py) and the model set up without torchmetrics or
sklearn: the same numbers as torchmetrics' metrics, the same initial Gaussians and strategy as
splatfacto's populate_modules, and neither package imported by start-up."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest
import torch

from bytesplat_ns import compat
from bytesplat_ns.image_metrics import Lpips, psnr

UNROUTABLE = "https://10.255.255.1/models/alexnet-owt-7be5be79.pth"  # connects never answer


@pytest.fixture
def empty_hub(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "hub"))
    return tmp_path / "hub"


def torchmetrics_lpips_with_random_backbone():
    """torchmetrics' LPIPS network (its shipped linear weights, a random AlexNet), and that AlexNet's
    weights under torchvision's ``features.<index>`` names, as torch's hub cache holds them."""
    from torchmetrics.functional.image.lpips import _LPIPS

    torch.manual_seed(3)
    reference = _LPIPS(pretrained=True, net="alex", pnet_rand=True).eval()
    backbone = {}
    for key, value in reference.net.state_dict().items():
        index, kind = re.fullmatch(r"slice\d\.(\d+)\.(weight|bias)", key).groups()
        backbone[f"features.{index}.{kind}"] = value.clone()
    assert len(backbone) == 10  # five convolutions
    return reference, backbone


def test_psnr_matches_torchmetrics():
    from torchmetrics.image import PeakSignalNoiseRatio

    a, b = torch.rand(1, 3, 40, 56), torch.rand(1, 3, 40, 56)
    b = (a + 0.05 * (b - 0.5)).clamp(0, 1)
    assert float(psnr(a, b)) == pytest.approx(float(PeakSignalNoiseRatio(data_range=1.0)(a, b)), rel=1e-6)


def test_lpips_matches_torchmetrics_from_the_hub_cache(empty_hub, monkeypatch):
    reference, backbone = torchmetrics_lpips_with_random_backbone()
    url, cached = compat.lpips_weights("alex")
    cached.parent.mkdir(parents=True)
    torch.save({**backbone, "classifier.1.weight": torch.zeros(4, 9216)}, cached)  # a checkpoint has more than features

    def no_network(*_args):
        raise AssertionError("the network was checked although the weights are cached")

    monkeypatch.setattr(compat, "can_reach", no_network)
    metric = Lpips()
    torch.manual_seed(4)
    a = torch.rand(2, 3, 70, 90)
    b = (a + 0.2 * torch.randn_like(a)).clamp(0, 1)
    with torch.no_grad():
        expected = reference(a, b, normalize=True).mean()
    got = metric(a, b)
    assert metric.available
    assert float(got) == pytest.approx(float(expected), rel=1e-5)
    assert float(metric(a, a)) == pytest.approx(0.0, abs=1e-7)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        metric(a * 2, b)


def test_unreachable_lpips_costs_under_a_second_and_is_skipped(empty_hub, monkeypatch):
    real_weights = compat.lpips_weights
    monkeypatch.setattr(compat, "lpips_weights", lambda net="alex": (UNROUTABLE, real_weights(net)[1]))
    metric = Lpips(connect_timeout_s=0.3)
    a = torch.rand(1, 3, 32, 32)
    start = time.perf_counter()
    with pytest.warns(UserWarning, match="unreachable and nothing is cached"):
        assert float(metric(a, a)) == 0.0
    assert time.perf_counter() - start < 1.0
    assert not metric.available
    with warnings_as_errors():  # once only: later calls neither wait nor warn
        assert float(metric(a, a)) == 0.0


class warnings_as_errors:
    def __enter__(self):
        import warnings

        self._catch = warnings.catch_warnings()
        self._catch.__enter__()
        warnings.simplefilter("error")

    def __exit__(self, *exc):
        return self._catch.__exit__(*exc)


def test_model_reports_no_lpips_when_unavailable(empty_hub, monkeypatch):
    from tests.helpers.model_steps import make_camera, make_model

    real_weights = compat.lpips_weights
    monkeypatch.setattr(compat, "lpips_weights", lambda net="alex": (UNROUTABLE, real_weights(net)[1]))
    model = make_model("reference", (torch.rand(64, 3) - 0.5, torch.randint(0, 255, (64, 3))))
    model.lpips.connect_timeout_s = 0.3
    model.eval()
    camera = make_camera(W=32, H=24)
    with torch.no_grad(), pytest.warns(UserWarning, match="LPIPS is unavailable"):
        outputs = model.get_outputs(camera)
        metrics, _images = model.get_image_metrics_and_images(outputs, {"image": torch.rand(24, 32, 3)})
    assert "lpips" not in metrics and {"psnr", "ssim"} <= set(metrics)


def test_random_start_is_splatfactos(monkeypatch):
    """The same Gaussians (random draws in splatfacto's order, its 3-neighbour scales) and the same
    densification settings as splatfacto's own populate_modules, from the same seed."""
    from nerfstudio.data.scene_box import SceneBox
    from nerfstudio.models.splatfacto import SplatfactoModelConfig

    from bytesplat_ns.model import ByteSplatModelConfig

    settings = dict(num_random=500, random_init=True)
    box = SceneBox(aabb=torch.tensor([[-1.0, -1, -1], [1, 1, 1]]))
    torch.manual_seed(11)
    ours = ByteSplatModelConfig(**settings).setup(scene_box=box, num_train_data=3, metadata={})
    torch.manual_seed(11)
    with compat.offline_safe_lpips(connect_timeout_s=0.1):  # splatfacto builds LPIPS: no network here
        theirs = SplatfactoModelConfig(**settings).setup(scene_box=box, num_train_data=3, metadata={})
    for name, value in theirs.gauss_params.items():
        torch.testing.assert_close(ours.gauss_params[name], value, rtol=1e-6, atol=1e-6, msg=name)
    for field_name in vars(theirs.strategy):
        assert getattr(ours.strategy, field_name) == getattr(theirs.strategy, field_name), field_name
    assert torch.equal(ours.background_color, theirs.background_color)
    assert type(ours.camera_optimizer) is type(theirs.camera_optimizer)
    assert not any(key.startswith(("psnr", "ssim", "lpips")) for key in ours.state_dict())


def test_model_start_up_imports_neither_torchmetrics_nor_sklearn():
    code = (
        "import sys, torch\n"
        "from tests.helpers.model_steps import make_model\n"
        "make_model('reference', (torch.rand(32, 3) - 0.5, torch.randint(0, 255, (32, 3))))\n"
        "print(sorted(m for m in ('torchmetrics', 'sklearn', 'transformers') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_checkpoints_with_torchmetrics_modules_still_load():
    from tests.helpers.model_steps import make_model

    model = make_model("reference", (torch.rand(16, 3) - 0.5, torch.randint(0, 255, (16, 3))))
    state = dict(model.state_dict())
    state["lpips.net.lin0.model.1.weight"] = torch.zeros(1, 64, 1, 1)  # what earlier checkpoints carried
    model.load_state_dict(state, strict=True)


def test_a_model_with_its_metrics_deep_copies_and_pickles():
    """The sharded pipeline deep-copies the model; the LPIPS holder's lock and weights do not travel."""
    import copy
    import pickle

    from tests.helpers.model_steps import make_model

    model = make_model("reference", (torch.rand(16, 3) - 0.5, torch.randint(0, 255, (16, 3))))
    for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model.lpips))):
        lpips = clone.lpips if hasattr(clone, "lpips") else clone
        assert lpips.available and lpips._weights is None and lpips._lock is not model.lpips._lock
        with lpips._lock:
            pass
