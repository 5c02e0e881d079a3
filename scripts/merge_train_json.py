"""Merge `bench.train` JSON files (one per process) into one, and print a line per run.

    python scripts/merge_train_json.py OUT.json "NOTE" IN.json [IN.json ...]

Missing inputs (a run cut short by its timeout) are skipped.
"""

import json
import sys


def main() -> None:
    out, note, inputs = sys.argv[1], sys.argv[2], sys.argv[3:]
    runs, env, scene = [], None, None
    for path in inputs:
        try:
            with open(path) as f:
                d = json.load(f)
        except (OSError, ValueError):
            continue
        env, scene = env or d["environment"], scene or d.get("scene")
        runs += d["runs"]
    with open(out, "w") as f:
        json.dump({"environment": env, "scene": scene, "note": note, "runs": runs}, f, indent=1)
    for r in runs:
        print(r["label"], "ms/it %.2f" % r["ms_per_iteration"], "psnr %.3f ssim %.4f" % (r["eval"]["psnr"], r["eval"]["ssim"]),
              "N", r["num_gaussians"])


if __name__ == "__main__":
    main()
