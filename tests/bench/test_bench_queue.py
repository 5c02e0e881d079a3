"""``bytesplat-bench queue``: a detached setup + job list, collected by later calls (CPU, real processes)."""

import json
import lzma
import tarfile
import time
from pathlib import Path

import pytest

from bytesplat_ns.bench import queue as q


def _fake_checkout(tmp_path):
    repo = tmp_path / "checkout"
    (repo / "docs" / "results").mkdir(parents=True)
    (repo / "docs" / "results" / "earlier.json").write_text('{"suite": "earlier"}')
    (repo / "setup.sh").write_text("export FROM_SETUP=yes\n")
    return repo


def _wait_done(queue_dir, seconds=240):
    deadline = time.time() + seconds
    while time.time() < deadline:
        status = q.read_status(queue_dir)
        if status and status["done"]:
            return status
        time.sleep(0.2)
    raise AssertionError(f"queue not done: {q.read_status(queue_dir)}")


def test_job_syntax():
    jobs = q.parse_jobs(["a", "+b", "@30 c", "+@5 d"])
    assert [j["command"] for j in jobs] == ["a", "b", "c", "d"]
    assert [j["group"] for j in jobs] == [0, 0, 1, 1]
    assert [j["not_after_s"] for j in jobs] == [None, None, 30.0, 5.0]
    with pytest.raises(ValueError):
        q.parse_jobs(["+alone"])
    with pytest.raises(ValueError):
        q.parse_jobs(["@5 "])


def test_queue_runs_detached_and_collects(tmp_path):
    repo = _fake_checkout(tmp_path)
    queue_dir = tmp_path / "queue"
    jobs = [
        # the setup's environment and the queue's variables reach the jobs, in the checkout's copy
        'echo "{\\"setup\\": \\"$FROM_SETUP\\"}" > $RESULTS/from_setup.json && test -f setup.sh',
        # alongside: each waits for the other's marker, so this passes only if both run at once
        "touch $Q/a; for i in $(seq 100); do [ -f $Q/b ] && exit 0; sleep 0.1; done; exit 1",
        "+touch $Q/b; for i in $(seq 100); do [ -f $Q/a ] && exit 0; sleep 0.1; done; exit 1",
        # a failure does not stop the next job; run folders stay out of the results
        "exit 7",
        "mkdir -p $SUITES/s/work/run $SUITES/s/steps && echo '{}' > $SUITES/s/steps/one.json"
        " && echo '{}' > $SUITES/s/work/run/big.json && echo log > $SUITES/s/work/run/train.log"
        " && echo log > $SUITES/s/work/run/eval-gsplat.log && echo png > $SUITES/s/work/run/worst_view.png",
        "@0 touch $Q/never",
    ]
    assert q.main(["start", "--dir", str(queue_dir), "--repo", str(repo), "--setup", "source setup.sh", *jobs]) == 0
    status = _wait_done(queue_dir)
    assert status["setup"]["state"] == "ok"
    assert [j["state"] for j in status["jobs"]] == ["ok", "ok", "ok", "failed", "ok", "skipped"]
    assert status["jobs"][3]["rc"] == 7
    assert json.loads((queue_dir / "results" / "from_setup.json").read_text()) == {"setup": "yes"}
    assert (queue_dir / "results" / "earlier.json").exists()
    assert not (queue_dir / "never").exists()

    out = tmp_path / "out"
    assert q.main(["collect", "--dir", str(queue_dir), "--out", str(out)]) == 0
    with tarfile.open(out / "queue-results.tar.xz") as tar:
        names = set(tar.getnames())
    assert {"results/earlier.json", "results/from_setup.json", "suites/s/steps/one.json"} <= names
    assert not any("work" in n for n in names)
    with tarfile.open(out / "queue-logs.tar.xz") as tar:
        names = set(tar.getnames())
    assert {"logs/setup.log", "logs/job0.log", "suites/s/work/run/train.log", "suites/s/work/run/eval-gsplat.log"} <= names
    # each run's worst eval view comes back on its own, out of the results
    with tarfile.open(out / "queue-views.tar.xz") as tar:
        assert tar.getnames() == ["suites/s/work/run/worst_view.png"]
    # an extension the setup built comes back compressed, every collect
    (queue_dir / "out" / "ext_cuda.so").write_bytes(b"\x7fELF" + bytes(1000))
    for _ in range(2):
        assert q.main(["collect", "--dir", str(queue_dir), "--out", str(out)]) == 0
        with lzma.open(out / "ext_cuda.so.xz") as f:
            assert f.read() == b"\x7fELF" + bytes(1000)
    # the modules of our kernels, which the setup packs itself, come back as they are
    (queue_dir / "out" / "bytesplat_jit.tar.xz").write_bytes(b"packed modules")
    (queue_dir / "out" / "bytesplat_jit.tar.xz.tmp").write_bytes(b"still packing")
    assert q.main(["collect", "--dir", str(queue_dir), "--out", str(out)]) == 0
    assert (out / "bytesplat_jit.tar.xz").read_bytes() == b"packed modules"
    assert not (out / "bytesplat_jit.tar.xz.tmp").exists()


def test_start_outside_a_checkout_is_one_clear_error(tmp_path, capsys):
    assert q.main(["start", "--dir", str(tmp_path / "queue"), "--repo", str(tmp_path), "true"]) == 2
    assert "not a bytesplat-ns checkout" in capsys.readouterr().err
    assert not (tmp_path / "queue").exists()


def test_failed_setup_skips_every_job(tmp_path):
    repo = _fake_checkout(tmp_path)
    queue_dir = tmp_path / "queue"
    q.main(["start", "--dir", str(queue_dir), "--repo", str(repo), "--setup", "false", "touch $Q/ran"])
    status = _wait_done(queue_dir)
    assert status["setup"]["state"] == "failed"
    assert [j["state"] for j in status["jobs"]] == ["skipped"]
    assert not (queue_dir / "ran").exists()


def test_collect_on_a_machine_without_a_queue_fails_at_once(tmp_path, capsys):
    began = time.time()
    assert q.main(["collect", "--dir", str(tmp_path / "none"), "--wait", "60", "--out", str(tmp_path)]) \
        == q.NO_QUEUE_STATUS
    assert time.time() - began < 5
    assert "fresh machine" in capsys.readouterr().err


def test_a_running_queue_is_not_replaced(tmp_path):
    repo = _fake_checkout(tmp_path)
    queue_dir = tmp_path / "queue"
    q.main(["start", "--dir", str(queue_dir), "--repo", str(repo), "--setup", "true", "sleep 3"])
    with pytest.raises(SystemExit, match="already runs"):
        q.main(["start", "--dir", str(queue_dir), "--repo", str(repo), "--setup", "true", "true"])
    first = _wait_done(queue_dir)
    # a finished one is kept beside the next
    q.main(["start", "--dir", str(queue_dir), "--repo", str(repo), "--setup", "true", "true"])
    kept = tmp_path / f"queue-{int(first['started_at'])}"
    assert q.read_status(kept)["jobs"][0]["command"] == "sleep 3"
    assert _wait_done(queue_dir)["jobs"][0]["command"] == "true"


def test_start_checks_each_jobs_data_before_the_setup(tmp_path, capsys):
    repo = _fake_checkout(tmp_path)
    (repo / ".data" / "fox").mkdir(parents=True)
    queue_dir = tmp_path / "queue"
    job = "bytesplat-bench suite s --data .data/{} --only x --results-dir $RESULTS"
    assert q.main(["start", "--dir", str(queue_dir), "--repo", str(repo), "--setup", "true", "true",
                   job.format("lego")]) == 2
    err = capsys.readouterr().err
    assert "job1 trains on --data .data/lego" in err and "carry" in err
    assert not queue_dir.exists()  # nothing started: no setup ran
    # present, or a path the job's environment gives: started
    assert q.main(["start", "--dir", str(queue_dir), "--repo", str(repo), "--setup", "true", job.format("fox"),
                   "wallclock --data $Q/data"]) == 0
    assert [j["state"] for j in _wait_done(queue_dir)["jobs"]] == ["failed", "failed"]  # no such commands here


def test_wait_baselines_waits_for_the_setups_build_markers(tmp_path):
    """A queue job does not source scripts/gpu_setup.sh, so it cannot `wait` on the setup's background builds:
    scripts/wait_baselines.sh waits until their marker files are gone, and gives up (status 1) after WAIT_S."""
    import os
    import subprocess
    import threading

    script = Path(__file__).resolve().parents[2] / "scripts" / "wait_baselines.sh"
    marker = tmp_path / "gsplat-1.5.3"
    marker.touch()
    env = dict(os.environ, BASELINE_BUILDS=str(tmp_path), WAIT_S="60")
    threading.Timer(1.5, marker.unlink).start()
    t0 = time.monotonic()
    assert subprocess.run(["bash", str(script)], env=env, timeout=60).returncode == 0
    assert time.monotonic() - t0 >= 1.0
    marker.touch()
    done = subprocess.run(["bash", str(script)], env=dict(env, WAIT_S="1"), capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "gsplat-1.5.3" in done.stderr
