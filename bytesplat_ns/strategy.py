"""gsplat's DefaultStrategy with a running-statistics update that never waits for the GPU.

``DefaultStrategy._update_state`` runs after every backward pass and gathers the visible Gaussians
with ``torch.where(radii > 0)`` and boolean indexing: three host-device synchronisations per step,
each draining the GPU's queue (`bytesplat-bench profile`). The update below is the same arithmetic
on dense [N] tensors, masked instead of gathered. With one camera per step (how splatfacto and
bytesplat train) every Gaussian appears at most once, so the result is identical to gsplat's, bit
for bit; with several cameras the sums are the same and the screen-radius maximum is the exact
maximum over the cameras (gsplat's scatter there keeps whichever duplicate wrote last).
Densification, pruning and resets are gsplat's own code.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Dict, Tuple

import torch
from gsplat.strategy import DefaultStrategy


REFINE_SCHEDULE = ("refine_start_iter", "refine_stop_iter", "refine_every", "reset_every", "pause_refine_after_reset")


def refine_due(step: int, refine_start_iter: int, refine_stop_iter: int, refine_every: int, reset_every: int,
               pause_refine_after_reset: int) -> bool:
    """gsplat DefaultStrategy's rule for its grow-and-prune steps, from its ``REFINE_SCHEDULE`` fields."""
    return (refine_start_iter < step < refine_stop_iter and step % refine_every == 0
            and step % reset_every >= pause_refine_after_reset)


@dataclass
class SyncFreeDefaultStrategy(DefaultStrategy):
    # (width, height, cameras, device) -> _pixel_scale's tensor
    _pixel_scales: Dict[Tuple[int, int, int, torch.device], torch.Tensor] = field(default_factory=dict, init=False,
                                                                                    repr=False)
    @classmethod
    def like(cls, strategy: DefaultStrategy) -> "SyncFreeDefaultStrategy":
        """The same settings as ``strategy`` (a gsplat DefaultStrategy)."""
        return cls(**{f.name: getattr(strategy, f.name) for f in fields(strategy) if f.init})

    def refines_at(self, step: int) -> bool:
        """Whether ``step_post_backward(step)`` may change the number of Gaussians: gsplat's rule for
        its grow-and-prune steps (the same on every rank, so sharded runs need no message to know)."""
        return refine_due(step, **{key: getattr(self, key) for key in REFINE_SCHEDULE})

    def _update_state(self, params, state: Dict[str, Any], info: Dict[str, Any], packed: bool = False):
        if packed:  # records already lists of visible Gaussians: gsplat's update has nothing to gather
            return super()._update_state(params, state, info, packed=packed)
        for key in ("width", "height", "n_cameras", "radii", self.key_for_gradient):
            assert key in info, f"{key} is required but missing."
        means2d = info[self.key_for_gradient]
        grads = means2d.absgrad if self.absgrad else means2d.grad  # [C, N, 2]
        # gsplat scales the two components in place by these float32-exact factors: one multiply here
        norms = (grads * self._pixel_scale(info, grads.device)).norm(dim=-1)
        n = len(list(params.values())[0])
        for key in ("grad2d", "count") + (("radii",) if self.refine_scale2d_stop_iter > 0 else ()):
            if state[key] is None:
                state[key] = torch.zeros(n, device=grads.device)
        radii = info["radii"]  # [C, N]
        visible = radii > 0.0
        valid = info.get("step_valid")  # False: the step's tile lists did not fit their room (pair_capacity.py)
        if valid is not None:
            visible = visible & valid
        if visible.shape[0] == 1:  # one camera (every training step): the sums over it are its values
            state["grad2d"] += torch.where(visible[0], norms[0], 0.0)
            state["count"] += visible[0]
        else:
            state["grad2d"] += torch.where(visible, norms, 0.0).sum(0)
            state["count"] += visible.sum(0, dtype=torch.float32)
        if self.refine_scale2d_stop_iter > 0:  # the state is >= 0: a 0 for "not visible" leaves it as it is
            screen = torch.where(visible, radii / float(max(info["width"], info["height"])), 0.0).amax(0)
            torch.maximum(state["radii"], screen, out=state["radii"])

    def _pixel_scale(self, info: Dict[str, Any], device: torch.device) -> torch.Tensor:
        """[2] float32 on ``device``: gsplat's factors from normalised to pixel gradients, (width/2, height/2)
        times the number of cameras; made once per image size, camera count and device (a tensor built
        from host numbers every step would be a host-to-device copy every step)."""
        key = (info["width"], info["height"], info["n_cameras"], device)
        cache = self._pixel_scales
        if key not in cache:
            cache[key] = torch.tensor([info["width"] / 2.0 * info["n_cameras"], info["height"] / 2.0 * info["n_cameras"]],
                                      dtype=torch.float32, device=device)
        return cache[key]
