"""Run a module with this rank pinned to its own share of the host's physical cores (an experiment:
does a host-bound two-rank step gain when the ranks stop sharing cores?).

    torchrun --standalone --nproc-per-node 2 scripts/pin_rank.py bytesplat_ns.bench.cli distributed ...

The process's allowed CPUs are grouped by physical core (hyperthread siblings together), the cores
split into LOCAL_WORLD_SIZE consecutive blocks, and rank LOCAL_RANK keeps block LOCAL_RANK; then the
module runs as ``python -m``. Prints the CPUs it kept.
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path
from typing import Dict, List, Tuple


def physical_cores(cpus: List[int]) -> List[List[int]]:
    """``cpus`` grouped by (package, core id), in order of their first CPU."""
    groups: Dict[Tuple[int, int], List[int]] = {}
    for c in sorted(cpus):
        topo = Path(f"/sys/devices/system/cpu/cpu{c}/topology")
        try:
            key = (int((topo / "physical_package_id").read_text()), int((topo / "core_id").read_text()))
        except (OSError, ValueError):
            key = (0, c)
        groups.setdefault(key, []).append(c)
    return sorted(groups.values(), key=lambda g: g[0])


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        sys.exit("usage: pin_rank.py MODULE [ARGS...]  (run under torchrun; see the docstring)")
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    cores = physical_cores(list(os.sched_getaffinity(0)))
    per = max(1, len(cores) // world)
    mine = [c for g in cores[rank * per : (rank + 1) * per] for c in g]
    if mine:
        os.sched_setaffinity(0, mine)
    print(f"pin_rank: local rank {rank}/{world}: CPUs {mine} ({len(cores)} physical cores seen)", flush=True)
    module = sys.argv[1]
    sys.argv = [module] + sys.argv[2:]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
