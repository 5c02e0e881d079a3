"""Cheap ``inspect.stack()`` under ``ns-train``: the module of an import-machinery frame, known up front.

nerfstudio 1.1.5's method table (``nerfstudio.configs.method_configs``, imported by ``ns-train``
before it parses an argument) lists 26 external methods, and each listing calls ``inspect.stack()``
to tell a listing from a user's choice. ``inspect.stack()`` looks up the module of every frame on
the stack, and ``ns-train`` is several imports deep at that point, so about half the frames belong
to Python's import machinery, whose code lives in frozen modules (file names such as
``<frozen importlib._bootstrap>``). No module's ``__file__`` matches such a name, so each lookup
walks all of ``sys.modules`` (4,500 modules by then) and gives up: measured on CPU, 2.5-2.9 s of
``ns-train``'s start-up; with these names mapped, 0.6-0.7 s.

The plugin is imported (through nerfstudio's entry points) before the method table lists its
external methods, so :func:`map_frozen_import_frames` fills ``inspect``'s file-to-module map for the
import machinery's frozen modules first: the lookup finds the module those frames really belong to,
without the walk. It only adds entries that are true (a frozen module's code name to that module).
"""

from __future__ import annotations

import inspect
import os
import sys

IMPORT_MACHINERY = ("importlib._bootstrap", "importlib._bootstrap_external")


def frozen_file_name(module_name: str) -> str:
    """The file name Python gives the code of a frozen module."""
    return f"<frozen {module_name}>"


def map_frozen_import_frames() -> None:
    """Let ``inspect.getmodule`` find the import machinery's frames by name: both the bare file name
    (checked first) and its absolute form relative to the current directory (checked after it)."""
    for name in IMPORT_MACHINERY:
        if name not in sys.modules:
            continue
        file_name = frozen_file_name(name)
        for key in (file_name, os.path.normcase(os.path.abspath(file_name))):
            inspect.modulesbyfile.setdefault(key, name)
