"""nerfstudio's ``torch_compile()`` decorators set up at the first call (deferred_compile.py): the
method table no longer builds torch.compile's backend at import, and a decorated function still
gets ``torch.compile`` with its arguments when it runs."""

from __future__ import annotations

import subprocess
import sys

from bytesplat_ns.deferred_compile import deferred


def test_the_decorator_compiles_at_the_first_call_with_its_arguments():
    calls = []

    def compile_now(*args, **kwargs):
        calls.append((args, kwargs))
        if args:
            return ("compiled", args[0])
        return lambda function: (lambda *a, **k: ("compiled", function(*a, **k)))

    torch_compile = deferred(compile_now)

    @torch_compile(dynamic=True)
    def double(x, scale=2):
        return x * scale

    assert calls == [] and double.__wrapped__.__name__ == "double"  # nothing built at decoration
    assert double(3) == ("compiled", 6) and double(3, scale=5) == ("compiled", 15)
    assert calls == [((), {"dynamic": True})]  # built once, with the decorator's arguments
    module = object()
    assert torch_compile(module, mode="max-autotune") == ("compiled", module)  # a direct call compiles now
    assert calls[-1] == ((module,), {"mode": "max-autotune"})


SCRIPT = """
import sys
{imports}
import nerfstudio.utils.misc as misc
print(getattr(misc.torch_compile, "deferred", False), "torch._inductor.compile_fx" in sys.modules)
"""


def _python(code: str, *args: str) -> str:
    """The stdout of ``code`` run in a fresh interpreter (the imports under test happen once per process)."""
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", code, *args], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _after(imports: str):
    swapped, inductor = _python(SCRIPT.format(imports=imports)).split()
    return swapped == "True", inductor == "True"


def test_the_method_table_defers_splatfactos_compile_and_a_plain_import_does_not():
    # ns-train, ns-eval, ...: our dataparser package is discovered before splatfacto is imported
    swapped, inductor = _after("import nerfstudio.configs.method_configs\n"
                               "from nerfstudio.models.splatfacto import get_viewmat\n"
                               "assert get_viewmat.__wrapped__.__name__ == 'get_viewmat'")
    assert swapped and not inductor
    # importing our packages without a method table being built leaves nerfstudio's helper alone
    assert _after("import bytesplat_ns.data.dataparser") == (False, False)


LAUNCH = """
import sys
{launch}
print("INDUCTOR", "torch._inductor.compile_fx" in sys.modules)
"""


def test_the_launchers_and_the_timed_ns_train_never_build_the_backend():
    """bytesplat-train (no method table) defers too, and bytesplat-bench's timed ns-train imports ns-train's
    modules in the command's order, so that its start-up is the user's."""
    launches = {
        "bytesplat-train": "from bytesplat_ns.launcher import entrypoint\n"
                           "try:\n    entrypoint(['bytesplat', '--help'])\nexcept SystemExit:\n    pass",
        "timed ns-train": "from bytesplat_ns.bench import timed_ns_train\n"
                          "try:\n    timed_ns_train.main(['--timings', sys.argv[1], '--', 'bytesplat', '--help'])\n"
                          "except SystemExit:\n    pass",
    }
    for name, launch in launches.items():
        out = _python(LAUNCH.format(launch=launch), "/dev/null")
        assert "INDUCTOR False" in out, (name, out[-2000:])
