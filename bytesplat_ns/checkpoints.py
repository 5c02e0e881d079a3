"""Checkpoint files: find, read, check and write them so that no crash leaves a run unusable.

- Writes go to a temporary file in a hidden folder of the run directory (``.checkpoint-partial/``),
  are fsynced, then renamed into ``nerfstudio_models/``. The temporary file must not sit in
  ``nerfstudio_models/``: nerfstudio's loaders parse every name in it as a step number.
- :class:`CheckpointWriter` does the write in a background thread after a host copy of the state
  was started on the training thread (into pinned memory, without waiting for the GPU); at most one
  write is in flight, and :meth:`~CheckpointWriter.finish` waits for it and reports its error.
- With keep-only-latest, a writer removes only the checkpoint it wrote itself and has just
  superseded, never one it did not write and never a newer one.
- :func:`load_for_eval` replaces nerfstudio's ``eval_load_checkpoint`` (ns-eval, ns-export, ns-viewer):
  every unreadable or non-finite checkpoint is one :class:`BytesplatError`.
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path
from typing import Any, List, Optional, Tuple

import torch

from bytesplat_ns.errors import BytesplatError

CHECKPOINT_NAME = re.compile(r"^step-(\d{9})\.ckpt$")
PARTIAL_DIR_NAME = ".checkpoint-partial"


def checkpoint_path(checkpoint_dir: Path, step: int) -> Path:
    return checkpoint_dir / f"step-{step:09d}.ckpt"


def checkpoint_steps(checkpoint_dir: Path) -> List[int]:
    """Steps of the complete checkpoints in ``checkpoint_dir`` (sorted; other names are ignored)."""
    if not checkpoint_dir.is_dir():
        return []
    return sorted(int(m.group(1)) for m in map(CHECKPOINT_NAME.match, os.listdir(checkpoint_dir)) if m)


def latest_checkpoint(load_dir: Path) -> Path:
    """The newest ``step-*.ckpt`` in ``load_dir``; a clear error if there is none."""
    if not load_dir.is_dir():
        raise BytesplatError(f"Checkpoint directory {load_dir} does not exist.")
    steps = checkpoint_steps(load_dir)
    if not steps:
        raise BytesplatError(f"No checkpoint (step-XXXXXXXXX.ckpt) in {load_dir}.")
    return checkpoint_path(load_dir, steps[-1])


def checkpoint_to_load(config) -> Optional[Path]:
    """The checkpoint that ``--load-dir``/``--load-step``/``--load-checkpoint`` name, or None."""
    if config.load_dir is not None:
        if config.load_step is None:
            return latest_checkpoint(config.load_dir)
        return checkpoint_path(config.load_dir, config.load_step)
    return config.load_checkpoint


def require_checkpoint_file(path: Path) -> None:
    """A clear error when the checkpoint file ``path`` names is not there."""
    if not Path(path).is_file():
        raise BytesplatError(f"Checkpoint {path} does not exist.")


def read_checkpoint(path: Path) -> dict:
    """torch.load a nerfstudio checkpoint, turning the usual failures into one clear message."""
    require_checkpoint_file(path)
    if path.stat().st_size == 0:
        raise BytesplatError(f"Checkpoint {path} is empty (0 bytes).")
    try:
        state = torch.load(path, map_location="cpu")
    except Exception as error:  # noqa: BLE001 - corrupt/truncated/foreign files all end here
        # torch's own text can run to a paragraph (and advises weights_only=False): keep its first sentence.
        detail = (str(error).strip().splitlines() or [""])[0].split(". ")[0][:160]
        raise BytesplatError(
            f"Cannot read checkpoint {path}: it is truncated, corrupt or not a checkpoint ({type(error).__name__}: {detail})"
        ) from error
    if not isinstance(state, dict) or "pipeline" not in state or "step" not in state:
        raise BytesplatError(f"{path} is not a nerfstudio checkpoint (no 'pipeline'/'step' entries).")
    if isinstance(state["pipeline"], dict):
        check_finite_checkpoint(state, path)
    return state


def non_finite_tensors(tensors: dict) -> List[str]:
    """Names of the floating-point tensors in ``tensors`` that hold a NaN or an infinity."""
    return [
        name
        for name, value in tensors.items()
        if isinstance(value, torch.Tensor) and value.is_floating_point() and not bool(torch.isfinite(value).all())
    ]


def check_finite_checkpoint(state: dict, path: Path) -> None:
    bad = non_finite_tensors(state["pipeline"])
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise BytesplatError(
            f"Checkpoint {path} holds non-finite (NaN/inf) values in {bad[0]}{more}: training diverged before step "
            f"{state['step']}.",
            hint="load an earlier checkpoint with --load-step, or retrain with lower learning rates",
        )


def load_for_eval(config, pipeline):
    """nerfstudio's ``eval_utils.eval_load_checkpoint`` with clear errors: (checkpoint path, step)."""
    if config.load_dir is None:
        raise BytesplatError("The config names no checkpoint directory (load_dir).")
    path = checkpoint_to_load(config)
    assert path is not None
    state = read_checkpoint(path)
    pipeline.load_pipeline(state["pipeline"], state["step"])
    print(f"Done loading checkpoint from {path}")
    return path, int(state["step"])


# ---- writing --------------------------------------------------------------------------------------


def start_host_copy(value: Any) -> Tuple[Any, List["torch.cuda.Event"]]:
    """A copy of ``value`` whose tensors are new CPU tensors (training may change the originals while
    the copy is being written), and the events after which it is complete. CUDA tensors are copied
    into pinned memory without waiting, in stream order (later kernels cannot change what is being
    copied); torch's pinned-memory cache reuses the blocks from one save to the next while the Gaussian
    count fits them (a grown count allocates anew, docs/wallclock.md)."""
    devices = set()

    def copy(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            v = v.detach()
            if not v.is_cuda:
                return v.to("cpu", copy=True)
            devices.add(v.device)
            return torch.empty(v.shape, dtype=v.dtype, pin_memory=True).copy_(v, non_blocking=True)
        if isinstance(v, dict):
            return type(v)((k, copy(x)) for k, x in v.items())
        if isinstance(v, (list, tuple)):
            return type(v)(copy(x) for x in v)
        return v

    snapshot = copy(value)
    events = []
    for device in devices:
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(device))
        events.append(event)
    return snapshot, events


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return  # not supported on this platform/filesystem: the rename is still atomic
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomically(state: dict, path: Path) -> Path:
    """Write ``state`` to ``path`` so that ``path`` is either absent, the old file or the complete new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial_dir = path.parent.parent / PARTIAL_DIR_NAME  # same filesystem: os.replace stays atomic
    partial_dir.mkdir(parents=True, exist_ok=True)
    partial = partial_dir / (path.name + ".partial")
    with open(partial, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(partial, path)
    _fsync_dir(path.parent)
    return path


def write_checkpoint(
    state: dict, checkpoint_dir: Path, step: int, keep_only_latest: bool, supersedes: Optional[Path] = None
) -> Path:
    """Write the checkpoint of ``step`` atomically; with ``keep_only_latest``, then remove ``supersedes``
    (the caller's previous checkpoint) if it is older. Nothing else is ever deleted."""
    path = write_atomically(state, checkpoint_path(checkpoint_dir, step))
    if keep_only_latest and supersedes is not None and supersedes != path:
        match = CHECKPOINT_NAME.match(supersedes.name)
        if match and int(match.group(1)) < step and supersedes.parent == path.parent:
            supersedes.unlink(missing_ok=True)
    return path


class CheckpointWriter:
    """Writes one run's checkpoints, in a background thread when ``background`` is set.

    ``save`` starts the host copy on the calling thread, waits for the previous write (so at most one
    is in flight and a failed one is reported before the next), then starts the new one."""

    def __init__(self, checkpoint_dir: Path, keep_only_latest: bool, background: bool = True):
        self.checkpoint_dir = checkpoint_dir
        self.keep_only_latest = keep_only_latest
        self.background = background
        self.last_written: Optional[Path] = None
        self._thread: Optional[threading.Thread] = None
        self._error: Optional[BaseException] = None

    def save(self, state: dict, step: int) -> None:
        snapshot, copied = start_host_copy(state)
        self.finish()
        if not self.background:
            self._write(snapshot, step, copied)
            self._raise_pending()
            return
        # Not a daemon: an interpreter that exits on an exception still completes the write.
        self._thread = threading.Thread(target=self._write, args=(snapshot, step, copied), name="checkpoint-writer")
        self._thread.start()

    def finish(self) -> None:
        """Wait for the write in flight; a failed write is one clear error."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._raise_pending()

    def _raise_pending(self) -> None:
        error, self._error = self._error, None
        if error is not None:
            raise BytesplatError(f"Writing a checkpoint to {self.checkpoint_dir} failed: {type(error).__name__}: {error}") from error

    def _write(self, snapshot: dict, step: int, copied: List["torch.cuda.Event"]) -> None:
        try:
            for event in copied:  # the device-to-host copies of the save step
                event.synchronize()
            self.last_written = write_checkpoint(
                snapshot, self.checkpoint_dir, step, self.keep_only_latest, supersedes=self.last_written
            )
        except BaseException as error:  # noqa: BLE001 - reported by finish() on the training thread
            self._error = error


def refuse_existing_run(checkpoint_dir: Path, load_dir: Optional[Path], load_checkpoint: Optional[Path]) -> None:
    """A new run must not write into a run directory that already holds checkpoints, unless it
    resumes from that directory."""
    steps = checkpoint_steps(checkpoint_dir)
    if not steps:
        return
    resumes_here = (load_dir is not None and Path(load_dir).resolve() == checkpoint_dir.resolve()) or (
        load_checkpoint is not None and Path(load_checkpoint).resolve().parent == checkpoint_dir.resolve()
    )
    if not resumes_here:
        raise BytesplatError(
            f"{checkpoint_dir} already holds checkpoints of an earlier run (latest: step {steps[-1]}); "
            "not overwriting them.",
            hint=f"resume it with --load-dir {checkpoint_dir}, or start a new run with another --timestamp or --output-dir",
        )
