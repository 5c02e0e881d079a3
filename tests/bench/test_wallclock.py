"""``bytesplat-bench wallclock`` and its timing shim (issue 21, item 1), on CPU.

splatfacto in nerfstudio 1.1.5 rasterizes with gsplat's CUDA kernels only, so the end-to-end test
compares two configurations of bytesplat instead (the tool treats each entry as its own method).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
import torch
from PIL import Image

from bytesplat_ns.bench import wallclock
from bytesplat_ns.bench.timed_ns_train import CollectionTimer, PhaseTimers
from bytesplat_ns.errors import BytesplatError


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_phase_timers_are_exclusive():
    clock = FakeClock()
    timers = PhaseTimers(clock)

    def log():
        clock.now += 2.0

    def evaluate():
        clock.now += 1.0
        timed_log()
        clock.now += 3.0

    timed_log = timers.wrap("log", log, detail="put_scalar")
    timers.wrap("eval", evaluate)()
    assert timers.seconds["eval"] == pytest.approx(4.0)  # its own 1 + 3 s, not the nested log
    assert timers.seconds["log"] == pytest.approx(2.0)
    assert timers.calls == {"data": 0, "setup": 0, "steps": 0, "eval": 1, "log": 1, "save": 0}
    assert timers.detail == {"log:put_scalar": pytest.approx(2.0)}  # per named function, exclusive too


def test_collection_timer_counts_only_while_active():
    clock = FakeClock()
    timer = CollectionTimer(clock)
    for active, generation, seconds in ((False, 2, 5.0), (True, 2, 0.5), (True, 0, 0.25), (True, 2, 1.0)):
        timer.active = active
        timer("start", {"generation": generation})
        clock.now += seconds
        timer("stop", {"generation": generation, "collected": 0, "uncollectable": 0})
    timer.active = True
    timer("stop", {"generation": 1})  # a collection that started while inactive is not counted
    assert timer.summary() == {"collections": [1, 0, 2], "seconds": [0.25, 0.0, 1.5]}


def test_step_time_fields():
    fields = wallclock.step_time_fields([605.0] + [5.0] * 97 + [6.0, 50.0])
    assert fields["first_step_ms"] == 605.0 and fields["step_median_ms"] == 5.0 and fields["step_max_ms"] == 605.0 and fields["step_p90_ms"] == 5.0
    assert fields["slow_steps"] == 2 and fields["slow_steps_excess_s"] == pytest.approx((45.0 + 600.0) / 1000)
    assert wallclock.step_time_fields([]) == {}
    windows = wallclock.step_time_fields([2.0] * wallclock.STEP_WINDOW + [4.0, 3.0, 100.0])
    assert windows["step_median_ms_by_window"] == [2.0, 4.0]  # the last window is the steps left over


SCHEDULE = {"refine_every": 100, "refine_start_iter": 500, "refine_stop_iter": 15000, "reset_every": 3000,
            "pause_refine_after_reset": 0, "sh_degree": 3, "sh_degree_interval": 1000, "resolution_schedule": 3000,
            "num_downscales": 2, "steps_per_eval_image": 100, "steps_per_eval_all_images": 1000,
            "steps_per_eval_batch": 0, "start_step": 0}


def test_steps_by_kind_follow_splatfactos_schedule():
    kind = lambda step, **changes: wallclock.step_kind(step, {**SCHEDULE, **changes})  # noqa: E731
    assert kind(0) == "first" and kind(7000, start_step=7000) == "first"  # a resumed run's first step
    assert [kind(s) for s in (1000, 2000, 3000, 6000)] == ["schedule_change"] * 4  # SH 1..3 (and 1/2 resolution); full resolution
    assert kind(4000) == "refine"  # SH degree 3 already
    assert kind(9000) == "refine" and kind(9000, num_downscales=0) == "refine"  # SH at 3 already, no coarse start
    assert [kind(s) for s in (500, 600, 14900, 15000)] == ["plain", "refine", "refine", "plain"]  # after the warm-up, before the stop
    assert [kind(s) for s in (1, 101, 1001, 102)] == ["plain", "after_eval", "after_eval", "plain"]  # no eval at step 0
    # splatfacto's opacity reset every 3000 steps pauses densification for num_train_data + refine_every steps
    paused = dict(pause_refine_after_reset=150)
    assert [kind(s, **paused) for s in (3100, 3200, 6100, 2900)] == ["plain", "refine", "plain", "refine"]
    fields = wallclock.step_kind_fields([900.0, 3.0, 5.0, 4.0], {**SCHEDULE, "refine_every": 2, "refine_start_iter": 0})
    assert fields["step_kinds"] == {"first": {"steps": 1, "median_ms": 900.0, "total_s": 0.9},
                                    "refine": {"steps": 1, "median_ms": 5.0, "total_s": 0.005},
                                    "plain": {"steps": 2, "median_ms": 3.5, "total_s": 0.007}}
    assert wallclock.step_kind_fields([1.0], None) == {}  # a model without splatfacto's schedule


def test_steps_that_captured_a_cuda_graph_are_their_own_kind():
    captured = {0, 1000, 1001, 4000}  # bytesplat's --cuda-graph-steps: the trainer's capture steps
    kinds = [wallclock.step_kind(s, SCHEDULE, captured) for s in (0, 1000, 1001, 4000, 1002)]
    assert kinds == ["first", "capture", "capture", "capture", "plain"]  # a capture outranks the schedule's kinds
    fields = wallclock.step_kind_fields([900.0, 40.0, 3.0], SCHEDULE, [1])
    assert fields["step_kinds"] == {"first": {"steps": 1, "median_ms": 900.0, "total_s": 0.9},
                                    "capture": {"steps": 1, "median_ms": 40.0, "total_s": 0.04},
                                    "plain": {"steps": 1, "median_ms": 3.0, "total_s": 0.003}}


def test_a_profiled_window_must_lie_inside_the_run(tmp_path):
    from bytesplat_ns.bench.timed_ns_train import parse_own_arguments

    own, rest = parse_own_arguments(["--timings", "t.json", "--profile-steps", "20:30", "--", "bytesplat"])
    assert own.profile_steps == (20, 30) and rest == ["bytesplat"]
    for bad in ("30:20", "0:5", "5", "a:b"):
        with pytest.raises(SystemExit):
            parse_own_arguments(["--timings", "t.json", "--profile-steps", bad, "--", "bytesplat"])
    with pytest.raises(BytesplatError, match="does not reach"):
        wallclock.main(["--methods", "bytesplat", "--iterations", "30", "--profile-steps", "20:30",
                        "--work-dir", str(tmp_path), "--out", str(tmp_path / "w.json")])


def test_method_entries():
    assert wallclock.MethodEntry.parse("splatfacto") == wallclock.MethodEntry("splatfacto", "splatfacto", ())
    entry = wallclock.MethodEntry.parse("ref=bytesplat --pipeline.model.rasterizer reference")
    assert entry == wallclock.MethodEntry("ref", "bytesplat", ("--pipeline.model.rasterizer", "reference"))
    # an '=' inside an argument is not a label
    assert wallclock.MethodEntry.parse("bytesplat --x=1").label == "bytesplat"
    with pytest.raises(BytesplatError, match="names no method"):
        wallclock.MethodEntry.parse("ref=")


def test_failed_process_is_one_error_naming_its_log(tmp_path):
    log = tmp_path / "train.log"
    with pytest.raises(BytesplatError, match="exited with 3: boom") as error:
        wallclock._run_logged([sys.executable, "-c", "print('boom'); raise SystemExit(3)"], log)
    assert str(log) in str(error.value)


def test_two_configurations_end_to_end(tmp_path):
    scene = f"bytesplat-scene --num-views 10 --width 32 --scene-cache-dir {tmp_path / 'scenes'}"
    out = tmp_path / "wallclock.json"
    result = wallclock.main([
        "--methods", "ref=bytesplat --pipeline.model.rasterizer reference --steps-per-eval-image 2",
        "auto=bytesplat --steps-per-eval-image 2 --steps-per-eval-all-images 2",
        "--iterations", "3", "--seeds", "1", "--dataparser", scene, "--eval-rasterizers", "reference", "--profile-steps", "1:2",
        "--work-dir", str(tmp_path / "runs"), "--out", str(out),
    ])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    for key in ("torch", "nerfstudio", "gsplat", "device", "date", "command", "runs", "summary"):
        assert key in result
    assert [(r["method"], r["seed"], r["iterations"]) for r in result["runs"]] == [("ref", 1, 3), ("auto", 1, 3)]
    for run in result["runs"]:
        parts = [run[key] for key in wallclock.BREAKDOWN]
        assert sum(parts) == pytest.approx(run["wall_s"], abs=1e-6)
        assert all(part >= 0 for part in parts), run
        assert 0 <= run["exit_s"] <= run["other_s"]
        assert 0 <= run["train_untimed_s"] and run["exit_s"] + run["train_untimed_s"] <= run["other_s"] + 1e-6
        assert 0 <= run["loop_untimed_s"] <= run["train_untimed_s"] + 1e-6
        # what else ran on the host beside it (the CPU's load average, Linux has one)
        assert run["host_cpus"] == os.cpu_count() and run["host_load_max"] >= 0.0
        startup = [run["startup_interpreter_s"], run["startup_imports_s"], run["startup_setup_s"]]
        assert sum(startup) == pytest.approx(run["startup_s"], abs=1e-6) and min(startup) > 0
        # every phase ran: 3 steps, eval images at step 2, the final checkpoint, the writers
        assert min(run["startup_s"], run["data_s"], run["steps_s"], run["eval_s"], run["log_s"], run["save_s"]) > 0
        assert run["num_gaussians"] > 0 and 0 < run["ssim"] <= 1 and run["psnr"] > 5
        assert run["train_image_size"][0] == 32  # the scene's --width: the resolution the run trained at
        assert 200 < run["peak_host_memory_mb"] < 64 * 1024  # torch + nerfstudio alone take a few hundred MB
        assert run["step_median_ms"] > 0 and run["step_max_ms"] >= run["step_p99_ms"] >= run["step_median_ms"]
        # torch.profiler over iteration 1 of the run itself: on CPU no kernels, launches or device syncs
        profiled = run["step_profile"]
        assert profiled["steps"] == [1, 2] and 0 < profiled["wall_ms_per_step"] < 1000 * run["steps_s"]
        assert profiled["device_busy_ms_per_step"] == 0 and profiled["kernel_launches_per_step"] == 0
        assert profiled["syncs_per_step"] == {}
        top = profiled["host_top_ops_ms_per_step"]  # the host's own time by op: the step's aten ops ran
        assert 0 < len(top) <= 12 and all(ms > 0 for ms in top.values()) and any(k.startswith("aten::") for k in top)
        kinds = run["step_kinds"]  # 3 steps: the first, then plain ones (the eval at step 2 is the last step's)
        assert set(kinds) == {"first", "plain"} and sum(kind["steps"] for kind in kinds.values()) == 3
        assert kinds["first"]["total_s"] == pytest.approx(run["first_step_ms"] / 1000.0)
        assert run["gc_full_collections"] >= 0 and 0 <= run["gc_full_s"] <= run["gc_s"] < run["wall_s"]
        assert "--machine.seed 1" in run["ns_train_command"] and run["ns_train_command"].startswith("ns-train bytesplat")
        assert run["ns_eval_command"].startswith("ns-eval --load-config")
        assert {"log:write_out_storage", "log:console", "log:tensorboard_scalar"} <= set(run["detail_s"])
        # the images cached when first read, each split's apart: the training images inside the first step
        cached = [run["detail_s"][f"data:load_{split}_images"] for split in ("train", "eval")]
        assert min(cached) > 0 and sum(cached) <= run["data_s"] + 1e-6
        assert cached[0] <= run["first_step_ms"] / 1000.0
        # the eval phase by part: the queued render and its hand-over to the worker; the all-images eval after the drain
        eval_parts = {"eval:queue_image", "eval:submit"} | ({"eval:drain_eval_images", "eval:all_images"}
                                                            if run["method"] == "auto" else set())
        assert eval_parts <= set(run["detail_s"]), run["detail_s"]
        assert sum(v for k, v in run["detail_s"].items() if k.startswith("eval:")) <= run["eval_s"] + 1e-6
        assert run["budget_removed"] == 0  # 3 steps: the budget step (15000) is never reached
        # ns-eval's mean is the mean of the per-image metrics kept beside it
        images = run["eval_images"]
        assert images and all(image["file"] and image["index"] is not None for image in images)
        assert sum(image["psnr"] for image in images) / len(images) == pytest.approx(run["psnr"], rel=1e-6)
        assert run["psnr_worst_image"] == min(image["psnr"] for image in images)
        assert run.get("psnr_std", 0.0) >= 0  # ns-eval's spread: none with a single eval image
        # the worst view's panel: ground truth | render | depth of the scene's eval image size
        with Image.open(run["worst_view"]) as panel:
            assert panel.format == "PNG" and panel.size[0] == 3 * 32
        # the same checkpoint through the backend it was evaluated with: the same scores
        again = run["eval_by_rasterizer"]["reference"]
        assert again["psnr"] == pytest.approx(run["psnr"], abs=1e-4) and run["psnr_with_reference"] == again["psnr"]
        assert run["psnr_worst_image_with_reference"] == again["psnr_worst_image"]
        assert [i["file"] for i in again["eval_images"]] == [i["file"] for i in images]
    ref, auto = result["runs"]
    assert ref["eval_curve"] == []  # steps_per_eval_all_images 1000: none in 3 steps
    assert [point["step"] for point in auto["eval_curve"]] == [2]
    point = auto["eval_curve"][0]
    assert point["psnr"] > 5 and 0 < point["ssim"] <= 1
    # each image of the in-training eval, in eval order: their mean is the logged mean
    assert len(point["psnr_by_image"]) == len(auto["eval_images"])
    assert sum(point["psnr_by_image"]) / len(point["psnr_by_image"]) == pytest.approx(point["psnr"], abs=1e-3)
    assert point["worst_image"]["psnr"] == pytest.approx(min(point["psnr_by_image"]), abs=1e-3)
    assert "--pipeline.model.rasterizer reference" in ref["ns_train_command"]
    assert result["summary"]["ref"]["wall_s"]["min"] == ref["wall_s"] == result["summary"]["ref"]["wall_s"]["median"]
    assert result["summary"]["ref"]["psnr_with_reference"]["mean"] == ref["psnr_with_reference"]
    png = out.with_suffix(".png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def fake_result(path, seeds, iterations=100, method="m"):
    runs = [{"method": method, "seed": s, "iterations": iterations, "wall_s": 10.0 + s, "steps_s": 4.0 + s,
             "psnr": 20.0 + s, "ssim": 0.5} for s in seeds]
    path.write_text(json.dumps({"benchmark": "bytesplat-bench wallclock", "device": "dev", "command": f"c{seeds}",
                                "runs": runs, "summary": {}}))
    return path


def test_merge_combines_runs_from_separate_sessions(tmp_path):
    a, b = fake_result(tmp_path / "a.json", [0]), fake_result(tmp_path / "b.json", [1, 2])
    out = tmp_path / "all.json"
    result = wallclock.main(["--merge", str(a), str(b), "--out", str(out)])
    assert [r["seed"] for r in result["runs"]] == [0, 1, 2] and result["commands"] == ["c[0]", "c[1, 2]"]
    assert result["summary"]["m"]["wall_s"] == {"mean": 11.0, "median": 11.0, "min": 10.0, "max": 12.0}
    assert result["summary"]["m"]["seeds"] == 3 and json.loads(out.read_text())["runs"] == result["runs"]
    longer = fake_result(tmp_path / "c.json", [0], iterations=300)
    assert set(wallclock.main(["--merge", str(a), str(longer), "--out", str(out)])["summary"]) == {"m@100", "m@300"}
    with pytest.raises(BytesplatError, match="repeat"):
        wallclock.main(["--merge", str(a), str(a), "--out", str(out)])
    (tmp_path / "other.json").write_text(json.dumps({"runs": []}))
    with pytest.raises(BytesplatError, match="not a bytesplat-bench wallclock result"):
        wallclock.main(["--merge", str(a), str(tmp_path / "other.json"), "--out", str(out)])


def test_offline_lpips_guards_every_methods_lpips(tmp_path, monkeypatch):
    """--offline-lpips: a method that builds torchmetrics' LPIPS itself (splatfacto) gets the offline
    check too: no download attempt, a placeholder, and ns-eval's lpips is not reported."""
    import nerfstudio.scripts.train as ns_train
    import torchmetrics.image.lpip as lpip_module

    from bytesplat_ns import compat
    from bytesplat_ns.bench import timed_ns_train

    def download(*args, **kwargs):
        raise AssertionError("the download must not be tried offline")

    monkeypatch.setattr(lpip_module, "LearnedPerceptualImagePatchSimilarity", download)
    monkeypatch.setattr(compat, "can_reach", lambda url, timeout_s: False)
    monkeypatch.setattr(compat, "lpips_weights", lambda net_type="alex": ("http://weights.invalid/a.pth", tmp_path / "a.pth"))
    built = []

    def entrypoint():  # stands in for ns-train: builds LPIPS as splatfacto's populate_modules does
        from torchmetrics.image.lpip import LearnedPerceptualImagePatchSimilarity

        built.append(LearnedPerceptualImagePatchSimilarity(normalize=True))

    monkeypatch.setattr(ns_train, "entrypoint", entrypoint)
    monkeypatch.setattr(timed_ns_train, "install", lambda *args: None)
    with pytest.warns(UserWarning, match="LPIPS is unavailable"):
        timed_ns_train.main(["--timings", str(tmp_path / "t.json"), "--offline-lpips", "--", "splatfacto"])
    assert len(built) == 1 and isinstance(built[0], compat._LpipsPlaceholder)
    assert json.loads((tmp_path / "t.json").read_text())["seconds"]
    results = tmp_path / "eval.json"
    results.write_text(json.dumps({"results": {"psnr": 28.0, "ssim": 0.9, "lpips": 0.0}}))
    assert wallclock.read_eval(results, lpips_measured=False) == {"psnr": 28.0, "ssim": 0.9}
    assert wallclock.read_eval(results)["lpips"] == 0.0
    results.write_text(json.dumps({"results": {"psnr": 28.0, "psnr_std": 1.5, "ssim": 0.9, "ssim_std": float("nan")}}))
    assert wallclock.read_eval(results, lpips_measured=False) == {"psnr": 28.0, "psnr_std": 1.5, "ssim": 0.9}


def test_skip_image_writes_drops_tensorboards_images_and_nothing_else(tmp_path, monkeypatch):
    """--skip-image-writes: in the timed run tensorboard still writes scalars but encodes no image."""
    from types import SimpleNamespace

    import nerfstudio.configs.base_config  # noqa: F401 - nerfstudio's writer module needs it imported first
    import nerfstudio.scripts.train as ns_train
    from nerfstudio.utils import writer

    from bytesplat_ns.bench import timed_ns_train

    monkeypatch.setattr(writer.TensorboardWriter, "write_image", writer.TensorboardWriter.write_image)
    written = []

    def entrypoint():  # stands in for ns-train: one eval image and one scalar through tensorboard's writer
        board = writer.TensorboardWriter.__new__(writer.TensorboardWriter)
        board.tb_writer = SimpleNamespace(add_image=lambda *a, **k: written.append("image"),
                                          add_scalar=lambda *a, **k: written.append("scalar"))
        board.write_image("Eval Images/img", torch.zeros(4, 4, 3), 100)
        board.write_scalar("Train Loss", 0.5, 100)

    monkeypatch.setattr(ns_train, "entrypoint", entrypoint)
    monkeypatch.setattr(timed_ns_train, "install", lambda *args: None)
    timed_ns_train.main(["--timings", str(tmp_path / "a.json"), "--", "splatfacto"])
    assert written == ["image", "scalar"]
    written.clear()
    timed_ns_train.main(["--timings", str(tmp_path / "b.json"), "--skip-image-writes", "--", "splatfacto"])
    assert written == ["scalar"]


def test_wallclock_passes_skip_image_writes_on_and_records_it(tmp_path, monkeypatch):
    """The switch reaches the timed run and every run record says so: such runs are quality only."""
    from bytesplat_ns.bench.gpu_sharing import measures_the_method

    commands = []

    def fake_run_logged(command, log):
        commands.append(command)
        timings = Path(command[command.index("--timings") + 1])
        seconds = {key: 0.1 for key in ("setup_s", "data_s", "steps_s", "eval_s", "log_s", "save_s")}
        timings.write_text(json.dumps({"seconds": seconds, "process_end": time.time()}))
        return 1.0

    monkeypatch.setattr(wallclock, "_run_logged", fake_run_logged)
    monkeypatch.setattr("bytesplat_ns.bench.train.environment", lambda argv, prog: {"device": "cpu", "command": prog})
    for flags, skipped in (([], False), (["--skip-image-writes"], True)):
        commands.clear()
        result = wallclock.main(["--methods", "splatfacto", "--iterations", "7", "--no-eval", *flags,
                                 "--work-dir", str(tmp_path / "runs"), "--out", str(tmp_path / "w.json")])
        command = commands[0]
        assert ("--skip-image-writes" in command[:command.index("--")]) is skipped
        (run,) = result["runs"]
        assert run["image_writes_skipped"] is skipped
        assert ("--skip-image-writes" in run["launched_command"]) is skipped
        assert measures_the_method(dict(run, gpu_processes_max=1)) is not skipped


def test_repeats_run_the_same_command_again_in_parallel(tmp_path, monkeypatch):
    """--repeats N runs each (method, seed) N times into their own folders; --parallel P keeps up to P
    runs in flight at once and records it (their wall times measure contention)."""
    import threading
    import time as time_module

    active, peak, seen, lock = [0], [0], [], threading.Lock()

    def fake_run_one(entry, seed, args, repeat=0):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time_module.sleep(0.2)
        with lock:
            active[0] -= 1
            seen.append((entry.label, seed, repeat))
        return {"method": entry.label, "seed": seed, "repeat": repeat, "iterations": args.iterations,
                "concurrent_runs": args.parallel, "wall_s": 1.0 + repeat, "psnr": 20.0 + repeat}

    monkeypatch.setattr(wallclock, "run_one", fake_run_one)
    monkeypatch.setattr("bytesplat_ns.bench.train.environment", lambda argv, prog: {"device": "cpu", "command": prog})
    out = tmp_path / "w.json"
    result = wallclock.main(["--methods", "bytesplat", "--seeds", "42", "--repeats", "5", "--parallel", "3",
                             "--iterations", "7", "--out", str(out)])
    assert sorted(seen) == [("bytesplat", 42, k) for k in range(5)] and peak[0] == 3
    assert [r["repeat"] for r in result["runs"]] == [0, 1, 2, 3, 4]  # in job order, whatever finished first
    assert result["summary"]["bytesplat"]["seeds"] == 1 and result["summary"]["bytesplat"]["runs"] == 5
    assert result["summary"]["bytesplat"]["psnr"] == {"mean": 22.0, "median": 22.0, "min": 20.0, "max": 24.0}
    with pytest.raises(BytesplatError, match="at least 1"):
        wallclock.main(["--repeats", "0", "--out", str(out)])


def test_repeat_runs_get_their_own_folders():
    entry = wallclock.MethodEntry.parse("bytesplat")
    first = wallclock.ns_train_args(entry, None, 10, 3, Path("w"), [], repeat=0)
    again = wallclock.ns_train_args(entry, None, 10, 3, Path("w"), [], repeat=2)
    assert first[first.index("--timestamp") + 1] == "seed3" and again[again.index("--timestamp") + 1] == "seed3-r2"
    assert [a for a in first if a != "seed3"] == [a for a in again if a != "seed3-r2"]  # otherwise the same command


def test_a_failed_run_keeps_the_others(tmp_path, monkeypatch):
    """One run of several failing (e.g. killed for memory) is recorded with its error; the others are
    written and summarized, and the command still ends with one error naming the failure."""
    def fake_run_one(entry, seed, args, repeat=0):
        if repeat == 1:
            raise BytesplatError("wallclock: ns-train ... exited with -9: Killed", hint="the full output is in r1/train.log")
        return {"method": entry.label, "seed": seed, "repeat": repeat, "iterations": args.iterations,
                "wall_s": 5.0, "psnr": 30.0 + repeat}

    monkeypatch.setattr(wallclock, "run_one", fake_run_one)
    monkeypatch.setattr("bytesplat_ns.bench.train.environment", lambda argv, prog: {"device": "cpu", "command": prog})
    out = tmp_path / "w.json"
    with pytest.raises(BytesplatError, match="1 of 3 runs failed") as failure:
        wallclock.main(["--methods", "bytesplat", "--seeds", "42", "--repeats", "3", "--parallel", "3",
                        "--out", str(out)])
    assert failure.value.hint == "the full output is in r1/train.log"
    written = json.loads(out.read_text())
    assert [("error" in r) for r in written["runs"]] == [False, True, False]
    assert written["summary"]["bytesplat"]["runs"] == 2 and written["summary"]["bytesplat"]["psnr"]["max"] == 32.0


def test_a_method_entry_may_name_bytesplats_launcher():
    entry = wallclock.MethodEntry.parse("fast=bytesplat-train bytesplat --pipeline.model.sh-degree 2")
    assert entry == wallclock.MethodEntry("fast", "bytesplat", ("--pipeline.model.sh-degree", "2"), "bytesplat-train")
    assert wallclock.MethodEntry.parse("bytesplat").launcher == "ns-train"
    assert wallclock.MethodEntry.parse("bytesplat-train bytesplat").label == "bytesplat-train-bytesplat"
    with pytest.raises(BytesplatError, match="names no method"):
        wallclock.MethodEntry.parse("fast=bytesplat-train")


def test_the_timed_run_uses_the_launcher_it_is_given(tmp_path, monkeypatch):
    import nerfstudio.scripts.train as ns_train

    from bytesplat_ns import launcher
    from bytesplat_ns.bench import timed_ns_train

    called = []
    monkeypatch.setattr(ns_train, "entrypoint", lambda: called.append(("ns-train", sys.argv[:])))
    monkeypatch.setattr(launcher, "entrypoint", lambda: called.append(("bytesplat-train", sys.argv[:])))
    monkeypatch.setattr(timed_ns_train, "install", lambda *args: None)
    monkeypatch.setattr(sys, "argv", ["x"])
    for name in ("ns-train", "bytesplat-train"):
        timed_ns_train.main(["--timings", str(tmp_path / "t.json"), "--launcher", name, "--", "bytesplat", "--a", "1"])
    assert called == [("ns-train", ["ns-train", "bytesplat", "--a", "1"]),
                      ("bytesplat-train", ["bytesplat-train", "bytesplat", "--a", "1"])]
    with pytest.raises(SystemExit):
        timed_ns_train.main(["--timings", str(tmp_path / "t.json"), "--launcher", "other", "--", "bytesplat"])


def event_writers_of(kind: str) -> list:
    """nerfstudio's event writers as a run has them (instances made without their files): the console
    and nerfstudio's tensorboard writer, or bytesplat's batched one."""
    import nerfstudio.configs.base_config  # noqa: F401 - nerfstudio's writer module needs it imported first
    from nerfstudio.utils import writer

    from bytesplat_ns.event_writers import TrainingLoopTensorboardWriter

    if kind == "nerfstudio":
        return [object.__new__(writer.TensorboardWriter), object.__new__(writer.LocalWriter)]
    return [TrainingLoopTensorboardWriter(None, steps_per_log=10), object.__new__(writer.LocalWriter)]


@pytest.mark.parametrize("writers, drained", [("nerfstudio", [0, 10, 20]), ("batched", [])])
def test_logged_steps_end_with_the_gpu_drained_where_the_writers_would_wait(monkeypatch, writers, drained):
    """On the steps nerfstudio logs, where its writers read the logged tensors (a wait for the GPU
    there anyway), the train iteration's timer waits for the GPU, so queued step work is step time,
    not log time. bytesplat's batched writer reads none there: then the timers add no wait."""
    from types import SimpleNamespace

    import nerfstudio.configs.base_config  # noqa: F401 - nerfstudio's writer module needs it imported first
    import torch
    from nerfstudio.utils import writer

    from bytesplat_ns.bench.timed_ns_train import drained_on_logged_steps

    monkeypatch.setattr(writer, "EVENT_WRITERS", event_writers_of(writers))
    syncs = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: syncs.append(steps[-1]))
    steps = []
    trainer = SimpleNamespace(config=SimpleNamespace(logging=SimpleNamespace(steps_per_log=10)))
    iteration = drained_on_logged_steps(lambda self, step: steps.append(step) or step * 2)
    assert [iteration(trainer, s) for s in range(25)] == [2 * s for s in range(25)]
    assert syncs == drained


def _restore_writer_methods(monkeypatch):
    """What split_write_out_storage wraps goes back after the test."""
    from nerfstudio.utils import writer

    from bytesplat_ns.event_writers import HostValues, TrainingLoopTensorboardWriter

    for cls, name in ((writer.TensorboardWriter, "write_scalar"), (writer.TensorboardWriter, "write_image"),
                      (writer.LocalWriter, "write_stats_log"), (TrainingLoopTensorboardWriter, "write_scalar"),
                      (TrainingLoopTensorboardWriter, "write_held"), (HostValues, "values")):
        monkeypatch.setattr(cls, name, vars(cls)[name])
    monkeypatch.setattr(writer, "write_out_storage", writer.write_out_storage)


def test_the_batched_writers_parts_are_timed(monkeypatch):
    """bytesplat's tensorboard writer overrides write_scalar: its collecting, the hand-over of held steps and the
    wait for their copies each get a detail of the log phase (nerfstudio's base class's wrapper never sees them)."""
    from types import SimpleNamespace

    import nerfstudio.configs.base_config  # noqa: F401 - nerfstudio's writer module needs it imported first
    from nerfstudio.utils import writer

    from bytesplat_ns.bench import timed_ns_train
    from bytesplat_ns.event_writers import TrainingLoopTensorboardWriter

    _restore_writer_methods(monkeypatch)
    timers = timed_ns_train.PhaseTimers()
    timed_ns_train.split_write_out_storage(timers)
    written = []
    file_writer = SimpleNamespace(add_summary=lambda summary, step, wall_time: written.append(step))
    batched = TrainingLoopTensorboardWriter(SimpleNamespace(_get_file_writer=lambda: file_writer), steps_per_log=10)
    monkeypatch.setattr(writer, "EVENT_WRITERS", [batched])
    monkeypatch.setattr(writer, "EVENT_STORAGE", [])
    for step in (0, 10, 20):
        writer.put_scalar(name="Train Loss", scalar=0.5, step=step)
        writer.write_out_storage()
    batched.flush_scalars()
    assert written == [0, 10, 20]
    assert {"log:tensorboard_scalar", "log:tensorboard_held_scalars", "log:held_scalars_wait"} <= set(timers.detail)


@pytest.mark.parametrize("writers, waits", [("nerfstudio", [1]), ("batched", [])])
def test_write_out_storage_waits_for_the_gpu_in_its_own_timer(monkeypatch, writers, waits):
    """write_out_storage's wait for queued GPU work is timed apart from the writers (detail gpu_wait):
    one synchronise on steps whose events hold CUDA tensors, none on the others; none at all where
    the writers read no tensors as they write (bytesplat's batched tensorboard writer)."""
    from types import SimpleNamespace

    import nerfstudio.configs.base_config  # noqa: F401 - nerfstudio's writer module needs it imported first
    import torch
    from nerfstudio.utils import writer

    from bytesplat_ns.bench import timed_ns_train

    syncs = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: syncs.append(len(writer.EVENT_STORAGE)))
    _restore_writer_methods(monkeypatch)
    monkeypatch.setattr(writer, "EVENT_WRITERS", [])
    timers = timed_ns_train.PhaseTimers()
    # the writers are asked (as the first test checks); none is called here
    monkeypatch.setattr(timed_ns_train, "logging_waits_for_gpu", lambda: writers == "nerfstudio")
    timed_ns_train.split_write_out_storage(timers)
    cuda_scalar = SimpleNamespace(is_cuda=True)
    monkeypatch.setattr(writer, "EVENT_STORAGE", [{"name": "a", "event": 1.0, "step": 1}])
    writer.write_out_storage()
    assert syncs == []
    writer.EVENT_STORAGE.extend([{"name": "b", "event": {"x": cuda_scalar}, "step": 2}])
    writer.write_out_storage()
    assert syncs == waits and writer.EVENT_STORAGE == []
    assert set(timers.detail) == ({"log:gpu_wait"} if waits else set())


def _capture_with_half_resolution_copies(root: Path) -> Path:
    """Two 1700x8 photos (above nerfstudio-data's 1600-pixel auto limit) and their images_2/ copies."""
    from PIL import Image

    frames = []
    for i in range(2):
        for folder, size in (("images", (1700, 8)), ("images_2", (850, 4))):
            (root / folder).mkdir(parents=True, exist_ok=True)
            Image.new("RGB", size).save(root / folder / f"{i}.png")
        pose = [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, float(i)], [0, 0, 0, 1]]
        frames.append({"file_path": f"images/{i}.png", "transform_matrix": pose})
    meta = {"fl_x": 1000.0, "fl_y": 1000.0, "cx": 850.0, "cy": 4.0, "w": 1700, "h": 8, "frames": frames}
    (root / "transforms.json").write_text(json.dumps(meta))
    return root


def test_the_default_dataparser_trains_at_the_photos_own_resolution(tmp_path):
    from nerfstudio.data.dataparsers.nerfstudio_dataparser import NerfstudioDataParserConfig

    capture = _capture_with_half_resolution_copies(tmp_path / "capture")

    def train_width(**options) -> int:
        parser = NerfstudioDataParserConfig(data=capture, eval_mode="all", **options).setup()
        return int(parser.get_dataparser_outputs("train").cameras.width.max())

    # the pitfall: an images_2/ folder alone halves the training resolution
    assert train_width() == 850
    assert train_width(downscale_factor=1) == 1700
    default = wallclock.parser().parse_args([]).dataparser
    assert default.split() == ["nerfstudio-data", "--downscale-factor", "1"]
    entry = wallclock.MethodEntry.parse("bytesplat")
    args = wallclock.ns_train_args(entry, capture, 10, 0, tmp_path / "run", default.split())
    assert args[-3:] == ["nerfstudio-data", "--downscale-factor", "1"]


def test_eval_images_records_each_image_in_order_and_changes_nothing_else():
    from types import SimpleNamespace

    from bytesplat_ns.bench.eval_images import record_image_metrics

    class Model:
        def get_image_metrics_and_images(self, outputs, batch):
            return {"psnr": torch.tensor(20.0 + outputs), "ssim": 0.5, "lpips": 0.1}, {"img": outputs}

    dataset = SimpleNamespace(image_filenames=[Path("/data/a.png"), Path("/data/b.png"), Path("/data/c.png")])
    pipeline = SimpleNamespace(model=Model(), datamanager=SimpleNamespace(eval_dataset=dataset))
    images = []
    record_image_metrics(pipeline, images)
    returned = [pipeline.model.get_image_metrics_and_images(o, {"image_idx": torch.tensor(i)}) for o, i in ((1, 2), (3, 0))]
    assert [r[1] for r in returned] == [{"img": 1}, {"img": 3}] and returned[0][0]["lpips"] == 0.1
    assert images == [{"index": 2, "file": "c.png", "psnr": 21.0, "ssim": 0.5},
                      {"index": 0, "file": "a.png", "psnr": 23.0, "ssim": 0.5}]
    assert wallclock.eval_image_fields(images)["psnr_worst_image"] == 21.0
    assert wallclock.eval_image_fields([]) == {"eval_images": []}


def test_eval_with_another_rasterizer_needs_a_bytesplat_model():
    from types import SimpleNamespace

    from bytesplat_ns.bench.eval_images import use_rasterizer

    with pytest.raises(BytesplatError, match="not a bytesplat model"):
        use_rasterizer(SimpleNamespace(model=SimpleNamespace(config=SimpleNamespace())), "gsplat")
    model = SimpleNamespace(config=SimpleNamespace(rasterizer="auto"), _backend="fused")
    use_rasterizer(SimpleNamespace(model=model), "gsplat")
    assert (model.config.rasterizer, model._backend) == ("gsplat", None)  # resolved again on the next render


def test_worst_view_keeps_the_lowest_psnr_panel(tmp_path):
    from bytesplat_ns.bench.eval_images import WorstView

    worst = WorstView()
    assert not worst.write(tmp_path / "none.png")
    for psnr, level in ((30.0, 0.2), (12.0, 0.9), (20.0, 0.5)):
        image = torch.full((4, 6, 3), level)  # ground truth | render, 3 pixels each
        depth = torch.arange(12.0).reshape(4, 3, 1)
        worst.offer({"psnr": psnr, "file": f"{psnr}.png"}, {"depth": depth}, {"img": image})
    assert worst.entry["file"] == "12.0.png"
    assert worst.write(tmp_path / "w.png", max_width=4)
    with Image.open(tmp_path / "w.png") as panel:
        assert panel.size == (4, 2)  # 9 x 4 shrunk to 4 wide
    full = worst.panel
    assert full.shape == (4, 9, 3) and int(full[0, 0, 0]) == round(0.9 * 255)
    assert full[0, 6, 0] == 255 and full[3, 8, 0] == 0  # depth: nearest white, farthest black


def test_a_run_records_how_many_gaussians_the_budget_removed():
    from types import SimpleNamespace

    from bytesplat_ns.bench.timed_ns_train import budget_removed
    from bytesplat_ns.gaussian_budget import BudgetSettings, GaussianBudget

    assert budget_removed(SimpleNamespace()) is None  # not bytesplat's model (splatfacto)
    assert budget_removed(SimpleNamespace(_budget=None)) == 0  # never built: no step reached it
    budget = GaussianBudget(BudgetSettings(fraction=0.4), densify_stop=10)
    budget.history += [{"removed": 30.0}, {"removed": 12.0}]
    assert budget_removed(SimpleNamespace(_budget=budget)) == 42


def test_a_run_records_its_graph_replays_and_captures():
    from types import SimpleNamespace

    from bytesplat_ns.bench.timed_ns_train import graph_step_fields
    from bytesplat_ns.step_graphs import StepGraphs

    assert graph_step_fields(SimpleNamespace()) == {}  # nerfstudio's trainer (splatfacto)
    assert graph_step_fields(SimpleNamespace(step_graphs=None)) == {}  # graph steps off or failed
    graphs = StepGraphs()
    graphs.replays, graphs.capture_steps, graphs.capture_seconds = 4990, [2, 101, 201], 0.3
    graphs.failures.append((3000, "operation not permitted when stream is capturing"))
    assert graph_step_fields(SimpleNamespace(step_graphs=graphs)) == {
        "graph_replays": 4990, "graph_capture_steps": [2, 101, 201], "graph_capture_s": 0.3,
        "graph_capture_failures": [[3000, "operation not permitted when stream is capturing"]]}
