"""Committed GPU results for tests: one step's JSON output out of a suite document in docs/results/."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"

# ns-eval's output format: not a bytesplat-bench result
NS_EVAL_OUTPUT = {"experiment_name": "bytesplat-scene", "method_name": "bytesplat", "checkpoint": "step-000000999.ckpt",
                  "results": {"psnr": 28.7, "ssim": 0.957, "num_rays_per_sec": 9.7e6, "fps": 198.0}}


def step_result(suite: str, step: str) -> Dict:
    doc = json.loads((RESULTS / f"{suite}.json").read_text())
    for s in doc["steps"]:
        if s["name"] == step:
            return s["result"]
    raise KeyError(f"{suite} has no step {step}")


def step_file(folder: Path, suite: str, step: str) -> Path:
    """The step's result written to ``folder/<step>.json`` (as ``bytesplat-bench`` wrote it)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{step}.json"
    path.write_text(json.dumps(step_result(suite, step)))
    return path
