"""``--pipeline.communicator auto`` decides on modelled time over the ranks' link (issue 26, item 4):
the same scene picks the exchange that moves fewer bytes on a slow link and the one with less work
on a fast one; the start-up probe gives every rank the same link estimate."""

from __future__ import annotations

import json
import math

import torch
import torch.multiprocessing as mp

from bytesplat_ns.distributed import Views
from bytesplat_ns.distributed.auto import ComputeCosts, choose
from bytesplat_ns.distributed.link_probe import LinkEstimate, probe_link
from tests.helpers import link_probe_worker
from tests.helpers.checkpoint_runs import free_port


def orbit_views(w: int, h: int, f: float, n: int = 4) -> Views:
    def look_at(eye):
        eye = torch.tensor(eye, dtype=torch.float32)
        forward = -eye / eye.norm()
        right = torch.linalg.cross(forward, torch.tensor([0.0, 0.0, 1.0]))
        right = right / right.norm()
        down = torch.linalg.cross(forward, right)
        R = torch.stack([right, down, forward])
        m = torch.eye(4)
        m[:3, :3], m[:3, 3] = R, -R @ eye
        return m

    eyes = [(4.0 * math.cos(a), 4.0 * math.sin(a), 1.0) for a in torch.linspace(0, 1.2, n).tolist()]
    K = torch.tensor([[f, 0.0, w / 2], [0.0, f, h / 2], [0.0, 0.0, 1.0]]).expand(n, 3, 3).clone()
    return Views(torch.stack([look_at(e) for e in eyes]), K, w, h, [None] * n, torch.zeros(n, 3))


def dense_scene(n: int = 200_000):
    g = torch.Generator().manual_seed(5)
    return (torch.rand(n, 3, generator=g) * 2 - 1), torch.full((n, 3), 0.01)


def test_a_slow_link_picks_pixel_a_fast_one_sparse_grad_on_the_same_scene():
    means, scales = dense_scene()
    views = orbit_views(64, 48, 60.0)
    slow = choose(means, scales, views, world=2, link=LinkEstimate.from_config(1.0))
    fast = choose(means, scales, views, world=2, link=LinkEstimate.from_config(10_000.0))
    assert slow.pixel_bytes < slow.sparse_grad_bytes == fast.sparse_grad_bytes  # bytes: pixel always
    assert slow.choice == "pixel" and fast.choice == "sparse-grad", (slow.log_line(), fast.log_line())
    assert slow.sparse_grad_transfer_s > 10 * slow.pixel_transfer_s
    for d in (slow, fast):
        line = d.log_line()
        assert line.startswith(f"auto communicator: {d.choice} (modelled") and "ms transfer" in line and "ms work" in line
        assert "(config)" in line and "MiB/step" in line and "Gaussians visible per view" in line
    assert "1.0 Gb/s" in slow.log_line() and "10000.0 Gb/s" in fast.log_line()


def test_the_choice_flips_once_as_the_link_gets_faster():
    means, scales = dense_scene(50_000)
    views = orbit_views(64, 48, 60.0)
    choices = [choose(means, scales, views, world=2, link=LinkEstimate.from_config(g)).choice
               for g in (0.1, 1, 10, 100, 1_000, 10_000, 100_000)]
    assert choices[0] == "pixel" and choices[-1] == "sparse-grad", choices
    assert sum(a != b for a, b in zip(choices, choices[1:])) == 1, choices  # one crossover


def test_modelled_time_is_transfer_plus_work():
    means, scales = dense_scene(10_000)
    views = orbit_views(64, 48, 60.0)
    link = LinkEstimate(1e9, 0.0, "config")
    costs = ComputeCosts(0.0, 0.0, 0.0, 0.0)
    d = choose(means, scales, views, world=2, link=link, costs=costs)
    assert d.sparse_grad_time_s == d.sparse_grad_transfer_s == d.sparse_grad_bytes / 2 / 1e9
    assert d.pixel_time_s == d.pixel_transfer_s == d.pixel_bytes / 2 / 1e9


def test_one_process_has_an_infinitely_fast_link():
    link = probe_link()
    assert link.bandwidth_bytes_per_s == float("inf") and link.seconds(1e12) == 0.0


def test_the_probe_gives_every_rank_the_same_finite_estimate(tmp_path):
    mp.start_processes(link_probe_worker.probe_rank, args=(2, free_port(), str(tmp_path)), nprocs=2, start_method="spawn")
    estimates = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in range(2)]
    assert estimates[0] == estimates[1]
    assert 0 < estimates[0]["bandwidth_bytes_per_s"] < float("inf") and estimates[0]["latency_s"] >= 0
    assert estimates[0]["source"] == "probe"
