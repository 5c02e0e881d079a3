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
    with pytest.raises(SystemExit, match="no gsplat installed there"):
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
