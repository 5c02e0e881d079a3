"""Training steps replayed as CUDA graphs: the host issues one graph instead of a step's ~80 launches.

Where a training step is bound by its host side (fox in ``ns-train``: the host takes longer to issue a step
than the GPU to run it, docs/wallclock.md), the GPU waits between kernels. A CUDA graph of the step's render,
loss and backward is captured once and replayed on the following steps; the host then issues a few copies,
one graph launch and the Adam step (outside the graph: its learning rates change every step). What a graph
holds fixed and what the trainer does about it:

- the per-step inputs (the view matrix, intrinsics and ground-truth image) are copied into the graph's own
  buffers before each replay; the random background is drawn inside the graph (CUDA graphs advance the
  random stream at every replay);
- the tile lists are binned into a fixed room (pair_capacity.py; the trainer sizes the rooms ahead for graph steps),
  the largest any training view would get; a replayed step whose pairs outgrow it changes nothing on the
  GPU and its view is trained again eagerly, as any sized step's; the graph is then captured again;
- the Gaussians, their count, the SH degree and the image size: a densification step, an opacity reset,
  a new SH degree or resolution makes the trainer capture again at the next graph step;
- the gradients live in the graph's memory: after a replay each Gaussian parameter's ``.grad`` is pointed
  at them again (an eager step in between leaves its own there);
- a logged step is replayed too: its training PSNR is read from the graph's render and background after the
  replay (``ByteSplatModel.graph_step_dicts``);
- steps that render or score anything else run eagerly (``ByteSplatModel.graph_step_blocker``): splatfacto's
  scale regularisation (every 10th step, off by default), pruning scores and diagnostics;
- the first capture of each image size and SH degree follows an eager warm-up pass of the step;
- a step that cannot be captured (``CaptureFailed``) runs eagerly, with one console line, and the next graph
  step captures again, into a fresh memory pool; a second failure in a row turns graph steps off for the rest
  of the run, and training goes on eagerly.

The replayed step is the eager step up to the order of float sums and the random background's stream
(GPU test ``tests/engine/test_step_graphs_gpu.py``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

import torch
from torch import Tensor

if TYPE_CHECKING:
    from bytesplat_ns.model import ByteSplatModel

WARMUP_STEPS = 1
"""Eager passes on a side stream before the first capture of each shape (image size, SH degree): what is made
once per shape must not be made inside a capture, such as the fused loss's normalisation for an image size (a
host-to-device copy, cached: raster/_wrapper.py), lazily loaded kernels and library workspaces. Without it graph
steps ended where fox's coarse start changes resolution (step 3000, H100, 2026-12-07; the failed capture's
message was not kept, the copy above is the cause the code shows)."""

MAX_FAILED_CAPTURES_IN_A_ROW = 2
"""A failed capture's step runs eagerly and the next graph step captures again; this many failures in a row
end graph steps for the run."""


class CaptureFailed(RuntimeError):
    """The step could not be captured as a CUDA graph (something in it waits for the GPU or reads a tensor on
    the host, or a kernel's launch is not capturable); the random generator is as it was before the capture."""


@dataclass
class StepGraph:
    """One captured render + loss + backward: its fixed inputs, outputs and what it was captured for."""

    key: Tuple
    graph: "torch.cuda.CUDAGraph"
    viewmat: Tensor
    intrinsics: Tensor
    image: Tensor
    loss: Tensor
    rgb: Tensor  # the rendered image and the background it was composited on: a logged step's training metrics
    background: Tensor
    info: Dict
    grads: List[Optional[Tensor]]
    room: int
    captured_at: int  # the model step of the capture: the graph's first replay

    def replay(self, viewmat: Tensor, intrinsics: Tensor, image: Tensor) -> None:
        self.viewmat.copy_(viewmat)
        self.intrinsics.copy_(intrinsics)
        self.image.copy_(image)
        self.graph.replay()


def graph_key(params: List[Tensor], sh_degree: Optional[int], width: int, height: int, image: Tensor) -> Tuple:
    """What a graph holds fixed besides its input buffers and room: every parameter tensor (a densification
    step or an opacity reset replaces them), the SH degree and the image size."""
    return (tuple((id(p), p.data_ptr(), tuple(p.shape)) for p in params), sh_degree, width, height,
            tuple(image.shape), image.dtype)


class StepGraphs:
    """The trainer's graph of its training step (module docstring): captured where a graph step finds none
    that fits, replayed otherwise. Counts its replays and captures, the steps it captured at, the host's
    seconds in the captures and the captures that failed."""

    def __init__(self):
        self.current: Optional[StepGraph] = None
        self.replays = 0
        self.capture_steps: List[int] = []
        self.capture_seconds = 0.0  # host time of the captures: the old graph's release to the new one's instantiation
        self.failures: List[Tuple[int, str]] = []  # (model step, error) of each capture that failed
        self._failed_in_a_row = 0
        self._stream: Optional["torch.cuda.Stream"] = None  # captures run on it (a graph is captured off the default stream)
        self._warmed_shapes: set = set()  # graph_key's shape part of every capture so far (WARMUP_STEPS)

    @property
    def captures(self) -> int:
        return len(self.capture_steps)

    @property
    def off(self) -> bool:
        """Graph steps have ended for this run: ``MAX_FAILED_CAPTURES_IN_A_ROW`` captures failed in a row."""
        return self._failed_in_a_row >= MAX_FAILED_CAPTURES_IN_A_ROW

    def run(self, model: "ByteSplatModel", key: Tuple, viewmat: Tensor, intrinsics: Tensor, image: Tensor,
            width: int, height: int) -> Optional[StepGraph]:
        """Replay the graph for ``key`` on these inputs, capturing it first where the current one does not fit
        (or a step it replayed outgrew its room): ``model.graph_step_loss`` and its backward, in the
        room ``model.graph_step_room()`` gives then. The Gaussian parameters' gradients then hold the step's.
        None, and nothing run, where the model has no room to give yet."""
        graph = self.current
        # a step's total is read two steps later, so an overflow may come from a step of the graph before
        # this one (its room too small): that one is captured again already
        outgrown = graph is not None and model.pair_room.last_overflow_step >= graph.captured_at
        if graph is None or graph.key != key or outgrown:
            start = time.perf_counter()
            # The new capture allocates from the old graph's memory pool: a graph is never replayed once the next
            # is captured, so the new one reuses that memory instead of asking the driver for more. The old
            # graph's buffers go back to the pool now; the graph itself (whose reference keeps the pool shared)
            # goes once the new capture has ended. After a failed capture there is no old graph: a fresh pool.
            previous = graph.graph if graph is not None else None
            self.current = graph = None
            room = model.graph_step_room()
            if room is None:
                return None
            try:
                graph = self.current = self._capture(model, key, (viewmat, intrinsics, image), width, height, room,
                                                     previous)
            except CaptureFailed as failure:
                self.failures.append((model.step, str(failure.__cause__ or failure)))
                self._failed_in_a_row += 1
                raise
            del previous
            self._failed_in_a_row = 0
            self.capture_steps.append(graph.captured_at)
            self.capture_seconds += time.perf_counter() - start
        graph.replay(viewmat, intrinsics, image)
        for p, grad in zip(model.gaussian_parameters(), graph.grads):
            p.grad = grad
        self.replays += 1
        return graph

    def _capture(self, model: "ByteSplatModel", key: Tuple, views: Tuple[Tensor, Tensor, Tensor], width: int,
                 height: int, room: int, previous: Optional["torch.cuda.CUDAGraph"] = None) -> StepGraph:
        params = model.gaussian_parameters()
        viewmat, intrinsics, image = views
        # A parameter's gradient accumulator runs on the stream it was made on, and a live autograd graph keeps
        # it: one made by an eager step on the default stream would make the captured backward depend on that
        # stream (cudaErrorStreamCaptureImplicit, seen on an H100 on 2026-12-06). The last step's render
        # statistics are the only graph still held (the trainer returns its losses detached), so drop them:
        # the warm-up and the capture then make the accumulators on the capture stream.
        model.info = {}
        static = [viewmat.clone(), intrinsics.clone(), image.clone()]
        inputs = (static[0], static[1], width, height, static[2], room)
        if self._stream is None:
            self._stream = torch.cuda.Stream()
        stream = self._stream
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            if key[1:] not in self._warmed_shapes:
                for _ in range(WARMUP_STEPS):
                    for p in params:
                        p.grad = None
                    model.graph_step_loss(*inputs)[0].backward()
                self._warmed_shapes.add(key[1:])
            for p in params:
                p.grad = None  # the captured backward then makes each gradient in the graph's memory
            # a failed capture leaves the random generator in capture mode (every later random draw fails with
            # "Offset increment outside graph capture"): its state from before goes back then
            generator = torch.cuda.default_generators[params[0].device.index or 0]
            before = generator.clone_state()
            graph = torch.cuda.CUDAGraph()
            # thread_local: the eval images' worker thread may use the GPU meanwhile. capture_begin, not
            # torch.cuda.graph, which would also empty the allocator's cache at every capture
            graph.capture_begin(pool=previous.pool() if previous is not None else None, capture_error_mode="thread_local")
            error: Optional[BaseException] = None
            try:
                loss, rgb, background = model.graph_step_loss(*inputs)
                loss.backward()
            except Exception as raised:
                error = raised
            try:
                graph.capture_end()
            except Exception as raised:
                error = error or raised
        torch.cuda.current_stream().wait_stream(stream)
        if error is not None:
            generator.graphsafe_set_state(before)
            for p in params:
                p.grad = None
            model.info = {}
            raise CaptureFailed(f"the training step could not be captured as a CUDA graph ({error})") from error
        return StepGraph(key, graph, static[0], static[1], static[2], loss.detach(), rgb.detach(), background,
                         dict(model.info), [p.grad for p in params], room, model.step)
