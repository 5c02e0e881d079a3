"""``bytesplat-export``: a trained run's Gaussians to a splat file, in a chosen format, frame and SH degree.

    bytesplat-export --load-config outputs/scene/bytesplat/RUN/config.yml --output scene.spz --frame data
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional

import tyro

from bytesplat_ns.errors import BytesplatError
from bytesplat_ns.export.frames import Frame, frame_transform, transform_splats
from bytesplat_ns.export.splats import Splats, load_pipeline, run_dir_of, splats_from_model

Format = Literal["ply", "compressed-ply", "spz", "splat", "sog"]
# Longest suffix first: ".compressed.ply" is compressed PLY, any other ".ply" the 3DGS one.
SUFFIXES = ((".compressed.ply", "compressed-ply"), (".ply", "ply"), (".spz", "spz"), (".splat", "splat"),
            (".sog", "sog"))


@dataclass
class ExportConfig:
    load_config: Path
    """config.yml of a finished ns-train run (any bytesplat or splatfacto method, trained on any number of ranks)."""
    output: Path
    """File to write. Its suffix picks the format unless --format is given: .ply, .compressed.ply, .spz,
    .splat, .sog."""
    format: Optional[Format] = None
    """ply: 3DGS float PLY; compressed-ply: PlayCanvas/SuperSplat compressed PLY; spz: Niantic SPZ;
    splat: antimatter15 .splat (base colour only); sog: PlayCanvas SOG bundle."""
    frame: Frame = "nerfstudio"
    """nerfstudio: the training frame (z-up, centred, rescaled); data: the capture's own coordinates
    (dataparser transform and scale undone); y-up: the nerfstudio frame with +z turned to +y."""
    sh_degree: Optional[int] = None
    """SH degree to keep (0..the model's); default: all of it."""


def output_format(config: ExportConfig) -> str:
    if config.format is not None:
        return config.format
    name = config.output.name.lower()
    for suffix, fmt in SUFFIXES:
        if name.endswith(suffix):
            return fmt
    raise BytesplatError(
        f"cannot tell the format of {config.output} from its suffix",
        hint="name it .ply, .compressed.ply, .spz, .splat or .sog, or pass --format",
    )


def write(path: Path, splats: Splats, fmt: str, vertical_axis: Optional[str]) -> None:
    from bytesplat_ns.export import antimatter_splat, gsply_formats, ply, sog

    if fmt == "ply":
        ply.write_ply(path, splats, vertical_axis)
    elif fmt == "compressed-ply":
        gsply_formats.write_compressed_ply(path, splats)
    elif fmt == "spz":
        gsply_formats.write_spz(path, splats)
    elif fmt == "splat":
        antimatter_splat.write_splat(path, splats)
    elif fmt == "sog":
        sog.write_sog(path, splats)
    else:
        raise BytesplatError(f"unknown format {fmt!r}")


def export(config: ExportConfig) -> Path:
    """Write the export; returns its path."""
    fmt = output_format(config)
    to_frame = frame_transform(config.frame, run_dir_of(config.load_config))  # bad input fails before loading
    splats = splats_from_model(load_pipeline(config.load_config).model)
    if config.sh_degree is not None:
        splats = splats.with_sh_degree(config.sh_degree)
    splats, dropped = splats.drop_invisible()
    if len(splats) == 0:
        raise BytesplatError(f"{config.load_config}: no Gaussian is visible (finite and above alpha 1/255)")
    splats = transform_splats(splats, to_frame)
    config.output.parent.mkdir(parents=True, exist_ok=True)
    # write next to the target, then rename: an interrupted export never leaves a truncated file behind
    partial = config.output.with_name(config.output.name + ".partial")
    # the PLY header names the up axis where the frame has one (the capture's own frame may have any)
    vertical_axis = {"nerfstudio": "z", "y-up": "y"}.get(config.frame)
    try:
        write(partial, splats, fmt, vertical_axis)
        partial.replace(config.output)
    finally:
        partial.unlink(missing_ok=True)
    print(f"bytesplat-export: {len(splats)} Gaussians (SH degree {splats.sh_degree}, {dropped} invisible dropped) "
          f"-> {config.output} ({fmt}, {config.frame} frame)")
    return config.output


def entrypoint() -> None:
    from bytesplat_ns.cli_errors import install_excepthook

    install_excepthook()
    export(tyro.cli(ExportConfig, prog="bytesplat-export"))


if __name__ == "__main__":
    entrypoint()
