"""Stop a diverged run loudly, without a host-device synchronisation per step.

Each step adds its loss into a running sum that stays on the device (one launch): the sum is finite
exactly when every loss in it is (a NaN or an infinity stays in any sum; training losses are far
from float32's overflow). The sum (and every parameter group) is read only every ``interval`` steps
and before each checkpoint, so a NaN run ends within ``interval`` steps and never writes a NaN
checkpoint.
"""

from __future__ import annotations

from typing import Dict, List, Optional

import torch

from bytesplat_ns.errors import BytesplatError

DIVERGED_HINT = "lower the learning rates (--optimizers.<group>.optimizer.lr); the last finite checkpoint is kept"


class DivergenceError(BytesplatError):
    """Training produced NaN/inf values."""


class DivergenceGuard:
    def __init__(self, interval: int):
        self.interval = max(1, int(interval))
        self._loss_sum: Optional[torch.Tensor] = None
        self._first_step: Optional[int] = None  # first step added into the sum since the last check

    def observe(self, step: int, loss: torch.Tensor) -> None:
        """Add this step's loss into the device-side sum (no synchronisation)."""
        loss = loss.detach()
        # a copy to start the sum: a replayed step graph writes its loss into the same tensor every step
        self._loss_sum = loss.clone() if self._loss_sum is None else self._loss_sum + loss
        if self._first_step is None:
            self._first_step = step

    def due(self, step: int) -> bool:
        return step % self.interval == 0

    def check(self, step: int, param_groups: Dict[str, List[torch.Tensor]]) -> None:
        """Read the flag and the parameters (synchronises); a clear error if anything is non-finite."""
        total, first, self._loss_sum, self._first_step = self._loss_sum, self._first_step, None, None
        flag = torch.isfinite(total).all() if total is not None else None
        groups_finite = {name: torch.stack([torch.isfinite(p.detach()).all() for p in params]).all()
                         for name, params in param_groups.items() if params}
        everything = list(groups_finite.values()) + ([flag] if flag is not None else [])
        if not everything or bool(torch.stack(everything).all()):
            return  # the one host read of a healthy check
        for name, finite in groups_finite.items():
            if not bool(finite):
                raise DivergenceError(
                    f"Training diverged: parameter group '{name}' holds NaN/inf values at step {step}.", DIVERGED_HINT
                )
        if flag is not None and not bool(flag):
            span = f"at step {step}" if first == step else f"between steps {first} and {step}"
            # The parameters are still finite: name the groups the last backward gave NaN/inf gradients.
            groups = [
                name for name, params in param_groups.items()
                if any(p.grad is not None and not bool(torch.isfinite(p.grad).all()) for p in params)
            ]
            culprits = f" (non-finite gradients in parameter groups {', '.join(repr(g) for g in groups)})" if groups else ""
            raise DivergenceError(f"Training diverged: the loss became NaN/inf {span}{culprits}.", DIVERGED_HINT)
