"""scripts/pin_rank.py (the rank-pinning experiment of docs/benchmarks.md): each local rank keeps its
own block of physical cores, and the module runs with its arguments as ``python -m`` would run it."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[1] / "scripts" / "pin_rank.py"
_SPEC = importlib.util.spec_from_file_location("pin_rank", SCRIPT)
pin_rank = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(pin_rank)

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="needs sched_getaffinity (Linux)")


def test_physical_cores_cover_every_allowed_cpu_once():
    cpus = sorted(os.sched_getaffinity(0))
    cores = pin_rank.physical_cores(cpus)
    assert sorted(c for g in cores for c in g) == cpus
    assert [g[0] for g in cores] == sorted(g[0] for g in cores)


def _run_rank(tmp_path: Path, rank: int, world: int):
    (tmp_path / "show_affinity.py").write_text(
        "import json, os, sys\nprint(json.dumps({'cpus': sorted(os.sched_getaffinity(0)), 'argv': sys.argv}))\n")
    env = dict(os.environ, LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world), PYTHONPATH=str(tmp_path))
    out = subprocess.run([sys.executable, str(SCRIPT), "show_affinity", "--flag", "x"], env=env, capture_output=True,
                         text=True, timeout=60, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_ranks_get_disjoint_cores_and_the_module_its_arguments(tmp_path):
    allowed = sorted(os.sched_getaffinity(0))
    cores = pin_rank.physical_cores(allowed)
    got = [_run_rank(tmp_path, r, 2) for r in range(2)]
    # as under `python -m`: argv[0] is the module's file, then its arguments
    assert all(g["argv"][0].endswith("show_affinity.py") and g["argv"][1:] == ["--flag", "x"] for g in got)
    if len(cores) < 2:
        pytest.skip("one physical core: nothing to split")
    a, b = (set(g["cpus"]) for g in got)
    assert a and b and not a & b and a | b <= set(allowed)
    assert a == set(c for g in cores[: len(cores) // 2] for c in g)


def test_without_a_module_it_says_how_to_call_it():
    out = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "usage: pin_rank.py MODULE" in out.stderr
