"""Paired quality comparison of ns-eval outputs named ``eval_{RUN}_s{SEED}.json`` (written by
``quality`` in scripts/gpu_train_lib.sh): per run kind, PSNR / SSIM differences to the baseline
kind with the same seed (mean and standard deviation over seeds), and the median ms per step after
warm-up read from the run's ns-train log (``quality_{RUN}_s{SEED}.log``, the trainer's progress
table), and the Gaussian count of the evaluated checkpoint where that file is still there (a run that
densified far more than its pairs is the first thing to look at when one seed scores low). Prints a
table and writes the JSON given by --out."""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path
from typing import Dict, Optional

_EVAL = re.compile(r"eval_(?P<kind>.+)_s(?P<seed>\d+)\.json$")
_STEP = re.compile(r"^\s*(\d+) \([\d.]+%\)\s+([\d.]+) ms\s")


def median_ms_per_step(log: Path, after_step: int = 100) -> Optional[float]:
    """Median of the trainer's per-step times (rows below one second) after ``after_step``."""
    if not log.exists():
        return None
    times = [float(m.group(2)) for line in log.read_text(errors="replace").splitlines()
             if (m := _STEP.match(line)) and int(m.group(1)) >= after_step]
    return statistics.median(times) if times else None


def checkpoint_gaussians(checkpoint: Optional[str]) -> Optional[int]:
    """Number of Gaussians in a nerfstudio checkpoint (its ``...gauss_params.means``), None if absent."""
    if not checkpoint or not Path(checkpoint).is_file():
        return None
    import torch

    state = torch.load(checkpoint, map_location="cpu", weights_only=False).get("pipeline", {})
    return next((int(v.shape[0]) for k, v in state.items() if k.endswith("gauss_params.means")), None)


def pair(evals: Path, logs: Path, baseline: str) -> Dict:
    from bytesplat_ns.bench.train import paired_differences

    runs: Dict[str, Dict[int, Dict]] = {}
    for f in sorted(evals.glob("eval_*_s*.json")):
        m = _EVAL.search(f.name)
        if not m:
            continue
        r = json.loads(f.read_text())
        name = f"{m['kind']}_s{m['seed']}"
        runs.setdefault(m["kind"], {})[int(m["seed"])] = {
            "psnr": r["results"]["psnr"], "ssim": r["results"]["ssim"], "checkpoint": r.get("checkpoint"),
            "ms_per_step": median_ms_per_step(logs / f"quality_{name}.log"),
            "num_gaussians": checkpoint_gaussians(r.get("checkpoint")),
        }
    base = runs.get(baseline, {})

    def as_run(seed: int, row: Dict) -> Dict:  # bench.train's run shape
        return {"seed": seed, "eval": {"psnr": row["psnr"], "ssim": row["ssim"]}}

    summary = {}
    for kind, by_seed in runs.items():
        pairs = [(as_run(s, by_seed[s]), as_run(s, base[s])) for s in sorted(by_seed) if s in base]
        diffs = paired_differences(pairs) if pairs else {"seeds": [], "psnr_diff_mean": None, "psnr_diff_std": None,
                                                         "ssim_diff_mean": None, "ssim_diff_std": None}
        ms = [v["ms_per_step"] for v in by_seed.values() if v["ms_per_step"] is not None]
        summary[kind] = dict(diffs, median_ms_per_step=statistics.median(ms) if ms else None)
    return {"baseline": baseline, "runs": runs, "summary": summary}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--evals", type=Path, required=True)
    p.add_argument("--logs", type=Path, required=True)
    p.add_argument("--baseline", default="gpu1")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    result = pair(a.evals, a.logs, a.baseline)
    a.out.write_text(json.dumps(result, indent=1))
    for kind, row in result["summary"].items():
        diff = "-" if row["psnr_diff_mean"] is None else (
            f"{row['psnr_diff_mean']:+.3f} +- {row['psnr_diff_std']:.3f} dB, SSIM {row['ssim_diff_mean']:+.4f}")
        ms = "-" if row["median_ms_per_step"] is None else f"{row['median_ms_per_step']:.1f} ms/step"
        print(f"{kind:>10}: seeds {row['seeds']} vs {a.baseline}: {diff}; {ms}")
    for kind, by_seed in result["runs"].items():
        print(f"{kind:>10}: " + ", ".join(f"s{s} {r['psnr']:.3f} dB {r['num_gaussians'] or '?'} Gaussians"
                                          for s, r in sorted(by_seed.items())))


if __name__ == "__main__":
    main()
