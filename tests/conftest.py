"""Shared fixtures and the GPU skips of the whole test tree.

``@pytest.mark.gpu`` (or a module's ``pytestmark = pytest.mark.gpu``) marks a test that needs CUDA;
``@pytest.mark.gpu(count=2)`` one that needs two devices. Collection skips them, with the reason,
on a machine that has fewer, so no test module decides this on its own.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tests.helpers.browser import CHROMIUM, Chromium


def cuda_devices() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def pytest_collection_modifyitems(config, items):
    available = cuda_devices()
    for item in items:
        needed = max((marker.kwargs.get("count", 1) for marker in item.iter_markers("gpu")), default=0)
        if needed > available:
            found = f"{available} CUDA GPU{'s' if available != 1 else ''} here"
            item.add_marker(pytest.mark.skip(reason=f"needs {needed} CUDA GPU{'s' if needed > 1 else ''}, {found}"))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, request) -> Path:
    """One temporary folder per test module, for the runs its module-scoped fixtures share."""
    return tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1])


@pytest.fixture
def browser(tmp_path, request):
    """Headless Chromium with a window of the test module's ``WINDOW`` (width, height) in pixels."""
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is not installed (install.sh installs it)")
    with Chromium(tmp_path / "chromium-profile", *request.module.WINDOW) as b:
        yield b
