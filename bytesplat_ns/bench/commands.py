"""The ``bytesplat-bench`` subcommands a suite step may name, and each one's own argument parser.

A suite step is checked against the parser of the subcommand it runs, so a declared suite that no
longer matches its benchmark's options fails its test instead of a GPU job.
"""

from __future__ import annotations

import argparse
import importlib
from typing import Dict, Tuple

from bytesplat_ns.errors import BytesplatError

# subcommand -> (module, function returning its argparse parser)
STEP_COMMANDS: Dict[str, Tuple[str, str]] = {
    "raster": ("bytesplat_ns.bench.cli", "raster_parser"),
    "train": ("bytesplat_ns.bench.train", "parser"),
    "distributed": ("bytesplat_ns.bench.distributed", "parser"),
    "matrix": ("bytesplat_ns.bench.matrix", "parser"),
    "profile": ("bytesplat_ns.bench.profile_train", "parser"),
    "wallclock": ("bytesplat_ns.bench.wallclock", "parser"),
    "step": ("bytesplat_ns.bench.step", "parser"),
    "dram": ("bytesplat_ns.bench.dram", "parser"),
    "sass": ("bytesplat_ns.bench.sass", "parser"),
    "city": ("bytesplat_ns.bench.city_render", "parser"),
    "loop": ("bytesplat_ns.bench.loop_overhead", "parser"),
}

# the option each subcommand writes its JSON to: the suite runner sets it per step
OUTPUT_OPTION: Dict[str, str] = {name: "--out" for name in STEP_COMMANDS}
OUTPUT_OPTION["matrix"] = "--out-dir"


def step_parser(command: str) -> argparse.ArgumentParser:
    """The argument parser ``bytesplat-bench COMMAND`` itself uses."""
    if command not in STEP_COMMANDS:
        raise BytesplatError(f"unknown bytesplat-bench subcommand '{command}' in a suite step",
                             hint=f"choose one of {', '.join(STEP_COMMANDS)}")
    module, attr = STEP_COMMANDS[command]
    return getattr(importlib.import_module(module), attr)()
