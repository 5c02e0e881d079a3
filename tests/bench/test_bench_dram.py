"""Summing Nsight Compute's CSV into device-memory bytes per stage (bytesplat_ns.bench.dram)."""

import pytest

from bytesplat_ns.bench.dram import parse_ncu_csv

CSV = '''==PROF== Connected to process 123
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","123","python","h","fused_loss_kernel","1","7","(256, 1, 1)","(8160, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","byte","1,000,000"
"0","123","python","h","fused_loss_kernel","1","7","(256, 1, 1)","(8160, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_write.sum","byte","250"
"1","123","python","h","elementwise","1","7","(128, 1, 1)","(10, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","byte","4096"
"1","123","python","h","elementwise","1","7","(128, 1, 1)","(10, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_write.sum","byte","8"
==PROF== Disconnected from process 123
'''


def test_parse_sums_every_kernel_in_base_units():
    got = parse_ncu_csv(CSV)
    assert got == {"kernels": 2, "dram_read_bytes": 1_004_096.0, "dram_write_bytes": 258.0, "dram_bytes": 1_004_354.0}


def _fake_ncu(tmp_path, exit_code=0):
    """A stand-in for ncu: records its arguments and prints the CSV above."""
    script = tmp_path / "ncu"
    (tmp_path / "csv.txt").write_text(CSV)
    script.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path}/args.txt\ncat {tmp_path}/csv.txt\nexit {exit_code}\n")
    script.chmod(0o755)
    return str(script)


def test_each_stage_runs_once_under_ncu_and_its_report_is_summed(tmp_path):
    from bytesplat_ns.bench.dram import measure_stage

    row = measure_stage(_fake_ncu(tmp_path), "split", tmp_path / "scene.pt", 2)
    assert row == {"stage": "split", "kernels": 2, "dram_read_bytes": 1_004_096.0, "dram_write_bytes": 258.0,
                   "dram_bytes": 1_004_354.0}
    args = (tmp_path / "args.txt").read_text().split()
    assert args[:4] == ["--clock-control", "none", "--profile-from-start", "off"]  # only the pass between
    # cudaProfilerStart/Stop, at the clocks the GPU runs at
    assert args[args.index("--metrics") + 1] == "dram__bytes_read.sum,dram__bytes_write.sum"
    assert args[args.index("-m") + 1] == "bytesplat_ns.bench.dram"
    assert args[args.index("--stage") + 1] == "split" and args[args.index("--scene-file") + 1] == str(tmp_path / "scene.pt")


def test_a_stage_that_cannot_be_measured_is_its_rows_error(tmp_path):
    from bytesplat_ns.bench.dram import measure_stage

    missing = measure_stage(str(tmp_path / "no-ncu"), "split", tmp_path / "scene.pt", 2)
    assert missing["stage"] == "split" and "no-ncu" in missing["error"] and "dram_bytes" not in missing
    failed = measure_stage(_fake_ncu(tmp_path, exit_code=3), "gsplat-fussim", tmp_path / "scene.pt", 2)
    assert failed["error"].startswith("child exited with 3")


def test_dram_is_a_subcommand_with_a_suite():
    from bytesplat_ns.bench import suites
    from bytesplat_ns.bench.commands import step_parser

    args = step_parser("dram").parse_args(["--num-gaussians", "1000", "--stages", "split", "two_launch"])
    assert args.stages == ["split", "two_launch"] and args.ncu == "ncu"
    assert suites.SUITES["dram-traffic"].steps[0].command == "dram"


def test_each_gsplat_stage_is_counted_again_for_every_gsplat_site(tmp_path):
    from bytesplat_ns.bench import dram

    site = tmp_path / "gsplat-1.5.3"
    (site / "gsplat-1.5.3.dist-info").mkdir(parents=True)
    runs = dram.stage_runs(["split", "gsplat-fussim"], [str(site)])
    assert [(stage, where) for stage, where, _ in runs] == [("split", None), ("gsplat-fussim", None),
                                                              ("gsplat-fussim", str(site))]
    assert runs[0][2] is None and runs[2][2] == "1.5.3"
    from bytesplat_ns.errors import BytesplatError

    with pytest.raises(BytesplatError, match="no gsplat installed there"):
        dram.stage_runs(["gsplat-fussim"], [str(tmp_path / "empty")])


def test_a_site_goes_first_on_the_childs_path(tmp_path):
    from bytesplat_ns.bench.dram import measure_stage

    script = tmp_path / "ncu"
    script.write_text(f"#!/bin/sh\necho \"$PYTHONPATH\" > {tmp_path}/path.txt\ncat {tmp_path}/csv.txt\n")
    script.chmod(0o755)
    (tmp_path / "csv.txt").write_text(CSV)
    row = measure_stage(str(script), "gsplat-fussim", tmp_path / "scene.pt", 2, site="/opt/gsplat-site")
    assert row["dram_bytes"] == 1_004_354.0
    assert (tmp_path / "path.txt").read_text().split(":")[0].strip() == "/opt/gsplat-site"


HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
          '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value","Rule Name","Rule Type",'
          '"Rule Description","Estimated Speedup Type","Estimated Speedup"')
BWD = "void bytesplat::<unnamed>::render_bwd_kernel<0, 1, 0>(int, int, const float *, bool)"
FILL = "void at::vectorized_elementwise_kernel<4, at::FillFunctor<float>, std::array<char *, 1>>(int, T2, T3)"


def _details(kid, kernel, section, metric, unit, value, rule=("", "", "")):
    return (f'"{kid}","1","python3.12","h","{kernel}","1","7","(256, 1, 1)","(120, 68, 1)","0","9.0","{section}",'
            f'"{metric}","{unit}","{value}","{rule[0]}","{rule[1]}","{rule[2]}","",""')


# the metrics ncu's details page gives for its sections (as an H200 printed them), a rule row and
# metrics the profile does not keep
DETAILS = "\n".join(["==PROF== Connected to process 1", HEADER,
    _details(0, BWD, "GPU Speed Of Light Throughput", "Memory Throughput", "%", "44.52"),
    _details(0, BWD, "GPU Speed Of Light Throughput", "Duration", "ns", "1,698,112"),
    _details(0, BWD, "GPU Speed Of Light Throughput", "Compute (SM) Throughput", "%", "81.70"),
    _details(0, BWD, "Compute Workload Analysis", "Issue Slots Busy", "%", "81.70"),
    _details(0, BWD, "Memory Workload Analysis", "Local Memory Spilling Requests", "", "979,088"),
    _details(0, BWD, "Memory Workload Analysis", "Memory Throughput", "byte/s", "258,540,835,940.15"),
    _details(0, BWD, "Launch Statistics", "Registers Per Thread", "register/thread", "48"),
    _details(0, BWD, "Occupancy", "Theoretical Occupancy", "%", "62.50"),
    _details(0, BWD, "Occupancy", "Achieved Occupancy", "%", "60.98"),
    _details(0, BWD, "Occupancy", "", "", "", rule=("TheoreticalOccupancy", "OPT", "The 10.00 theoretical warps")),
    _details(1, FILL, "GPU Speed Of Light Throughput", "Duration", "us", "1.95"),
    _details(1, FILL, "Compute Workload Analysis", "Issue Slots Busy", "%", "0.03"),
    _details(1, FILL, "Launch Statistics", "Registers Per Thread", "register/thread", "16"),
    "==PROF== Disconnected from process 1"]) + "\n"


def test_kernel_profile_keeps_each_kernels_bounds_in_launch_order():
    from bytesplat_ns.bench.dram import parse_ncu_kernels, profile_summary

    bwd, fill = parse_ncu_kernels(DETAILS)
    assert bwd["name"] == "render_bwd_kernel<0, 1, 0>" and bwd["kernel"] == BWD
    assert bwd["duration_us"] == pytest.approx(1698.112) and bwd["issue_slots_busy_pct"] == 81.7
    assert bwd["sm_throughput_pct"] == 81.7 and bwd["registers"] == 48 and bwd["local_spill_requests"] == 979_088
    assert (bwd["achieved_occupancy_pct"], bwd["theoretical_occupancy_pct"]) == (60.98, 62.5)
    assert bwd["dram_bytes"] == round(258_540_835_940.15 * 1698.112e-6)  # the SOL page's DRAM rate times the time
    assert bwd["grid"] == "(120, 68, 1)" and bwd["block"] == "(256, 1, 1)"
    # a long template argument list is dropped, a duration in us stays in us, missing metrics stay absent
    assert fill["name"] == "vectorized_elementwise_kernel" and fill["duration_us"] == pytest.approx(1.95)
    assert "dram_bytes" not in fill and "local_spill_requests" not in fill
    assert profile_summary({"kernel_profile": [bwd, fill]}, top=1) == \
        "1700 us in 2; render_bwd_kernel<0, 1, 0> 1698 us (issue 82%)"


def test_a_duration_in_an_unknown_unit_is_an_error_not_a_wrong_number():
    from bytesplat_ns.bench.dram import parse_ncu_kernels

    with pytest.raises(ValueError, match="unknown unit 'cycle'"):
        parse_ncu_kernels(DETAILS.replace('"Duration","ns"', '"Duration","cycle"'))


def test_kernels_adds_a_second_child_under_the_sections(tmp_path):
    from bytesplat_ns.bench.dram import KERNEL_SECTIONS, measure_stage

    script = tmp_path / "ncu"
    (tmp_path / "sums.txt").write_text(CSV)
    (tmp_path / "details.txt").write_text(DETAILS)
    # the stand-in prints the sections' report when asked for sections, else the metric sums
    script.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path}/args.txt\n"
                      f"case \"$*\" in *--section*) cat {tmp_path}/details.txt;; *) cat {tmp_path}/sums.txt;; esac\n")
    script.chmod(0o755)
    row = measure_stage(str(script), "split", tmp_path / "scene.pt", 2, kernels=True)
    assert row["dram_bytes"] == 1_004_354.0 and [k["name"] for k in row["kernel_profile"]] == [
        "render_bwd_kernel<0, 1, 0>", "vectorized_elementwise_kernel"]
    plain, sections = (line.split() for line in (tmp_path / "args.txt").read_text().splitlines())
    assert "--section" not in plain and "--metrics" not in sections
    assert [sections[i + 1] for i, a in enumerate(sections) if a == "--section"] == list(KERNEL_SECTIONS)
    assert sections[:4] == ["--clock-control", "none", "--profile-from-start", "off"]
    assert sections[sections.index("--page") + 1] == "details"

    (tmp_path / "details.txt").write_text("no table\n")
    failed = measure_stage(str(script), "split", tmp_path / "scene.pt", 2, kernels=True)
    assert failed["dram_bytes"] == 1_004_354.0 and failed["kernel_profile_error"] == "no ncu CSV table in the output"


def test_the_report_lists_the_kernels_that_take_the_time():
    from bytesplat_ns.bench.dram import parse_ncu_kernels
    from bytesplat_ns.bench.report import dram_table

    row = {"stage": "split", "num_gaussians": 1_000_000, "scene": "synthetic", "kernels": 2, "dram_read_bytes": 1e6,
           "dram_write_bytes": 0.0, "dram_bytes": 1e6, "kernel_profile": parse_ncu_kernels(DETAILS)}
    lines = dram_table([{"result": {"rows": [row]}}])
    text = "\n".join(lines)
    assert "| 1M | split | `render_bwd_kernel<0, 1, 0>` | 1698 | 100% | 82% | 61 / 62% | 48 | 979088 | 439.0 |" in text
    assert "| 1M | split | 1 other kernels | 2 | 0% | - | - | - | - | 0.0 |" in text


def test_the_suite_profiles_the_split_schedule_and_gsplat_kernel_by_kernel():
    from bytesplat_ns.bench import suites

    step = suites.SUITES["dram-traffic"].steps[1]
    assert step.name == "kernels_1m" and "--kernels" in step.args and "split" in step.args


def test_reach_stages_are_counted_only_where_gsplat_bins_per_axis(tmp_path, monkeypatch):
    """gsplat-fussim-reach is the raster benchmark's strongest baseline (the opacity-aware lists): gsplat 1.4.0
    bins square boxes only, so this process's 1.4.0 gets no row for it; the 1.5.3 site does."""
    from bytesplat_ns.bench import baselines, dram

    monkeypatch.setattr(baselines, "gsplat_version", lambda: "1.4.0")
    site = tmp_path / "gsplat-1.5.3"
    (site / "gsplat-1.5.3.dist-info").mkdir(parents=True)
    runs = dram.stage_runs(["split-trimmed", "gsplat-fussim-reach", "gsplat-fussim"], [str(site)])
    assert [(stage, where, version) for stage, where, version in runs] == [
        ("split-trimmed", None, None), ("gsplat-fussim-reach", str(site), "1.5.3"),
        ("gsplat-fussim", None, "1.4.0"), ("gsplat-fussim", str(site), "1.5.3")]


def test_each_stage_has_a_pass(monkeypatch):
    """Every stage the CLI offers resolves to a pass: the fused ones on the scene's lists, the gsplat ones
    with the SSIM named between "gsplat-" and the optional "-reach", on the opacity-aware lists with it."""
    from bytesplat_ns.bench import baselines, dram

    asked = []
    monkeypatch.setattr(baselines, "gsplat_version", lambda: "1.5.3")
    monkeypatch.setattr(baselines, "ssim_function", lambda name: name)
    monkeypatch.setattr(baselines, "gsplat_bins", lambda inp, version, opacity_aware=False: (opacity_aware, None))
    monkeypatch.setattr(baselines, "gsplat_raster_loss_pass",
                        lambda inp, offsets, fids, ssim: asked.append((ssim, offsets)) or (lambda: None))
    for stage in dram.STAGES:
        assert callable(dram.stage_function(stage, object()))
    assert asked == [("pytorch_msssim", False), ("fussim", False), ("pytorch_msssim", True), ("fussim", True)]
    with pytest.raises(SystemExit, match="unknown stage"):
        dram.stage_function("gsplat-nossim-x", object())


def test_the_trimmed_pass_trims_again_each_time(monkeypatch):
    """split-trimmed profiles the pass training runs: the trimming's launches are in it, every pass (not the
    lists cached by an earlier one), and the pass then renders those lists."""
    import torch

    from bytesplat_ns.bench import dram
    from bytesplat_ns.bench.raster import StageInputs
    from bytesplat_ns.bench.synthetic import synthetic_scene
    from bytesplat_ns.raster.fused import trim_tile_lists
    from bytesplat_ns.raster.options import DEFAULT_OPTIONS

    inp = StageInputs(0, 0, 0, 0, projection="torch", scene=synthetic_scene(300, 64, 48, 0, device="cpu"))
    rendered = []
    monkeypatch.setattr(StageInputs, "fused_raster_loss", lambda self, **kw: rendered.append((kw, self.trimmed_bins())))
    first = inp.trimmed_bins()
    dram.trimmed_split_pass(inp)
    kw, lists = rendered[0]
    # trimmed again in the pass, then rendered with training's falloff
    assert kw == {"schedule": "split", "trimmed": True, "fast_exp": DEFAULT_OPTIONS.fast_exp} and lists is not first
    expected = trim_tile_lists(inp.m2, inp.con, inp.op, *inp.opacity_aware_bins(), inp.W, inp.H)
    assert all(torch.equal(a, b) for a, b in zip(lists, expected))
