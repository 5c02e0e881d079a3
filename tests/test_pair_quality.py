"""scripts/pair_quality.py (the GPU scripts' seed-paired quality summary) on ns-eval-shaped files."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location("pair_quality", Path(__file__).parents[1] / "scripts" / "pair_quality.py")
pair_quality = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(pair_quality)


def _eval(path: Path, psnr: float, ssim: float) -> None:
    path.write_text(json.dumps({"checkpoint": "step-999.ckpt", "results": {"psnr": psnr, "ssim": ssim}}))


def test_differences_are_paired_by_seed_and_step_times_read_from_the_log(tmp_path):
    _eval(tmp_path / "eval_gpu1_s1.json", 28.0, 0.95)
    _eval(tmp_path / "eval_gpu1_s2.json", 29.0, 0.96)
    _eval(tmp_path / "eval_pixel2_s1.json", 28.1, 0.951)
    _eval(tmp_path / "eval_pixel2_s2.json", 28.8, 0.958)
    _eval(tmp_path / "eval_pixel2_s3.json", 20.0, 0.5)  # no baseline with seed 3: not paired
    # the trainer's progress rows: step (percent), time per step, time left, rays/s
    rows = ["0 (0.00%)           2 s, 490.778 ms      1 h, 23 m, 1 s",
            "50 (5.00%)          300.000 ms           11 m, 38 s           275.69 K",
            "100 (10.00%)        20.000 ms            24 s, 417.679 ms     3.94 M",
            "110 (11.00%)        24.000 ms            24 s, 417.679 ms     3.94 M",
            "120 (12.00%)        22.000 ms            24 s, 417.679 ms     3.94 M"]
    (tmp_path / "quality_pixel2_s1.log").write_text("\n".join(rows))
    out = pair_quality.pair(tmp_path, tmp_path, "gpu1")
    row = out["summary"]["pixel2"]
    assert row["seeds"] == [1, 2]
    assert row["psnr_diff_mean"] == pytest.approx((0.1 - 0.2) / 2)
    assert row["psnr_diff_std"] == pytest.approx(0.2121320, rel=1e-5)
    assert row["ssim_diff_mean"] == pytest.approx((0.001 - 0.002) / 2)
    assert row["median_ms_per_step"] == pytest.approx(22.0)  # warm-up rows (< step 100) left out
    assert out["summary"]["gpu1"]["psnr_diff_mean"] == 0.0
    assert out["runs"]["pixel2"][3]["ms_per_step"] is None  # no log


def test_main_writes_json_and_prints_a_line_per_kind(tmp_path, capsys):
    _eval(tmp_path / "eval_gpu1_s1.json", 28.0, 0.95)
    _eval(tmp_path / "eval_sparse2_s1.json", 27.5, 0.94)
    pair_quality.main(["--evals", str(tmp_path), "--logs", str(tmp_path), "--out", str(tmp_path / "q.json")])
    assert json.loads((tmp_path / "q.json").read_text())["summary"]["sparse2"]["psnr_diff_mean"] == pytest.approx(-0.5)
    assert "sparse2: seeds [1] vs gpu1: -0.500 +- 0.000 dB" in capsys.readouterr().out


def test_gaussian_count_read_from_the_checkpoint_when_it_is_there(tmp_path):
    import torch

    ckpt = tmp_path / "step-999.ckpt"
    torch.save({"pipeline": {"_model.gauss_params.means": torch.zeros(7, 3), "_model.x": torch.zeros(2)}}, ckpt)
    assert pair_quality.checkpoint_gaussians(str(ckpt)) == 7
    assert pair_quality.checkpoint_gaussians(str(tmp_path / "gone.ckpt")) is None
    (tmp_path / "eval_gpu1_s1.json").write_text(json.dumps({"checkpoint": str(ckpt), "results": {"psnr": 28.0, "ssim": 0.9}}))
    assert pair_quality.pair(tmp_path, tmp_path, "gpu1")["runs"]["gpu1"][1]["num_gaussians"] == 7
