"""The Python heap of a training process: its start-up without garbage collections, its exit
without a walk over the whole heap.

Importing torch, torchvision and nerfstudio creates millions of long-lived objects (modules,
functions, classes). While they are created, the garbage collector runs again and again over all
of them (about a fifth of the import time measured on CPU), and at exit the interpreter's teardown
collects over them once more (2-3 s for a process holding torch and nerfstudio, on CPU and GPU
machines alike). ``gc.freeze`` moves every object alive into a generation the collector never scans:

- :func:`pause_collections` / :func:`freeze_start_up` bracket a launcher's start-up (imports,
  parsing, trainer setup): no collections during it, then its objects are frozen, so training's
  full collections no longer scan them either. Garbage cycles made during start-up are kept: a
  one-time cost of a few megabytes at most.
- :func:`freeze_at_plugin_discovery`: under nerfstudio's tools (``ns-train``, ``ns-eval``, ...) our
  code first runs when nerfstudio's method table discovers its plugins: the dataparsers (after torch
  and half of nerfstudio are imported), then the methods (after every built-in one). The heap is
  frozen at both, so the rest of start-up no longer runs full collections over the imports before
  them. Only while a method table is being built, so that importing the package elsewhere (a
  notebook, a test) never freezes its importer's heap.
- :func:`freeze_set_up` is the same freeze for a trainer that nerfstudio's ``ns-train`` set up (no
  pause before it: its imports were collected as usual): once its set-up is done, training's full
  collections scan only what training creates (``--freeze-heap-after-setup``); once per process.
- :func:`freeze_heap_at_exit` arms an exit hook that closes nerfstudio's tensorboard writers (every
  queued event written) and freezes the heap before the interpreter's teardown. Objects in
  reference cycles are then not finalised at exit, which is why the writers are closed first.
"""

from __future__ import annotations

import atexit
import gc
import sys

_state = {"paused": False, "exit_hook": False, "set_up_frozen": False}
METHOD_TABLE = "nerfstudio.configs.method_configs"  # imported by every nerfstudio tool that lists methods


def freeze_at_plugin_discovery() -> None:
    """Freeze every object alive now if nerfstudio's method table is being built (or was). Called by
    the first module of ours that each of its discoveries imports (dataparsers, then methods), so at
    most twice per process."""
    if METHOD_TABLE in sys.modules:
        gc.freeze()


def pause_collections() -> None:
    """No garbage collections until :func:`freeze_start_up`."""
    if gc.isenabled():
        gc.disable()
        _state["paused"] = True


def freeze_start_up() -> None:
    """End a pause: freeze every object alive and collect again from here on."""
    if _state["paused"]:
        gc.freeze()
        gc.enable()
        _state["paused"] = False


def freeze_set_up() -> None:
    """Freeze every object alive now (a trainer's set-up is done), ending a launcher's pause if any.
    Once per process: a later trainer in the same process (benchmarks, tests) would also freeze the
    earlier one's uncollected cycles, its tensors with them."""
    if _state["set_up_frozen"]:
        return
    _state["set_up_frozen"] = True
    if _state["paused"]:
        freeze_start_up()
    else:
        gc.freeze()


def freeze_heap_at_exit() -> None:
    """Arm (once per process) the exit hook: close the tensorboard writers, then freeze the heap."""
    if not _state["exit_hook"]:
        atexit.register(_before_teardown)  # atexit runs its hooks last-in first-out, all before teardown
        _state["exit_hook"] = True


def _before_teardown() -> None:
    from bytesplat_ns.event_writers import close_tensorboard_writers

    close_tensorboard_writers()
    gc.disable()
    gc.freeze()
