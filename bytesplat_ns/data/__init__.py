"""Scenes, dataparsers and datamanagers."""

from bytesplat_ns.deferred_compile import defer_at_plugin_discovery
from bytesplat_ns.heap import freeze_at_plugin_discovery

# nerfstudio's dataparser discovery imports this package first, before splatfacto
freeze_at_plugin_discovery()  # heap.py
defer_at_plugin_discovery()  # deferred_compile.py
