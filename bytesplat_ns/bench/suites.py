"""The declared benchmark suites: each one is data (name, purpose, GPUs, steps), run by
``bytesplat-bench suite NAME`` (``bytesplat_ns.bench.suite_runner``).

A step is one existing ``bytesplat-bench`` subcommand with its arguments; the runner adds the
output option (``--out``). Arguments may hold ``{work}`` (the suite's scratch folder for run
directories) and ``{data}`` (the ``--data`` path given on the suite's command line). Each suite
reproduces how a figure on the results page (docs/results.md) was measured.
"""

from __future__ import annotations

import shlex

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

# the record-exchange step wants large contiguous blocks at high Gaussian counts
_EXPANDABLE = (("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),)


@dataclass(frozen=True)
class Step:
    """One ``bytesplat-bench COMMAND ARGS...`` run in its own process."""

    command: str
    args: Tuple[str, ...] = ()
    name: str = ""  # the step's output file stem; defaults to its index and command
    ranks: int = 1  # > 1: launched under torch.distributed.run with this many processes
    devices: Optional[str] = None  # CUDA_VISIBLE_DEVICES for this step (steps run side by side on GPUs)
    group: Optional[str] = None  # consecutive steps with the same group run at the same time
    env: Tuple[Tuple[str, str], ...] = ()
    timeout_s: Optional[float] = None


@dataclass(frozen=True)
class Suite:
    name: str
    purpose: str  # one line
    gpus: int  # GPUs the steps need (0: runs on the CPU)
    steps: Tuple[Step, ...]
    needs_data: bool = False  # the suite's command line must give --data


def _args(text: str) -> Tuple[str, ...]:
    return tuple(shlex.split(text))  # quotes keep a method entry with arguments as one word


def _dist(args: str, ranks: int = 2, name: str = "") -> Step:
    return Step("distributed", _args("--width 1920 --height 1080 " + args), name=name, ranks=ranks, env=_EXPANDABLE)


def _per_seed_on_capture(methods: str, iterations: int, work: str, name: str) -> Tuple[Step, ...]:
    """One wallclock step per seed 0, 1, 2 on the capture of --data: the methods of a seed back to back
    (``methods``: shell words, a labelled entry quoted), each step named ``name.format(seed=...)``."""
    return tuple(Step("wallclock", _args(f"--data {{data}} --methods {methods} --iterations {iterations} --seeds {seed} "
                                         f"--offline-lpips --work-dir {{work}}/{work}"), name=name.format(seed=seed))
                 for seed in (0, 1, 2))


def _budget_on_capture(budget: str, then: Tuple[Step, ...] = ()) -> Tuple[Step, ...]:
    """A Gaussian budget (``budget``: a labelled method entry) against none on the capture of --data, 30000
    iterations: seeds 0-2 with the six runs at once (``capture_seeds``), ``then`` these steps, then each seed's
    pair back to back without eval, the GPU to itself (the wall clock: ``capture_wall`` for seed 0,
    ``capture_wall_seed1`` and ``capture_wall_seed2``; about 200 s each on an H100, one device call apiece)."""
    return (Step("wallclock", _args(f"--data {{data}} --methods '{_NO_BUDGET}' '{budget}' --iterations 30000 --seeds 0 1 2 "
                                    "--parallel 6 --offline-lpips --work-dir {work}/capture"), name="capture_seeds"),
            *then,
            *(Step("wallclock", _args(f"--data {{data}} --methods '{_NO_BUDGET}' '{budget}' --iterations 30000 "
                                      f"--seeds {seed} --no-eval --offline-lpips --work-dir {{work}}/capture-wall"),
                   name="capture_wall" + (f"_seed{seed}" if seed else "")) for seed in (0, 1, 2)))


def _budget_on_large(budget: str) -> Step:
    """A Gaussian budget against none on the built-in large scene, 30000 iterations, seeds 0-2, the six runs at once."""
    return Step("wallclock", ("--methods", _NO_BUDGET, budget, "--iterations", "30000", "--seeds", "0", "1", "2",
                              "--parallel", "6", "--dataparser", "bytesplat-scene --scene-size large",
                              "--offline-lpips", "--work-dir", "{work}/large"), name="large_seeds")


_COUNTS = "--views 4 --warmup 1 --repeats 3 --communicators pixel sparse-grad dense"
_SEEDS = "--scene large --iterations 3000 --num-downscales 0 --seeds 1 2 3 4 5"
_GSPLAT_153 = "/tmp/gsplat-1.5.3"  # where scripts/gpu_setup.sh installs the carried gsplat 1.5.3 wheel
_TRAINED_CAPTURE = "{work}/train/bytesplat-seed0/bytesplat/bytesplat/seed0"  # a train_30k / train_5k step's run
_VISIBLE_ONLY = "visible=bytesplat --pipeline.model.optimize-visible-only True"
# kernel-levers' arms name each lever against the render's defaults until 2026-12-07 (expf, one pixel per
# backward thread; the falloff as 2^q is the default since), so that arm keeps the label "bytesplat"
_EXACT_EXP = "bytesplat=bytesplat --pipeline.model.fused.fast-exp False"
_FAST_EXP = "fast_exp=bytesplat --pipeline.model.fused.fast-exp True"
_BWD_2PX = "bwd_2px=bytesplat --pipeline.model.fused.fast-exp False --pipeline.model.fused.bwd-pixels-per-thread 2"
_TRIMMED = "trimmed=bytesplat --pipeline.model.fused.trim-tile-lists True"
_GSPLAT_BACKEND = "gsplat_backend=bytesplat --pipeline.model.rasterizer gsplat"
# gsplat's rasterizer and splatfacto's optimizer path: torch's Adam (foreach, as splatfacto's), each stepped by
# nerfstudio's loop; what still differs from splatfacto is bytesplat's data and densification statistics
_GSPLAT_TORCH_ADAM = ("gsplat_torch_adam=bytesplat --pipeline.model.rasterizer gsplat --optimizer-steps-in-one-pass False "
                      + " ".join(f"--optimizers.{group}.optimizer.implementation torch"
                                 for group in ("means", "scales", "quats", "features_dc", "features_rest", "opacities")))
_UNTRIMMED = "untrimmed=bytesplat --pipeline.model.fused.trim-tile-lists False"
_PER_OPTIMIZER = "per_optimizer=bytesplat --optimizer-steps-in-one-pass False"
_NERFSTUDIO_LOOP = "nerfstudio_loop=bytesplat --lean-training-loop False"
# the two binnings of eager steps: graph steps (on by default) would size the rooms ahead in both
_SIZED_ROOM = "sized_room=bytesplat --pipeline.model.fused.sync-free-binning True --cuda-graph-steps False"
_COUNT_READ_BACK = "count_read_back=bytesplat --pipeline.model.fused.sync-free-binning False --cuda-graph-steps False"
_GRAPH_STEPS = "graph_steps=bytesplat --pipeline.model.fused.sync-free-binning True --cuda-graph-steps True"
_PYTHON_STEPS = "python_steps=bytesplat --cuda-graph-steps False"
_GT_POOL = "gt_pool=bytesplat --pipeline.model.gt-downscale pool"
_GT_CONV = "gt_conv=bytesplat --pipeline.model.gt-downscale conv"
_LEVERS = "levers=bytesplat --pipeline.model.fused.fast-exp True --pipeline.model.fused.bwd-pixels-per-thread 2"
_RASTER_1080P = "--num-gaussians 1000000 4000000 --width 1920 --height 1080"
_BUDGET_40 = "budget40=bytesplat --pipeline.model.budget-prune-fraction 0.4"
_BUDGET_30 = "budget30=bytesplat --pipeline.model.budget-prune-fraction 0.3"
# The budget suites' other arm: no budget (the default until 2026-12-06, so the label stays "bytesplat").
_NO_BUDGET = "bytesplat=bytesplat --pipeline.model.budget-prune-fraction 0"
# gpu1b repeats the one-GPU baseline: how far two runs of one configuration land apart
_QUALITY = "--pipeline.model.num-downscales 0 --pipeline.views-per-step 2"

SUITES: Dict[str, Suite] = {s.name: s for s in (
    Suite("raster-1080p",
          "raster + splatfacto's loss, forward + backward, fused vs gsplat at 1920x1080, 1M and 4M random Gaussians",
          1,
          tuple(Step("raster", _args("--num-gaussians 1000000 4000000 --width 1920 --height 1080 --warmup 3 "
                                     "--repeats 10 --raster-only"), name=f"raster_{i}") for i in (1, 2))),
    Suite("raster-trained",
          "raster + loss on a trained scene: the built-in large scene after 3000 iterations, rendered at 1920x1440",
          1,
          (Step("train", _args("--scene large --iterations 3000 --num-downscales 0 --methods bytesplat:fused "
                               "--seed 1 --work-dir {work}/train"), name="train_large"),
           Step("raster", _args("--trained {work}/train/bytesplat-fused/bytesplat/bench --trained-scale 2.4 "
                                "--warmup 3 --repeats 10"), name="raster_trained"))),
    Suite("train-seeds",
          "a whole training iteration at equal quality: bytesplat (fused) and splatfacto, large scene, 5 seeds, "
          "one GPU each at the same time",
          2,
          (Step("train", _args(f"{_SEEDS} --methods bytesplat:fused --work-dir {{work}}/fused"),
                name="train_fused", devices="0", group="pair"),
           Step("train", _args(f"{_SEEDS} --methods splatfacto --work-dir {{work}}/splatfacto"),
                name="train_splatfacto", devices="1", group="pair"))),
    Suite("train-quality",
          "training quality of the fused backend against gsplat's rasterizer: medium scene, 3000 iterations",
          1,
          (Step("train", _args("--scene medium --iterations 3000 --methods bytesplat:gsplat bytesplat:fused "
                               "--num-downscales 0 --hw-prune off --work-dir {work}/train"), name="train_medium"),)),
    Suite("distributed-scaling",
          "two GPUs against one and against gsplat's distributed mode: 1M, 4M and 16M Gaussians, 8 views of 1080p",
          2,
          (_dist("--num-gaussians 16000000 --views 8 --warmup 2 --repeats 5 --communicators sparse-grad dense",
                 name="scaling_16m_v8"),
           _dist("--num-gaussians 1000000 4000000 --views 8 --warmup 3 --repeats 10 --communicators sparse-grad dense",
                 name="scaling_v8"))),
    Suite("distributed-counts",
          "every strategy (pixel, sparse-grad, dense, gsplat distributed) at growing counts, 1M to 140M Gaussians, "
          "4 views of 1080p",
          2,
          tuple(_dist(f"--num-gaussians {n} {_COUNTS}", name=f"counts_{n}")
                for n in (1_000_000, 4_000_000, 16_000_000, 50_000_000))
          + (_dist(f"--num-gaussians 100000000 {_COUNTS} --skip-one-rank", name="counts_100000000"),)
          + tuple(_dist(f"--num-gaussians {n} {_COUNTS} --skip-one-rank --skip-gsplat", name=f"counts_{n}")
                  for n in (140_000_000, 125_000_000))),
    Suite("capacity",
          "the most Gaussians that train: 62.5M on one H200, 125M on two (record exchange), 140M on two (pixel)",
          2,
          (_dist("--num-gaussians 62500000 --views 4 --warmup 1 --repeats 2 --skip-gsplat", ranks=1,
                 name="capacity_1gpu_62m"),
           _dist("--num-gaussians 125000000 --views 4 --warmup 1 --repeats 2 --communicators dense sparse-grad "
                 "--skip-one-rank --skip-gsplat", name="capacity_2gpu_125m"),
           _dist("--num-gaussians 140000000 --views 4 --warmup 1 --repeats 2 --communicators pixel --skip-one-rank "
                 "--skip-gsplat", name="capacity_pixel_140m"))),
    Suite("raster-baselines",
          "raster + loss and the whole render + loss + backward, fused vs gsplat 1.4.0 and 1.5.3, each with "
          "pytorch_msssim and with fussim, 1080p, 1M and 4M random Gaussians (--data: the folder gsplat 1.5.3 is "
          "pip-installed into with --target)",
          1,
          (Step("raster", _args("--num-gaussians 1000000 4000000 --width 1920 --height 1080 --warmup 3 --repeats 10 "
                                "--baseline-ssim pytorch_msssim fussim --gsplat-site {data}"), name="raster_baselines"),
           # the same against the strongest baseline with the host's issue time timed too (no launches queued)
           Step("raster", _args("--num-gaussians 1000000 4000000 --width 1920 --height 1080 --warmup 3 --repeats 10 "
                                "--baseline-ssim fussim --gsplat-site {data} --queue-ms 0 --raster-only"),
                name="raster_baselines_issued")),
          needs_data=True),
    Suite("step-baselines",
          "a whole training step (activations, projection, SH, binning, render, loss, backward, densification "
          "statistics, optimizer) with its time per stage: splatfacto's (gsplat 1.4.0, pytorch_msssim, Adam), gsplat "
          "1.5.3's fastest (fussim, SelectiveAdam) and ours (and ours with square tile boxes, and with the reach "
          "computed in torch), 1080p, 1M and 4M random Gaussians (--data: the folder gsplat 1.5.3 is pip-installed "
          "into with --target)",
          1,
          (Step("step", _args("--num-gaussians 1000000 4000000 --width 1920 --height 1080 --warmup 10 --repeats 50 "
                              "--implementations splatfacto bytesplat bytesplat-square-tiles bytesplat-reach-torch "
                              "--gsplat-site {data}"),
                name="step_baselines"),),
          needs_data=True),
    Suite("tile-reach",
          "the whole training step (bytesplat-bench step) with the opacity-aware tile reach from cuda/tile_reach.cu "
          "(the default) against its PyTorch definition, 1080p, 1M random Gaussians: six pairs, the order alternated",
          1,
          tuple(Step("step", _args("--num-gaussians 1000000 --width 1920 --height 1080 --warmup 10 --repeats 50 "
                                   f"--implementations {pair}"), name=f"pair_{i}")
                for i, pair in enumerate(("bytesplat bytesplat-reach-torch", "bytesplat-reach-torch bytesplat") * 3,
                                         start=1))),
    Suite("raster-capacity",
          "the fused split schedule around its per-tile list capacity: 1M to 8M random Gaussians at 1080p",
          1,
          (Step("raster", _args("--num-gaussians 1000000 2000000 4000000 8000000 --width 1920 --height 1080 "
                                "--warmup 2 --repeats 5 --skip-gsplat"), name="raster_cliff"),)),
    Suite("distributed-quality",
          "training quality on two GPUs against one with the same batch: medium scene at full resolution, "
          "1000 steps, ns-train + ns-eval, paired by seed",
          2,
          (Step("wallclock", (
              "--methods", f"gpu1=bytesplat-distributed --machine.num-devices 1 {_QUALITY}",
              f"gpu1b=bytesplat-distributed --machine.num-devices 1 {_QUALITY}",
              f"sparse2=bytesplat-distributed --machine.num-devices 2 --pipeline.communicator sparse-grad {_QUALITY}",
              f"pixel2=bytesplat-distributed --machine.num-devices 2 --pipeline.communicator pixel {_QUALITY}",
              "--seeds", "1", "2", "3", "--iterations", "1000", "--dataparser", "bytesplat-scene --scene-size medium",
              "--work-dir", "{work}/quality"), name="quality"),)),
    Suite("quickstart",
          "the README's quick start as a user runs it: ns-train bytesplat on the built-in scene, 3000 iterations, "
          "then ns-eval, 3 seeds",
          1,
          (Step("wallclock", ("--methods", "bytesplat", "--iterations", "3000", "--seeds", "0", "1", "2",
                              "--dataparser", "", "--work-dir", "{work}/quickstart"), name="quickstart"),)),
    Suite("quickstart-stability",
          "the README's quick-start command five times over (same seed: the spread GPU atomics leave), five runs at "
          "once, then ns-eval; against the same on the scene with a gradient sky to learn (what it had been)",
          1,
          (Step("wallclock", ("--methods", "bytesplat", "--iterations", "3000", "--seeds", "42", "--repeats", "5",
                              "--parallel", "5", "--dataparser", "", "--work-dir", "{work}/stability"),
                name="transparent_sky"),
           Step("wallclock", ("--methods", "bytesplat", "--iterations", "3000", "--seeds", "42", "--repeats", "5",
                              "--parallel", "5", "--dataparser", "bytesplat-scene --scene-sky gradient",
                              "--work-dir", "{work}/stability-gradient"), name="gradient_sky"))),
    Suite("quickstart-stability-cpu",
          "the README's quick-start command five times over on a CPU (the PyTorch rasterizer), two at once with one "
          "thread each, then ns-eval (each run records its peak host memory)",
          0,
          (Step("wallclock", ("--methods", "bytesplat", "--iterations", "3000", "--seeds", "42", "--repeats", "5",
                              "--parallel", "2", "--dataparser", "", "--offline-lpips", "--work-dir", "{work}/stability"),
                name="transparent_sky", env=(("OMP_NUM_THREADS", "1"),)),)),
    Suite("wallclock-fox",
          "wall-clock time to a trained model with ns-train + ns-eval, splatfacto vs bytesplat, on a real capture "
          "(--data)",
          1,
          (Step("wallclock", _args("--data {data} --methods splatfacto bytesplat --iterations 5000 --seeds 0 1 2 "
                                   "--offline-lpips --work-dir {work}/wallclock"), name="wallclock"),),
          needs_data=True),
    Suite("wallclock-fox-launch",
          "start-up on a real capture (--data): bytesplat launched by bytesplat-train and by ns-train, and splatfacto, "
          "one seed back to back, 5000 iterations, ns-eval",
          1,
          (Step("wallclock", _args("--data {data} --methods 'bytesplat-train=bytesplat-train bytesplat' bytesplat "
                                   "splatfacto --iterations 5000 --seeds 0 --offline-lpips --work-dir {work}/wallclock"),
                name="wallclock"),),
          needs_data=True),
    Suite("wallclock-fox-seeds",
          "ns-train bytesplat on a real capture (--data), 3 seeds, then splatfacto on the first seed, back to back in "
          "one call, 5000 iterations, ns-eval",
          1,
          tuple(Step("wallclock", _args(f"--data {{data}} --methods {method} --iterations 5000 --seeds {seed} "
                                        "--offline-lpips --work-dir {work}/wallclock"), name=f"{method}_seed{seed}")
                for method, seed in (("bytesplat", 0), ("bytesplat", 1), ("bytesplat", 2), ("splatfacto", 0))),
          needs_data=True),
    Suite("wallclock-fox-30k",
          "the same at 30000 iterations, splatfacto's full schedule: one step per bytesplat seed 0-2 and "
          "splatfacto's seed 0, each alone on the GPU (wall clock; a splatfacto run takes about 18 minutes), and "
          "splatfacto's seeds 1 and 2 without tensorboard's image writes (quality only: the same training, about 8 "
          "minutes shorter each), and seeds 3-5 of both methods the same way (3DGS runs at 30000 iterations "
          "spread by 1.5 dB over seeds: more seeds to compare the means); run a few steps at a time with --only, "
          "the document keeps the steps of earlier runs (--data)",
          1,
          tuple(Step("wallclock", _args(f"--data {{data}} --methods {method} --iterations 30000 --seeds {seed} "
                                        "--offline-lpips --work-dir {work}/wallclock"), name=f"{method}_seed{seed}")
                for method, seed in (("bytesplat", 0), ("splatfacto", 0), ("bytesplat", 1), ("bytesplat", 2)))
          + tuple(Step("wallclock", _args(f"--data {{data}} --methods {method} --iterations 30000 --seeds {seed} "
                                          "--skip-image-writes --offline-lpips --work-dir {work}/quality"),
                       name=f"{method}_seed{seed}_quality")
                  for method, seed in (("splatfacto", 1), ("splatfacto", 2), ("splatfacto", 3), ("bytesplat", 3),
                                       ("splatfacto", 4), ("bytesplat", 4), ("splatfacto", 5), ("bytesplat", 5))),
          needs_data=True),
    Suite("gaussian-budget",
          "the Gaussian budget (40% of the Gaussians removed when densification stops) against none on a real capture "
          "(--data): ns-train + ns-eval, 30000 iterations, 3 seeds, the six runs at once (quality and Gaussians; "
          "their wall clocks measure the shared GPU), then each seed's pair back to back, one step per seed (wall "
          "clock); then the budget alone at seeds 3-5, the three runs at once without tensorboard's image writes "
          "(quality: splatfacto's 30000-iteration runs cover seeds 0-5)",
          1,
          _budget_on_capture(_BUDGET_40)
          + (Step("wallclock", _args(f"--data {{data}} --methods '{_BUDGET_40}' --iterations 30000 --seeds 3 4 5 "
                                     "--parallel 3 --skip-image-writes --offline-lpips --work-dir {work}/capture-more"),
                  name="capture_seeds_3_5"),),
          needs_data=True),
    Suite("gaussian-budget-large",
          "the same on the built-in large scene: ns-train + ns-eval, 30000 iterations, 6 seeds, one step per seed with "
          "its pair at once (quality and Gaussians; run the steps one --only at a time, so that each seed's result "
          "is kept as soon as it is done)",
          1,
          tuple(Step("wallclock", ("--methods", _NO_BUDGET, _BUDGET_40, "--iterations", "30000", "--seeds", str(seed),
                                   "--parallel", "2", "--dataparser", "bytesplat-scene --scene-size large",
                                   "--offline-lpips", "--work-dir", "{work}/large"), name=f"large_seed{seed}")
                for seed in range(6))),
    Suite("gaussian-budget-30",
          "the Gaussian budget at the issue's smallest cut (30% of the Gaussians removed when densification stops; "
          "40% cost 0.11 dB on the large scene) against none, 30000 iterations, 3 seeds: the capture of --data and the "
          "built-in large scene, each scene's six runs at once (quality and Gaussians; the two steps may run at once "
          "too), then each seed's pair on the capture back to back, one step per seed (wall clock), then the budget "
          "alone on the capture, one seed per step (quality of runs that had the GPU alone)",
          1,
          _budget_on_capture(_BUDGET_30, then=(_budget_on_large(_BUDGET_30),))
          + _per_seed_on_capture(f"'{_BUDGET_30}'", 30000, "capture-alone", "capture_alone_seed{seed}"),
          needs_data=True),
    Suite("spoiled-views",
          "30000-iteration runs that ended with one eval view spoiled, again with the view diagnostics (each eval "
          "image's PSNR in the trainer's evals, the worst view's panel, the final checkpoint evaluated through gsplat "
          "too): bytesplat on the capture of --data, seeds 5, 3 and 4 (24.38, 28.16 and 28.17 dB "
          "before, each alone) at once without tensorboard's image writes; the 30% budget on the built-in large scene, seeds 0 and 2, at once; "
          "then bytesplat on the capture, seeds 6-11, the six runs at once, each with the Gaussians that spoil its worst "
          "view found, described and followed back through its checkpoints, one per 1000 steps (bytesplat-bench "
          "spoilers); splatfacto the same, seeds 6-8, three at once; and at 5000 iterations, where seed 5 spoils a "
          "view in every bytesplat variant run so far: splatfacto and bytesplat on gsplat's rasterizer (its kernels "
          "and splatfacto's loss, bytesplat's data, optimizer and densification), seeds 3-6, the eight runs at once; "
          "then splatfacto's seed 5 three more times, at once; then seed 5 twice each on gsplat's rasterizer, and on it "
          "with torch's Adam stepped through nerfstudio's loop as well (the four runs at once)",
          1,
          (Step("wallclock", _args("--data {data} --methods bytesplat --iterations 30000 --seeds 5 3 4 --parallel 3 --skip-image-writes "
                                   "--eval-rasterizers gsplat --offline-lpips --work-dir {work}/capture"),
                name="capture_seeds"),
           Step("wallclock", ("--methods", _BUDGET_30, "--iterations", "30000", "--seeds", "0", "2", "--parallel", "2",
                              "--dataparser", "bytesplat-scene --scene-size large", "--eval-rasterizers", "gsplat",
                              "--offline-lpips", "--work-dir", "{work}/large"), name="large_budget_seeds"),
           Step("wallclock", ("--data", "{data}", "--methods", "bytesplat --steps-per-save 1000", "--iterations", "30000",
                              "--seeds", "6", "7", "8", "9", "10", "11", "--parallel", "6", "--skip-image-writes",
                              "--spoilers", "--offline-lpips", "--work-dir", "{work}/spoilers"), name="capture_spoilers"),
           Step("wallclock", ("--data", "{data}", "--methods", "splatfacto --steps-per-save 1000", "--iterations", "30000",
                              "--seeds", "6", "7", "8", "--parallel", "3", "--skip-image-writes", "--spoilers",
                              "--offline-lpips", "--work-dir", "{work}/spoilers"), name="capture_spoilers_splatfacto"),
           Step("wallclock", _args(f"--data {{data}} --methods splatfacto '{_GSPLAT_BACKEND}' --iterations 5000 "
                                   "--seeds 3 4 5 6 --parallel 8 --skip-image-writes --offline-lpips --work-dir {work}/5k"),
                name="capture_5k_seeds"),
           Step("wallclock", _args("--data {data} --methods splatfacto --iterations 5000 --seeds 5 --repeats 3 --parallel 3 "
                                   "--skip-image-writes --offline-lpips --work-dir {work}/5k-seed5"),
                name="capture_5k_seed5_splatfacto"),
           Step("wallclock", _args(f"--data {{data}} --methods '{_GSPLAT_BACKEND}' '{_GSPLAT_TORCH_ADAM}' --iterations 5000 "
                                   "--seeds 5 --repeats 2 --parallel 4 --skip-image-writes --offline-lpips "
                                   "--work-dir {work}/5k-seed5-bisect"),
                name="capture_5k_seed5_bisect")),
          needs_data=True),
    Suite("trained-capture",
          "raster + loss and a whole step on a real capture (--data) trained for 30000 iterations, at its full "
          "resolution: fused vs gsplat 1.4.0 and 1.5.3 (installed at /tmp/gsplat-1.5.3 by scripts/gpu_setup.sh) with "
          "pytorch_msssim and fussim; steps: splatfacto's, gsplat 1.5.3's fastest, ours, ours with Adam on visible "
          "Gaussians only, with square tile boxes, with the reach computed in torch, with the longest tiles first, "
          "with the backward's rows warp cull and on the tile lists as binned, untrimmed (the raster step times both "
          "kinds of tile list, and the trimmed ones); then, kernel by kernel under Nsight Compute on the same Gaussians, "
          "the pass training runs (the trimmed lists, the trimming included) and gsplat 1.5.3 + fussim on the "
          "opacity-aware lists (issue slots, occupancy, DRAM bytes: what bounds each)",
          1,
          (Step("wallclock", _args("--data {data} --methods bytesplat --iterations 30000 --seeds 0 --offline-lpips "
                                   "--work-dir {work}/train"), name="train_30k"),
           Step("raster", _args(f"--trained {_TRAINED_CAPTURE} --warmup 3 --repeats 10 --baseline-ssim pytorch_msssim "
                                f"fussim --gsplat-site {_GSPLAT_153}"), name="raster_trained"),
           Step("step", _args(f"--trained {_TRAINED_CAPTURE} --warmup 10 --repeats 50 --implementations splatfacto "
                              f"bytesplat bytesplat-visible bytesplat-square-tiles bytesplat-reach-torch "
                              f"bytesplat-longest-first bytesplat-rows-cull bytesplat-untrimmed --gsplat-site {_GSPLAT_153}"),
                name="step_trained"),
           Step("dram", _args(f"--trained {_TRAINED_CAPTURE} --stages split-trimmed gsplat-fussim-reach "
                              f"--gsplat-site {_GSPLAT_153} --kernels"), name="kernels_trained")),
          needs_data=True),
    Suite("dram-traffic",
          "device-memory bytes of one raster + loss pass (forward, loss, backward), counted by Nsight Compute: the "
          "split schedule on the square 3-sigma lists, the fused kernel's two- and one-launch schedules, and gsplat 1.4.0 and 1.5.3 "
          "(installed at /tmp/gsplat-1.5.3 by scripts/gpu_setup.sh) with pytorch_msssim and with fussim, 1080p, 1M "
          "and 4M random Gaussians; then the split schedule and gsplat 1.4.0's rasterization kernel by kernel (1M), "
          "and kernel by kernel at 1M and 4M the pass training runs (the trimmed lists, the trimming included) and "
          "the strongest baseline (gsplat 1.5.3 + fussim on the opacity-aware lists)",
          1,
          (Step("dram", _args("--num-gaussians 1000000 4000000 --width 1920 --height 1080 --stages split two_launch "
                              f"one_launch gsplat-pytorch_msssim gsplat-fussim --gsplat-site {_GSPLAT_153}"),
                name="dram_1080p"),
           Step("dram", _args("--num-gaussians 1000000 --width 1920 --height 1080 --stages split gsplat-pytorch_msssim "
                              "--kernels"), name="kernels_1m"),
           Step("dram", _args("--num-gaussians 1000000 4000000 --width 1920 --height 1080 --stages split-trimmed "
                              f"gsplat-fussim-reach --gsplat-site {_GSPLAT_153} --kernels"), name="kernels_strongest"))),
    Suite("visible-adam",
          "Adam on the visible Gaussians only (--pipeline.model.optimize-visible-only) against Adam on all of them: "
          "ns-train + ns-eval on a real capture (--data), 5000 iterations, 3 seeds, each pair back to back",
          1,
          _per_seed_on_capture(f"bytesplat '{_VISIBLE_ONLY}'", 5000, "wallclock", "seed{seed}"),
          needs_data=True),
    Suite("trimmed-lists",
          "the trimmed tile lists (--pipeline.model.fused.trim-tile-lists, the default since 2026-12-05) against the "
          "lists as binned, as a user feels them: ns-train + ns-eval on a real capture (--data), 5000 iterations, 3 "
          "seeds, each pair back to back (the runs from before trimming was the default name the untrimmed arm bytesplat)",
          1,
          _per_seed_on_capture(f"'{_UNTRIMMED}' '{_TRIMMED}'", 5000, "wallclock", "seed{seed}"),
          needs_data=True),
    Suite("host-time",
          "where the time of a training step goes on the host: nerfstudio's training loop body on a real capture (--data, "
          "full resolution from the start) under torch.profiler after 2000 iterations, with the tile lists as binned and "
          "trimmed (the default; host ops, GPU busy, synchronisations and where they come from); then the whole step "
          "on 1M random Gaussians at 1080p (wall, GPU busy, host issue time): ours, ours on the lists as binned, with "
          "every opt-in render lever, and gsplat 1.5.3's fastest (installed at /tmp/gsplat-1.5.3 by scripts/gpu_setup.sh)",
          1,
          (Step("profile", _args("--data {data} --methods bytesplat@fused.trim_tile_lists=false "
                                 "bytesplat@fused.trim_tile_lists=true "
                                 "--warmup-iters 2000 --profile-iters 50 --work-dir {work}/profile"), name="loop_capture"),
           Step("step", _args(f"--num-gaussians 1000000 --width 1920 --height 1080 --warmup 10 --repeats 50 "
                              f"--implementations bytesplat bytesplat-untrimmed bytesplat-bwd-2px "
                              f"--gsplat-site {_GSPLAT_153}"), name="step_1m")),
          needs_data=True),
    Suite("one-pass-optimizers",
          "the optimizers' calls in one pass per step (the trainer's --optimizer-steps-in-one-pass, default) against "
          "nerfstudio's loop over each optimizer: nerfstudio's training loop body on a real capture (--data, full "
          "resolution from the start) under the profilers after 2000 iterations, then ns-train + ns-eval, 5000 "
          "iterations, 3 seeds, each pair back to back; then seeds 3-5 of both for quality, the six runs at once",
          1,
          (Step("profile", _args("--data {data} --methods bytesplat bytesplat@trainer.optimizer_steps_in_one_pass=false "
                                 "--warmup-iters 2000 --profile-iters 100 --work-dir {work}/profile"), name="loop_capture"),)
          + _per_seed_on_capture(f"bytesplat '{_PER_OPTIMIZER}'", 5000, "wallclock", "seed{seed}")
          # quality only (the six runs share the GPU): seeds 3-5 of both
          + (Step("wallclock", _args(f"--data {{data}} --methods bytesplat '{_PER_OPTIMIZER}' --iterations 5000 "
                                     "--seeds 3 4 5 --parallel 6 --offline-lpips --work-dir {work}/seeds"),
                  name="quality_seeds"),),
          needs_data=True),
    Suite("sync-free-binning",
          "the training step's tile pairs binned into a room sized from earlier steps (--pipeline.model.fused."
          "sync-free-binning True) against the count read back from the GPU every step, both with the steps issued from Python "
          "(--cuda-graph-steps False): nerfstudio's "
          "training loop body on a real capture (--data, full resolution from the start) under the profilers after "
          "2000 iterations, then ns-train + ns-eval, 5000 iterations, 3 seeds, each pair back to back",
          1,
          (Step("profile", _args("--data {data} --methods bytesplat@fused.sync_free_binning=true,trainer.cuda_graph_steps=false "
                                 "bytesplat@fused.sync_free_binning=false,trainer.cuda_graph_steps=false --warmup-iters 2000 --profile-iters 100 "
                                 "--work-dir {work}/profile"), name="loop_capture"),)
          + _per_seed_on_capture(f"'{_SIZED_ROOM}' '{_COUNT_READ_BACK}'", 5000, "wallclock", "seed{seed}"),
          needs_data=True),
    Suite("cuda-graph-steps",
          "the plain training steps' render, loss and backward replayed as a CUDA graph (--cuda-graph-steps True, "
          "the default, with the room sized ahead it needs: --pipeline.model.fused.sync-free-binning True) against the "
          "steps issued from Python (--cuda-graph-steps False): ns-train + ns-eval on a real capture (--data), 5000 iterations, 3 seeds, each "
          "pair back to back",
          1,
          _per_seed_on_capture(f"'{_GRAPH_STEPS}' '{_PYTHON_STEPS}'", 5000, "wallclock", "seed{seed}"),
          needs_data=True),
    Suite("step-graph",
          "the ceiling of CUDA graphs for the training step: our whole step (projection, SH, binning into a room sized "
          "from its first pair count, render + loss, backward, densification statistics, Adam) captured once and "
          "replayed, against the same step issued from Python (wall, GPU busy, host issue time): on a real capture "
          "(--data) after 5000 iterations of ns-train bytesplat, one train view at full resolution, and on 1M random "
          "Gaussians at 1080p",
          1,
          (Step("wallclock", _args("--data {data} --methods bytesplat --iterations 5000 --seeds 0 --no-eval "
                                   "--offline-lpips --work-dir {work}/train"), name="train_5k"),
           Step("step", _args(f"--trained {_TRAINED_CAPTURE} --warmup 10 --repeats 100 --implementations bytesplat "
                              "bytesplat-graph"), name="step_trained"),
           Step("step", _args("--num-gaussians 1000000 --width 1920 --height 1080 --warmup 10 --repeats 50 "
                              "--implementations bytesplat bytesplat-graph"), name="step_1m")),
          needs_data=True),
    Suite("gt-downscale",
          "the training image shrunk for splatfacto's coarse start by one average pool (--pipeline.model.gt-downscale "
          "pool, the default) against splatfacto's box-filter convolution (conv, which loads cuDNN at the first step "
          "and autotunes each new image size): ns-train + ns-eval on a real capture (--data), 5000 iterations, "
          "3 seeds, each pair back to back",
          1,
          _per_seed_on_capture(f"'{_GT_POOL}' '{_GT_CONV}'", 5000, "wallclock", "seed{seed}"),
          needs_data=True),
    Suite("step-in-run",
          "whether ns-train's plain step is bound by its host or by the GPU, measured inside the run: ns-train bytesplat "
          "on a real capture (--data), 5000 iterations, seed 0, with torch.profiler over 100 of its iterations (the "
          "GPU's kernel time, kernel launches and host-device synchronisations per step, against the unprofiled steps' "
          "median), one run with the window at 2000 (quarter resolution) and one at 4000 (half resolution)",
          1,
          tuple(Step("wallclock", _args(f"--data {{data}} --methods bytesplat --iterations 5000 --seeds 0 --no-eval "
                                        f"--offline-lpips --profile-steps {start}:{start + 100} "
                                        f"--work-dir {{work}}/window{start}"), name=f"window_{start}")
                for start in (2000, 4000)),
          needs_data=True),
    Suite("lean-training-loop",
          "bytesplat's training loop (the trainer's --lean-training-loop, default) against nerfstudio's Trainer.train on "
          "a real capture (--data): ns-train at 30000 iterations without ns-eval, seeds 0 and 1, one step each with "
          "the pair back to back (each step about 5 minutes on one H200); then ns-train + ns-eval at 5000 "
          "iterations, 3 seeds, each pair back to back",
          1,
          tuple(Step("wallclock", _args(f"--data {{data}} --methods bytesplat '{_NERFSTUDIO_LOOP}' --iterations 30000 "
                                        f"--seeds {seed} --no-eval --offline-lpips --work-dir {{work}}/wall30k"),
                     name=f"wall_30k_seed{seed}") for seed in (0, 1))
          + _per_seed_on_capture(f"bytesplat '{_NERFSTUDIO_LOOP}'", 5000, "wallclock", "seed{seed}"),
          needs_data=True),
    Suite("sass-loops",
          "the compositing loops' instruction counts in the machine code for sm_90 (H100/H200), per kernel instance "
          "(no GPU: nvcc and cuobjdump)",
          0,
          (Step("sass", _args("--arch 90 --sources render_fwd.cu render_bwd.cu fused_loss.cu"), name="sm90"),)),
    Suite("city-render-cpu",
          "the built-in large scene's generator on one CPU core: seconds per view of each kind for the small, large "
          "and 4k cities (two views of each kind), each scene's render time estimated from them, and the small "
          "city generated whole with one worker",
          0,
          (Step("city", _args("--presets small large 4k --views-per-kind 2 --generate small"), name="one_core",
                env=(("OMP_NUM_THREADS", "1"),)),)),
    Suite("loop-overhead-cpu",
          "the training loop's own host time per step with the step stubbed out (bytesplat's loop, "
          "--lean-training-loop, against nerfstudio's Trainer.train): 3000 steps, 5 runs of each, alternating, "
          "in one process on the CPU (no GPU)",
          0,
          (Step("loop", _args("--iterations 3000 --repeats 5"), name="cpu"),)),
    Suite("kernel-levers",
          "the render kernels' levers against its defaults until 2026-12-07 (expf, one pixel per backward thread): "
          "the falloff as 2^q from the prescaled conic (--pipeline.model.fused.fast-exp True, the default since) and "
          "two pixels per thread in the backward (--pipeline.model.fused.bwd-pixels-per-thread 2): raster + loss and "
          "the forward at 1080p with 1M and 4M random Gaussians, the whole step with expf, with 2^q and with both, "
          "and ns-train + ns-eval with both on a real capture (--data), 5000 iterations, 3 seeds, each pair back to "
          "back; then fast_exp alone for quality, seeds 3-6, the eight runs at once, each lever alone, seeds 0-2, the "
          "nine runs at once, and both together, seeds 3-8, the twelve runs at once",
          1,
          (Step("raster", _args(f"{_RASTER_1080P} --warmup 3 --repeats 10 --raster-only"), name="raster_1080p"),
           Step("step", _args(f"{_RASTER_1080P} --warmup 10 --repeats 50 --implementations bytesplat-exact-exp "
                              "bytesplat bytesplat-bwd-2px"), name="step_1080p"))
          + _per_seed_on_capture(f"'{_EXACT_EXP}' '{_LEVERS}'", 5000, "wallclock", "seed{seed}")
          # quality only (the eight runs share the GPU): fast_exp alone, seeds 3-6
          + (Step("wallclock", _args(f"--data {{data}} --methods '{_EXACT_EXP}' '{_FAST_EXP}' --iterations 5000 "
                                     "--seeds 3 4 5 6 --parallel 8 --offline-lpips --work-dir {work}/fast-exp"),
                  name="fast_exp_seeds"),
             # quality only, the nine runs at once: each lever alone, seeds 0-2
             Step("wallclock", _args(f"--data {{data}} --methods '{_EXACT_EXP}' '{_FAST_EXP}' '{_BWD_2PX}' "
                                     "--iterations 5000 --seeds 0 1 2 --parallel 9 --offline-lpips --work-dir {work}/alone"),
                  name="alone_seeds_0_2"),
             # quality only, the twelve runs at once: both levers together, seeds 3-8
             Step("wallclock", _args(f"--data {{data}} --methods '{_EXACT_EXP}' '{_LEVERS}' --iterations 5000 "
                                     "--seeds 3 4 5 6 7 8 --parallel 12 --offline-lpips --work-dir {work}/together"),
                  name="together_seeds_3_8")),
          needs_data=True),
)}
