"""bytesplat-ns: fast 3D Gaussian Splatting training as a nerfstudio method plugin."""

__version__ = "0.1.0"

from pathlib import Path as _Path

# In a source checkout, cuda/ and method_configs/ sit beside this package (the installed wheel maps
# them to bytesplat_ns.cuda and bytesplat_ns.method_configs). Let the same names resolve here too,
# so running from the repository root works whether the install is editable or not.
_checkout = _Path(__file__).resolve().parent.parent
if (_checkout / "method_configs" / "__init__.py").is_file() and not (_Path(__file__).parent / "method_configs").exists():
    __path__.append(str(_checkout))  # type: ignore[name-defined]  # noqa: F821

from bytesplat_ns import compat as _compat  # noqa: E402,F401  (torch.load allow-list for nerfstudio checkpoints)
from bytesplat_ns.cli_errors import install_excepthook as _install_excepthook  # noqa: E402

_install_excepthook()
