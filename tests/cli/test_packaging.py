"""The plugin installs as nerfstudio expects: entry points resolve, a normal wheel carries cuda/ and
the method configs, and ns-train lists the method."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.helpers.cli import cli_env, run_cli

ROOT = Path(__file__).resolve().parents[2]


def test_entry_points_resolve():
    from nerfstudio.plugins.registry import discover_methods
    from nerfstudio.plugins.registry_dataparser import discover_dataparsers

    methods, descriptions = discover_methods()
    assert "bytesplat" in methods
    assert methods["bytesplat"].pipeline.model.rasterizer == "auto"
    dataparsers, _ = discover_dataparsers()
    assert "bytesplat-scene" in dataparsers


def test_wheel_carries_cuda_sources_and_method_configs(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(ROOT)],
        check=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("bytesplat_ns-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    sources = sorted(p.name for p in (ROOT / "cuda").iterdir() if p.suffix in {".cu", ".cuh", ".cpp", ".h"})
    for name in sources:
        assert f"bytesplat_ns/cuda/{name}" in names
    assert "bytesplat_ns/method_configs/bytesplat.py" in names
    entry_points = zipfile.ZipFile(wheel).read(
        next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    ).decode()
    assert "bytesplat = bytesplat_ns.method_configs.bytesplat:bytesplat" in entry_points


@pytest.mark.slow
def test_ns_train_lists_bytesplat(tmp_path):
    result = run_cli(["ns-train", "--help"], cli_env(tmp_path), timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "bytesplat" in result.stdout
