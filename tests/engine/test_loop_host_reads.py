"""No host reads of tensors in the training loop outside logging steps (issue 21).

A read of a tensor's value on the host (``item``, ``tolist``, ``float``, ...) waits for every queued
GPU kernel. On CPU the spy below counts them in everything the loop runs around the model: the
datamanager, the trainer loop, schedulers and the writers. The model's own forward/backward and the
optimizer's step are left out: on CPU they run the reference rasterizer and torch's CPU Adam, which
are not the GPU path (tests/engine/test_sync_free_step.py covers the GPU step's pieces).
"""

from __future__ import annotations

import collections
import copy
import traceback

import torch

from bytesplat_ns.bench.train import setup_trainer
from bytesplat_ns.data.scene import SceneSpec, ensure_scene
from bytesplat_ns.method_configs.bytesplat import bytesplat_config

READS = ("item", "tolist", "cpu", "numpy", "__float__", "__int__", "__bool__")
ITERATIONS, LOG_EVERY = 14, 5  # logging steps 0, 5, 10
AFTER_THE_LOOP = "after the loop"


def test_reads_happen_only_at_logging_steps(tmp_path, monkeypatch):
    scene = ensure_scene(SceneSpec(size="small", num_views=10, width=32), cache_dir=tmp_path / "scenes")
    config = copy.deepcopy(bytesplat_config)
    config.logging.steps_per_log = LOG_EVERY
    trainer, _ = setup_trainer("host-reads", config, scene, ITERATIONS, tmp_path / "out", seed=0, device="cpu")
    state = {"step": None, "paused": 0}
    reads = collections.defaultdict(list)

    def spy(name):
        real = getattr(torch.Tensor, name)

        def read(self, *args, **kwargs):
            if state["step"] is not None and not state["paused"]:
                frame = traceback.extract_stack(limit=2)[0]
                reads[state["step"]].append(f"{name} at {frame.filename}:{frame.lineno}")
            return real(self, *args, **kwargs)

        return read

    def paused(function):
        def run(*args, **kwargs):
            state["paused"] += 1
            try:
                return function(*args, **kwargs)
            finally:
                state["paused"] -= 1

        return run

    for name in READS:
        monkeypatch.setattr(torch.Tensor, name, spy(name))
    model, optimizers = trainer.pipeline.model, trainer.optimizers
    for name in ("get_outputs", "get_metrics_dict", "get_loss_dict"):
        monkeypatch.setattr(model, name, paused(getattr(model, name)))
    monkeypatch.setattr(torch.Tensor, "backward", paused(torch.Tensor.backward))
    monkeypatch.setattr(optimizers, "optimizer_scaler_step_some", paused(optimizers.optimizer_scaler_step_some))
    for callback in trainer.callbacks:  # densification: the GPU strategy's own tests cover it
        monkeypatch.setattr(callback, "run_callback_at_location", paused(callback.run_callback_at_location))
    real_iteration = type(trainer).train_iteration

    def train_iteration(self, step):
        state["step"] = step
        return real_iteration(self, step)

    monkeypatch.setattr(type(trainer), "train_iteration", train_iteration)
    real_after_train = type(trainer)._after_train

    def after_train(self):  # the final checkpoint and the last logged step's scalars: training is over
        state["step"] = AFTER_THE_LOOP
        return real_after_train(self)

    monkeypatch.setattr(type(trainer), "_after_train", after_train)
    trainer.train()
    logging_steps = {s for s in range(ITERATIONS) if s % LOG_EVERY == 0}
    off_log = {step: where for step, where in reads.items() if step not in logging_steps | {AFTER_THE_LOOP}}
    assert off_log == {}, off_log
    # after the loop: the divergence check before the final checkpoint (once), then the last logged
    # step's scalars, held back by the batched tensorboard writer, are read and written
    after = reads[AFTER_THE_LOOP]
    assert len([r for r in after if "divergence.py" in r]) == 1, after
    assert [r for r in after if "event_writers.py" in r], after
    assert all("divergence.py" in r or "event_writers.py" in r for r in after), after
    # on logging steps only the batched writer's host values (on CPU every tensor is one; on a GPU the
    # device ones are copied without a wait): nerfstudio's write_scalar_dict, a float() per value, is not reached
    logged = [r for step in logging_steps for r in reads[step] if step > 0]  # step 0 also loads the data
    assert logged and all("event_writers.py" in r for r in logged), logged
    # the spy does see the loop: the logged values are read back at every logging step
    assert logging_steps <= set(reads), dict(reads)
