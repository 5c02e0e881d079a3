"""bytesplat-ns: fast 3D Gaussian Splatting training as a nerfstudio method plugin."""

__version__ = "0.1.0"

from bytesplat_ns import compat as _compat  # noqa: E402,F401  (torch.load allow-list for nerfstudio checkpoints)
from bytesplat_ns.cli_errors import install_excepthook as _install_excepthook  # noqa: E402

_install_excepthook()
