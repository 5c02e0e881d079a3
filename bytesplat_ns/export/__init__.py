"""Export a trained run's Gaussians to the files splat viewers open (``bytesplat-export``).

One module per concern: :mod:`.splats` (the Gaussians as arrays, read from a run), :mod:`.sh_rotation`
(rotating SH coefficients), :mod:`.frames` (which coordinate frame they are written in), one module per
file format, and :mod:`.cli`.
"""
