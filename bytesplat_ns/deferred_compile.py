"""nerfstudio's ``torch_compile()`` decorators set up at their first call, not at import.

nerfstudio's splatfacto module decorates a helper (``get_viewmat``) with ``torch_compile()`` when it
is imported, and ``torch.compile`` builds its backend as soon as it wraps a function: it imports
torch's inductor and dynamo's debugging backends, about a fifth of ``ns-train``'s imports on CPU,
paid by every nerfstudio tool that builds the method table although bytesplat never calls that
helper. Our dataparser package is imported by the method table's discovery before splatfacto, so
there (and only while a method table is being built, as the heap freeze in ``heap.py``) nerfstudio's
decorator factory is swapped for one that calls the real one with the same arguments at the
function's first call: splatfacto gets the same compiled function, a method that never calls it
never builds the backend. Direct calls (``torch_compile(module)``) compile at once, as before.
``bytesplat-train``, which builds no method table, swaps it before it imports a model.
"""

from __future__ import annotations

import functools
import sys
import threading
from typing import Any, Callable

from bytesplat_ns.heap import METHOD_TABLE


def defer_at_plugin_discovery() -> None:
    """:func:`defer_nerfstudio_compile` if nerfstudio's method table is being built."""
    if METHOD_TABLE in sys.modules:
        defer_nerfstudio_compile()


def defer_nerfstudio_compile() -> None:
    """Swap ``nerfstudio.utils.misc.torch_compile`` for :func:`deferred` (once; modules that imported it
    before keep the original): ``bytesplat-train`` calls it before it imports any model."""
    from nerfstudio.utils import misc

    if not getattr(misc.torch_compile, "deferred", False):
        misc.torch_compile = deferred(misc.torch_compile)


def deferred(compile_now: Callable[..., Any]) -> Callable[..., Any]:
    """``compile_now`` (a ``torch.compile``-like factory) whose decorator form, ``compile_now(**options)``,
    compiles the decorated function at its first call."""

    @functools.wraps(compile_now)
    def torch_compile(*args, **kwargs):
        if args:  # torch_compile(model, ...): compiled now
            return compile_now(*args, **kwargs)

        def decorate(function):
            compiled = []
            lock = threading.Lock()

            @functools.wraps(function)
            def call(*call_args, **call_kwargs):
                if not compiled:
                    with lock:
                        if not compiled:
                            compiled.append(compile_now(**kwargs)(function))
                return compiled[0](*call_args, **call_kwargs)

            return call

        return decorate

    torch_compile.deferred = True
    return torch_compile
