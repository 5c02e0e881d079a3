"""The formats gsply (0.4.6) writes correctly: PlayCanvas' compressed PLY and Niantic's SPZ.

Both were checked to round-trip with distinct SH coefficients in their right order (the tests read the
compressed PLY back with plyfile and a decoder of the PlayCanvas layout, and SPZ with gsply's reader).
"""

from __future__ import annotations

from pathlib import Path

from bytesplat_ns.export.splats import Splats


def to_gsdata(splats: Splats):
    import gsply

    return gsply.GSData(
        means=splats.means, scales=splats.log_scales, quats=splats.quats, opacities=splats.logit_opacities,
        sh0=splats.sh0, shN=splats.sh_rest,
    )


def write_compressed_ply(path: Path, splats: Splats) -> None:
    """PlayCanvas/SuperSplat compressed PLY: 256-splat chunks with min/max bounds, 11-10-11 bit positions
    and scales, 2-10-10-10 smallest-three quaternions, 8-bit colour/opacity and 8-bit SH (range [-4, 4])."""
    import gsply

    # compress_to_bytes, not plywrite: plywrite renames a target that does not end in .compressed.ply
    Path(path).write_bytes(gsply.compress_to_bytes(to_gsdata(splats)))


def write_spz(path: Path, splats: Splats) -> None:
    """Niantic SPZ (gzip container, version 3): 24-bit fixed-point positions, 8-bit log-scales, colour,
    opacity and SH, smallest-three quaternions."""
    import gsply

    gsply.write_spz(str(path), to_gsdata(splats), version=3)
