"""Helpers for tests that drive the nerfstudio command-line tools in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, Optional, Sequence

BIN = Path(sys.executable).parent  # console scripts sit beside the interpreter (venv or pyenv)


def tool(name: str) -> str:
    """Absolute path of a console script such as ns-train (pyenv shims may not be rehashed)."""
    path = BIN / name
    return str(path) if path.exists() else name


def cli_env(cache_dir: Path, extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    env = dict(os.environ)
    env.update(
        BYTESPLAT_CACHE=str(cache_dir),
        PYTHONUNBUFFERED="1",
        WANDB_MODE="disabled",
        MPLBACKEND="Agg",
    )
    env.update(extra or {})
    return env


def run_cli(args: Sequence[str], env: Dict[str, str], timeout: float, cwd: Optional[Path] = None):
    """Run a CLI to completion; the result carries returncode, stdout and stderr (text)."""
    return subprocess.run(
        [tool(args[0]), *args[1:]], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def describe(result) -> str:
    return f"exit {result.returncode}\n--- stdout ---\n{result.stdout[-4000:]}\n--- stderr ---\n{result.stderr[-4000:]}"
