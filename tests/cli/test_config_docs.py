"""docs/configuration.md lists every switch bytesplat adds to nerfstudio's configs, with the default
the code has, and no flag that does not exist."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from nerfstudio.data.datamanagers.full_images_datamanager import FullImageDatamanagerConfig
from nerfstudio.data.dataparsers.nerfstudio_dataparser import NerfstudioDataParserConfig
from nerfstudio.engine.trainer import TrainerConfig
from nerfstudio.models.splatfacto import SplatfactoModelConfig
from nerfstudio.pipelines.base_pipeline import VanillaPipelineConfig

from bytesplat_ns.data.datamanager import BytesplatDatamanagerConfig
from bytesplat_ns.data.dataparser import BytesplatSceneDataParserConfig
from bytesplat_ns.data.lazy_images import LazyImageDatamanagerConfig
from bytesplat_ns.distributed.pipeline import ShardedPipelineConfig
from bytesplat_ns.model import ByteSplatModelConfig
from bytesplat_ns.raster.options import FusedRasterConfig
from bytesplat_ns.trainer import ByteSplatTrainerConfig

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"

# (config class, the nerfstudio class it extends or None for all its fields, the flag's prefix)
CONFIGS = [
    (FusedRasterConfig, None, "--pipeline.model.fused."),
    (ByteSplatModelConfig, SplatfactoModelConfig, "--pipeline.model."),
    (ByteSplatTrainerConfig, TrainerConfig, "--"),
    (BytesplatDatamanagerConfig, FullImageDatamanagerConfig, "--pipeline.datamanager."),
    (LazyImageDatamanagerConfig, BytesplatDatamanagerConfig, "--pipeline.datamanager."),
    (BytesplatSceneDataParserConfig, NerfstudioDataParserConfig, "bytesplat-scene --"),
    (ShardedPipelineConfig, VanillaPipelineConfig, "--pipeline."),
]


def _added_fields(cls, base):
    """Fields ``cls`` adds to ``base`` (or all of them), except nested configs with their own flags."""
    inherited = set() if base is None else {f.name for f in dataclasses.fields(base)}
    return [f for f in dataclasses.fields(cls)
            if f.init and f.name not in inherited and not f.name.startswith("_") and f.name != "fused"]


def _default(field):
    if field.default is not dataclasses.MISSING:
        return field.default
    return field.default_factory()


def _rows():
    """(flags named in the first cell, the backticked values of the second cell) per table row."""
    rows = []
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`"):
            continue
        flags = [re.sub(r"\s+\(.*", "", f) for f in re.findall(r"`([^`]+)`", cells[0])]
        rows.append((flags, re.findall(r"`([^`]+)`", cells[1])))
    return rows


def _matches(value, written: str) -> bool:
    if isinstance(value, bool) or value is None or isinstance(value, (str, tuple)):
        return written == str(value)
    if re.fullmatch(r"-?[0-9.]+(?:e-?[0-9]+)?(?:/[0-9.]+)?", written):
        number = written.split("/")
        shown = float(number[0]) / (float(number[1]) if len(number) == 2 else 1.0)
        return abs(shown - float(value)) <= 1e-12 * max(1.0, abs(float(value)))
    return False


@pytest.mark.parametrize("cls, base, prefix", CONFIGS, ids=[c[0].__name__ for c in CONFIGS])
def test_every_added_switch_is_listed_with_its_default(cls, base, prefix):
    rows = _rows()
    for field in _added_fields(cls, base):
        flag = prefix + field.name.replace("_", "-")
        found = [values for flags, values in rows if flag in flags]
        assert found, f"{flag} ({cls.__name__}.{field.name}) is not in docs/configuration.md"
        default = _default(field)
        assert any(_matches(default, v) for v in found[0]), (
            f"{flag}: docs/configuration.md gives {found[0]}, the code's default is {default!r}")


def test_no_listed_switch_is_stale():
    known = {prefix + f.name.replace("_", "-") for cls, base, prefix in CONFIGS for f in _added_fields(cls, base)}
    known.add("--optimizers.<group>.optimizer.implementation")
    listed = {flag for flags, _ in _rows() for flag in flags if flag.startswith(("--", "bytesplat-scene --"))}
    assert listed - known == set(), "docs/configuration.md lists flags the configs do not have"
