"""nerfstudio method specifications for bytesplat and its variants."""

from bytesplat_ns.heap import freeze_at_plugin_discovery

freeze_at_plugin_discovery()  # nerfstudio's method discovery imports this package first (heap.py)
