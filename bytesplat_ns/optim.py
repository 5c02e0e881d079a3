"""Adam for the Gaussians' parameters: ``torch.optim.Adam`` with bytesplat's update kernel on the GPU.

nerfstudio builds one ``torch.optim.Adam`` per Gaussian attribute (six per step, one tensor each,
millions of rows). :class:`DeviceAdam` is that optimizer with the same options, state layout
(``step`` / ``exp_avg`` / ``exp_avg_sq`` per parameter) and state_dict, so checkpoints load into
either and gsplat's densification edits its state as usual; only where the update runs is chosen
by ``implementation``:

- ``"bytesplat"`` (default): the bundled kernel (cuda/adam.cu, one launch per tensor, exactly
  torch's Adam arithmetic) for every group whose parameters are contiguous float32 CUDA tensors and
  whose options it supports (amsgrad, weight_decay, maximize, differentiable, capturable off, plain
  float lr and betas); any other group, or every group when the extension cannot be built here,
  takes torch's fused Adam on the GPU and torch's default Adam on the CPU.
- ``"torch-fused"``: torch's fused Adam (one kernel per group) when every parameter is on the GPU.
- ``"torch"``: torch's default Adam everywhere (A/B runs).

Visible rows only (gsplat's SelectiveAdam): when ``visible_rows`` ([N] bool, one per Gaussian) is set
before a step, that step updates only those rows of every parameter whose first dimension is N:
Adam's arithmetic on them, the other rows' parameters and moments left as they are (the step count
is the tensor's, as for every row). The model sets it from the step's render
(``--pipeline.model.optimize-visible-only``); it holds for one step. The kernel skips the hidden
rows' bytes; elsewhere :func:`masked_adam_step` (torch's Adam arithmetic, then the visible rows kept).

A step decided on the GPU: when ``step_valid`` (one bool on the device) is set before a step, that step
changes nothing where it is False, parameters, moments and step counts alike, without the host reading
it. The model sets it on the training steps whose tile lists were binned into a buffer sized ahead
(``bytesplat_ns/pair_capacity.py``): False when the lists did not fit, and the step is redone later. It
holds for one step and needs the kernel for every group (:meth:`DeviceAdam.decides_on_device`).

One pass (:class:`OnePassOptimizers`, the trainer's ``--optimizer-steps-in-one-pass``): nerfstudio clears
and steps its six Gaussian optimizers one by one, each step through ``GradScaler.step`` and torch's
``Optimizer.step`` wrapper; about 0.4 ms of host time per training step, which a host-bound step pays
in full. The one-pass path clears the gradients directly and steps every :class:`DeviceAdam` that
allows it with one launch for all step counts and one kernel per tensor (:func:`step_in_one_pass`).

On the GPU the groups are created ``fused=True`` under the first two, so the state is torch's fused
layout (a float32 ``step`` on the parameter's device) whichever path runs. On the CPU nothing
changes: torch's default Adam, so CPU runs stay comparable with earlier ones. An explicit ``fused``
or ``foreach`` argument means torch's implementation as asked.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Literal, Optional, Sequence, Tuple, Type

import torch
from nerfstudio.engine.optimizers import AdamOptimizerConfig, Optimizers
from nerfstudio.utils import writer
from torch import Tensor
from torch.amp import GradScaler

from bytesplat_ns.errors import SettingError

AdamImplementation = Literal["bytesplat", "torch-fused", "torch"]
IMPLEMENTATIONS = ("bytesplat", "torch-fused", "torch")

_kernel_error: Optional[str] = None  # why the extension could not be loaded in this process


def _all_on_cuda(params: list) -> bool:
    tensors = [p for group in params for p in (group["params"] if isinstance(group, dict) else [group])]
    return bool(tensors) and all(isinstance(t, torch.Tensor) and t.is_cuda and t.is_floating_point() for t in tensors)


def _adam_kernel() -> Optional[Callable]:
    """``raster._wrapper.adam_step``, or None (one warning per process) when the extension cannot be
    built or loaded here; the failure is remembered so no step retries the build."""
    global _kernel_error
    if _kernel_error is not None:
        return None
    from bytesplat_ns.raster import _wrapper
    from bytesplat_ns.raster._build import CudaBuildError

    try:
        _wrapper._ops()
    except CudaBuildError as e:
        _kernel_error = str(e)
        warnings.warn(f"bytesplat: CUDA kernels unavailable, Adam steps with torch's fused kernel ({e})")
        return None
    return _wrapper.adam_step


def _kernel_tensor(t: Optional[Tensor], like: Tensor) -> bool:
    return (isinstance(t, Tensor) and t.is_cuda and t.device == like.device and t.dtype == torch.float32
            and t.layout == torch.strided and t.is_contiguous() and t.shape == like.shape)


def _kernel_fits(group: dict, state) -> bool:
    """Whether the kernel computes exactly what torch's Adam would for this group."""
    if group["amsgrad"] or group["weight_decay"] != 0 or group["maximize"] or group["differentiable"]:
        return False
    if group["capturable"] or any(isinstance(v, Tensor) for v in (group["lr"], *group["betas"], group["eps"])):
        return False
    for p in group["params"]:
        if p.grad is None:
            continue  # skipped, as torch skips it
        if not (_kernel_tensor(p, p) and _kernel_tensor(p.grad, p)):
            return False
        s = state.get(p)
        if s and not (_kernel_tensor(s.get("exp_avg"), p) and _kernel_tensor(s.get("exp_avg_sq"), p)):
            return False
    return True


def _torch_adam_step() -> Callable:
    """``torch.optim.Adam.step`` without the step-hook wrapper torch adds to a class on its first
    instance (this optimizer's own ``step`` already runs the hooks once)."""
    step = torch.optim.Adam.step
    return step.__wrapped__ if getattr(step, "hooked", False) else step


def masked_adam_step(param: Tensor, grad: Tensor, state: dict, lr: float, beta1: float, beta2: float, eps: float,
                     visible: Tensor) -> None:
    """One Adam step of ``param`` (amsgrad, weight decay, maximize off) on its ``visible`` rows only, with
    torch's single-tensor Adam arithmetic; ``state`` (step, exp_avg, exp_avg_sq) is initialised as torch
    does when empty. No host read of a device tensor."""
    if len(state) == 0:
        state["step"] = torch.zeros((), dtype=torch.float32, device=param.device if param.is_cuda else "cpu")
        state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
    state["step"] += 1
    exp_avg, exp_avg_sq, t = state["exp_avg"], state["exp_avg_sq"], state["step"]
    new_avg = exp_avg.lerp(grad, 1 - beta1)
    new_avg_sq = exp_avg_sq.mul(beta2).addcmul_(grad, grad, value=1 - beta2)
    if t.is_cuda:  # the bias corrections on the device
        step_size = lr / (1 - beta1 ** t)
        bias_correction2_sqrt = (1 - beta2 ** t).sqrt()
        update = new_avg / ((new_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)) * step_size
        new_param = param - update
    else:
        step = float(t)
        denom = (new_avg_sq.sqrt() / (1 - beta2 ** step) ** 0.5).add_(eps)
        new_param = param.addcdiv(new_avg, denom, value=-(lr / (1 - beta1 ** step)))
    rows = visible.reshape(-1, *([1] * (param.dim() - 1)))
    for current, new in ((param, new_param), (exp_avg, new_avg), (exp_avg_sq, new_avg_sq)):
        current.copy_(torch.where(rows, new, current))


class DeviceAdam(torch.optim.Adam):
    """``torch.optim.Adam`` whose update runs where ``implementation`` says (module docstring)."""

    visible_rows: Optional[Tensor] = None  # this step's visible Gaussians (module docstring)
    step_valid: Optional[Tensor] = None  # this step's flag on the device: False changes nothing (module docstring)

    def __init__(self, params: Iterable, implementation: AdamImplementation = "bytesplat", **kwargs):
        if implementation not in IMPLEMENTATIONS:
            raise SettingError(f"unknown Adam implementation {implementation!r}",
                               hint=f"use one of {', '.join(IMPLEMENTATIONS)}")
        params = list(params)
        chosen = kwargs.get("fused") is not None or kwargs.get("foreach") is not None
        if not chosen and implementation != "torch" and _all_on_cuda(params):
            kwargs["fused"] = True  # torch's fused state layout; also the fallback path on the GPU
        super().__init__(params, **kwargs)
        self.implementation = "torch" if chosen else implementation

    def __getstate__(self):  # torch's keeps only defaults, state and param_groups
        return {**super().__getstate__(), "implementation": self.implementation}

    @torch.no_grad()
    def step(self, closure=None):
        visible, self.visible_rows = self.visible_rows, None  # one step's
        valid, self.step_valid = self.step_valid, None
        if valid is not None and not self.decides_on_device():
            raise SettingError("an Adam step decided on the GPU (step_valid) needs bytesplat's Adam kernel for "
                               "every parameter group")
        if visible is not None:
            return self._visible_rows_step(visible, closure, valid)
        amp = getattr(self, "grad_scale", None) is not None or getattr(self, "found_inf", None) is not None
        kernel_groups: List[dict] = []
        if getattr(self, "implementation", "torch") == "bytesplat" and not amp:
            kernel_groups = [g for g in self.param_groups if _kernel_fits(g, self.state)]
        kernel = _adam_kernel() if kernel_groups else None
        if kernel is None:
            return _torch_adam_step()(self, closure)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in kernel_groups:
            self._kernel_step(group, kernel, None, valid)
        rest = [g for g in self.param_groups if not any(g is k for k in kernel_groups)]
        if rest:  # torch's own step over the other groups only
            groups, self.param_groups = self.param_groups, rest
            try:
                _torch_adam_step()(self)
            finally:
                self.param_groups = groups
        return loss

    def _visible_rows_step(self, visible: Tensor, closure=None, valid: Optional[Tensor] = None):
        """This step on the ``visible`` rows only: the kernel where it applies, :func:`masked_adam_step`
        elsewhere."""
        if getattr(self, "grad_scale", None) is not None or getattr(self, "found_inf", None) is not None:
            raise SettingError("Adam on visible rows only does not support gradient scaling (AMP)")
        for group in self.param_groups:
            if group["amsgrad"] or group["weight_decay"] != 0 or group["maximize"]:
                raise SettingError("Adam on visible rows only supports amsgrad, weight_decay and maximize off")
            for p in group["params"]:
                if p.grad is not None and (p.dim() == 0 or p.shape[0] != visible.shape[0]):
                    raise SettingError(f"Adam on visible rows only: a parameter of shape {tuple(p.shape)} has no row "
                                       f"per Gaussian ({visible.shape[0]} visible flags)")
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        use_kernel = getattr(self, "implementation", "torch") == "bytesplat"
        for group in self.param_groups:
            kernel = _adam_kernel() if use_kernel and _kernel_fits(group, self.state) else None
            if kernel is not None:
                self._kernel_step(group, kernel, visible, valid)
                continue
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is not None:
                    masked_adam_step(p, p.grad, self.state[p], float(group["lr"]), float(beta1), float(beta2),
                                     float(group["eps"]), visible)
        return loss

    def _kernel_step(self, group: dict, kernel: Callable, visible: Optional[Tensor] = None,
                     valid: Optional[Tensor] = None) -> None:
        _launch_kernel_steps(kernel, [(p, state, group) for p, state in self._kernel_todo(group)], visible, valid)

    def decides_on_device(self) -> bool:
        """Whether a step with ``step_valid`` can be decided on the GPU: bytesplat's kernel steps every group
        (no gradient scaling, every group's options and tensors as the kernel takes them)."""
        if getattr(self, "implementation", "torch") != "bytesplat":
            return False
        if getattr(self, "grad_scale", None) is not None or getattr(self, "found_inf", None) is not None:
            return False
        return all(_kernel_fits(g, self.state) for g in self.param_groups) and _adam_kernel() is not None

    def _kernel_todo(self, group: dict) -> List[Tuple[Tensor, dict]]:
        """The group's parameters with a gradient and their state, initialised as torch's fused Adam does."""
        todo = []
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state[p]
            if len(state) == 0:  # as torch's fused Adam initialises it
                state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            elif not (state["step"].device == p.device and state["step"].dtype == torch.float32):
                # a state from torch's non-fused Adam (step on the host): once, to the fused layout
                state["step"] = state["step"].to(device=p.device, dtype=torch.float32)
            todo.append((p, state))
        return todo

    def steps_in_one_pass(self) -> bool:
        """Whether :func:`step_in_one_pass` may step this optimizer: every group takes the kernel, no
        visible-rows step is pending, no gradient scaling, and no step hooks (its own or global) to run."""
        if getattr(self, "implementation", "torch") != "bytesplat" or self.visible_rows is not None:
            return False
        if getattr(self, "grad_scale", None) is not None or getattr(self, "found_inf", None) is not None:
            return False
        if self._optimizer_step_pre_hooks or self._optimizer_step_post_hooks or _global_step_hooks():
            return False
        return all(_kernel_fits(g, self.state) for g in self.param_groups)


def _global_step_hooks() -> bool:
    from torch.optim import optimizer

    return bool(optimizer._global_optimizer_pre_hooks or optimizer._global_optimizer_post_hooks)


def _launch_kernel_steps(kernel: Callable, todo: List[Tuple[Tensor, dict, dict]], visible: Optional[Tensor] = None,
                        valid: Optional[Tensor] = None) -> None:
    """One Adam step of each (parameter, state, group) in ``todo``: one launch for all their counts (as
    torch's fused Adam does per group), then the kernel per tensor, which reads its count there. With
    ``valid`` (one bool on the device) the counts get the flag added and the kernel changes nothing where
    it is False."""
    if not todo:
        return
    counts = [state["step"] for _, state, _ in todo]
    if valid is None:
        torch._foreach_add_(counts, 1)
    else:  # a list of the flag: foreach's add of one tensor reads it on the host
        torch._foreach_add_(counts, [valid.to(torch.float32)] * len(counts))
    extra = () if valid is None else (valid,)
    for p, state, group in todo:
        beta1, beta2 = group["betas"]
        kernel(p, p.grad, state["exp_avg"], state["exp_avg_sq"], state["step"], group["lr"], beta1, beta2,
               group["eps"], visible, *extra)
    torch.autograd.graph.increment_version([p for p, _, _ in todo])  # written through raw pointers


@torch.no_grad()
def step_in_one_pass(optimizers: Sequence[torch.optim.Optimizer]) -> None:
    """``opt.step()`` for each of ``optimizers``, the :class:`DeviceAdam` ones that
    :meth:`DeviceAdam.steps_in_one_pass` allows in one pass: one launch for all their step counts and
    one kernel per tensor, without torch's per-optimizer ``step`` wrapper (its hook and profiler
    bookkeeping, ~0.05 ms of host time each). The same arithmetic on the same state as their own ``step``."""
    kernel = None
    # the optimizers' work by their step_valid flag (None, or the model's one flag for every Gaussian optimizer)
    batches: Dict[int, Tuple[Optional[Tensor], List[Tuple[Tensor, dict, dict]]]] = {}
    for optimizer in optimizers:
        if isinstance(optimizer, DeviceAdam) and optimizer.steps_in_one_pass():
            kernel = kernel or _adam_kernel()
            if kernel is not None:
                valid, optimizer.step_valid = optimizer.step_valid, None
                batches.setdefault(id(valid), (valid, []))[1].extend(
                    (p, state, group) for group in optimizer.param_groups for p, state in optimizer._kernel_todo(group))
                optimizer._opt_called = True  # what torch's wrapper records for the LR scheduler's order check
                continue
        optimizer.step()
    for valid, todo in batches.values():
        _launch_kernel_steps(kernel, todo, None, valid)


class OnePassOptimizers(Optimizers):
    """nerfstudio's ``Optimizers`` whose per-step calls take the short way where that changes nothing:
    gradients cleared by setting them to None (what ``zero_grad()`` does by default) and the Adam steps
    in one pass (:func:`step_in_one_pass`) when gradients are neither scaled nor clipped. Anything else
    (AMP, ``max_norm``, optimizers that are not bytesplat's Adam) goes nerfstudio's way."""

    @classmethod
    def adopt(cls, optimizers: Optimizers) -> "OnePassOptimizers":
        """``optimizers`` itself, now of this class (the same optimizers, schedulers and parameters: the
        model's and the callbacks' references to them stay valid)."""
        optimizers.__class__ = cls
        return optimizers

    def zero_grad_some(self, param_groups: List[str]) -> None:
        for name in param_groups:
            optimizer = self.optimizers[name]
            if type(optimizer).zero_grad is not torch.optim.Optimizer.zero_grad:
                optimizer.zero_grad()
                continue
            for group in optimizer.param_groups:
                for p in group["params"]:
                    p.grad = None

    def zero_grad_all(self) -> None:
        self.zero_grad_some(list(self.optimizers))

    def optimizer_scaler_step_some(self, grad_scaler: GradScaler, param_groups: List[str]) -> None:
        if grad_scaler.is_enabled() or any(self.config[name]["optimizer"].max_norm is not None for name in param_groups):
            return super().optimizer_scaler_step_some(grad_scaler, param_groups)
        # nerfstudio steps an optimizer only when one of its parameters has a gradient
        step_in_one_pass([self.optimizers[name] for name in param_groups
                          if any(p.grad is not None for g in self.optimizers[name].param_groups for p in g["params"])])

    def optimizer_scaler_step_all(self, grad_scaler: GradScaler) -> None:
        self.optimizer_scaler_step_some(grad_scaler, list(self.optimizers))

    learning_rate_events_every = 1
    """Put the ``learning_rate/<group>`` events on the steps that are multiples of this only (1: every step,
    as nerfstudio); the trainer raises it to ``steps_per_log`` where no event writer keeps the others."""

    def scheduler_step_all(self, step: int) -> None:
        if self.learning_rate_events_every == 1:
            return super().scheduler_step_all(step)
        put = step % self.learning_rate_events_every == 0
        for name, scheduler in self.schedulers.items():
            scheduler.step()
            if put:
                writer.put_scalar(name=f"learning_rate/{name}", scalar=scheduler.get_last_lr()[0], step=step)


@dataclass
class DeviceAdamOptimizerConfig(AdamOptimizerConfig):
    """nerfstudio's Adam config (same fields, same checkpoints) building a :class:`DeviceAdam`."""

    _target: Type = field(default_factory=lambda: DeviceAdam)
    implementation: AdamImplementation = "bytesplat"
    """Where the Adam update runs on the GPU: 'bytesplat' (the bundled kernel, exact torch Adam arithmetic;
    torch's fused Adam where it does not apply), 'torch-fused' (torch's fused Adam) or 'torch' (torch's
    default Adam). CPU parameters always take torch's default Adam."""

    def __setstate__(self, state: dict) -> None:
        # config.yml written before `implementation` had `fused_on_gpu` (True was the default);
        # False meant torch's default Adam on the GPU.
        if state.pop("fused_on_gpu", True) is False:
            state.setdefault("implementation", "torch")
        self.__dict__.update(state)
