"""What a step of Adam on some rows only must give: torch's own Adam over every row of a copy, then
only the visible rows kept (the tests of ``optim.DeviceAdam.visible_rows``, CPU and GPU)."""

from __future__ import annotations

import torch


def adam_then_keep_visible(param, grad, state, lr, visible, eps=1e-15, **adam_options):
    """torch.optim.Adam (``adam_options``: e.g. ``foreach=False`` or ``fused=True``) on a copy of ``param``
    with ``state`` copied in, then only the ``visible`` rows ([rows] bool) kept. Returns (param, state)."""
    q = param.detach().clone()
    opt = torch.optim.Adam([q], lr=lr, eps=eps, **adam_options)
    if state:
        opt.state[q] = {k: v.clone() for k, v in state.items()}
    q.grad = grad.clone()
    opt.step()
    new = opt.state[q]
    rows = visible.reshape(-1, *([1] * (param.dim() - 1)))
    old = {k: state.get(k, torch.zeros_like(param)) for k in ("exp_avg", "exp_avg_sq")}
    return torch.where(rows, q, param.detach()), {
        "step": new["step"], **{k: torch.where(rows, new[k], old[k]) for k in old}}
