"""The GPU-sharing watch of ``bytesplat-bench wallclock`` (CPU: the query is stood in for)."""

import time

from bytesplat_ns.bench import gpu_sharing


def test_the_watch_keeps_the_most_processes_seen_at_once():
    seen = iter([{"1"}, {"1", "2", "3"}, {"1", "2"}])
    watch = gpu_sharing.GpuProcessWatch(interval=0.05, first=0.0, query=lambda: next(seen, {"1"}))
    with watch:
        time.sleep(0.5)
    assert watch.most == 3


def test_the_last_query_at_the_end_catches_a_short_run():
    with gpu_sharing.GpuProcessWatch(first=60.0, query=lambda: {"7", "8"}) as watch:
        pass
    assert watch.most == 2


def test_without_nvidia_smi_nothing_is_recorded(monkeypatch):
    monkeypatch.setattr(gpu_sharing.shutil, "which", lambda name: None)
    assert gpu_sharing.query_compute_pids() is None
    with gpu_sharing.GpuProcessWatch(first=0.0, interval=0.01) as watch:
        time.sleep(0.05)
    assert watch.most is None


def test_only_runs_alone_and_complete_measure_the_method():
    from bytesplat_ns.bench.gpu_sharing import measures_the_method

    assert measures_the_method({"concurrent_runs": 1, "gpu_processes_max": 1})
    assert measures_the_method({})  # older records: no count, nothing skipped
    assert not measures_the_method({"concurrent_runs": 2})
    assert not measures_the_method({"gpu_processes_max": 3})
    assert not measures_the_method({"concurrent_runs": 1, "gpu_processes_max": 1, "image_writes_skipped": True})


def test_the_watch_keeps_the_highest_host_load_seen():
    loads = iter([0.5, 17.25, 2.0])
    watch = gpu_sharing.GpuProcessWatch(interval=0.05, first=0.0, query=lambda: {"1"},
                                        load=lambda: next(loads, 1.0))
    with watch:
        time.sleep(0.5)
    assert watch.host_load_max == 17.25


def test_without_a_load_average_none_is_recorded():
    with gpu_sharing.GpuProcessWatch(first=60.0, query=lambda: {"1"}, load=lambda: None) as watch:
        pass
    assert watch.host_load_max is None and watch.most == 1
    assert gpu_sharing.host_load() is None or gpu_sharing.host_load() >= 0.0
