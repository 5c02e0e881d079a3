"""bytesplat-bench step's ``bytesplat-graph``: the whole step captured as one CUDA graph trains as the
same step issued from Python, and a step whose tile pairs outgrow the room is reported, not timed."""

from __future__ import annotations

import pytest
import torch

from bytesplat_ns.bench import step
from bytesplat_ns.bench.synthetic import synthetic_scene

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _clock():
    return step.StageClock()


def test_replayed_graph_trains_as_the_step_issued_from_python():
    scene = synthetic_scene(20_000, 256, 192, 3)
    graphed, eager = step.BytesplatGraphStep(scene), step.BytesplatStep(scene)
    replays = 5
    graph_losses = [float(graphed(_clock())) for _ in range(replays)]
    report = graphed.report()
    assert report["graph_replays"] == replays and report["eager_steps"] == 1 + graphed.warmup_steps
    assert report["pair_room"] > 1024
    eager_losses = [float(eager(_clock())) for _ in range(report["eager_steps"] + replays)]
    # the same steps in the same order (two GPU runs differ in the backward's float atomics, not more)
    assert graph_losses == pytest.approx(eager_losses[report["eager_steps"]:], rel=1e-4)
    assert graph_losses[-1] < eager_losses[0]  # it trains
    for name, param in graphed.params.items():
        other = eager.params[name]
        close = torch.isclose(param, other, rtol=1e-3, atol=1e-5)
        # Adam with eps 1e-15 moves a parameter by its learning rate whatever the gradient's size: a gradient near
        # zero whose sign the atomics' order flips moves it the other way, so a few entries may differ
        assert close.float().mean() > 0.999, name


def test_a_room_too_small_makes_the_row_an_error():
    scene = synthetic_scene(20_000, 256, 192, 3)
    graphed = step.BytesplatGraphStep(scene)
    graphed.room_margin = 0.0  # room for 1024 pairs: far fewer than the scene's
    graphed(_clock())
    with pytest.raises(RuntimeError, match="outgrew their room"):
        graphed.report()
    row = step.run_here(["bytesplat-graph"], scene, warmup=1, repeats=2, profile_steps=1)[0]
    assert "error" not in row and row["pair_room"] > 1024 and row["graph_replays"] > 0


def test_the_rows_of_both_steps_start_from_the_same_loss():
    scene = synthetic_scene(20_000, 256, 192, 3)
    rows = step.run_here(["bytesplat", "bytesplat-graph"], scene, warmup=3, repeats=5, profile_steps=2)
    assert all("error" not in r for r in rows), rows
    ours, graphed = rows
    assert graphed["loss_step0"] == pytest.approx(ours["loss_step0"], rel=1e-6)
    assert graphed["loss_last"] < graphed["loss_step0"]
    assert "graph replay" in graphed["stages_ms"] and graphed["gpu_busy_ms"] > 0
    assert "render bwd" in graphed["kernel_categories_ms"]  # the profiler sees the graph's kernels
    assert "CUDA graph" in graphed["implementation"]
