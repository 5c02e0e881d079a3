"""LPIPS on an offline machine (issue 21): no network wait, and the metric still works when cached."""

from __future__ import annotations

import time

import pytest
import torch
import torchmetrics.image.lpip as lpip_module
import torchvision
from torchvision.models._api import WeightsEnum

from bytesplat_ns import compat

UNROUTABLE = "https://10.255.255.1/models/alexnet-owt-7be5be79.pth"  # a blackhole: connects never answer


@pytest.fixture
def empty_hub(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "hub"))
    return tmp_path / "hub"


def test_can_reach_gives_up_within_its_timeout():
    start = time.perf_counter()
    assert not compat.can_reach(UNROUTABLE, timeout_s=0.3)
    assert time.perf_counter() - start < 1.0


def test_unreachable_download_costs_under_a_second(empty_hub, monkeypatch):
    real_weights = compat.lpips_weights
    monkeypatch.setattr(compat, "lpips_weights", lambda net="alex": (UNROUTABLE, real_weights(net)[1]))
    real_class = lpip_module.LearnedPerceptualImagePatchSimilarity
    start = time.perf_counter()
    with pytest.warns(UserWarning, match="unreachable and nothing is cached"):
        with compat.offline_safe_lpips() as status:
            metric = lpip_module.LearnedPerceptualImagePatchSimilarity(normalize=True)
    assert time.perf_counter() - start < 1.0
    assert not status.available and isinstance(metric, compat._LpipsPlaceholder)
    assert lpip_module.LearnedPerceptualImagePatchSimilarity is real_class  # restored on exit


def test_cached_weights_are_used_without_the_network(empty_hub, monkeypatch):
    url, cached = compat.lpips_weights("alex")
    assert cached == empty_hub / "checkpoints" / "alexnet-owt-7be5be79.pth" and url.endswith(cached.name)
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"stand-in")  # what counts is that the file is there: the loader below reads it
    loads = []

    def load_cached(self, *args, **kwargs):
        loads.append(self.url)
        return torchvision.models.alexnet(weights=None).state_dict()

    def no_network(*_args):
        raise AssertionError("the network was checked although the weights are cached")

    monkeypatch.setattr(WeightsEnum, "get_state_dict", load_cached)
    monkeypatch.setattr(compat, "can_reach", no_network)
    with compat.offline_safe_lpips() as status:
        metric = lpip_module.LearnedPerceptualImagePatchSimilarity(normalize=True)
    assert status.available and loads == [url]
    assert isinstance(metric, lpip_module.LearnedPerceptualImagePatchSimilarity)
    a = torch.rand(1, 3, 64, 64)
    assert float(metric(a, a)) == pytest.approx(0.0, abs=1e-6)
    assert float(metric(a, torch.rand(1, 3, 64, 64))) > 0.0


def test_torchmetrics_is_patched_when_imported_not_before(tmp_path):
    """A process that never builds torchmetrics' LPIPS does not import torchmetrics for the check; one
    that imports it later still gets the offline-safe class."""
    import subprocess
    import sys

    code = (
        "import sys, warnings\n"
        "from bytesplat_ns import compat\n"
        "compat.can_reach = lambda url, timeout_s: False\n"
        f"compat.lpips_weights = lambda net='alex': ('http://weights.invalid/a.pth', __import__('pathlib').Path({str(tmp_path)!r}) / 'a.pth')\n"
        "with compat.offline_safe_lpips() as status:\n"
        "    assert 'torchmetrics' not in sys.modules\n"
        "    from torchmetrics.image.lpip import LearnedPerceptualImagePatchSimilarity as L\n"
        "    with warnings.catch_warnings(record=True):\n"
        "        warnings.simplefilter('always')\n"
        "        metric = L(normalize=True)\n"
        "assert isinstance(metric, compat._LpipsPlaceholder) and not status.available\n"
        "import torchmetrics.image.lpip as m\n"
        "assert m.LearnedPerceptualImagePatchSimilarity.__name__ == 'LearnedPerceptualImagePatchSimilarity'\n"
        "assert not any(isinstance(f, compat._PatchAfterImport) for f in sys.meta_path)\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
