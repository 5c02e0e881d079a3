"""Turn a BytesplatError that reaches the top of any nerfstudio CLI into one clear line.

Installed when the plugin is imported (ns-train lists methods through our entry point; ns-eval,
ns-export and ns-viewer import us while reading a bytesplat config), so every CLI gets it.
Other exceptions keep Python's usual traceback.
"""

from __future__ import annotations

import sys
import threading

_installed = False


def install_excepthook() -> None:
    global _installed
    if _installed:
        return
    _installed = True
    previous_hook = sys.excepthook

    def hook(exc_type, exc, tb):
        from bytesplat_ns.errors import BytesplatError

        if issubclass(exc_type, BytesplatError):
            sys.stderr.write(f"\nbytesplat: error: {exc}\n")
            sys.stderr.flush()
            return
        previous_hook(exc_type, exc, tb)

    sys.excepthook = hook

    previous_thread_hook = threading.excepthook

    def thread_hook(args):
        from bytesplat_ns.errors import BytesplatError

        if args.exc_type is not None and issubclass(args.exc_type, BytesplatError):
            sys.stderr.write(f"\nbytesplat: error: {args.exc_value}\n")
            return
        previous_thread_hook(args)

    threading.excepthook = thread_hook
