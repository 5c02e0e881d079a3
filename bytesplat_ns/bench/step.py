r"""``bytesplat-bench step``: one whole training step, as each trainer runs it, with where its time goes.

    bytesplat-bench step --num-gaussians 1000000 4000000 --gsplat-site /tmp/gsplat-1.5.3 --out step.json

A step is what a trainer does per image after the data is on the GPU: activations, projection, SH,
binning, rendering, the loss, the backward pass, the densification statistics and the optimizer.
Every implementation trains the same Gaussians against the same image, in splatfacto's six parameter
groups with its learning rates: random ones (``synthetic.synthetic_scene``: 1920x1080, SH 3, one camera;
``--num-gaussians``) or a trained run's with one of its train views and images (``--trained RUN_DIR``;
the gsplat of a ``--gsplat-site`` gets the same scene through a file, ``bench.scene_file``):

- ``splatfacto``: gsplat's ``rasterization`` (this process's gsplat, nerfstudio's 1.4.0), the loss
  with pytorch_msssim, one ``torch.optim.Adam`` per group, gsplat's ``DefaultStrategy`` statistics.
- ``gsplat``: the gsplat of each ``--gsplat-site`` (e.g. 1.5.3, in a child process that puts it first
  on its path) as its own trainer runs it where it is fastest: fussim's fused SSIM, gsplat's
  ``SelectiveAdam`` (updates only the Gaussians the camera sees) and its strategy's statistics.
- ``bytesplat``: our fused split schedule (projection, SH from the DC and rest parameters as they
  are, our binning into each Gaussian's opacity-aware reach, render + loss + 2D gradients in our
  kernels), the sync-free statistics and ``optim.DeviceAdam`` (by default our Adam kernel,
  cuda/adam.cu) stepped as the trainer steps it (``optim.step_in_one_pass``, its default
  ``--optimizer-steps-in-one-pass``), with the inputs ``ns-train bytesplat`` gives it (:func:`model_inputs`).
- ``bytesplat-visible``: the same with Adam on the visible Gaussians only
  (``--pipeline.model.optimize-visible-only``: ``DeviceAdam.visible_rows``, the kernel's row mask).
- ``bytesplat-square-tiles``: ``bytesplat`` binning each Gaussian into the projection's square
  3-sigma box instead of its opacity-aware reach (``--pipeline.model.fused.opacity-aware-tiles
  False``, ``raster/tile_reach.py``: the same render, longer tile lists).
- ``bytesplat-reach-torch``: ``bytesplat`` computing the opacity-aware reach with its PyTorch
  definition (``--pipeline.model.fused.tile-reach torch``, raster/tile_reach.py, about 15 elementwise
  launches) instead of our one-launch kernel (cuda/tile_reach.cu): the same radii, hence the same lists.
- ``bytesplat-exact-exp``: ``bytesplat`` with the falloff as expf instead of 2^q from the prescaled conic
  (``--pipeline.model.fused.fast-exp False``, cuda/common.cuh ``staged_conic``).
- ``bytesplat-bwd-2px``: ``bytesplat`` with two pixels per thread in the backward
  (``--pipeline.model.fused.bwd-pixels-per-thread 2``, cuda/render_bwd.cu ``render_bwd_2px_kernel``): every
  opt-in lever of the render at once.
- ``bytesplat-longest-first``: ``bytesplat`` with the blocks taking the longest tile lists first
  (``--pipeline.model.fused.tile-order longest_first``, raster/tiles.py ``tile_order``).
- ``bytesplat-rows-cull``: ``bytesplat`` with the backward's per-warp cull also testing each row of warp
  blocks against each Gaussian's alpha >= 1/255 ellipse (``--pipeline.model.fused.warp-cull-rows True``,
  raster/warp_masks.py).
- ``bytesplat-untrimmed``: ``bytesplat`` walking the tile lists as binned, without dropping the entries whose
  Gaussian reaches no 8x4 block of their tile (``--pipeline.model.fused.trim-tile-lists False``; the default
  trims them, cuda/warp_masks.cu ``trim_tile_lists``).
- ``bytesplat-graph``: ``bytesplat``'s step captured once as a CUDA graph and replayed (:class:`BytesplatGraphStep`),
  its tile lists binned into a room sized from its first step's pair count: the step with no host work but one
  graph launch, the ceiling of graphing the trainer's step (the row's ``pair_room``; a replayed step whose pairs
  outgrew it makes the row an error).

Reported per implementation: ``wall_ms`` (host clock over ``--repeats`` back-to-back steps, the
GPU drained at both ends: what a training loop gets), the stages' spans (CUDA events at the stage
boundaries on the host's stream: ``rasterize`` (or ``rasterize+loss`` where the loss is fused into
it), ``loss``, ``backward``, ``densification``, ``optimizer``) and, from a few steps under
torch.profiler, the GPU's busy time per kernel category (projection, SH, binning, render, loss,
optimizer, each forward and backward, and the rest: activations, copies, reductions). ``wall_ms``
minus ``gpu_busy_ms`` is the time the GPU waited for the host (launches, Python, synchronisations).
``host_issue_ms``: the median host time of one more step started on an idle GPU (its Python, launches and
the waits of its device reads); near ``wall_ms``, the step is bound by its host side.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

# splatfacto's learning rates (nerfstudio 1.1.5 method_configs) and Adam eps, per parameter group
LEARNING_RATES = {"means": 1.6e-4, "scales": 5e-3, "quats": 1e-3, "features_dc": 2.5e-3,
                  "features_rest": 2.5e-3 / 20, "opacities": 5e-2}
ADAM_EPS = 1e-15

# The bytesplat steps that differ from the trainer's defaults in fused options only: name -> the changed fields.
OPTION_VARIANTS: Dict[str, Dict] = {
    "bytesplat": {},
    "bytesplat-square-tiles": {"opacity_aware_tiles": False},
    "bytesplat-reach-torch": {"tile_reach": "torch"},
    "bytesplat-exact-exp": {"fast_exp": False},
    "bytesplat-bwd-2px": {"bwd_pixels_per_thread": 2},
    "bytesplat-longest-first": {"tile_order": "longest_first"},
    "bytesplat-rows-cull": {"warp_cull_rows": True},
    "bytesplat-untrimmed": {"trim_tile_lists": False},
}
IMPLEMENTATIONS = ("splatfacto", "gsplat", "bytesplat", "bytesplat-visible", *list(OPTION_VARIANTS)[1:], "bytesplat-graph")


def options_label(options) -> str:
    """How a step's fused options read in its label (the results keep these words: do not reword them)."""
    words = "square tile boxes" if not options.opacity_aware_tiles else "opacity-aware tiles" + (
        ", reach in torch" if options.tile_reach == "torch" else "")
    words += ", falloff as expf" if not options.fast_exp else ""
    words += ", 2 pixels per thread in the backward" if options.bwd_pixels_per_thread == 2 else ""
    words += ", longest tiles first" if options.tile_order == "longest_first" else ""
    words += ", rows warp cull" if options.warp_cull_rows else ""
    return words + (", trimmed tile lists" if options.trim_tile_lists else "")


# kernel name -> category; the first pattern that matches wins, "bwd"/"backward" in a name marks it backward
KERNEL_CATEGORIES: Tuple[Tuple[str, str], ...] = (
    ("optimizer", r"adam|multi_tensor_apply"),
    ("sh", r"spherical_harmonics|(^|[^a-z])sh_|_sh_|compute_sh"),
    ("projection", r"projection|quat_scale_to_covar|world_to_cam|persp_proj"),
    ("binning", r"isect|intersect|radix|onesweep|bin_tiles|count_kernel|emit_kernel|offsets_kernel"),
    ("render", r"rasteriz|render_fwd|render_bwd|fused_loss_kernel"),
    ("loss", r"ssim|loss_grad|conv|cudnn|gemm|xmma|winograd|implicit"),
)
BACKWARD = re.compile(r"bwd|backward", re.IGNORECASE)


def kernel_category(name: str) -> str:
    """``"<category> fwd"`` / ``"<category> bwd"`` for a CUDA kernel's name, ``"other kernels"`` when no
    pattern matches (elementwise activations, copies, reductions, the densification statistics)."""
    lowered = name.lower()
    for category, pattern in KERNEL_CATEGORIES:
        if re.search(pattern, lowered):
            if category == "optimizer":
                return category
            if category == "render" and "fused_loss_kernel" in lowered:
                return "render+loss fwd+bwd"
            return f"{category} {'bwd' if BACKWARD.search(name) else 'fwd'}"
    return "other kernels"


def categorize(kernel_us: Dict[str, float], steps: int) -> Dict[str, float]:
    """Milliseconds per step in each category of ``kernel_us`` (kernel name -> total microseconds over
    ``steps`` steps), largest first."""
    out: Dict[str, float] = {}
    for name, us in kernel_us.items():
        key = kernel_category(name)
        out[key] = out.get(key, 0.0) + us / 1000.0 / steps
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


class StageClock:
    """CUDA events at stage boundaries: ``start()``, then ``mark(stage)`` after each stage's launches; each
    boundary also stamps the host's clock (``host_stages``: where the host's time goes)."""

    def __init__(self, new_event: Callable[[], "torch.cuda.Event"] = lambda: torch.cuda.Event(enable_timing=True)):
        self.new_event = new_event
        self.events: List[Tuple[str, torch.cuda.Event]] = []
        self.host: List[Tuple[str, float]] = []

    def _record(self, name: str) -> None:
        event = self.new_event()
        event.record()
        self.events.append((name, event))
        self.host.append((name, time.perf_counter()))

    def host_stages(self) -> List[Dict[str, float]]:
        """Per step, each stage's host milliseconds (from the boundary before it to its own), then clears:
        the time to issue the stage's launches and to wait for any device read inside it."""
        out = _per_step(self.host, lambda a, b: 1e3 * (b - a))
        self.host.clear()
        return out

    def start(self) -> None:
        self._record("")

    def mark(self, stage: str) -> None:
        self._record(stage)

    def steps(self) -> List[Dict[str, float]]:
        """Per step (from one ``start`` to the next), each stage's milliseconds; call after a sync."""
        out = _per_step(self.events, lambda a, b: a.elapsed_time(b))
        self.events.clear()
        self.host.clear()
        return out


def _per_step(marks: List[Tuple[str, Any]], span: Callable[[Any, Any], float]) -> List[Dict[str, float]]:
    """Stage boundaries ``(stage, mark)`` (``""`` where a step starts) -> per step, each stage's
    ``span(mark before it, its mark)``."""
    out: List[Dict[str, float]] = []
    for (_, a), (name, b) in zip(marks, marks[1:]):
        if name == "":
            continue
        if not out or name in out[-1]:
            out.append({})
        out[-1][name] = span(a, b)
    return out


def initial_params(scene: Dict) -> Dict[str, torch.nn.Parameter]:
    """splatfacto's parameters of ``synthetic_scene``'s Gaussians (log scales, logit opacities, SH
    split into DC and rest)."""
    colors = scene["colors"]
    raw = {"means": scene["means"], "scales": scene["scales"].log(), "quats": scene["quats"],
           "features_dc": colors[:, 0, :], "features_rest": colors[:, 1:, :],
           "opacities": torch.logit(scene["opacities"].clamp(1e-6, 1 - 1e-6))[:, None]}
    return {k: torch.nn.Parameter(v.detach().clone().contiguous()) for k, v in raw.items()}


def activated(params: Dict[str, torch.Tensor]) -> Tuple[torch.Tensor, ...]:
    """What splatfacto's get_outputs hands the rasterizer: means, unit quats, scales, opacities, SH."""
    quats = params["quats"] / params["quats"].norm(dim=-1, keepdim=True)
    colors = torch.cat([params["features_dc"][:, None, :], params["features_rest"]], dim=1)
    return (params["means"], quats, torch.exp(params["scales"]), torch.sigmoid(params["opacities"]).squeeze(-1),
            colors)


def model_inputs(params: Dict[str, torch.Tensor]) -> Tuple:
    """What ByteSplatModel.get_outputs hands its fused path: :func:`activated` less two per-step
    copies, the quaternions as they are (both projections normalise them, forward and backward) and
    the SH coefficients unstacked (``ShCoefficients``: the SH kernel reads DC and rest in place)."""
    from bytesplat_ns.raster.sh import ShCoefficients

    return (params["means"], params["quats"], torch.exp(params["scales"]),
            torch.sigmoid(params["opacities"]).squeeze(-1),
            ShCoefficients(params["features_dc"], params["features_rest"]))


class TrainingStep:
    """One implementation's step on ``scene`` (``synthetic.synthetic_scene``'s dict)."""

    label = ""

    def __init__(self, scene: Dict):
        self.scene = scene
        self.params = initial_params(scene)
        self.W, self.H, self.sh_degree = scene["width"], scene["height"], scene["sh_degree"]

    def adam_groups(self, optimizer: Callable) -> List[torch.optim.Optimizer]:
        return [optimizer([{"params": [p], "lr": LEARNING_RATES[name], "name": name}])
                for name, p in self.params.items()]

    def __call__(self, clock: StageClock) -> torch.Tensor:
        raise NotImplementedError

    def report(self) -> Dict:
        """What the implementation adds to its row."""
        return {}


class GsplatStep(TrainingStep):
    """gsplat's ``rasterization`` + splatfacto's loss (``ssim``) + ``optimizer`` + its strategy."""

    def __init__(self, scene: Dict, ssim: str, selective_adam: bool):
        super().__init__(scene)
        import gsplat
        from gsplat.strategy import DefaultStrategy

        from bytesplat_ns.bench.baselines import ssim_function

        self.version = gsplat.__version__
        self.ssim = ssim_function(ssim)
        self.selective = selective_adam
        if selective_adam:
            from gsplat.optimizers import SelectiveAdam

            self.optimizers = self.adam_groups(lambda groups: SelectiveAdam(groups, eps=ADAM_EPS, betas=(0.9, 0.999)))
        else:
            self.optimizers = self.adam_groups(lambda groups: torch.optim.Adam(groups, eps=ADAM_EPS))
        self.strategy = DefaultStrategy(verbose=False)
        self.strategy_state = self.strategy.initialize_state(scene_scale=1.0)
        self.label = f"gsplat {self.version} + {ssim}" + (" + SelectiveAdam" if selective_adam else " + Adam")

    def __call__(self, clock: StageClock) -> torch.Tensor:
        from gsplat.rendering import rasterization

        from bytesplat_ns.bench.baselines import baseline_loss

        s = self.scene
        clock.start()
        render, _, info = rasterization(*activated(self.params), s["viewmats"], s["Ks"], self.W, self.H,
                                        sh_degree=self.sh_degree, backgrounds=s["backgrounds"], packed=False)
        info["means2d"].retain_grad()  # the strategy's step_pre_backward
        clock.mark("rasterize")
        loss = baseline_loss(render, s["gt"], self.ssim)
        clock.mark("loss")
        loss.backward()
        clock.mark("backward")
        self.strategy._update_state(self.params, self.strategy_state, info, packed=False)
        clock.mark("densification")
        if self.selective:
            radii = info["radii"]
            visible = ((radii > 0).all(-1) if radii.dim() == 3 else radii > 0).any(0)
            for optimizer in self.optimizers:
                optimizer.step(visible)
        else:
            for optimizer in self.optimizers:
                optimizer.step()
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=True)
        clock.mark("optimizer")
        return loss


class BytesplatStep(TrainingStep):
    """``raster.fused.fused_render_loss`` (default options) + sync-free statistics + DeviceAdam (our Adam kernel),
    stepped in one pass as the trainer does."""

    def __init__(self, scene: Dict, visible_only: bool = False, **option_changes):
        """``option_changes``: :class:`FusedOptions` fields that differ from the trainer's defaults."""
        super().__init__(scene)
        from dataclasses import replace

        from bytesplat_ns.raster.options import DEFAULT_OPTIONS

        self.visible_only = visible_only
        self.options = replace(DEFAULT_OPTIONS, **option_changes)
        adam = "bytesplat Adam, visible Gaussians only" if visible_only else "bytesplat Adam"
        self.label = f"bytesplat (fused split, {options_label(self.options)}) + {adam}"
        from bytesplat_ns.optim import DeviceAdam
        from bytesplat_ns.strategy import SyncFreeDefaultStrategy

        self.optimizers = self.adam_groups(lambda groups: DeviceAdam(groups, eps=ADAM_EPS))
        self.strategy = SyncFreeDefaultStrategy(verbose=False)
        self.strategy_state = self.strategy.initialize_state(scene_scale=1.0)

    def __call__(self, clock: StageClock) -> torch.Tensor:
        return self.train_step(clock)[0]

    def train_step(self, clock: StageClock, pair_room: Optional[int] = None) -> Tuple[torch.Tensor, Dict]:
        """One step; ``pair_room`` as ``fused_render_loss``'s (None: the pair count read back)."""
        from bytesplat_ns.optim import step_in_one_pass
        from bytesplat_ns.raster.fused import fused_render_loss

        s = self.scene
        clock.start()
        loss, _, _, info = fused_render_loss(*model_inputs(self.params), s["viewmats"], s["Ks"], self.W, self.H, s["gt"],
                                             s["backgrounds"], sh_degree=self.sh_degree, options=self.options,
                                             pair_room=pair_room)
        info["means2d"].retain_grad()
        clock.mark("rasterize+loss")
        loss.backward()
        clock.mark("backward")
        self.strategy._update_state(self.params, self.strategy_state, info, packed=False)
        clock.mark("densification")
        visible = (info["radii"] > 0).any(0) if self.visible_only else None
        for optimizer in self.optimizers:
            optimizer.visible_rows = visible
        # as the trainer's default --optimizer-steps-in-one-pass: one launch for the step counts, one
        # kernel per tensor, gradients cleared to None (a visible-rows step takes each optimizer's own)
        step_in_one_pass(self.optimizers)
        for param in self.params.values():
            param.grad = None
        clock.mark("optimizer")
        return loss, info


class _NoClock:
    """A stage clock that records nothing: no CUDA events in a graph capture."""

    def start(self) -> None:
        pass

    def mark(self, stage: str) -> None:
        pass


class BytesplatGraphStep(BytesplatStep):
    """``bytesplat``'s step captured once as a CUDA graph and then replayed: what the step costs when the host
    issues nothing but one graph launch (no Python, no per-kernel launches, no allocator), the ceiling of
    graphing the trainer's step. The tile lists are binned into a room sized from the first step's pair count
    (``fused_render_loss(pair_room=)``: nothing is read back, every shape and pointer stays the same); a step
    whose pairs outgrow the room would be inexact, so the graph also records whether any did (:meth:`report`)."""

    room_margin = 1.2  # as --pipeline.model.fused.pair-room-margin
    warmup_steps = 2  # eager steps on a side stream before the capture: lazily built state, cuBLAS/cub workspaces

    def __init__(self, scene: Dict):
        super().__init__(scene)
        self.label = self.label + ", the whole step replayed as one CUDA graph"
        self.graph: Optional[torch.cuda.CUDAGraph] = None
        self.pair_room = 0
        self.eager_steps = 0
        self.replays = 0
        self.first_loss = float("nan")

    def _capture(self) -> None:
        from bytesplat_ns.pair_capacity import room_for

        loss, info = self.train_step(_NoClock())  # the pair count read back, once
        self.first_loss = float(loss)
        self.pair_room = room_for(int(info["pair_total"]), self.room_margin)
        # the loss's autograd graph would keep the parameters' gradient accumulators, and with them the stream they
        # were made on, alive into the capture: the backward would then make that stream wait on the capture
        del loss, info
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self.warmup_steps):
                self.train_step(_NoClock(), self.pair_room)
        torch.cuda.current_stream().wait_stream(side)
        self.eager_steps = 1 + self.warmup_steps
        self.overflowed = torch.zeros((), dtype=torch.bool, device="cuda")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.loss, info = self.train_step(_NoClock(), self.pair_room)
            self.overflowed |= (info["pair_total"] > self.pair_room).squeeze()
        self.graph = graph

    def __call__(self, clock: StageClock) -> torch.Tensor:
        if self.graph is None:
            self._capture()
        clock.start()
        self.graph.replay()
        clock.mark("graph replay")
        self.replays += 1
        return self.loss

    def report(self) -> Dict:
        """The room and the steps run; raises if any replayed step's pairs did not fit (its row is then an error)."""
        if self.graph is not None and bool(self.overflowed):
            raise RuntimeError(f"a replayed step's tile lists outgrew their room of {self.pair_room} pairs")
        return {"pair_room": self.pair_room, "eager_steps": self.eager_steps, "graph_replays": self.replays,
                "loss_step0": self.first_loss}


def build_step(implementation: str, scene: Dict) -> TrainingStep:
    if implementation == "splatfacto":
        return GsplatStep(scene, "pytorch_msssim", selective_adam=False)
    if implementation == "gsplat":
        return GsplatStep(scene, "fussim", selective_adam=True)
    if implementation == "bytesplat-visible":
        return BytesplatStep(scene, visible_only=True)
    if implementation in OPTION_VARIANTS:
        return BytesplatStep(scene, **OPTION_VARIANTS[implementation])
    if implementation == "bytesplat-graph":
        return BytesplatGraphStep(scene)
    raise ValueError(f"unknown implementation {implementation!r} (choose from {IMPLEMENTATIONS})")


def kernel_times(step: TrainingStep, steps: int) -> Dict[str, float]:
    """Total device microseconds per kernel name over ``steps`` steps under torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    clock = StageClock()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step(clock)
        torch.cuda.synchronize()
    clock.events.clear()
    out: Dict[str, float] = {}
    for event in prof.key_averages():
        us = getattr(event, "self_device_time_total", None)
        if us is None:
            us = getattr(event, "self_cuda_time_total", 0.0)
        if us and event.device_type == torch.autograd.DeviceType.CUDA:
            out[event.key] = out.get(event.key, 0.0) + float(us)
    return out


def host_issue_ms(step: Callable[["StageClock"], object], clock: "StageClock", steps: int,
                  synchronize: Callable[[], None] = torch.cuda.synchronize) -> Tuple[float, Dict[str, float]]:
    """Median host time for ``step`` to return when it starts on an idle GPU: its Python, its launches and
    the waits of any device read inside it; and the median of each stage's share (``StageClock.host_stages``).
    Near ``wall_ms``, the step is bound by its host side: a faster kernel then shortens only the GPU's busy
    time, not the step."""
    times = []
    clock.host.clear()
    for _ in range(max(1, steps)):
        synchronize()
        start = time.perf_counter()
        step(clock)
        times.append((time.perf_counter() - start) * 1000.0)
    synchronize()
    clock.events.clear()
    spans = clock.host_stages()
    stages = {name: statistics.median(s[name] for s in spans if name in s) for name in spans[0]} if spans else {}
    return statistics.median(times), stages


def measure(step: TrainingStep, warmup: int, repeats: int, profile_steps: int) -> Dict:
    """``step``'s wall, stage spans and kernel categories (see the module docstring)."""
    clock = StageClock()
    loss0 = float(step(clock))  # the untrained scene's loss: the same for every implementation
    for _ in range(max(0, warmup - 1)):
        step(clock)
    torch.cuda.synchronize()
    clock.events.clear()
    losses = []
    start = time.perf_counter()
    for _ in range(repeats):
        losses.append(step(clock).detach())
    torch.cuda.synchronize()
    wall_ms = (time.perf_counter() - start) * 1000.0 / repeats
    spans = clock.steps()
    stages = {name: statistics.median(s[name] for s in spans) for name in spans[0]}
    host_ms, host_stages = host_issue_ms(step, clock, repeats)
    kernels = kernel_times(step, profile_steps)
    categories = categorize(kernels, profile_steps)
    busy = sum(categories.values())
    return {"implementation": step.label, "num_gaussians": int(step.params["means"].shape[0]),
            "loss_step0": loss0, "loss_last": float(losses[-1]), "steps_trained": max(1, warmup) + repeats,
            "wall_ms": wall_ms, "stages_ms": stages, "stages_sum_ms": sum(stages.values()),
            "gpu_busy_ms": busy, "host_gaps_ms": max(0.0, wall_ms - busy), "host_issue_ms": host_ms,
            "host_issue_stages_ms": host_stages,
            **step.report(),
            "kernel_categories_ms": categories,
            "top_kernels_ms": {k: v / 1000.0 / profile_steps for k, v in sorted(kernels.items(), key=lambda kv: -kv[1])[:12]}}


def run_here(implementations: Sequence[str], scene: Dict, warmup: int, repeats: int, profile_steps: int) -> List[Dict]:
    """Each implementation's row on ``scene`` (one failing is its row's error): every step trains its
    own copy of the parameters (``initial_params``)."""
    rows = []
    for implementation in implementations:
        try:
            step = build_step(implementation, scene)
            row = measure(step, warmup, repeats, profile_steps)
        except Exception as e:  # noqa: BLE001
            row = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        rows.append({"name": implementation, **row})
        step = None
        torch.cuda.empty_cache()
    return rows


def run_in_site(site: str, implementation: str, scene: Dict, args: argparse.Namespace) -> Dict:
    """``run_here`` for one implementation on ``scene`` (handed over in a file) in a child process with
    ``site`` first on its path."""
    from bytesplat_ns.bench.baselines import child_failure, site_env
    from bytesplat_ns.bench.scene_file import save_scene

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "row.json"
        command = [sys.executable, "-m", "bytesplat_ns.bench.step", "--implementations", implementation,
                   "--scene-file", str(save_scene(scene, Path(tmp) / "scene.pt")),
                   "--warmup", str(args.warmup), "--repeats", str(args.repeats),
                   "--profile-steps", str(args.profile_steps), "--out", str(out)]
        done = subprocess.run(command, env=site_env(site), capture_output=True, text=True)
        if done.returncode != 0 or not out.is_file():
            return {"name": implementation, "site": site, "error": child_failure(done)}
        rows = json.loads(out.read_text())["rows"]
    return dict(rows[0], site=site)


def scenes(args: argparse.Namespace) -> List[Tuple[str, Dict]]:
    """(label, scene) to time: ``--scene-file``'s, else the trained run's view or the random scenes."""
    if args.scene_file is not None:
        from bytesplat_ns.bench.scene_file import load_scene

        return [("file", load_scene(args.scene_file))]
    from bytesplat_ns.bench.trained import scenes_from_options

    return scenes_from_options(args, [1_000_000, 4_000_000])


def speedups(rows: List[Dict]) -> Dict[str, float]:
    """bytesplat's wall against each other row's, for one Gaussian count."""
    ours = next((r for r in rows if r.get("name") == "bytesplat" and "wall_ms" in r), None)
    if ours is None:
        return {}
    return {f"vs {r['implementation']}": r["wall_ms"] / ours["wall_ms"] for r in rows
            if r is not ours and "wall_ms" in r}


def parser() -> argparse.ArgumentParser:
    from bytesplat_ns.bench.trained import add_scene_options

    p = argparse.ArgumentParser(prog="bytesplat-bench step", description=__doc__.split("\n\n")[0].strip(" r\"`"))
    add_scene_options(p, "the step trains its Gaussians on one of its train views (--trained-view) at full resolution")
    p.add_argument("--trained-view", type=int, default=0, help="with --trained: the train view the step renders")
    p.add_argument("--scene-file", type=Path, default=None, help=argparse.SUPPRESS)  # a parent's scene (run_in_site)
    p.add_argument("--implementations", nargs="+", default=["splatfacto", "bytesplat"], choices=IMPLEMENTATIONS,
                   help="timed in this process (gsplat: with this process's gsplat)")
    p.add_argument("--gsplat-site", action="append", default=[], metavar="DIR",
                   help="also time the 'gsplat' implementation with the gsplat installed in DIR, in a child process")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--repeats", type=int, default=50)
    p.add_argument("--profile-steps", type=int, default=5)
    p.add_argument("--out", type=Path, default=Path("step.json"))
    return p


def main(argv: Optional[List[str]] = None) -> Dict:
    p = parser()
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    if args.trained is not None:
        from bytesplat_ns.bench.trained import reject_random_scene_options

        reject_random_scene_options(p, args)
    if args.sh_degree not in (None, 3):
        p.error("--sh-degree: the step trains SH degree 3 (random scenes) or the trained model's degree")
    from bytesplat_ns.bench.baselines import site_gsplat_version

    for site in args.gsplat_site:  # a folder without gsplat: one clear error now, not a mislabelled row later
        site_gsplat_version(site)
    if not torch.cuda.is_available():
        from bytesplat_ns.errors import BytesplatError

        raise BytesplatError("bytesplat-bench step needs a CUDA GPU")
    rows: List[Dict] = []
    counts: List[int] = []
    for label, scene in scenes(args):
        n = int(scene["means"].shape[0])
        counts.append(n)
        here = run_here(args.implementations, scene, args.warmup, args.repeats, args.profile_steps)
        sited = [run_in_site(site, "gsplat", scene, args) for site in args.gsplat_site]
        group = here + sited
        for row in group:
            row.setdefault("num_gaussians", n)
            row["scene"] = label
        rows += group
        print(f"[step] {n:,} Gaussians ({label}): " + ", ".join(
            f"{r.get('implementation', r['name'])} {r['wall_ms']:.2f} ms" if "wall_ms" in r else f"{r['name']}: {r['error']}"
            for r in group), flush=True)
        width, height = scene["width"], scene["height"]
    result: Dict = {"benchmark": "bytesplat-bench step", "width": width, "height": height, "sh_degree": scene["sh_degree"],
                    "rows": rows,
                    "speedups": {str(n): speedups([r for r in rows if r["num_gaussians"] == n]) for n in counts}}
    from bytesplat_ns.bench.train import environment

    result.update(environment(list(sys.argv[1:] if argv is None else argv), prog="bytesplat-bench step"))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
