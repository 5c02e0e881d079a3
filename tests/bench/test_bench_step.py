"""bytesplat-bench step: the kernel categories, the stage clock's bookkeeping, splatfacto's parameter
layout (CPU); the steps themselves on a GPU (skipped without one)."""

from __future__ import annotations

import pytest
import torch

from bytesplat_ns.bench import step
from bytesplat_ns.bench.synthetic import synthetic_scene


@pytest.mark.parametrize("name, category", [
    ("fully_fused_projection_fwd_kernel", "projection fwd"),          # gsplat 1.4.0
    ("projection_ewa_3dgs_fused_bwd_kernel", "projection bwd"),        # gsplat 1.5.3
    ("compute_sh_fwd_kernel", "sh fwd"), ("spherical_harmonics_bwd_kernel", "sh bwd"),
    ("void cub::DeviceRadixSortOnesweepKernel<...>", "binning fwd"), ("isect_offset_encode", "binning fwd"),
    ("intersect_tile_kernel", "binning fwd"), ("emit_kernel", "binning fwd"),
    ("rasterize_to_pixels_fwd_kernel", "render fwd"), ("rasterize_to_pixels_3dgs_bwd_kernel", "render bwd"),
    ("render_fwd_kernel", "render fwd"), ("render_bwd_kernel", "render bwd"), ("loss_grad_kernel", "loss fwd"),
    ("fusedssim_backwardCUDA", "loss bwd"), ("cudnn::detail::conv2d_grouped_direct_kernel", "loss fwd"),
    ("void at::native::multi_tensor_apply_kernel<FusedAdamMathFunctor>", "optimizer"),
    ("selective_adam_update_kernel", "optimizer"),
    ("void bytesplat::(anonymous namespace)::adam_step_kernel<true>(float*, float const*, float*, float*, long, "
     "float const*, bytesplat::(anonymous namespace)::AdamScalars)", "optimizer"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", "other kernels"),
    ("Memcpy DtoD (Device -> Device)", "other kernels"),
])
def test_kernel_categories(name, category):
    assert step.kernel_category(name) == category


def test_categorize_sums_per_step():
    per_step = step.categorize({"render_fwd_kernel": 3000.0, "render_bwd_kernel": 1000.0, "emit_kernel": 500.0,
                                "count_kernel": 500.0, "elementwise": 200.0}, steps=2)
    assert per_step == {"render fwd": 1.5, "render bwd": 0.5, "binning fwd": 0.5, "other kernels": 0.1}
    assert list(per_step)[0] == "render fwd"  # largest first


class FakeEvent:
    clock = [0.0]

    def record(self):
        FakeEvent.clock[0] += 1.0
        self.t = FakeEvent.clock[0] ** 1.5  # uneven spacing: each span differs

    def elapsed_time(self, other):
        return other.t - self.t


def test_stage_clock_splits_steps_at_start():
    clock = step.StageClock(new_event=FakeEvent)
    for _ in range(3):
        clock.start()
        clock.mark("a")
        clock.mark("b")
    steps = clock.steps()
    assert len(steps) == 3 and all(list(s) == ["a", "b"] for s in steps)
    assert all(s["a"] > 0 and s["b"] > 0 for s in steps) and steps[0]["a"] != steps[1]["a"]
    assert clock.events == []


def test_splatfacto_parameters_reproduce_the_scene():
    scene = synthetic_scene(500, 64, 48, 3, seed=1, device="cpu")
    params = step.initial_params(scene)
    assert set(params) == set(step.LEARNING_RATES)
    assert params["features_rest"].shape == (500, 15, 3) and params["opacities"].shape == (500, 1)
    means, quats, scales, opacities, colors = step.activated(params)
    torch.testing.assert_close(scales, scene["scales"], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(opacities, scene["opacities"].clamp(1e-6, 1 - 1e-6), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(colors, scene["colors"])
    torch.testing.assert_close(quats.norm(dim=-1), torch.ones(500))


def test_trained_scene_excludes_the_random_scenes_options(capsys):
    with pytest.raises(SystemExit) as exit_info:
        step.main(["--trained", "/nonexistent/run", "--num-gaussians", "1000"])
    assert exit_info.value.code == 2 and "cannot be combined with --trained" in capsys.readouterr().err


def test_another_gsplat_gets_the_same_scene_through_a_file(tmp_path, monkeypatch):
    """run_in_site hands its scene to the child as a file the child loads unchanged."""
    import json
    import subprocess

    from bytesplat_ns.bench.scene_file import load_scene

    scene = synthetic_scene(300, 64, 48, 3, seed=2, device="cpu")
    seen = {}

    def fake_run(command, env, capture_output, text):
        path = command[command.index("--scene-file") + 1]
        seen["scene"] = load_scene(path, device="cpu")
        seen["env"] = env
        out = command[command.index("--out") + 1]
        with open(out, "w") as f:
            json.dump({"rows": [{"name": "gsplat", "wall_ms": 1.0}]}, f)
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(subprocess, "run", fake_run)
    args = step.parser().parse_args(["--warmup", "1", "--repeats", "2"])
    row = step.run_in_site(str(tmp_path), "gsplat", scene, args)
    assert row == {"name": "gsplat", "wall_ms": 1.0, "site": str(tmp_path)}
    assert seen["env"]["PYTHONPATH"].split(":")[0] == str(tmp_path)
    assert set(seen["scene"]) == set(scene)
    for key, value in scene.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(seen["scene"][key], value), key
        else:
            assert seen["scene"][key] == value, key


def test_step_is_a_registered_subcommand_with_a_suite():
    from bytesplat_ns.bench import suites
    from bytesplat_ns.bench.commands import step_parser

    assert step_parser("step").parse_args([]).implementations == ["splatfacto", "bytesplat"]
    assert step_parser("step").parse_args(["--implementations", "bytesplat-square-tiles"]).implementations == [
        "bytesplat-square-tiles"]
    assert suites.SUITES["step-baselines"].steps[0].command == "step"


def test_bytesplat_row_steps_its_optimizers_as_the_trainer_does(monkeypatch):
    """The row's optimizer stage is the trainer's default one pass (optim.step_in_one_pass over all six),
    Adam's update on every parameter, the gradients cleared to None. The fused render is CUDA-only, so
    a differentiable stand-in gives the loss here."""
    from bytesplat_ns import optim
    from bytesplat_ns.raster import fused

    scene = synthetic_scene(200, 32, 24, 3, seed=3, device="cpu")
    row = step.BytesplatStep(scene)
    before = {name: p.detach().clone() for name, p in row.params.items()}

    def stand_in(means, quats, scales, opacities, sh, *args, **kwargs):
        means2d = means[:, :2].unsqueeze(0) * 1.0
        loss = (means ** 2).sum() + quats.sum() + scales.sum() + opacities.sum()
        loss = loss + (sh.dc ** 2).sum() + (sh.rest ** 2).sum() + means2d.sum()
        return loss, None, None, {"means2d": means2d, "radii": torch.ones(1, len(means), dtype=torch.int32)}

    passes = []
    monkeypatch.setattr(fused, "fused_render_loss", stand_in)
    monkeypatch.setattr(optim, "step_in_one_pass", lambda optimizers: passes.append(list(optimizers)) or
                        [o.step() for o in optimizers])
    monkeypatch.setattr(row.strategy, "_update_state", lambda *args, **kwargs: None)
    row(step.StageClock(new_event=lambda: type("E", (), {"record": lambda self: None})()))

    assert len(passes) == 1 and passes[0] == row.optimizers and len(row.optimizers) == len(row.params)
    for name, param in row.params.items():
        assert param.grad is None, name
        # Adam's first step moves every entry with a gradient by its learning rate
        moved = (param.detach() - before[name]).abs()
        torch.testing.assert_close(moved.max(), torch.tensor(step.LEARNING_RATES[name]), rtol=1e-2, atol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_steps_train_the_same_scene_from_the_same_loss():
    scene = synthetic_scene(20_000, 256, 192, 3)
    rows = step.run_here(["splatfacto", "bytesplat", "bytesplat-visible", "bytesplat-square-tiles",
                          "bytesplat-reach-torch"], scene, warmup=3,
                         repeats=5, profile_steps=2)
    assert all("error" not in r for r in rows), rows
    first = rows[0]["loss_step0"]
    for row in rows:
        assert row["loss_step0"] == pytest.approx(first, rel=1e-4)  # one loss, two implementations
        assert row["loss_last"] < row["loss_step0"]  # the optimizer really trains
        assert row["wall_ms"] > 0 and row["gpu_busy_ms"] > 0 and sum(row["stages_ms"].values()) > 0
        assert {"backward", "densification", "optimizer"} <= set(row["stages_ms"])
        assert "optimizer" in row["kernel_categories_ms"] and "render fwd" in row["kernel_categories_ms"]
    ours, visible_only, square_tiles = rows[1], rows[2], rows[3]
    assert "visible Gaussians only" in visible_only["implementation"]
    assert "opacity-aware tiles" in ours["implementation"]  # the default
    assert "square tile boxes" in square_tiles["implementation"]
    assert square_tiles["loss_step0"] == pytest.approx(ours["loss_step0"], rel=1e-6)  # the same render
    assert "reach in torch" in rows[4]["implementation"]
    assert rows[4]["loss_step0"] == pytest.approx(ours["loss_step0"], rel=1e-7)  # the same tile lists
    assert "render bwd" in ours["kernel_categories_ms"] and "binning fwd" in ours["kernel_categories_ms"]


def test_host_issue_time_starts_each_step_on_an_idle_device_and_takes_the_median(monkeypatch):
    from bytesplat_ns.bench.step import StageClock, host_issue_ms

    now = [100.0]
    monkeypatch.setattr(step.time, "perf_counter", lambda: now[0])
    calls, durations = [], iter([0.004, 0.001, 0.002])

    def fake_step(clock):
        calls.append("step")
        clock.start()
        took = next(durations)
        now[0] += took / 4
        clock.mark("render")  # a quarter of the step
        now[0] += 3 * took / 4
        clock.mark("optimizer")

    clock = StageClock(new_event=lambda: type("E", (), {"record": lambda self: None})())
    ms, stages = host_issue_ms(fake_step, clock, 3, synchronize=lambda: calls.append("sync"))
    assert calls == ["sync", "step", "sync", "step", "sync", "step", "sync"]
    assert ms == pytest.approx(2.0)  # the median of 4, 1 and 2 ms
    assert stages == pytest.approx({"render": 0.5, "optimizer": 1.5})  # each stage's median
    assert clock.events == [] and clock.host == []


def test_graph_row_is_registered_and_reports_its_room():
    """``bytesplat-graph`` (its capture and replay are GPU-only: tests/bench/test_step_graph_gpu.py): a choice of
    the subcommand, in the step-graph suite beside ``bytesplat``, and a row that says its room and its steps."""
    from bytesplat_ns.bench import suites
    from bytesplat_ns.bench.commands import step_parser

    assert step_parser("step").parse_args(["--implementations", "bytesplat-graph"]).implementations == ["bytesplat-graph"]
    graphed = step.build_step("bytesplat-graph", synthetic_scene(200, 32, 24, 3, seed=3, device="cpu"))
    assert isinstance(graphed, step.BytesplatGraphStep) and "one CUDA graph" in graphed.label
    assert graphed.report() == {"pair_room": 0, "eager_steps": 0, "graph_replays": 0, "loss_step0": pytest.approx(
        float("nan"), nan_ok=True)}
    for name in ("step_trained", "step_1m"):
        args = next(s for s in suites.SUITES["step-graph"].steps if s.name == name).args
        assert args[args.index("--implementations") + 1:][:2] == ("bytesplat", "bytesplat-graph")


def test_each_bytesplat_variant_changes_only_its_options_and_keeps_its_label():
    """A variant is the trainer's fused defaults with its own fields changed, and its label keeps the words the
    committed results use (the results page finds earlier rows by them)."""
    from bytesplat_ns.raster.options import DEFAULT_OPTIONS

    scene = synthetic_scene(50, 16, 16, 1, seed=0, device="cpu")
    labels = {
        "bytesplat": "opacity-aware tiles, trimmed tile lists",
        "bytesplat-square-tiles": "square tile boxes, trimmed tile lists",
        "bytesplat-reach-torch": "opacity-aware tiles, reach in torch, trimmed tile lists",
        "bytesplat-exact-exp": "opacity-aware tiles, falloff as expf, trimmed tile lists",
        "bytesplat-bwd-2px": "opacity-aware tiles, 2 pixels per thread in the backward, trimmed tile lists",
        "bytesplat-longest-first": "opacity-aware tiles, longest tiles first, trimmed tile lists",
        "bytesplat-rows-cull": "opacity-aware tiles, rows warp cull, trimmed tile lists",
        "bytesplat-untrimmed": "opacity-aware tiles",
    }
    assert set(labels) == set(step.OPTION_VARIANTS)
    for name, words in labels.items():
        row = step.build_step(name, scene)
        assert row.label == f"bytesplat (fused split, {words}) + bytesplat Adam", name
        changed = {f: getattr(row.options, f) for f in DEFAULT_OPTIONS.__dataclass_fields__
                   if getattr(row.options, f) != getattr(DEFAULT_OPTIONS, f)}
        assert changed == step.OPTION_VARIANTS[name], name
    visible = step.build_step("bytesplat-visible", scene)
    assert visible.options == DEFAULT_OPTIONS and visible.label.endswith("+ bytesplat Adam, visible Gaussians only")
