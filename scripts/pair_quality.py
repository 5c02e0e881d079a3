"""Paired quality comparison of ns-eval outputs named ``eval_{RUN}_s{SEED}.json`` (written by
``quality`` in scripts/gpu_train_lib.sh): per run kind, PSNR / SSIM differences to the baseline
kind with the same seed (mean and standard deviation over seeds), and the median ms per step after
warm-up read from the run's ns-train log (``quality_{RUN}_s{SEED}.log``, the trainer's progress
table). Prints a table and writes the JSON given by --out."""

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


def _mean_std(values):
    return (statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0) if values else (None, None)


def pair(evals: Path, logs: Path, baseline: str) -> Dict:
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
        }
    base = runs.get(baseline, {})
    summary = {}
    for kind, by_seed in runs.items():
        seeds = sorted(s for s in by_seed if s in base)
        dpsnr = [by_seed[s]["psnr"] - base[s]["psnr"] for s in seeds]
        dssim = [by_seed[s]["ssim"] - base[s]["ssim"] for s in seeds]
        ms = [v["ms_per_step"] for v in by_seed.values() if v["ms_per_step"] is not None]
        (pm, ps), (sm, ss) = _mean_std(dpsnr), _mean_std(dssim)
        summary[kind] = {"seeds": seeds, "psnr_diff_mean": pm, "psnr_diff_std": ps, "ssim_diff_mean": sm,
                         "ssim_diff_std": ss, "median_ms_per_step": statistics.median(ms) if ms else None}
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


if __name__ == "__main__":
    main()
