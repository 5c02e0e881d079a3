"""Scenes, dataparsers and datamanagers."""

from bytesplat_ns.heap import freeze_at_plugin_discovery

freeze_at_plugin_discovery()  # nerfstudio's dataparser discovery imports this package first (heap.py)
