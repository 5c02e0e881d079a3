"""bytesplat-ns: fast 3D Gaussian Splatting training as a nerfstudio method plugin."""

__version__ = "0.1.0"
