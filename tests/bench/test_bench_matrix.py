"""``bytesplat-bench plots`` and ``bytesplat-bench matrix`` on the CPU.

plots: the committed GPU results in docs/results/ (one step of each kind) give non-empty PNG
figures, each kind's own, and a file that is not JSON (or lacks its kind's fields) is an error
naming it. matrix: a tiny matrix (small scene, 3 iterations, 1200 Gaussians at 40x28, 1 and 2 gloo
ranks) runs its pieces as subprocesses, records raster (no CUDA) and the gsplat-backed method as
skipped with the reason, keeps going past a piece that fails (its stderr tail in matrix.json), and
plots what the others wrote.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bytesplat_ns.bench.cli import main as cli_main
from bytesplat_ns.bench.plots import PlotInputError, detect_kind, load, plot_inputs
from tests.helpers.results_data import NS_EVAL_OUTPUT, step_file

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _pngs(paths):
    paths = list(paths)
    for p in paths:
        data = Path(p).read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 5000, p
    return sorted(Path(p).name for p in paths)


def _committed(folder: Path):
    """One committed result of each kind: raster, distributed (1M and 4M), train."""
    return [step_file(folder, "raster-1080p", "raster_1"), step_file(folder, "distributed-scaling", "scaling_v8"),
            step_file(folder, "train-quality", "train_medium")]


def test_detects_each_kind_from_content(tmp_path):
    raster, distributed, train = _committed(tmp_path)
    assert load(raster)[0] == "raster"
    assert load(distributed)[0] == "distributed"
    assert load(train)[0] == "train"
    assert detect_kind(NS_EVAL_OUTPUT) is None  # ns-eval output: not ours
    assert detect_kind([1, 2]) is None


def test_plots_from_the_committed_gpu_results(tmp_path, capsys):
    inputs = _committed(tmp_path / "in")
    tmp_path = tmp_path / "out"
    assert cli_main(["plots", "--inputs", *map(str, inputs), "--out-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    names = _pngs(tmp_path.glob("*.png"))
    assert len(names) == 4, names
    assert [n.split("_nvidia")[0] for n in names] == [
        "distributed_bytes_per_step", "distributed_scaling", "raster_time_per_stage", "train_psnr_time"]
    for n in names:
        assert f"wrote {tmp_path / n}" in out
    assert "no tile occupancy logged" in out  # that training run did not log it: a message, no figure


CAPACITY = ["capacity_1gpu_62m", "capacity_1gpu_75m", "capacity_2gpu_125m", "capacity_pixel_140m"]


def test_a_capacity_sweep_gets_a_figure_against_the_gaussian_count(tmp_path):
    """Three or more counts at one setting: views/s and peak memory against the count (the 75M
    file's two out-of-memory rows become crosses); two counts (the matrix's 1M and 4M) do not."""
    inputs = [step_file(tmp_path / "in", "capacity", s) for s in CAPACITY]
    written = plot_inputs(inputs, tmp_path / "sweep", log=lambda _: None)
    assert "distributed_counts_nvidia-h200_1920x1080_4views.png" in _pngs(written)
    two = step_file(tmp_path / "in", "distributed-scaling", "scaling_v8")
    written = plot_inputs([two], tmp_path / "two", log=lambda _: None)
    assert not [p for p in written if p.name.startswith("distributed_counts")]


def test_growing_counts_figures_keep_every_count_on_log_axes(tmp_path, monkeypatch):
    """The one-job sweep of 1M-140M (docs/results/distributed-counts.json): views/s on log axes whose
    range holds every count, the 140M out-of-memory rows included; bytes per step on a log axis, so
    the pixel exchange's ~80 MB bars stay visible next to 10 GB ones."""
    from bytesplat_ns.bench import plots

    axes_of = {}
    real_save = plots._save

    def save(fig, out_dir, name, written):
        axes_of[name.split("_nvidia")[0]] = [(a.get_xscale(), a.get_yscale(), a.get_xlim(), a.get_ylim()) for a in fig.axes]
        real_save(fig, out_dir, name, written)

    monkeypatch.setattr(plots, "_save", save)
    counts = [1_000_000, 4_000_000, 16_000_000, 50_000_000, 100_000_000, 125_000_000, 140_000_000]
    inputs = [step_file(tmp_path / "in", "distributed-counts", f"counts_{n}") for n in counts]
    plot_inputs(inputs, tmp_path / "out", log=lambda _: None)
    (xs, ys, xlim, ylim), (xs_mem, _, xlim_mem, _) = axes_of["distributed_counts"]
    assert (xs, ys, xs_mem) == ("log", "log", "log")
    for lo, hi in (xlim, xlim_mem):
        assert 0 < lo < 1e6 and hi > 140e6
    assert 0 < ylim[0] < 5 and ylim[1] > 200  # 4.8 views/s at 140M (pixel) .. 222 at 1M (dense)
    assert [a[1] for a in axes_of["distributed_bytes_per_step"]] == ["log", "log"]


def test_a_folder_skips_other_json_and_absent_kinds(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "eval.json").write_text(json.dumps(NS_EVAL_OUTPUT))
    step_file(tmp_path / "in", "raster-1080p", "raster_1")
    messages = []
    written = plot_inputs([tmp_path / "in"], tmp_path / "out", log=messages.append)
    assert [p.name for p in written] == ["raster_time_per_stage_nvidia-h200_1920x1080.png"]
    text = "\n".join(messages)
    assert "eval.json: not a bytesplat-bench result" in text
    assert "no distributed benchmark among the inputs" in text and "no train benchmark among the inputs" in text


def test_malformed_json_is_an_error_naming_the_file(tmp_path, capsys):
    bad = tmp_path / "broken.json"
    bad.write_text('{"benchmark": "raster", "runs": [')
    with pytest.raises(PlotInputError, match="broken.json: not valid JSON"):
        plot_inputs([bad], tmp_path / "out")
    assert cli_main(["plots", "--inputs", str(bad), "--out-dir", str(tmp_path / "out")]) == 1
    assert "broken.json: not valid JSON" in capsys.readouterr().err
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps({"benchmark": "bytesplat-bench distributed", "results": [{"impl": "bytesplat"}]}))
    with pytest.raises(PlotInputError, match="partial.json: a distributed benchmark file without 'environment'"):
        plot_inputs([partial], tmp_path / "out")
    with pytest.raises(PlotInputError, match="no such file"):
        plot_inputs([tmp_path / "missing.json"], tmp_path / "out")


def test_matrix_on_cpu(tmp_path):
    out = tmp_path / "m"
    argv = ["matrix", "--out-dir", str(out), "--scene-sizes", "small", "--iterations", "3", "--num-downscales", "0",
            "--tile-stats-every", "1", "--methods", "bytesplat:reference@hw_prune_capacity=8", "splatfacto",
            "no-such-method", "--gaussians", "1200", "--ranks", "1", "2", "--width", "40", "--height", "28",
            "--views", "2", "--warmup", "0", "--repeats", "2", "--communicators", "dense", "sparse-grad"]
    assert cli_main(argv) == 1  # the no-such-method piece failed; the others still ran
    index = json.loads((out / "matrix.json").read_text())
    assert index["benchmark"] == "bytesplat-bench matrix" and index["complete"] is True
    assert index["environment"]["cuda"] is False
    pieces = {p["name"]: p for p in index["pieces"]}
    assert set(pieces) == {"raster_N1200", "train_small_bytesplat-reference-hw_prune_capacity-8",
                           "train_small_splatfacto", "train_small_no-such-method", "distributed_R1_N1200",
                           "distributed_R2_N1200"}

    raster = pieces["raster_N1200"]
    assert raster["status"] == "skipped" and "CUDA" in raster["reason"] and "output" not in raster
    assert pieces["train_small_splatfacto"]["status"] == "skipped" and "gsplat" in pieces["train_small_splatfacto"]["reason"]
    assert pieces["distributed_R1_N1200"]["status"] == "covered"

    train = pieces["train_small_bytesplat-reference-hw_prune_capacity-8"]
    dist = pieces["distributed_R2_N1200"]
    for p in (train, dist):
        assert p["status"] == "ok" and p["seconds"] > 0 and p["returncode"] == 0, p
        assert (out / p["output"]).exists() and "stderr_tail" not in p
    assert "torch.distributed.run --standalone --nproc-per-node 2 -m bytesplat_ns.bench.cli distributed" in dist["command"]
    assert "bytesplat_ns.bench.cli train --scene small --iterations 3" in train["command"]
    report = json.loads((out / dist["output"]).read_text())
    assert report["environment"]["world_size"] == 2
    assert {(r["impl"], r["ranks"], r["communicator"]) for r in report["results"] if r["status"] == "ok"} == {
        ("bytesplat", 1, "none (1 rank)"), ("bytesplat", 2, "dense"), ("bytesplat", 2, "sparse-grad")}
    run = json.loads((out / train["output"]).read_text())["runs"][0]
    assert run["iterations"] == 3 and run["tile_occupancy"]

    failed = pieces["train_small_no-such-method"]
    assert failed["status"] == "failed" and failed["returncode"] != 0
    assert "no-such-method" in failed["stderr_tail"] and "output" not in failed  # nothing was written
    assert index["summary"] == {"covered": 1, "failed": 1, "ok": 2, "skipped": 2}

    plots = sorted(Path(p).name.split("_cpu")[0] for p in index["plots"])
    assert plots == ["distributed_bytes_per_step", "distributed_scaling", "train_psnr_time", "train_tile_occupancy"]
    _pngs(out / p for p in index["plots"])


def test_matrix_dry_run_skips_ranks_beyond_the_gpus(tmp_path, monkeypatch):
    """The plan on a (pretend) 2-GPU machine: 4 ranks skipped, 1 rank covered by the 2-rank piece,
    raster and every method planned; nothing runs."""
    from bytesplat_ns.bench import matrix

    monkeypatch.setattr(matrix, "_machine", lambda: {"cuda": True, "gpu_count": 2, "devices": ["GPU", "GPU"]})
    assert matrix.main(["--dry-run", "--out-dir", str(tmp_path), "--ranks", "1", "2", "4", "--gaussians", "1000",
                        "--scene-sizes", "small"]) == 0
    pieces = {p["name"]: p for p in json.loads((tmp_path / "matrix.json").read_text())["pieces"]}
    assert pieces["distributed_R4_N1000"]["status"] == "skipped" and "2" in pieces["distributed_R4_N1000"]["reason"]
    assert pieces["distributed_R1_N1000"]["status"] == "covered"
    assert pieces["distributed_R2_N1000"]["status"] == "planned"
    assert pieces["raster_N1000"]["status"] == "planned"
    assert {n for n, p in pieces.items() if n.startswith("train_") and p["status"] == "planned"} == {
        "train_small_splatfacto", "train_small_bytesplat-gsplat", "train_small_bytesplat-fused"}
    assert not list(tmp_path.glob("*.png"))


def test_train_runs_of_one_label_in_two_files_are_both_plotted(tmp_path, monkeypatch):
    """Two files with a run of the same label on one scene (two calls' runs of one method): both
    bars are drawn, each named by its file; a label found in one file keeps its name."""
    from bytesplat_ns.bench import plots

    run = {"label": "bytesplat-fused", "iterations": 10, "ms_per_iteration": 5.0, "eval": {"psnr": 30.0}}
    data = {"environment": {"device": "cpu", "date": "d"}, "scene": "/x/large-1", "runs": [run]}
    other = dict(data, runs=[dict(run, ms_per_iteration=6.0), dict(run, label="splatfacto")])
    drawn = {}
    monkeypatch.setattr(plots, "_bars", lambda ax, groups, series, **kw: drawn.setdefault(kw["ylabel"], series))
    written = []
    plots.plot_train([(tmp_path / "call1.json", data), (tmp_path / "call2.json", other)], tmp_path, written)
    assert drawn["ms / iteration (wall)"] == {
        "bytesplat-fused (call1)": [5.0], "bytesplat-fused (call2)": [6.0], "splatfacto": [5.0]}
    assert [p.name for p in written] == ["train_psnr_time_cpu_large-1.png"]
