"""The import graph of the bytesplat_ns package, from the source of its modules (for test_import_graph).

An edge ``a -> b`` is any ``import``/``from ... import`` statement in module ``a`` that names the
bytesplat_ns module ``b``, at the top level or inside a function or class: a lazy import is an edge
too, since it only hides a cycle until the function runs. ``from pkg import name`` points at
``pkg.name`` when that is a module, else at ``pkg``. The import of a package's ``__init__`` that
Python runs before any of its submodules is not an edge of the submodule (it is the parent's, not a
statement of the child).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from typing import Dict, List, Set

PACKAGE = "bytesplat_ns"

# Run in a fresh interpreter: import every module of the package, print name -> source file.
_LIST_MODULES = f"""
import importlib, json, pkgutil
import {PACKAGE}
files = {{"{PACKAGE}": {PACKAGE}.__file__}}
# method_configs/ lives beside the package in a checkout (mapped to {PACKAGE}.method_configs): walk it too
for package in ({PACKAGE}, importlib.import_module("{PACKAGE}.method_configs")):
    files[package.__name__] = package.__file__
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        module = importlib.import_module(info.name)
        files[info.name] = module.__file__
print(json.dumps(files))
"""


def import_every_module() -> Dict[str, str]:
    """Module name -> source file, after importing each in a fresh interpreter (raises if one fails)."""
    done = subprocess.run([sys.executable, "-c", _LIST_MODULES], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"importing the package failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    parts = module.split(".") if is_package else module.split(".")[:-1]
    parts = parts[: len(parts) - node.level + 1]
    return ".".join(parts + ([node.module] if node.module else []))


def _owning_module(name: str, modules: Set[str]) -> str:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name


def import_edges(files: Dict[str, str]) -> Dict[str, Set[str]]:
    """Module -> the package's modules its import statements name (see the module docstring)."""
    modules = set(files)
    edges: Dict[str, Set[str]] = {m: set() for m in files}
    for module, path in files.items():
        is_package = path.endswith("__init__.py")
        with open(path, encoding="utf-8") as handle:
            tree = ast.parse(handle.read(), filename=path)
        for node in ast.walk(tree):
            targets: List[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(module, is_package, node)
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    targets.append(full if full in modules else base)
            for target in targets:
                owner = _owning_module(target, modules)
                if owner and owner != module:
                    edges[module].add(owner)
    return edges


def cycles(edges: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found
