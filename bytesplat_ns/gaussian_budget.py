"""Gaussian budget: remove the Gaussians that contribute least to the training views.

Fewer Gaussians make every stage of a step cheaper (projection, SH, binning, render, optimizer) and
the export smaller. The hardware-aware pruning of ``pruning.py`` removes Gaussians where tiles
overflow the fused kernel's shared memory; the budget removes a share of all Gaussians, ranked by
how much they show in the training images:

    importance(g) = sum over the training views v and their pixels p of w(g, v, p),

``w = alpha * T``, the weight with which ``g`` is composited into ``p`` (the render is
``sum_g w c_g``). That is the gradient of the rendered image's sum with respect to unit colours, so
:func:`view_blending_weights` gets it from any backend's backward, with the backend's own rules
(tile reach, alpha threshold, early stop). Summing the weights also counts the pixels a Gaussian
covers, which the largest weight (the hardware-aware score) does not: a Gaussian that is opaque on
one pixel matters less than a faint one over a thousand. The same ranking is LightGaussian's
global significance without its volume term.

Schedule (:class:`GaussianBudget`): at the configured steps (default: the step gsplat stops
densifying, ``stop_split_at``), right after gsplat's own step, one pass over every training camera
at the current training resolution (a render and its backward each, no optimizer step), then the
lowest-ranked ``fraction`` of the Gaussians is removed with their optimizer and strategy state
(``pruning.apply_prune``). Gaussians no training view sees rank lowest. The rest of training then
adjusts the remaining Gaussians to the images (after ``stop_split_at`` nothing grows back).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Optional, Tuple

import torch
from torch import Tensor

from bytesplat_ns.errors import SettingError
from bytesplat_ns.pruning import apply_prune


def view_blending_weights(render: Callable[[Tensor], Tensor], num_gaussians: int, device: torch.device,
                          dtype: torch.dtype = torch.float32, pixel_weights: Optional[Tensor] = None) -> Tensor:
    """[N]: for one view, each Gaussian's compositing weights summed over the view's pixels (each
    pixel's times ``pixel_weights`` [H,W] when given: e.g. its error, for what spoils a view).

    ``render(colors)`` renders the view with ``colors`` [N,3] as the Gaussians' colours and returns
    the colour image (no background); the weights are the gradient of its first channel's (weighted)
    sum with respect to the first colour channel."""
    colors = torch.ones(num_gaussians, 3, device=device, dtype=dtype, requires_grad=True)
    with torch.enable_grad():
        channel = render(colors)[..., 0]
        total = channel.sum() if pixel_weights is None else (channel * pixel_weights).sum()
        (grad,) = torch.autograd.grad(total, colors)
    return grad[:, 0]


def lowest_ranked(importance: Tensor, fraction: float) -> Tensor:
    """Boolean mask of the ``floor(fraction * N)`` lowest-importance Gaussians (ties: lower index first)."""
    n = importance.shape[0]
    count = int(fraction * n)
    mask = torch.zeros(n, dtype=torch.bool, device=importance.device)
    if count > 0:
        order = torch.sort(importance, stable=True).indices
        mask[order[:count]] = True
    return mask


@dataclass
class BudgetSettings:
    """The model config's ``budget_prune_*`` fields (see ``ByteSplatModelConfig``)."""

    fraction: float = 0.0
    steps: Tuple[int, ...] = ()

    @property
    def active(self) -> bool:
        """Whether a budget step removes anything by these settings."""
        return self.fraction > 0

    def __post_init__(self):
        if not 0.0 <= self.fraction < 1.0:
            raise SettingError(f"--pipeline.model.budget-prune-fraction must be in [0, 1), got {self.fraction}")
        if any(int(s) <= 0 for s in self.steps):
            raise SettingError(f"--pipeline.model.budget-prune-steps must be positive steps, got {tuple(self.steps)}")


class GaussianBudget:
    """Removes the lowest-importance share of the Gaussians at the scheduled steps (module docstring).

    ``importance_pass`` is the model's: it renders every training camera and sums
    :func:`view_blending_weights` (returning [N] and the number of views)."""

    def __init__(self, settings: BudgetSettings, densify_stop: int, enabled: bool = True):
        self.settings = settings
        self.steps = tuple(sorted({int(s) for s in settings.steps})) or (int(densify_stop),)
        self.enabled = enabled and settings.active
        self.history: List[Dict[str, float]] = []

    def is_prune_step(self, step: int) -> bool:
        return self.enabled and step in self.steps

    def step_post_backward(self, params, optimizers, state, step: int,
                           importance_pass: Callable[[], Tuple[Tensor, int]]) -> Optional[Dict[str, float]]:
        if not self.is_prune_step(step):
            return None
        start = time.perf_counter()
        importance, views = importance_pass()
        mask = lowest_ranked(importance, self.settings.fraction)
        unseen = int((importance <= 0).sum())
        before = int(importance.shape[0])
        removed = apply_prune(params, optimizers, state, mask)
        stats = dict(step=float(step), gaussians=float(before), removed=float(removed), unseen=float(unseen),
                     views=float(views), seconds=time.perf_counter() - start)
        self.history.append(stats)
        return stats


def budget_announcement(budget: GaussianBudget, run_end_step: Optional[int] = None) -> str:
    """The console line that says what an enabled budget will do in this run (``run_end_step``: the
    step after the run's last, when known): a run that ends before its budget step prunes nothing."""
    steps = ", ".join(map(str, budget.steps))
    if run_end_step is not None and all(step >= run_end_step for step in budget.steps):
        return (f"bytesplat: Gaussian budget: this run ends before step {steps}, so it removes no Gaussians "
                "(--pipeline.model.budget-prune-steps sets earlier steps)")
    return (f"bytesplat: Gaussian budget: at step(s) {steps} the {budget.settings.fraction:.0%} of the Gaussians "
            "least seen in the training views are removed")


def summed_over_views(per_view: Iterable[Tensor], num_gaussians: int, device: torch.device) -> Tuple[Tensor, int]:
    """The sum of the per-view weights [N] (float64, so thousands of views add up exactly enough) and the view count."""
    total = torch.zeros(num_gaussians, dtype=torch.float64, device=device)
    views = 0
    for weights in per_view:
        total += weights.to(torch.float64)
        views += 1
    return total, views
