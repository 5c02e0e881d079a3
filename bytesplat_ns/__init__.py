"""bytesplat-ns: fast 3D Gaussian Splatting training as a nerfstudio method plugin."""

__version__ = "0.1.0"

import importlib.abc as _abc
import importlib.util as _util
import sys as _sys
from pathlib import Path as _Path


class _CheckoutFolders(_abc.MetaPathFinder):
    """In a source checkout, cuda/ and method_configs/ sit beside this package (an installed wheel
    maps them to bytesplat_ns.cuda and bytesplat_ns.method_configs). This finder, consulted after
    every other, resolves those two names to the checkout's folders, so running from the repository
    root works whether the install is editable or not; no other folder of the checkout becomes a
    subpackage."""

    def __init__(self, checkout: _Path):
        self.folders = {f"{__name__}.{name}": checkout / name for name in ("cuda", "method_configs")}

    def find_spec(self, fullname, path=None, target=None):
        folder = self.folders.get(fullname)
        if folder is None or not (folder / "__init__.py").is_file():
            return None
        return _util.spec_from_file_location(fullname, folder / "__init__.py", submodule_search_locations=[str(folder)])


_sys.meta_path.append(_CheckoutFolders(_Path(__file__).resolve().parent.parent))

from bytesplat_ns import compat as _compat  # noqa: E402,F401  (torch.load allow-list for nerfstudio checkpoints)
from bytesplat_ns.cli_errors import install_excepthook as _install_excepthook  # noqa: E402
from bytesplat_ns.frame_modules import map_frozen_import_frames as _map_frozen_import_frames  # noqa: E402

_install_excepthook()
_map_frozen_import_frames()  # before ns-train's method table lists its external methods
