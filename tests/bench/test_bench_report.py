"""bytesplat-bench report: docs/results.md from suite documents, stable, every table with its command, GPU,
versions and date."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bytesplat_ns.bench import report

REPO = Path(__file__).resolve().parents[2]


def _stage(ms):
    return {"median_ms": ms, "min_ms": ms - 0.1, "max_ms": ms + 0.1}


def _fixture_doc():
    raster = {"benchmark": "raster", "date": "2026-11-30 08:05 UTC", "gpu": "NVIDIA H200", "width": 1920, "height": 1080,
              "runs": [{"num_gaussians": 1_000_000, "raster_loss_fused_split": _stage(3.0),
                        "raster_loss_gsplat": _stage(12.0)}]}
    runs = [{"label": f"{m}-seed{s}", "method": m, "seed": s, "ms_per_iteration": ms, "num_gaussians": 1000,
             "eval": {"psnr": psnr, "ssim": 0.9}}
            for m, ms, psnr in (("bytesplat:fused", 8.0, 32.5), ("splatfacto", 12.0, 32.0)) for s in (1, 2)]
    train = {"environment": {"date": "2026-11-30 08:12 UTC", "device": "NVIDIA H200"}, "runs": runs}
    wallclock = {"benchmark": "bytesplat-bench wallclock", "date": "2026-12-01 10:00 UTC",
                 "runs": [{"method": m, "seed": s, "psnr": psnr + s, "wall_s": wall}
                          for m, psnr, wall in (("gpu1", 28.0, 60.0), ("sparse2", 28.25, 40.0)) for s in (1, 2)],
                 "summary": {"gpu1": {"seeds": 2, "wall_s": {"mean": 60.0}, "psnr": {"mean": 29.5, "min": 29.0, "max": 30.0}},
                             "sparse2": {"seeds": 2, "wall_s": {"mean": 40.0}, "psnr": {"mean": 29.75}}}}
    return {"suite": "fixture", "purpose": "a fixture suite", "gpus_needed": 1, "command": "bytesplat-bench suite fixture",
            "date": "2026-11-30 08:05 UTC", "gpu": "NVIDIA H200",
            "versions": {"torch": "2.11.0+cu130", "nerfstudio": "1.1.5", "gsplat": "1.4.0"},
            "steps": [{"name": "r", "command": "bytesplat-bench raster --num-gaussians 1000000", "status": "ok",
                       "result": raster},
                      {"name": "t", "command": "bytesplat-bench train --seeds 1 2", "status": "ok", "result": train},
                      {"name": "w", "command": "bytesplat-bench wallclock --seeds 1 2", "status": "ok",
                       "result": wallclock},
                      {"name": "x", "command": "bytesplat-bench raster --oops", "status": "failed", "result": None}],
            "plots": ["plots/fixture/raster.png"], "complete": False}


def test_report_renders_tables_with_their_command_gpu_versions_and_date(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    (results / "fixture.json").write_text(json.dumps(_fixture_doc()))
    page = tmp_path / "results.md"
    text = report.render(report.load_suites(results), results, page)
    assert "## Running a suite on a GPU machine" in text and "source scripts/gpu_setup.sh" in text
    assert "- Suite command: `bytesplat-bench suite fixture`" in text
    assert "GPU: NVIDIA H200; versions: torch 2.11.0+cu130, nerfstudio 1.1.5, gsplat 1.4.0; date: 2026-11-30 08:05 UTC" in text
    assert "| r | 1920x1080 | 1M | 3.00 | 12.00 | 4.00x | - | - | - |" in text
    # paired by seed: 12/8 = 1.5x faster and +0.5 dB in both seeds
    assert "| bytesplat:fused | 2 | 8.00 +- 0.00 | 32.50 +- 0.00 |" in text and "| 1.50x +- 0.00x | +0.50 +- 0.00 |" in text
    assert "| gpu1 | 2 | 60.00 | 29.50 | 29.00-30.00 | baseline |" in text
    assert "| sparse2 | 2 | 40.00 | 29.75 | - | +0.250 +- 0.000 |" in text
    assert "- Step `x`: `bytesplat-bench raster --oops` (failed)" in text
    assert "![raster](results/plots/fixture/raster.png)" in text
    assert report.render(report.load_suites(results), results, page) == text  # stable


def test_report_command_writes_the_page_and_rejects_other_json(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    (results / "fixture.json").write_text(json.dumps(_fixture_doc()))
    out = tmp_path / "page.md"
    cmd = [sys.executable, "-m", "bytesplat_ns.bench.cli", "report", "--results-dir", str(results), "--out", str(out)]
    assert subprocess.run(cmd, capture_output=True, text=True).returncode == 0
    first = out.read_text()
    assert "## fixture" in first
    assert subprocess.run(cmd, capture_output=True, text=True).returncode == 0
    assert out.read_text() == first
    (results / "stray.json").write_text(json.dumps({"runs": []}))
    run = subprocess.run(cmd, capture_output=True, text=True)
    assert run.returncode != 0 and "bytesplat: error:" in run.stderr and "stray.json is not a suite document" in run.stderr


def test_the_committed_results_page_is_up_to_date():
    results, page = REPO / "docs" / "results", REPO / "docs" / "results.md"
    docs = report.load_suites(results)
    assert {d["suite"] for d in docs} >= {"raster-1080p", "train-seeds", "distributed-counts", "capacity"}
    assert report.render(docs, results, page) == page.read_text()
    for doc in docs:
        assert all((results / p).is_file() for p in doc["plots"])


def test_wallclock_runs_are_listed_flat_with_where_each_came_from(tmp_path):
    fox = {**_fixture_doc(), "suite": "wallclock-fox-x", "command": "bytesplat-bench suite wallclock-fox-x"}
    fox["steps"][2]["result"] = {**fox["steps"][2]["result"], "device": "NVIDIA H200", "torch": "2.11.0+cu130",
                                 "data": "/somewhere/fox"}
    other_gpu = json.loads(json.dumps(fox))
    other_gpu["suite"], other_gpu["steps"][2]["result"]["device"] = "wallclock-fox-y", "NVIDIA A100"
    docs = [fox, other_gpu, _fixture_doc()]  # _fixture_doc's suite is not a wallclock-fox one
    listed = report.wallclock_runs(docs, "wallclock-fox", "H200")
    assert [(r["method"], r["seed"], r["wall_s"]) for r in listed["runs"]] == [
        ("gpu1", 1, 60.0), ("gpu1", 2, 60.0), ("sparse2", 1, 40.0), ("sparse2", 2, 40.0)]
    assert listed["runs"][0]["source"] == {"suite": "wallclock-fox-x", "step": "w",
                                           "command": "bytesplat-bench wallclock --seeds 1 2",
                                           "date": "2026-12-01 10:00 UTC", "gpu": "NVIDIA H200",
                                           "versions": {"torch": "2.11.0+cu130"}, "data": "fox"}
    written = report.write_run_lists(docs, tmp_path / "benchmarks")
    assert [p.name for p in written] == ["wallclock_fox_h200.json"]
    assert json.loads(written[0].read_text()) == listed


def test_the_committed_run_lists_are_up_to_date():
    docs = report.load_suites(REPO / "docs" / "results")
    for name, (prefix, gpu) in report.RUN_LISTS.items():
        committed = json.loads((REPO / "docs" / "benchmarks" / name).read_text())
        assert committed == report.wallclock_runs(docs, prefix, gpu)
        assert {"method", "seed", "iterations", "wall_s", "steps_s", "psnr", "ssim"} <= set(committed["runs"][-1])


@pytest.mark.parametrize("headline", ["| raster_1 | 1920x1080 | 1M | 2.98 | 11.77 | 3.95x |",
                                      "| bytesplat:fused | 5 | 8.32 +- 0.63 |", "1.66x +- 0.15x",
                                      "| 125M | bytesplat | sparse-grad | 2 | ok | 8.58 |"])
def test_the_results_page_carries_the_readme_headlines(headline):
    assert headline in (REPO / "docs" / "results.md").read_text()


def test_baseline_pairs_get_their_own_table_against_the_fused_schedule():
    from bytesplat_ns.bench.report import raster_table

    run = {"num_gaussians": 1_000_000, "raster_loss_fused_split": {"median_ms": 2.0}, "full_fused_split": {"median_ms": 4.0},
           "raster_loss_gsplat": {"median_ms": 8.0},
           "baselines": [{"gsplat": "1.5.3", "ssim": "fussim", "raster_loss": {"median_ms": 5.0}, "full": {"median_ms": 10.0},
                          "loss_rel_diff_vs_fused": 2e-7},
                         {"site": "/tmp/gsplat-9", "error": "child exited with 1: boom"}]}
    lines = raster_table([{"name": "s", "result": {"width": 1920, "height": 1080, "runs": [run]}}])
    row = next(line for line in lines if "fussim" in line)
    assert "| 1M | 1.5.3 | fussim | 5.00 | 2.50x | 10.00 | 2.50x | 2.0e-07 |" in row
    assert any("child exited with 1: boom" in line for line in lines)
    # a pair also timed on the opacity-aware lists gets those two columns, against ours on the same lists
    run["raster_loss_fused_split_opacity_tiles"] = {"median_ms": 1.5}
    run["baselines"][0]["raster_loss_opacity_tiles"] = {"median_ms": 4.5}
    lines = raster_table([{"name": "s", "result": {"width": 1920, "height": 1080, "runs": [run]}}])
    row = next(line for line in lines if "fussim" in line)
    assert "| 1M | 1.5.3 | fussim | 5.00 | 2.50x | 10.00 | 2.50x | 4.50 | 3.00x | 2.0e-07 |" in row
    # and where the fused split also ran on the trimmed lists (the default), those with the trimming's time added
    run.update({"raster_loss_fused_split_trimmed": {"median_ms": 1.3}, "trim_tile_lists_cuda": {"median_ms": 0.2}})
    lines = raster_table([{"name": "s", "result": {"width": 1920, "height": 1080, "runs": [run]}}])
    row = next(line for line in lines if "fussim" in line)
    assert "| 1M | 1.5.3 | fussim | 5.00 | 2.50x | 10.00 | 2.50x | 4.50 | 3.00x | 1.50 | 3.00x | 2.0e-07 |" in row
    # a run that names training's arm (the falloff as 2^q, the default since) is compared through that arm
    run.update({"raster_loss_fused_split_trimmed_fast_exp": {"median_ms": 1.05}, "training_arm":
                "raster_loss_fused_split_trimmed_fast_exp"})
    lines = raster_table([{"name": "s", "result": {"width": 1920, "height": 1080, "runs": [run]}}])
    row = next(line for line in lines if "fussim" in line)
    assert "| 4.50 | 3.00x | 1.25 | 3.60x | 2.0e-07 |" in row
    error_row = next(line for line in lines if "boom" in line)
    assert error_row.count("|") == row.count("|")


def test_opacity_aware_tiles_get_their_own_table_against_the_square_boxes():
    from bytesplat_ns.bench.report import raster_table

    run = {"num_gaussians": 224_129, "intersections": 3_000_000, "intersections_opacity_aware": 2_000_000,
           "binning_cuda": {"median_ms": 0.8}, "binning_cuda_opacity_tiles": {"median_ms": 0.5},
           "raster_loss_fused_split": {"median_ms": 3.0}, "raster_loss_fused_split_opacity_tiles": {"median_ms": 2.5},
           "full_fused_split": {"median_ms": 5.0}, "fused_split_loss_value": 0.25,
           "fused_split_opacity_tiles_loss_value": 0.25 * (1 + 4e-7)}
    lines = raster_table([{"name": "s", "result": {"width": 1079, "height": 1919, "runs": [run]}}])
    row = next(line for line in lines if "3000000" in line)
    assert row == "| 224.129k | 3000000 | 2000000 | 0.80 | 0.50 | 1.60x | 3.00 | 2.50 | 1.20x | 5.00 | - | - | 4.0e-07 |"
    plain = dict(run)
    del plain["intersections_opacity_aware"]  # results measured before the switch existed: no table
    assert not any("opacity-aware" in line for line in raster_table([{"name": "s", "result": {"runs": [plain]}}]))


def test_the_falloff_as_2_to_the_q_gets_its_own_table_against_expf():
    from bytesplat_ns.bench.report import raster_table

    run = {"num_gaussians": 1_000_000, "raster_loss_fused_split": {"median_ms": 3.0},
           "raster_loss_fused_split_fast_exp": {"median_ms": 2.5}, "raster_fwd_fused": {"median_ms": 0.8},
           "raster_fwd_fused_fast_exp": {"median_ms": 0.64}, "fused_split_loss_value": 0.25,
           "fused_split_fast_exp_loss_value": 0.25 * (1 - 2e-6)}
    lines = raster_table([{"name": "s", "result": {"width": 1920, "height": 1080, "runs": [run]}}])
    assert "| 1M | 3.00 | 2.50 | 1.20x | 0.80 | 0.64 | 1.25x | 2.0e-06 |" in lines
    plain = {k: v for k, v in run.items() if "fast_exp" not in k}  # measured before the switch existed: no table
    assert not any("2^q" in line for line in raster_table([{"name": "s", "result": {"runs": [plain]}}]))
    # the two-pixel backward's own table
    run.update({"raster_loss_fused_split_bwd_2px": {"median_ms": 2.4}, "fused_split_bwd_2px_loss_value": 0.25})
    lines = raster_table([{"name": "s", "result": {"width": 1920, "height": 1080, "runs": [run]}}])
    assert "| 1M | 3.00 | 2.40 | 1.25x | 0.0e+00 |" in lines
    # the rows test's own table, on both kinds of tile list
    run.update({"raster_loss_fused_split_rows_cull": {"median_ms": 2.0},
                "raster_loss_fused_split_opacity_tiles": {"median_ms": 2.8},
                "raster_loss_fused_split_opacity_tiles_rows_cull": {"median_ms": 2.0},
                "fused_split_rows_cull_loss_value": 0.25 * (1 + 1e-7), "warp_blocks_per_entry_box": 5.71,
                "warp_blocks_per_entry_rows": 3.75})
    lines = raster_table([{"name": "s", "result": {"width": 1920, "height": 1080, "runs": [run]}}])
    assert "| 1M | 5.71 | 3.75 | 3.00 | 2.00 | 1.50x | 2.80 | 2.00 | 1.40x | 1.0e-07 |" in lines
    assert sum("rows cull" in line for line in lines) == 1  # one header
    # the trimmed tile lists' own table, against the opacity-aware lists they are trimmed from
    run.update({"intersections_opacity_aware": 2_000_000, "intersections_trimmed": 1_500_000,
                "trim_tile_lists_cuda": {"median_ms": 0.05}, "raster_loss_fused_split_trimmed": {"median_ms": 2.5},
                "raster_loss_fused_split_trimmed_rows_cull": {"median_ms": 2.0},
                "raster_loss_fused_split_trimmed_fast_exp": {"median_ms": 2.24},
                "raster_loss_fused_split_trimmed_levers": {"median_ms": 1.4},
                "raster_fwd_fused_opacity_tiles": {"median_ms": 0.7}, "raster_fwd_fused_trimmed": {"median_ms": 0.56},
                "fused_split_opacity_tiles_loss_value": 0.25, "fused_split_trimmed_loss_value": 0.25 * (1 - 3e-7)})
    lines = raster_table([{"name": "s", "result": {"width": 1920, "height": 1080, "runs": [run]}}])
    assert ("| 1M | 2000000 | 1500000 | 0.05 | 2.80 | 2.50 | 1.12x | 2.80 | 2.00 | 1.40x | 2.80 | 2.24 | 1.25x "
            "| 2.80 | 1.40 | 2.00x | 0.70 | 0.56 | 1.25x | 3.0e-07 |") in lines


def test_dram_rows_get_a_table_against_the_split_schedule():
    result = {"benchmark": "bytesplat-bench dram", "rows": [
        {"stage": "split", "scene": "synthetic", "num_gaussians": 1_000_000, "kernels": 3, "dram_read_bytes": 300e6,
         "dram_write_bytes": 100e6, "dram_bytes": 400e6},
        {"stage": "gsplat-fussim", "scene": "synthetic", "num_gaussians": 1_000_000, "kernels": 9,
         "dram_read_bytes": 900e6, "dram_write_bytes": 300e6, "dram_bytes": 1200e6, "gsplat_version": "1.5.3"},
        {"stage": "one_launch", "scene": "synthetic", "num_gaussians": 1_000_000, "error": "child exited with 1: x"}]}
    assert report._kind(result) == "dram"
    lines = report.dram_table([{"name": "d", "result": result}])
    assert "| 1M | split | 300.0 | 100.0 | 400.0 | 3 | 1.00x |" in lines
    assert "| 1M | gsplat-fussim 1.5.3 | 900.0 | 300.0 | 1200.0 | 9 | 3.00x |" in lines
    assert any("one_launch | error: child exited with 1: x" in line for line in lines)


def _wallclock_step(name, runs):
    result = {"benchmark": "bytesplat-bench wallclock", "runs": runs, "summary": {}}
    return {"name": name, "status": "ok", "result": result}


def test_steps_split_by_seed_get_one_table_over_all_their_runs():
    from bytesplat_ns.bench.report import across_steps_table

    def run(method, seed, wall, psnr):
        return {"method": method, "seed": seed, "wall_s": wall, "steps_s": wall / 2, "psnr": psnr, "ssim": 0.9,
                "num_gaussians": 100}

    steps = [_wallclock_step(f"seed{s}", [run("a", s, 10.0 + s, 28.0 + s), run("b", s, 20.0, 27.5 + s)])
             for s in (0, 1, 2)]
    header, _, a, b = across_steps_table(steps)
    assert "wall_s median" in header
    assert a.split(" | ")[1:6] == ["3", "11.00", "10.00-12.00", "11.00", "50.0%"]
    assert b.split(" | ")[-1] == "-0.500 +- 0.000 |"
    # runs that shared the GPU count for quality, not for the wall clock
    shared = steps[:2] + [_wallclock_step("seed2", [dict(run("a", 2, 99.0, 30.0), concurrent_runs=2),
                                                    dict(run("b", 2, 99.0, 29.5), concurrent_runs=2)])]
    _, _, a, _ = across_steps_table(shared)
    assert a.split(" | ")[1:10] == ["3 (1 at once or without image writes: quality only)", "10.50", "10.00-11.00",
                                    "10.50", "50.0%", "29.00", "29.00", "28.00-30.00", "0.9000"]
    # PSNR's median and range beside the mean: one collapsed seed shows as such
    collapsed = steps[:2] + [_wallclock_step("seed2", [run("a", 2, 12.0, 20.0), run("b", 2, 20.0, 29.5)])]
    _, _, a, _ = across_steps_table(collapsed)
    assert a.split(" | ")[6:9] == ["25.67", "28.00", "20.00-29.00"]
    # and so do runs that skipped their image writes (wallclock --skip-image-writes)
    skipped = steps[:2] + [_wallclock_step("seed2", [dict(run("a", 2, 5.0, 30.0), image_writes_skipped=True),
                                                     dict(run("b", 2, 5.0, 29.5), image_writes_skipped=True)])]
    _, _, a, _ = across_steps_table(skipped)
    assert a.split(" | ")[1:3] == ["3 (1 at once or without image writes: quality only)", "10.50"]
    # runs at two training resolutions are two comparisons
    mixed = steps[:2] + [_wallclock_step("seed2", [dict(run("a", 2, 9.0, 30.0), train_image_size=[960, 540])])]
    mixed[0]["result"]["runs"][0]["train_image_size"] = [1920, 1080]
    assert across_steps_table(mixed) == ["Not pooled over the steps: their runs trained at different resolutions "
                                         "(960x540, 1920x1080)."]
    # a default run that pruned (bytesplat's Gaussian budget) and a run on another GPU each get their own row
    on_two_cards = [dict(step, result=dict(step["result"], device="H200")) for step in steps[:2]] + [
        _wallclock_step("seed2", [dict(run("a", 2, 5.0, 30.0), budget_removed=7), run("b", 2, 20.0, 29.5)])]
    on_two_cards[2]["result"]["device"] = "H100"
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ")[1] for line in across_steps_table(on_two_cards)[2:]}
    assert rows == {"a on H200": "2", "b on H200": "2", "a (budget) on H100": "1", "b on H100": "1"}
    # two steps that run the same method and seed are two configurations, not more samples
    assert across_steps_table([_wallclock_step("x", [run("a", 0, 1.0, 1.0)]),
                               _wallclock_step("y", [run("a", 0, 2.0, 2.0)])]) == []


def test_runs_with_steps_by_kind_get_a_table_of_them():
    from bytesplat_ns.bench.report import step_kinds_table

    def kinds(plain_ms, refine_s):
        return {"first": {"steps": 1, "median_ms": 900.0, "total_s": 0.9},
                "refine": {"steps": 41, "median_ms": 15.0, "total_s": refine_s},
                "plain": {"steps": 4958, "median_ms": plain_ms, "total_s": plain_ms * 4.958}}

    steps = [_wallclock_step(f"seed{s}", [{"method": "a", "seed": s, "step_kinds": kinds(3.0 + s, 0.5)},
                                          {"method": "b", "seed": s}]) for s in (0, 1)]
    header, _, a = step_kinds_table(steps)  # b recorded none: no row
    assert header.split(" | ")[2:5] == ["plain steps", "plain median ms", "plain total s"]
    assert a.split(" | ")[1:] == ["2", "4958", "3.50", "17.35", "0.90", "-", "-", "0.50", "- |"]
    assert step_kinds_table([_wallclock_step("x", [{"method": "b", "seed": 0}])]) == []


def test_an_incomplete_document_names_the_steps_not_run_yet():
    from bytesplat_ns.bench.report import steps_not_run, suite_section

    doc = {"suite": "gaussian-budget", "command": "c", "complete": False,
           "steps": [{"name": "capture_seeds", "command": "x", "status": "ok", "result": None}]}
    assert steps_not_run(doc) == ["capture_wall", "capture_wall_seed1", "capture_wall_seed2", "capture_seeds_3_5"]
    lines = suite_section(doc, Path("docs/results"), Path("docs"))
    assert any(line.startswith("- Not run yet: `capture_wall`") for line in lines)
    assert steps_not_run(dict(doc, complete=True)) == [] and steps_not_run(dict(doc, suite="no-such-suite")) == []


def test_a_suite_run_on_several_cards_names_each_in_its_header_and_steps():
    """A suite run in parts on different cards says so in its header and each step names its card; a step
    from before steps kept their card, whose result names none, counts as its document's."""
    from bytesplat_ns.bench.report import suite_section
    from bytesplat_ns.bench.suite_runner import steps_gpu

    steps = [{"name": "capture_seeds", "command": "x", "status": "ok", "result": {"device": "NVIDIA H200", "date": "d1"}},
             {"name": "capture_wall", "command": "y", "status": "ok", "result": {"device": "NVIDIA H100", "date": "d2"}},
             {"name": "capture_wall_seed1", "command": "z", "status": "ok", "date": "d3", "result": None}]
    doc = {"suite": "gaussian-budget", "command": "c", "complete": True, "gpu": "NVIDIA H100", "steps": steps}
    lines = suite_section(doc, Path("docs/results"), Path("docs"))
    assert any(line.startswith("- GPU: NVIDIA H200 and NVIDIA H100 (each step names its own);") for line in lines)
    assert "- Step `capture_seeds`: `x` (ok, d1, NVIDIA H200)" in lines
    assert "- Step `capture_wall`: `y` (ok, d2, NVIDIA H100)" in lines
    assert "- Step `capture_wall_seed1`: `z` (ok, d3, NVIDIA H100)" in lines
    # one card: the header names it and the steps do not repeat it
    lines = suite_section({**doc, "steps": steps[1:]}, Path("docs/results"), Path("docs"))
    assert any(line.startswith("- GPU: NVIDIA H100;") for line in lines)
    assert "- Step `capture_wall`: `y` (ok, d2)" in lines
    assert steps_gpu([], "NVIDIA H200") == "NVIDIA H200"
    assert steps_gpu([{"result": None, "gpu": "NVIDIA H100"}], "NVIDIA H200") == "NVIDIA H100"  # the suite run's card


def test_a_run_that_saw_other_gpu_processes_counts_for_quality_only():
    from bytesplat_ns.bench.gpu_sharing import runs_sharing_gpu

    assert runs_sharing_gpu({"concurrent_runs": 1}) == 1
    assert runs_sharing_gpu({"concurrent_runs": 1, "gpu_processes_max": 0}) == 1  # processes hidden: unknown
    assert runs_sharing_gpu({"concurrent_runs": 1, "gpu_processes_max": 3}) == 3
    assert runs_sharing_gpu({"concurrent_runs": 2, "gpu_processes_max": 1}) == 2


def test_a_document_run_in_parts_shows_the_whole_suites_command():
    from bytesplat_ns.bench.report import suite_command

    assert suite_command("bytesplat-bench suite raster-1080p --results-dir r") == "`bytesplat-bench suite raster-1080p --results-dir r`"
    part = ("bytesplat-bench suite wallclock-fox-30k --data .data/fox --only splatfacto_seed0 bytesplat_seed1 "
            "--results-dir /tmp/results --out-dir /tmp/suites/w --step-timeout 900")
    assert suite_command(part) == ("`bytesplat-bench suite wallclock-fox-30k --data .data/fox --step-timeout 900`, "
                                   "run in parts (`--only STEP`; each step's command below)")


def _step_row(name, wall, **extra):
    return {"name": name, "implementation": name, "num_gaussians": 1000, "wall_ms": wall, "gpu_busy_ms": wall - 0.5,
            "host_gaps_ms": 0.5, "stages_ms": {"rasterize+loss": wall - 1.0, "optimizer": 1.0},
            "kernel_categories_ms": {"render fwd": 1.0, "render bwd": 2.0}, **extra}


def test_the_step_table_shows_the_hosts_issue_time_where_it_was_measured():
    step = {"name": "s", "result": {"rows": [_step_row("bytesplat", 4.0, host_issue_ms=3.9,
                                                       host_issue_stages_ms={"rasterize+loss": 3.0, "optimizer": 0.9}),
                                             _step_row("older", 5.0),
                                             {"name": "broken", "num_gaussians": 1000, "error": "boom"}],
                                    "speedups": {"1000": {"vs older": 1.25}}}}
    lines = report.step_table([step])
    header = lines[0].split("|")
    assert "host issue ms" in lines[0] and header.index(" host issue ms ") == header.index(" host gaps ms ") + 1
    assert ("| 1k | bytesplat | 4.00 | 3.50 | 0.50 | 3.90 | rasterize+loss 3.00, optimizer 0.90 "
            "| rasterize+loss 3.00, optimizer 1.00 |") in lines[2]
    assert "| 1k | older | 5.00 | 4.50 | 0.50 | - | - | rasterize+loss 4.00, optimizer 1.00 |" in lines[3]
    assert lines[3].endswith("| 1.25x |")
    assert all(line.count("|") == lines[0].count("|") for line in lines)  # the error row keeps the columns


def test_the_permutation_p_value_counts_the_relabellings_at_least_as_far_apart():
    # [1, 2] vs [3, 4]: of the 6 ways to pick two of four, {1, 2} and {3, 4} differ by 2 in their means
    assert report.permutation_p([1.0, 2.0], [3.0, 4.0]) == pytest.approx(1 / 3)
    assert report.permutation_p([5.0, 5.0], [5.0, 5.0, 5.0]) == 1.0
    # too many relabellings to enumerate: seeded draws, the same answer every time
    far, near = [30.0 + 0.01 * i for i in range(20)], [20.0 + 0.01 * i for i in range(20)]
    assert report.permutation_p(far, near) == report.permutation_p(far, near) < 0.001
    mixed = [20.0 + 0.5 * i for i in range(40)]
    assert report.permutation_p(mixed[::2], mixed[1::2]) > 0.5


def _capture_step(name, data, runs):
    result = {"benchmark": "bytesplat-bench wallclock", "date": "2026-12-05 10:00 UTC", "runs": runs, "summary": {}}
    if data is not None:
        result["data"] = data
    return {"name": name, "command": "bytesplat-bench wallclock --seeds 0 1 2", "status": "ok", "result": result}


def test_quality_is_pooled_over_every_run_on_a_capture_against_splatfacto():
    run = lambda method, psnr, it=30000: {"method": method, "seed": 0, "iterations": it, "psnr": psnr, "ssim": 0.9}  # noqa: E731
    docs = [{"suite": "a", "steps": [_capture_step("s1", "/x/.data/fox", [run("bytesplat", 28.0), run("splatfacto", 29.0),
                                                                           run("bytesplat", 27.0, 5000)])]},
            {"suite": "b", "steps": [_capture_step("s2", "/y/fox", [run("bytesplat", 27.0), run("splatfacto", 30.0),
                                                                    {"method": "bytesplat", "iterations": 30000}]),
                                     _capture_step("builtin", None, [run("bytesplat", 40.0)])]}]
    lines = report.pooled_quality_table(docs)
    assert len(lines) == 2 + 3  # fox 5000 bytesplat, fox 30000 bytesplat and splatfacto; no built-in scene, no eval-less run
    by_method = {line.split(" | ")[1:3][1]: line for line in lines[2:] if "| 30000 |" in line}
    assert "| fox | 30000 | bytesplat | 2 | 27.50 | 27.50 | 0.71 | 27.00-28.00 | 0.9000 | -2.00 | 0.33 |" == by_method["bytesplat"]
    assert by_method["splatfacto"].endswith("| - | - |")
    assert "| fox | 5000 | bytesplat | 1 | 27.00 | 27.00 | - | 27.00-27.00 | 0.9000 | - | - |" in lines
    # a default run that pruned with the Gaussian budget is its own group; a labelled budget run stays under its label
    docs[0]["steps"][0]["result"]["runs"] += [dict(run("bytesplat", 29.0), budget_removed=90000),
                                              dict(run("budget40", 29.5), budget_removed=91000),
                                              dict(run("bytesplat", 26.0), budget_removed=0)]
    by_method = {line.split(" | ")[2]: line for line in report.pooled_quality_table(docs)[2:] if "| 30000 |" in line}
    assert sorted(by_method) == ["budget40", "bytesplat", "bytesplat (budget)", "splatfacto"]
    assert "| bytesplat (budget) | 1 | 29.00 |" in by_method["bytesplat (budget)"]
    assert "| bytesplat | 3 | 27.00 |" in by_method["bytesplat"]


def test_profile_runs_get_a_table_of_the_loop_bodys_host_time():
    run = {"label": "bytesplat", "num_gaussians": 200_000, "wall_ms_per_iteration": 5.0, "wall_ms_median": 4.0,
           "wall_ms_quartiles": [3.8, 4.0, 4.7], "device_busy_ms_per_iteration": 2.5,
           "syncs_per_iteration": {"cudaStreamSynchronize": 1.0, "cudaDeviceSynchronize": 0.04},
           "python_top": {"self": [{"function": "<method 'run_backward' of 'torch._C._EngineBase' objects>", "self_ms": 1.0},
                                   {"function": "<built-in method bytesplat_cuda_90_x.bin_tiles>", "self_ms": 0.5},
                                   {"function": "bytesplat_ns/model.py:103 viewmat", "self_ms": 0.4}], "total": []}}
    step = {"name": "loop", "status": "ok", "result": {"benchmark": "bytesplat-bench profile", "runs": [run]}}
    assert report._kind(step["result"]) == "profile"
    lines = report.profile_table([step])
    assert lines[2] == ("| bytesplat | 200k | 4.00 | 3.80-4.70 | 5.00 | 2.50 | 1.04 | run_backward 1.00; "
                        "bytesplat_cuda_90_x.bin_tiles 0.50; viewmat 0.40 |")


def test_runs_that_profiled_a_window_of_steps_get_a_row_each():
    from bytesplat_ns.bench.report import step_profile_table

    profile = {"steps": [2000, 2100], "wall_ms_per_step": 6.5, "device_busy_ms_per_step": 1.16,
               "kernel_launches_per_step": 96.2, "syncs_per_step": {"cudaStreamSynchronize": 2.33, "cudaEventSynchronize": 0.11},
               "host_top_ops_ms_per_step": {"aten::empty": 0.21, "cudaLaunchKernel": 0.72, "cudaHostAlloc": 0.47, "aten::mul": 0.09}}
    kinds = {"plain": {"steps": 4907, "median_ms": 4.34, "total_s": 23.96}}
    steps = [_wallclock_step("window_2000", [{"method": "a", "seed": 0, "step_profile": profile, "step_kinds": kinds}]),
             _wallclock_step("plain", [{"method": "a", "seed": 1}])]
    header, _, row = step_profile_table(steps)  # the run without a profile: no row
    assert header.split(" | ")[1:3] == ["steps", "plain step median ms (whole run)"]
    assert row.split(" | ")[:7] == ["| window_2000: a", "2000-2099", "4.34", "6.50", "1.16", "96.2", "2.44"]
    assert row.split(" | ")[7] == "cudaLaunchKernel 0.72; cudaHostAlloc 0.47; aten::empty 0.21 |"
    assert step_profile_table([_wallclock_step("x", [{"method": "a", "seed": 0}])]) == []
