"""bytesplat-bench suite: the declared suites match their subcommands, and a tiny suite runs end to end on
the CPU into one merged JSON document with its plots."""

import json
import multiprocessing
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bytesplat_ns.bench import suite_runner
from bytesplat_ns.bench.commands import STEP_COMMANDS, step_parser
from bytesplat_ns.bench.suites import SUITES, Step, Suite
from bytesplat_ns.errors import BytesplatError

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_suites():
    """The suites named in the last column of the README's results table."""
    section = README.read_text().split("## Results", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| what")]
    return {name for row in rows for name in re.findall(r"`([a-z0-9-]+)`", row.rstrip(" |").rsplit("|", 1)[-1])}


def test_the_readme_figures_have_suites():
    named = readme_suites()
    assert {"wallclock-fox-seeds", "raster-baselines", "step-baselines", "dram-traffic"} <= named
    assert named <= set(SUITES), f"README names suites that do not exist: {sorted(named - set(SUITES))}"
    for suite in SUITES.values():
        assert suite.steps and suite.purpose and "\n" not in suite.purpose


@pytest.mark.parametrize("name", sorted(SUITES))
def test_every_step_parses_with_its_subcommands_parser(name, tmp_path):
    suite = SUITES[name]
    data = tmp_path / "data" if suite.needs_data else None
    for piece, step in zip(suite_runner.plan(suite, tmp_path, data), suite.steps):
        assert step.command in STEP_COMMANDS
        args = piece.argv[piece.argv.index("bytesplat_ns.bench.cli") + 2:]
        ns = step_parser(step.command).parse_args(args)  # argparse exits (SystemExit) on a bad option
        assert "{" not in " ".join(args)  # every placeholder filled in
        out = (tmp_path / piece.output).resolve()
        assert Path(ns.out_dir) == out.parent if step.command == "matrix" else Path(ns.out) == out


def test_a_matrix_step_writes_a_folder_indexed_by_its_matrix_json(tmp_path):
    suite = Suite("m", "a matrix step", 0, (Step("matrix", ("--benchmarks", "raster", "--dry-run"), name="mx"),))
    (piece,) = suite_runner.plan(suite, tmp_path, None)
    args = piece.argv[piece.argv.index("bytesplat_ns.bench.cli") + 2:]
    assert step_parser("matrix").parse_args(args).out_dir == (tmp_path / "steps" / "mx").resolve()
    assert piece.output == "steps/mx/matrix.json"


def test_a_suite_that_needs_data_says_so(tmp_path):
    """And what --data is for that suite: a capture, or for the baselines' suites gsplat 1.5.3's install folder."""
    with pytest.raises(BytesplatError, match="needs --data: the capture"):
        suite_runner.plan(SUITES["wallclock-fox"], tmp_path, None)
    with pytest.raises(BytesplatError, match="needs --data: the folder gsplat 1.5.3 is pip-installed into"):
        suite_runner.plan(SUITES["step-baselines"], tmp_path, None)


def test_a_bad_step_option_is_caught_by_the_subcommands_parser(tmp_path):
    with pytest.raises(SystemExit):
        step_parser("raster").parse_args(["--no-such-option"])


def test_list_and_dry_run_print_the_suites_and_their_commands():
    run = subprocess.run([sys.executable, "-m", "bytesplat_ns.bench.cli", "suite", "--list"], capture_output=True, text=True)
    assert run.returncode == 0
    assert all(name in run.stdout for name in SUITES)
    run = subprocess.run([sys.executable, "-m", "bytesplat_ns.bench.cli", "suite", "capacity", "--dry-run"],
                         capture_output=True, text=True)
    assert run.returncode == 0
    assert "--num-gaussians 125000000" in run.stdout and "torchrun --standalone --nproc-per-node 2" in run.stdout


def test_an_unknown_suite_is_one_error_line():
    run = subprocess.run([sys.executable, "-m", "bytesplat_ns.bench.cli", "suite", "no-such-suite"],
                         capture_output=True, text=True)
    assert run.returncode != 0
    assert "bytesplat: error: unknown suite 'no-such-suite'" in run.stderr and "Traceback" not in run.stderr


def test_a_tiny_suite_runs_end_to_end_on_the_cpu(tmp_path):
    tiny = "--num-gaussians 1500 --width 48 --height 32 --views 2 --warmup 1 --repeats 1 --device cpu --skip-gsplat"
    suite = Suite("tiny", "two CPU runs of the distributed benchmark, side by side", 0, (
        Step("distributed", tuple(tiny.split()) + ("--seed", "1"), name="a", group="both"),
        Step("distributed", tuple(tiny.split()) + ("--seed", "2"), name="b", group="both"),
        Step("distributed", tuple(tiny.split()) + ("--communicators", "no-such-communicator"), name="bad"),
    ))
    doc = suite_runner.run_suite(suite, tmp_path / "out", tmp_path / "results", command="test", log=lambda *_: None)
    written = json.loads((tmp_path / "results" / "tiny.json").read_text())
    assert written == json.loads(json.dumps(doc))
    assert written["suite"] == "tiny" and written["gpu"] == "cpu" and written["versions"]["torch"]
    assert [s["status"] for s in written["steps"]] == ["ok", "ok", "failed"]
    assert written["complete"] is False
    a, b = (s["result"] for s in written["steps"][:2])
    assert a["benchmark"] == "bytesplat-bench distributed" and a["scene"]["seed"] == 1 and b["scene"]["seed"] == 2
    assert all(r["status"] == "ok" and r["views_per_second"] > 0 for r in a["results"])
    assert written["steps"][0]["command"].startswith("bytesplat-bench distributed --num-gaussians 1500")
    assert "invalid choice" in written["steps"][2]["stderr_tail"]
    assert written["plots"] and all((tmp_path / "results" / p).is_file() for p in written["plots"])


def test_a_rerun_of_a_whole_suite_keeps_the_documents_notes(tmp_path):
    tiny = "--num-gaussians 300 --width 16 --height 16 --views 2 --warmup 1 --repeats 1 --device cpu --skip-gsplat"
    suite = Suite("tiny-notes", "one CPU run", 0, (Step("distributed", tuple(tiny.split()), name="a"),))
    results = tmp_path / "results"
    first = suite_runner.run_suite(suite, tmp_path / "out", results, command="test", log=lambda *_: None)
    assert "notes" not in first
    path = results / "tiny-notes.json"
    written = json.loads(path.read_text())
    written["notes"] = ["how the baseline was installed"]
    path.write_text(json.dumps(written))
    again = suite_runner.run_suite(suite, tmp_path / "out", results, command="test", log=lambda *_: None)
    assert again["notes"] == ["how the baseline was installed"]
    assert json.loads(path.read_text())["notes"] == ["how the baseline was installed"]
    assert again["date"] and [s["status"] for s in again["steps"]] == ["ok"]


def test_wallclock_suites_list_their_runs_at_the_top_level():
    run = {"method": "bytesplat", "seed": 0, "iterations": 5000, "wall_s": 60.0, "steps_s": 30.0, "psnr": 28.1, "ssim": 0.88}
    steps = [{"name": "w", "result": {"benchmark": "bytesplat-bench wallclock", "runs": [run]}},
             {"name": "r", "result": {"benchmark": "raster", "runs": [{"num_gaussians": 1}]}}, {"name": "x", "result": None}]
    assert suite_runner.wallclock_runs(steps) == {"runs": [run]}
    assert suite_runner.wallclock_runs(steps[1:]) == {}


def test_only_selects_steps_by_name_and_rejects_unknown_ones():
    from bytesplat_ns.bench.suite_runner import select_steps
    from bytesplat_ns.errors import BytesplatError

    suite = SUITES["wallclock-fox-seeds"]
    picked = select_steps(suite, ["bytesplat_seed2", "bytesplat_seed0"])
    assert [step.name for step in picked.steps] == ["bytesplat_seed0", "bytesplat_seed2"]
    assert select_steps(suite, None) is suite
    with pytest.raises(BytesplatError, match="no step nope"):
        select_steps(suite, ["nope"])
    run = subprocess.run([sys.executable, "-m", "bytesplat_ns.bench.cli", "suite", "wallclock-fox-seeds", "--data", ".",
                          "--dry-run", "--only", "splatfacto_seed0"], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.count("bytesplat-bench wallclock") == 1 and "--methods splatfacto" in run.stdout


def test_only_completes_a_suite_over_several_runs(tmp_path):
    tiny = "--num-gaussians 1500 --width 48 --height 32 --views 2 --warmup 1 --repeats 1 --device cpu --skip-gsplat"
    whole = Suite("tiny2", "a suite run one step at a time", 0, (
        Step("distributed", tuple(tiny.split()) + ("--seed", "1"), name="first"),
        Step("distributed", tuple(tiny.split()) + ("--seed", "2"))))
    out, results = tmp_path / "out", tmp_path / "results"

    def run(names):
        return suite_runner.run_suite(suite_runner.select_steps(whole, names), out, results, command="test",
                                      log=lambda *_: None, whole=whole)

    second = suite_runner.step_name(2, whole.steps[1])
    doc = run([second])
    assert [s["name"] for s in doc["steps"]] == [second] and doc["complete"] is False
    doc = run(["first"])  # the second step's result from the document above is kept, in the suite's order
    assert [s["name"] for s in doc["steps"]] == ["first", second] and doc["complete"] is True
    assert [s["result"]["scene"]["seed"] for s in doc["steps"]] == [1, 2] and all(s["date"] for s in doc["steps"])
    assert json.loads((results / "tiny2.json").read_text())["complete"] is True
    # an earlier run's figure stays listed while its file is there; one whose file is gone is dropped
    (results / "plots" / "tiny2" / "kept.png").write_bytes(b"png")
    listed = json.loads((results / "tiny2.json").read_text())
    listed["plots"] += ["plots/tiny2/kept.png", "plots/tiny2/gone.png"]
    (results / "tiny2.json").write_text(json.dumps(listed))
    plots = run(["first"])["plots"]
    assert "plots/tiny2/kept.png" in plots and "plots/tiny2/gone.png" not in plots
    assert len(plots) == len(set(plots)) and all((results / p).is_file() for p in plots)
    (results / "tiny2.json").write_text(json.dumps({"suite": "another", "steps": doc["steps"]}))
    assert [s["name"] for s in run(["first"])["steps"]] == ["first"]  # another suite's document is not merged


def _wallclock_run(method, seed, wall, **extra):
    return {"method": method, "seed": seed, "iterations": 5000, "wall_s": wall, "steps_s": wall / 2,
            "startup_s": 5.0, "psnr": 28.0, "ssim": 0.88, **extra}


def test_the_wallclock_figure_draws_only_the_runs_that_had_the_gpu_alone(tmp_path, monkeypatch):
    from bytesplat_ns.bench import wallclock

    doc = {"gpu": "NVIDIA H200", "runs": [
        _wallclock_run("bytesplat", 0, 40.0, concurrent_runs=1, gpu_processes_max=1),
        _wallclock_run("bytesplat", 1, 60.0, gpu_processes_max=0),  # processes hidden: counted as alone
        _wallclock_run("bytesplat", 2, 500.0, concurrent_runs=2),  # --parallel 2
        _wallclock_run("splatfacto", 0, 180.0, gpu_processes_max=3),  # another job beside it
        _wallclock_run("splatfacto", 1, 170.0),
        {**_wallclock_run("splatfacto", 2, 1.0), "error": "ns-train exited with 1"}]}
    path = suite_runner.wallclock_figure(doc, tmp_path / "plots")
    assert path == tmp_path / "plots" / suite_runner.WALLCLOCK_FIGURE and path.stat().st_size > 1000
    seen = {}
    monkeypatch.setattr(wallclock, "plot_breakdown", lambda summary, p, title: seen.update(summary=summary, title=title))
    suite_runner.wallclock_figure(doc, tmp_path / "plots")
    assert seen["summary"]["bytesplat"]["runs"] == 2 and seen["summary"]["bytesplat"]["wall_s"]["mean"] == 50.0
    assert seen["summary"]["splatfacto"]["runs"] == 1 and seen["summary"]["splatfacto"]["wall_s"]["mean"] == 170.0
    assert "3 of 5 runs" in seen["title"] and "NVIDIA H200" in seen["title"]
    assert suite_runner.wallclock_figure({"runs": doc["runs"][2:4]}, tmp_path / "none") is None
    assert not (tmp_path / "none").exists()


def test_replot_lists_the_wallclock_figure_in_the_committed_document(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    doc = {"suite": "wallclock-fox-seeds", "gpu": "NVIDIA H200", "steps": [], "plots": ["plots/wallclock-fox-seeds/other.png"],
           "runs": [_wallclock_run("bytesplat", 0, 40.0), _wallclock_run("splatfacto", 0, 180.0)]}
    (results / "wallclock-fox-seeds.json").write_text(json.dumps(doc))
    run = subprocess.run([sys.executable, "-m", "bytesplat_ns.bench.cli", "suite", "wallclock-fox-seeds", "--replot",
                          "--results-dir", str(results)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    written = json.loads((results / "wallclock-fox-seeds.json").read_text())
    assert written["plots"] == ["plots/wallclock-fox-seeds/other.png", "plots/wallclock-fox-seeds/wallclock_breakdown.png"]
    assert (results / "plots" / "wallclock-fox-seeds" / "wallclock_breakdown.png").is_file()
    assert {k: v for k, v in written.items() if k != "plots"} == {k: v for k, v in doc.items() if k != "plots"}
    with pytest.raises(BytesplatError, match="no document of suite 'wallclock-fox-30k'"):
        suite_runner.replot("wallclock-fox-30k", results)
    (results / "wallclock-fox-30k.json").write_text(json.dumps({"suite": "wallclock-fox-30k", "steps": [],
                                                                "runs": [_wallclock_run("splatfacto", 1, 900.0, concurrent_runs=2)]}))
    with pytest.raises(BytesplatError, match="no wall-clock run that had the GPU alone"):
        suite_runner.replot("wallclock-fox-30k", results)


def _fake_step_process(piece, out_dir, timeout):
    """run_piece without a process: the step's output appears at once (its seed is in its name)."""
    output = out_dir / piece.output
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps({"benchmark": "fake", "step": piece.name}))
    piece.status, piece.seconds = "ok", 0.0


def _only_run_with_a_slow_read(whole, name, out, results, ready, go):
    """One ``--only`` run whose read of the earlier document takes half a second: without the lock,
    runs started together all read before any of them writes."""
    read = suite_runner.earlier_document

    def slow_read(path, suite):
        doc = read(path, suite)
        time.sleep(0.5)
        return doc

    suite_runner.run_piece = _fake_step_process
    suite_runner.earlier_document = slow_read
    ready.put(name)
    go.wait()
    suite_runner.run_suite(suite_runner.select_steps(whole, [name]), out, results, command="test",
                           log=lambda *_: None, whole=whole, plots=False)


def test_only_runs_at_the_same_time_share_one_results_folder(tmp_path):
    names = ["s0", "s1", "s2"]
    whole = Suite("shared", "three steps, each run by its own process at once", 0,
                  tuple(Step("distributed", ("--seed", str(i)), name=n) for i, n in enumerate(names)))
    results = tmp_path / "results"
    context = multiprocessing.get_context("fork")
    ready, go = context.Queue(), context.Event()
    children = [context.Process(target=_only_run_with_a_slow_read,
                                args=(whole, n, tmp_path / f"out-{n}", results, ready, go)) for n in names]
    for child in children:
        child.start()
    for _ in names:
        ready.get(timeout=60)
    go.set()
    for child in children:
        child.join(60)
    assert [child.exitcode for child in children] == [0, 0, 0]
    doc = json.loads((results / "shared.json").read_text())
    assert [s["name"] for s in doc["steps"]] == names and doc["complete"] is True
    assert [s["result"]["step"] for s in doc["steps"]] == names
    assert sorted(p.name for p in results.iterdir()) == ["shared.json", "shared.json.lock"]  # no partial file left


def _quality_step(name, seed, date):
    run = _wallclock_run("splatfacto", seed, 1000.0, iterations=30000, image_writes_skipped=True)
    return {"name": name, "command": "c", "status": "ok", "seconds": 1.0, "date": date,
            "result": {"benchmark": "bytesplat-bench wallclock", "runs": [run]}}


def test_merge_folds_documents_of_other_results_folders_into_one(tmp_path):
    suite = "wallclock-fox-30k"
    target, a, b = tmp_path / "docs", tmp_path / "a", tmp_path / "b"
    for folder in (target, a, b):
        folder.mkdir()
    alone = {"name": "splatfacto_seed0", "command": "c", "status": "ok", "seconds": 1.0, "date": "2026-12-03 14:49 UTC",
             "result": {"benchmark": "bytesplat-bench wallclock", "runs": [_wallclock_run("splatfacto", 0, 1070.0)]}}
    (target / f"{suite}.json").write_text(json.dumps({"suite": suite, "purpose": "old words", "gpu": "NVIDIA H200",
                                                      "date": "2026-12-03 14:49 UTC", "steps": [alone], "plots": []}))
    (a / f"{suite}.json").write_text(json.dumps({"suite": suite, "gpu": "other", "date": "2026-12-04 13:50 UTC",
                                                 "steps": [_quality_step("splatfacto_seed2_quality", 2, None)]}))
    (b / f"{suite}.json").write_text(json.dumps({"suite": suite, "date": "2026-12-04 13:51 UTC",
                                                 "steps": [_quality_step("splatfacto_seed1_quality", 1, "2026-12-04 13:52 UTC")]}))
    run = subprocess.run([sys.executable, "-m", "bytesplat_ns.bench.cli", "suite", suite, "--merge",
                          str(a / f"{suite}.json"), str(b / f"{suite}.json"), "--results-dir", str(target)],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    doc = json.loads((target / f"{suite}.json").read_text())
    assert [s["name"] for s in doc["steps"]] == ["splatfacto_seed0", "splatfacto_seed1_quality", "splatfacto_seed2_quality"]
    assert [s["date"] for s in doc["steps"]] == ["2026-12-03 14:49 UTC", "2026-12-04 13:52 UTC", "2026-12-04 13:50 UTC"]
    assert doc["date"] == "2026-12-04 13:52 UTC" and doc["complete"] is False
    # each step keeps the card of the document it came from (b names none: the header counts it as the target's)
    assert [s["gpu"] for s in doc["steps"]] == ["NVIDIA H200", None, "other"] and doc["gpu"] == "NVIDIA H200"
    assert suite_runner.steps_gpu(doc["steps"], doc["gpu"]) == "NVIDIA H200 and other (each step names its own)"
    assert doc["purpose"] == SUITES[suite].purpose
    assert [(r["seed"], r["wall_s"]) for r in doc["runs"]] == [(0, 1070.0), (1, 1000.0), (2, 1000.0)]
    # the figure draws the run that had the GPU alone, not the quality-only ones
    assert doc["plots"] == [f"plots/{suite}/wallclock_breakdown.png"] and (target / doc["plots"][0]).is_file()
    with pytest.raises(BytesplatError, match="is not a document of suite 'wallclock-fox-30k'"):
        suite_runner.merge_documents(suite, [tmp_path / "nowhere.json"], target)
    (a / "other.json").write_text(json.dumps({"suite": suite, "steps": [_quality_step("seed9", 9, None)]}))
    with pytest.raises(BytesplatError, match="does not declare: seed9"):
        suite_runner.merge_documents(suite, [a / "other.json"], target)
    (a / "empty.json").write_text(json.dumps({"suite": suite, "date": "2026-12-04 14:00 UTC", "steps": []}))
    empty = suite_runner.merge_documents(suite, [a / "empty.json"], tmp_path / "fresh", plots=False)
    assert empty["steps"] == [] and empty["date"] == "2026-12-04 14:00 UTC" and empty["complete"] is False
    run = subprocess.run([sys.executable, "-m", "bytesplat_ns.bench.cli", "suite", suite, "--merge", str(a / "other.json")],
                         capture_output=True, text=True)
    assert run.returncode != 0 and "bytesplat: error: --merge needs --results-dir" in run.stderr


def test_a_merge_that_replaces_every_step_takes_the_sources_header(tmp_path):
    """The header is the target's while an earlier step stays (its card and versions; the page names both cards
    from the steps'), the source's once every step was run again (here on another card)."""
    suite = "wallclock-fox-30k"
    target, a = tmp_path / "docs", tmp_path / "a"
    target.mkdir(), a.mkdir()
    old = _quality_step("splatfacto_seed1_quality", 1, "2026-12-03 14:49 UTC")
    (target / f"{suite}.json").write_text(json.dumps({"suite": suite, "gpu": "NVIDIA H200", "versions": {"torch": "old"},
                                                      "date": "2026-12-03 14:49 UTC", "steps": [old],
                                                      "notes": ["by hand"]}))
    (a / f"{suite}.json").write_text(json.dumps({"suite": suite, "gpu": "NVIDIA H100", "versions": {"torch": "new"},
                                                 "date": "2026-12-07 13:30 UTC",
                                                 "steps": [_quality_step("splatfacto_seed2_quality", 2, None)]}))
    kept = suite_runner.merge_documents(suite, [a / f"{suite}.json"], target, plots=False)
    assert kept["gpu"] == "NVIDIA H200" and kept["versions"] == {"torch": "old"}
    assert [s["gpu"] for s in kept["steps"]] == ["NVIDIA H200", "NVIDIA H100"]
    assert suite_runner.steps_gpu(kept["steps"], kept["gpu"]) == "NVIDIA H200 and NVIDIA H100 (each step names its own)"
    (a / f"{suite}.json").write_text(json.dumps({"suite": suite, "gpu": "NVIDIA H100", "versions": {"torch": "new"},
                                                 "date": "2026-12-07 13:30 UTC",
                                                 "steps": [_quality_step("splatfacto_seed1_quality", 1, None),
                                                           _quality_step("splatfacto_seed2_quality", 2, None)]}))
    replaced = suite_runner.merge_documents(suite, [a / f"{suite}.json"], target, plots=False)
    assert replaced["gpu"] == "NVIDIA H100" and replaced["versions"] == {"torch": "new"}
    assert replaced["notes"] == ["by hand"]  # the notes are the target's whichever header is taken
    assert [s["name"] for s in replaced["steps"]] == ["splatfacto_seed1_quality", "splatfacto_seed2_quality"]


def test_the_page_names_a_steps_card_where_it_is_not_the_documents():
    from bytesplat_ns.bench.report import _step_gpu

    doc = {"gpu": "NVIDIA H200"}
    assert _step_gpu({"result": {"gpu": "NVIDIA H100 80GB HBM3"}}, doc) == "NVIDIA H100 80GB HBM3"  # bytesplat-bench raster
    assert _step_gpu({"result": {"device": "NVIDIA H100 80GB HBM3"}}, doc) == "NVIDIA H100 80GB HBM3"
    assert _step_gpu({"result": {"gpu": "NVIDIA H200"}}, doc) is None and _step_gpu({"result": None}, doc) is None
    assert _step_gpu({"result": None, "gpu": "NVIDIA H100 80GB HBM3"}, doc) == "NVIDIA H100 80GB HBM3"  # the suite run's

