"""Every module of bytesplat_ns imports on its own, and the package's import graph has no cycles.

The graph counts lazy (function-level) imports as edges: tests/helpers/import_graph.py says why.
"""

from __future__ import annotations

from typing import Dict, Set

import pytest

from tests.helpers.import_graph import cycles, import_edges, import_every_module


@pytest.fixture(scope="module")
def graph() -> Dict[str, Set[str]]:
    return import_edges(import_every_module())


def _reachable(edges: Dict[str, Set[str]], start: str) -> Set[str]:
    seen, todo = set(), [start]
    while todo:
        for w in edges[todo.pop()]:
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen


def test_the_package_has_no_import_cycles(graph):
    assert "bytesplat_ns.distributed.trainer" in graph and "bytesplat_ns.method_configs.bytesplat" in graph
    found = cycles(graph)
    described = ["; ".join(f"{m} -> {sorted(graph[m] & set(c))}" for m in c) for c in found]
    assert not found, "import cycles:\n" + "\n".join(described)


def test_the_layers_point_one_way(graph):
    # The method configs and the pipeline never reach the torchrun CLI module; the single-process
    # trainer never reaches the sharded one; the tile statistics sit above pruning, not beside it.
    for name in [m for m in graph if m.startswith("bytesplat_ns.method_configs")] + ["bytesplat_ns.distributed.pipeline"]:
        assert "bytesplat_ns.train" not in _reachable(graph, name), name
    assert "bytesplat_ns.distributed.trainer" not in _reachable(graph, "bytesplat_ns.trainer")
    assert "bytesplat_ns.tile_occupancy" not in _reachable(graph, "bytesplat_ns.pruning")
    assert "bytesplat_ns.pruning" in graph["bytesplat_ns.tile_occupancy"]


def test_a_lazy_import_cycle_is_found(tmp_path):
    # A package whose cycle only exists through an import inside a function.
    pkg = tmp_path / "bytesplat_ns"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from bytesplat_ns.sub import a\n")
    (pkg / "sub" / "a.py").write_text("from . import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from bytesplat_ns.sub.a import x\n    return x\n")
    (pkg / "c.py").write_text("import bytesplat_ns.sub.b\n")
    files = {
        "bytesplat_ns": str(pkg / "__init__.py"),
        "bytesplat_ns.sub": str(pkg / "sub" / "__init__.py"),
        "bytesplat_ns.sub.a": str(pkg / "sub" / "a.py"),
        "bytesplat_ns.sub.b": str(pkg / "sub" / "b.py"),
        "bytesplat_ns.c": str(pkg / "c.py"),
    }
    edges = import_edges(files)
    assert edges["bytesplat_ns.sub.a"] == {"bytesplat_ns.sub.b"}  # relative import of a module
    assert edges["bytesplat_ns.sub.b"] == {"bytesplat_ns.sub.a"}  # the lazy one
    assert edges["bytesplat_ns.c"] == {"bytesplat_ns.sub.b"}
    assert cycles(edges) == [["bytesplat_ns.sub.a", "bytesplat_ns.sub.b"]]
    (pkg / "sub" / "b.py").write_text("X = 1\n")
    assert cycles(import_edges(files)) == []
