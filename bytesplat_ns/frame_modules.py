"""Cheap ``inspect.stack()`` under ``ns-train``: the module of an import-machinery frame, known up front.

nerfstudio 1.1.5's method table (``nerfstudio.configs.method_configs``, imported by ``ns-train``
before it parses an argument) lists 26 external methods, and each listing calls ``inspect.stack()``
to tell a listing from a user's choice. ``inspect.stack()`` looks up the module of every frame on
the stack, and ``ns-train`` is several imports deep at that point, so about half the frames belong
to Python's import machinery, whose code lives in frozen modules (file names such as
``<frozen importlib._bootstrap>``). No module's ``__file__`` matches such a name, so each lookup
walks all of ``sys.modules`` (4,500 modules by then) and gives up: measured on CPU, 2.5-2.9 s of
``ns-train``'s start-up; with these names mapped, 0.6-0.7 s.

Each listing is also a dataclass constructed inside dataclasses' generated ``__init__`` methods,
code compiled from a string (file name ``<string>``) that belongs to no module: three more walks
per listing, about 0.45 s of the start-up on CPU after the import machinery's frames are mapped.

The plugin is imported (through nerfstudio's entry points) before the method table lists its
external methods, so :func:`map_frozen_import_frames` fills ``inspect``'s file-to-module map for the
import machinery's frozen modules first: the lookup finds the module those frames really belong to,
without the walk. It only adds entries that are true: a frozen module's code name to that module,
and ``<string>`` to a module name no module can have (``sys.modules`` never holds it), so that the
lookup answers None at once, as the walk does.
"""

from __future__ import annotations

import inspect
import os
import sys

IMPORT_MACHINERY = ("importlib._bootstrap", "importlib._bootstrap_external")
STRING_CODE = "<string>"  # the file name of code compiled from a string (exec, dataclasses' methods)


def frozen_file_name(module_name: str) -> str:
    """The file name Python gives the code of a frozen module."""
    return f"<frozen {module_name}>"


def map_frozen_import_frames() -> None:
    """Let ``inspect.getmodule`` find the import machinery's frames by name, and string-compiled code's
    frames belong to none without a walk: both the bare file name (checked first) and its absolute
    form relative to the current directory (checked after it)."""
    entries = [(frozen_file_name(name), name) for name in IMPORT_MACHINERY if name in sys.modules]
    # no module is named "<string>": getmodule's sys.modules.get gives None, the walk's own answer
    entries.append((STRING_CODE, STRING_CODE))
    for file_name, name in entries:
        for key in (file_name, os.path.normcase(os.path.abspath(file_name))):
            inspect.modulesbyfile.setdefault(key, name)
