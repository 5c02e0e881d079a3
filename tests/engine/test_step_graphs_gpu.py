"""Training steps replayed as CUDA graphs (--cuda-graph-steps, bytesplat_ns/step_graphs.py) on the GPU: the
same training as the steps issued from Python, through densification (a new capture after each refine),
with steps trained again after their pairs outgrew the room, and a replayed step issues a handful of
launches and never waits for the GPU. Backgrounds are black in these runs: a graph draws its random
background from another place in the random stream than the eager step, so random backgrounds would
train different (equally good) Gaussians."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.same_training import GAUSSIAN_NAMES, fused_trainer

pytestmark = pytest.mark.gpu

NAMES = GAUSSIAN_NAMES


def _trainer(tmp_path, iterations, graphs, label, margin=4.0):
    return fused_trainer(tmp_path, iterations, label, margin=margin, graphs=graphs, background="black")


def _capture_steps(monkeypatch):
    """The model steps at which the trainer captures its graph, recorded as the run goes."""
    from bytesplat_ns.step_graphs import StepGraphs

    steps = []
    real_capture = StepGraphs._capture

    def capture(self, model, *args):
        steps.append(model.step)
        return real_capture(self, model, *args)

    monkeypatch.setattr(StepGraphs, "_capture", capture)
    return steps


def _check_replays(monkeypatch, per_capture=3):
    """After each of the first ``per_capture`` replays of every graph: the same step computed eagerly on the same
    Gaussians, view and room (``graph_step_loss`` outside a capture), its loss, gradients and render statistics
    against the replay's. Returns the checked steps' worst errors, recorded as the run goes."""
    from bytesplat_ns.step_graphs import StepGraphs

    checked = []
    real_run = StepGraphs.run

    def run(self, model, key, viewmat, intrinsics, image, width, height):
        graph = real_run(self, model, key, viewmat, intrinsics, image, width, height)
        if graph is None or model.step - graph.captured_at >= per_capture:
            return graph
        params = model.gaussian_parameters()
        replayed = [p.grad.clone() for p in params]
        info = model.info
        for p in params:
            p.grad = None
        loss, rgb, _ = model.graph_step_loss(viewmat, intrinsics, width, height, image, graph.room)
        loss.backward()
        errors = {name: ((a - p.grad).abs().max() / p.grad.abs().max().clamp_min(1e-30)).item()
                  for name, a, p in zip(NAMES, replayed, params)}
        errors["means2d"] = ((graph.info["means2d"].grad - model.info["means2d"].grad).abs().max()
                             / model.info["means2d"].grad.abs().max()).item()
        errors["loss"] = abs(graph.loss.item() - loss.item()) / loss.item()
        errors["image"] = (graph.rgb - rgb).abs().max().item()  # the render a logged step's PSNR is read from
        errors["radii_equal"] = torch.equal(graph.info["radii"], model.info["radii"])
        checked.append((model.step, errors))
        for p, grad in zip(params, graph.grads):  # the replay's gradients back, for the optimizers' step
            p.grad = grad
        model.info = info
        return graph

    monkeypatch.setattr(StepGraphs, "run", run)
    return checked


def _record_losses(trainer):
    """Each step's training loss, and the logged steps' training PSNR, recorded as the run goes."""
    losses, psnrs = {}, {}
    real = trainer.train_iteration

    def train_iteration(step):
        loss, loss_dict, metrics_dict = real(step)
        losses[step] = loss.item()
        if "psnr" in metrics_dict:
            psnrs[step] = float(metrics_dict["psnr"])
        return loss, loss_dict, metrics_dict

    trainer.train_iteration = train_iteration
    return losses, psnrs


def test_graph_steps_train_the_same_gaussians_as_steps_from_python(tmp_path, monkeypatch):
    """Two GPU runs of one training drift apart (Adam with eps 1e-15 moves a parameter whose gradient is near zero
    by its learning rate, in the direction the atomics' order gives it; a Gaussian near a threshold splits in one
    run only): after the refine at step 100 two eager runs render the train views only ~25 dB alike (H100,
    2026-12-07). So each replay is held against the eager step on the same Gaussians, and the two runs' losses
    against each other before the first refine."""
    captured_at = _capture_steps(monkeypatch)
    checked = _check_replays(monkeypatch)
    graphed = _trainer(tmp_path, 110, True, "graphed")
    graphed_losses, graphed_psnrs = _record_losses(graphed)
    graphed.train()
    # steps 0-1 have no pair total read yet; a capture at the first graph step and after each refine that grew
    # the Gaussians: gsplat's rule refines at 80 and 100 here (a refine waits num_train_data + refine_every = 76
    # steps after each opacity reset, the first at step 0). Every other step replays, the logged ones too
    assert captured_at == [2, 81, 101], captured_at
    assert graphed.step_graphs.replays >= 104, graphed.step_graphs.replays
    assert [step for step, _ in checked] == [2, 3, 4, 81, 82, 83, 101, 102, 103], checked
    for step, errors in checked:  # float sums in another order: atomics (gradients <= 1e-4 relative, issue 22)
        assert errors.pop("radii_equal"), step
        assert errors.pop("loss") < 1e-6, (step, errors)
        assert errors.pop("image") <= 1e-5, (step, errors)
        assert max(errors.values()) < 1e-4, (step, errors)
    model = graphed.pipeline.model
    for name in NAMES:  # every step updated every parameter once
        assert float(model.optimizers[name].state[model.gauss_params[name]]["step"]) == 110.0, name

    eager = _trainer(tmp_path, 110, False, "eager")
    eager_losses, eager_psnrs = _record_losses(eager)
    eager.train()
    assert eager.step_graphs is None
    # the same views in the same order, the same Gaussians until the first refine (at the end of step 80)
    for step in range(81):
        assert abs(graphed_losses[step] - eager_losses[step]) <= 1e-3 * eager_losses[step], step
    # the logged steps' training PSNR (every 10th step), read from the replayed render at steps 10-80
    assert sorted(graphed_psnrs) == sorted(eager_psnrs) == list(range(0, 110, 10))
    for step in range(0, 81, 10):
        assert abs(graphed_psnrs[step] - eager_psnrs[step]) < 0.01, (step, graphed_psnrs[step], eager_psnrs[step])
    counts = [t.pipeline.model.num_points for t in (graphed, eager)]
    assert abs(counts[0] - counts[1]) <= 0.02 * max(counts), counts


def test_the_gaussian_budget_removes_gaussians_between_graph_steps(tmp_path, monkeypatch):
    """The budget step (step 15000 of splatfacto's schedule, 50 here) removes the least seen Gaussians after a
    step: the next graph step captures the graph again for the fewer Gaussians, and training goes on."""
    def budget_at_step_50(config):
        config.pipeline.model.budget_prune_fraction = 0.3
        config.pipeline.model.budget_prune_steps = (50,)

    captured_at = _capture_steps(monkeypatch)
    trainer = fused_trainer(tmp_path, 70, "budget", margin=4.0, graphs=True, background="black",
                            configure=budget_at_step_50)
    model = trainer.pipeline.model
    counts = {}  # Gaussians at the start of each step
    real_iteration = trainer.train_iteration

    def train_iteration(step):
        counts[step] = model.num_points
        return real_iteration(step)

    trainer.train_iteration = train_iteration
    trainer.train()
    (stats,) = model.budget.history
    assert stats["step"] == 50 and stats["removed"] == int(0.3 * counts[50]) > 0
    assert counts[51] == counts[50] - stats["removed"] == model.num_points
    assert captured_at[0] == 2 and 51 <= min(s for s in captured_at if s > 50) <= 52, captured_at
    assert trainer.step_graphs.replays >= 50, trainer.step_graphs.replays
    for name in NAMES:
        assert float(model.optimizers[name].state[model.gauss_params[name]]["step"]) == 70.0, name
    assert all(p.isfinite().all() for p in model.gaussian_parameters())


def test_a_replayed_step_past_its_room_is_trained_again_and_the_graph_captured_again(tmp_path, monkeypatch):
    from bytesplat_ns.model import ByteSplatModel

    real_room = ByteSplatModel.graph_step_room
    model_steps = []

    def graph_step_room(self):  # asked at each capture
        room = real_room(self)
        return 1 if room is not None and self.step == 81 else room  # room for one pair: the step cannot fit

    monkeypatch.setattr(ByteSplatModel, "graph_step_room", graph_step_room)
    captured_at = _capture_steps(monkeypatch)
    trainer = _trainer(tmp_path, 90, True, "overflow")
    model = trainer.pipeline.model
    real_again = type(trainer).train_view_again

    def train_view_again(self, model, camera, batch, step):
        model_steps.append(step)
        real_again(self, model, camera, batch, step)

    monkeypatch.setattr(type(trainer), "train_view_again", train_view_again)
    trainer.train()
    # captured at step 81, after the refine at step 80, in a room too small: steps 81 and 82 replay it and
    # overflow. Step 81's total, read at step 83, trains its view again and captures the graph again, in the
    # room the view's own total now gives; step 82's, read at step 84, trains its view again and leaves the
    # new graph be (step 82 replayed the old one)
    assert model_steps == [83, 84] and model.pair_room.overflows == 2
    assert captured_at == [2, 81, 83], captured_at
    for name in NAMES:
        assert float(model.optimizers[name].state[model.gauss_params[name]]["step"]) == 90.0, name


def test_a_replayed_step_issues_few_launches_and_never_waits(tmp_path):
    from torch.profiler import ProfilerActivity, profile

    from bytesplat_ns.bench.profile_train import loop_body

    launches = {}
    for graphs in (True, False):
        trainer = _trainer(tmp_path, 22, graphs, f"graphs_{graphs}")
        trainer.train()
        loop_body(trainer, 22)  # captured here where graphs are on: the profile below holds replays only
        torch.cuda.synchronize()
        steps = [s for s in range(23, 33) if s % 10 != 0]  # no refine, divergence check or logged step
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for step in steps:
                loop_body(trainer, step)
        events = prof.key_averages()
        syncs = sum(e.count for e in events if e.key in ("cudaStreamSynchronize", "cudaDeviceSynchronize"))
        assert syncs == 0, syncs
        launches[graphs] = sum(e.count for e in events if e.key in ("cudaLaunchKernel", "cuLaunchKernel",
                                                                   "cudaLaunchKernelExC", "cuLaunchKernelEx"))
        launches[graphs] /= len(steps)
        if graphs:
            assert sum(e.count for e in events if e.key.startswith("cudaGraphLaunch")) == len(steps)
    assert launches[True] < 0.4 * launches[False], launches


def test_a_step_that_cannot_be_captured_turns_graph_steps_off_and_training_goes_on(tmp_path, monkeypatch, capsys):
    from bytesplat_ns.model import ByteSplatModel

    real_loss = ByteSplatModel.graph_step_loss

    def graph_step_loss(self, *args):  # waits for the GPU: not capturable
        if torch.cuda.is_current_stream_capturing():
            torch.cuda.synchronize()
        return real_loss(self, *args)

    monkeypatch.setattr(ByteSplatModel, "graph_step_loss", graph_step_loss)
    trainer = _trainer(tmp_path, 30, True, "uncapturable")
    trainer.train()
    # the first graph step (2) fails and runs eagerly, the next (3) captures again, fails too: graphs end
    assert trainer.step_graphs.off and [step for step, _ in trainer.step_graphs.failures] == [2, 3]
    assert trainer.step_graphs.replays == 0
    out = capsys.readouterr().out.replace("\n", " ")
    assert "step 2 ran eagerly, the next graph step captures again" in out
    assert "--cuda-graph-steps off for the rest of this run" in out
    model = trainer.pipeline.model
    for name in NAMES:  # every step trained once, eagerly after the failed capture
        assert float(model.optimizers[name].state[model.gauss_params[name]]["step"]) == 30.0, name
    assert torch.rand(4, device="cuda").isfinite().all()  # the random generator left capture mode
    assert all(p.isfinite().all() for p in model.gaussian_parameters())


def test_graph_steps_capture_at_each_new_resolution_of_the_coarse_start(tmp_path, monkeypatch):
    """splatfacto's coarse start trains at 1/4, then 1/2, then full resolution, and the first graph step at a new
    size captures a new graph. What is made once per size (the fused loss's normalisation, a host-to-device
    copy) must not be made inside that capture: an eager warm-up pass precedes the first capture of each size
    (step_graphs.WARMUP_STEPS). Without it, in ns-train on fox (H100, 2026-12-07), graph steps ended at the switch
    to 1/2 (step 3000; the failure's message was not kept, the copy is the cause the code shows)."""
    def coarse_start(config):
        model = config.pipeline.model
        model.num_downscales, model.resolution_schedule, model.min_train_resolution = 2, 30, 0  # 32x24 first

    captured_at = _capture_steps(monkeypatch)
    trainer = fused_trainer(tmp_path, 70, "coarse", margin=4.0, graphs=True, background="black", configure=coarse_start)
    sizes = {}
    real_view = type(trainer.pipeline.model).graph_step_view

    def graph_step_view(self, camera):
        view = real_view(self, camera)
        sizes.setdefault((view[2], view[3]), self.step)  # the first step at each size
        return view

    monkeypatch.setattr(type(trainer.pipeline.model), "graph_step_view", graph_step_view)
    trainer.train()
    graphs = trainer.step_graphs
    assert not graphs.off and graphs.failures == [], graphs.failures
    assert sorted(sizes.values()) == [2, 30, 60], sizes  # graph steps at 1/4 from step 2, 1/2 at 30, full at 60
    assert {30, 60} <= set(captured_at), captured_at  # a capture at the first step of each new size
    assert graphs.replays >= 60, graphs.replays
    model = trainer.pipeline.model
    for name in NAMES:
        assert float(model.optimizers[name].state[model.gauss_params[name]]["step"]) == 70.0, name
