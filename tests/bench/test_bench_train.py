"""bytesplat-bench's side-by-side training benchmark on CPU: per-method model options and the
JSON it writes (the GPU suites in bytesplat_ns/bench/suites.py use the same code)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bytesplat_ns.bench.train import main, set_model_option
from bytesplat_ns.model import ByteSplatModelConfig


def test_model_options_parse_to_the_field_type():
    cfg = ByteSplatModelConfig()
    for item in ("hw_prune=off", "tile-stats-every=50", "hw_prune_max_fraction=0.1", "use_scale_regularization=true",
                 "budget_prune_steps=7500+15000", "fused.trim-tile-lists=true"):
        set_model_option(cfg, item)
    assert (cfg.hw_prune, cfg.tile_stats_every, cfg.hw_prune_max_fraction, cfg.use_scale_regularization,
            cfg.budget_prune_steps, cfg.fused.trim_tile_lists) == ("off", 50, 0.1, True, (7500, 15000), True)
    with pytest.raises(SystemExit, match="unknown model option"):
        set_model_option(cfg, "fused.no_such_field=1")
    with pytest.raises(SystemExit, match="unknown model option"):
        set_model_option(cfg, "no_such_config.trim_tile_lists=1")
    with pytest.raises(SystemExit, match="unknown model option"):
        set_model_option(cfg, "no_such_field=1")
    with pytest.raises(SystemExit, match="unknown model option"):
        set_model_option(cfg, "hw_prune")


def test_an_entry_sets_model_and_trainer_fields():
    from bytesplat_ns.bench.train import method_from_entry

    label, config = method_from_entry("bytesplat@trainer.optimizer_steps_in_one_pass=false,fused.fast_exp=true")
    assert config.optimizer_steps_in_one_pass is False and config.pipeline.model.fused.fast_exp is True
    assert label == "bytesplat-trainer.optimizer_steps_in_one_pass-false-fused.fast_exp-true"
    with pytest.raises(SystemExit, match="unknown model option"):
        method_from_entry("bytesplat@trainer.no_such_field=1")


def test_unknown_method_is_one_clear_error():
    from bytesplat_ns.bench.train import method_from_entry

    with pytest.raises(SystemExit, match="unknown method 'nosuch'.*splatfacto"):
        method_from_entry("nosuch:fused")


def test_cpu_run_writes_per_method_results(tmp_path):
    out = tmp_path / "train.json"
    main(["--scene", "small", "--iterations", "4", "--num-downscales", "0", "--work-dir", str(tmp_path / "w"),
          "--methods", "bytesplat:reference@hw_prune=off,hw_prune_capacity=8,tile_stats_every=2", "--out", str(out)])
    report = json.loads(out.read_text())
    (run,) = report["runs"]
    assert run["label"] == "bytesplat-reference-hw_prune-off-hw_prune_capacity-8-tile_stats_every-2"
    assert run["iterations"] == 4 and run["eval"]["psnr"] > 0 and run["num_gaussians"] > 0
    assert [e["step"] for e in run["tile_occupancy"]] == [0.0, 2.0]
    assert all(e["capacity"] == 8 for e in run["tile_occupancy"]) and run["hw_prune_steps"] == []
    assert report["environment"]["command"].startswith("python -m bytesplat_ns.bench.train --scene small --iterations 4")
    # A/B against splatfacto: bytesplat follows splatfacto's coarse start as is (no resolution floor)
    assert "min_train_resolution: 0" in (Path(run["run_dir"]) / "config.yml").read_text()


def test_profile_train_reports_host_and_device_time(tmp_path):
    """bench.profile_train: the real loop body under the profiler after a real warm-up; on CPU the
    device columns are empty and the host table names the model's torch ops."""
    from bytesplat_ns.bench.profile_train import main as profile_main

    out = tmp_path / "profile.json"
    report = profile_main(["--scene", "small", "--methods", "bytesplat:reference@hw_prune=off", "--warmup-iters", "3",
                           "--profile-iters", "2", "--top", "5", "--work-dir", str(tmp_path / "w"), "--out", str(out)])
    (run,) = json.loads(out.read_text())["runs"]
    assert run == report["runs"][0]
    assert run["label"] == "bytesplat-reference-hw_prune-off" and run["num_gaussians"] > 0
    # after the warm-up's steps 0..2: two timed, two under torch.profiler, two under cProfile
    assert run["profiled_steps"] == [3, 8]
    assert run["wall_ms_per_iteration"] > 0 and run["device_busy_ms_per_iteration"] == 0
    assert run["wall_ms_median"] > 0 and len(run["wall_ms_quartiles"]) == 3 and isinstance(run["gc_pauses"], dict)
    python = run["python_top"]
    assert len(python["self"]) == len(python["total"]) == 5
    # the loop body is the outermost function profiled: under it is every iteration's whole time
    assert any(r["function"].endswith(" loop_body") and r["calls"] == 1.0 for r in python["total"])
    assert python["total"][0]["total_ms"] >= max(r["self_ms"] for r in python["self"]) > 0
    assert len(run["top_host"]) == 5 and all(r["name"].startswith("aten::") or r["calls"] > 0 for r in run["top_host"])
    assert run["top_device"] == []
    assert report["environment"]["command"].startswith("python -m bytesplat_ns.bench.profile_train --scene small")


def test_several_seeds_run_every_method_and_summarize(tmp_path):
    out = tmp_path / "train.json"
    main(["--scene", "small", "--iterations", "2", "--num-downscales", "0", "--work-dir", str(tmp_path / "w"),
          "--methods", "bytesplat:reference@hw_prune=off", "--seeds", "1", "2", "--out", str(out)])
    report = json.loads(out.read_text())
    assert [(r["label"], r["seed"]) for r in report["runs"]] == [
        ("bytesplat-reference-hw_prune-off-seed1", 1), ("bytesplat-reference-hw_prune-off-seed2", 2)]
    row = report["summary"]["bytesplat:reference@hw_prune=off"]
    psnrs = [r["eval"]["psnr"] for r in report["runs"]]
    assert row["runs"] == 2 and row["psnr_mean"] == pytest.approx(sum(psnrs) / 2)
    assert row["psnr_std"] == pytest.approx(abs(psnrs[0] - psnrs[1]) / 2 ** 0.5)


def test_profile_train_takes_a_capture_at_its_own_resolution(tmp_path, monkeypatch):
    """bench.profile_train --data: the given scene (here the built-in small one's folder) through the
    nerfstudio dataparser at downscale factor 1, and a nested model option from the entry."""
    from bytesplat_ns.bench import profile_train
    from bytesplat_ns.data.scene import SceneSpec, ensure_scene

    profiled = []
    real = profile_train.profile_method

    def recording(label, config, data, *args):
        parser = config.pipeline.datamanager.dataparser
        profiled.append((data, parser.downscale_factor, config.pipeline.model.fused.trim_tile_lists))
        return real(label, config, data, *args)

    monkeypatch.setattr(profile_train, "profile_method", recording)
    data = ensure_scene(SceneSpec(size="small"))
    report = profile_train.main(["--data", str(data), "--methods", "bytesplat:reference@hw_prune=off,fused.trim_tile_lists=1",
                                 "--warmup-iters", "2", "--profile-iters", "1", "--top", "3",
                                 "--work-dir", str(tmp_path / "w")])
    (run,) = report["runs"]
    assert report["scene"] == str(data) and run["num_gaussians"] > 0
    assert run["label"] == "bytesplat-reference-hw_prune-off-fused.trim_tile_lists-1"
    assert profiled == [(data.resolve(), 1, True)]


def test_gc_pauses_counts_the_collections_inside_the_block():
    import gc

    from bytesplat_ns.bench.profile_train import _gc_pauses

    with _gc_pauses() as pauses:
        gc.collect()
        gc.collect(0)
    assert pauses["gen2"]["count"] == 1 and pauses["gen0"]["count"] >= 1 and pauses["gen2"]["ms"] > 0
    before = len(gc.callbacks)
    with _gc_pauses() as outside:
        pass
    gc.collect()
    assert outside == {} and len(gc.callbacks) == before


def test_sync_sources_counts_each_synchronising_line_per_iteration(monkeypatch):
    """profile's sync_sources: the warnings torch's sync debug mode raises are counted at the
    innermost line outside torch; other warnings are not counted. (The debug mode itself is CUDA's:
    stubbed here.)"""
    import warnings

    from bytesplat_ns.bench import profile_train

    modes = []
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", modes.append)

    def synchronising_call():
        warnings.warn("called a synchronizing CUDA operation")

    def run_steps():
        for _ in range(2):
            synchronising_call()
            synchronising_call()
            warnings.warn("an unrelated warning")

    rows = profile_train.sync_sources(run_steps, iters=2)
    assert modes == ["warn", 0]
    assert len(rows) == 1 and rows[0]["per_iteration"] == 2.0
    here = "/".join(Path(__file__).parts[-2:])  # sync_sources names a line by its file's last two parts
    assert rows[0]["where"].startswith(f"{here}:") and rows[0]["where"].endswith("synchronising_call")


def test_summary_pairs_each_method_with_the_baseline_by_seed():
    from bytesplat_ns.bench.train import summarize

    def run(method, seed, psnr, ms):
        return {"method": method, "seed": seed, "eval": {"psnr": psnr, "ssim": 0.9}, "ms_per_iteration": ms}

    runs = [run("a", 1, 30.0, 10.0), run("base", 1, 29.5, 15.0), run("a", 2, 33.0, 10.0), run("base", 2, 33.1, 20.0),
            run("a", 3, 31.0, 10.0)]  # seed 3 has no baseline run: not paired
    s = summarize(runs, baseline="base")
    vs = s["a"]["vs_baseline"]
    assert vs["seeds"] == [1, 2] and vs["baseline"] == "base"
    assert vs["psnr_diff_mean"] == pytest.approx(0.2) and vs["psnr_diff_std"] == pytest.approx(0.6 / 2 ** 0.5)
    assert vs["speedup_mean"] == pytest.approx(1.75) and vs["ssim_diff_mean"] == pytest.approx(0.0)
    assert "vs_baseline" not in s["base"] and "vs_baseline" not in summarize(runs)["a"]


@pytest.mark.gpu
@pytest.mark.gpu
def test_fused_training_step_never_waits_for_the_gpu(tmp_path):
    """Between densification steps a bytesplat (fused) training iteration makes no host-device
    synchronisation: profile's sync_sources finds none (splatfacto's makes about 17)."""
    from bytesplat_ns.bench.profile_train import main as profile_main

    report = profile_main(["--scene", "small", "--methods", "bytesplat:fused", "--warmup-iters", "20",
                           "--profile-iters", "5", "--top", "3", "--work-dir", str(tmp_path / "w")])
    (run,) = report["runs"]
    assert run["profiled_steps"] == [20, 39]  # no refine step (every 100 from 500) among them
    assert run["sync_sources"] == [], run["sync_sources"]
