"""Helpers for the checkpoint-safety tests: tiny CPU ns-train runs and the nerfstudio tools on them."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path
from typing import List, Sequence

import requests

from tests.helpers.cli import cli_env, describe, run_cli, tool

# The built-in scene, shrunk to seconds per run on CPU (dataparser options follow its name).
TINY_SCENE = ["bytesplat-scene", "--num-views", "8", "--width", "48", "--height", "36"]


def train_args(out: Path, iterations: int, *extra: str, timestamp: str = "run") -> List[str]:
    return [
        "ns-train", "bytesplat",
        "--output-dir", str(out), "--experiment-name", "ckpt", "--timestamp", timestamp,
        "--vis", "tensorboard", "--machine.device-type", "cpu",
        "--max-num-iterations", str(iterations),
        "--steps-per-eval-image", "100000", "--steps-per-eval-all-images", "100000",
        "--pipeline.model.num-downscales", "0",
        *extra, *TINY_SCENE,
    ]


def run_dir(out: Path, timestamp: str = "run") -> Path:
    return out / "ckpt" / "bytesplat" / timestamp


def train(tmp: Path, out: Path, iterations: int, *extra: str, timestamp: str = "run", timeout: float = 300):
    return run_cli(train_args(out, iterations, *extra, timestamp=timestamp), cli_env(tmp / "cache"), timeout=timeout)


def assert_one_clear_error(result, *fragments: str) -> str:
    """A non-zero exit, one ``bytesplat: error:`` line, no traceback; returns the message."""
    assert result.returncode != 0, describe(result)
    text = result.stderr + result.stdout
    assert text.count("bytesplat: error:") == 1, describe(result)
    assert "Traceback" not in text, describe(result)
    message = text.split("bytesplat: error:", 1)[1]
    for fragment in fragments:
        assert fragment in message, describe(result)
    return message


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def viewer_outcome(tmp: Path, config: Path, timeout: float = 120.0):
    """Start ns-viewer on ``config``: ("served", log) once its page answers, or ("exited", rc, log)."""
    port = free_port()
    log_path = tmp / f"ns-viewer-{port}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [tool("ns-viewer"), "--load-config", str(config), "--viewer.websocket-port", str(port)],
            env=cli_env(tmp / "cache"), cwd=tmp, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return ("exited", proc.returncode, log_path.read_text(errors="replace"))
            try:
                if requests.get(f"http://127.0.0.1:{port}/", timeout=5).status_code == 200:
                    return ("served", 0, log_path.read_text(errors="replace"))
            except requests.RequestException:
                pass
            time.sleep(1.0)
        return ("timeout", None, log_path.read_text(errors="replace"))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def copy_run_with(src: Path, name: str, files: Sequence[tuple]) -> Path:
    """A copy of run directory ``src`` as sibling ``name`` (its config.yml pointing at itself) whose
    nerfstudio_models/ holds exactly ``files``: (file name, bytes) pairs."""
    dst = src.parent / name
    (dst / "nerfstudio_models").mkdir(parents=True)
    text = (src / "config.yml").read_text()
    assert f"\ntimestamp: {src.name}\n" in text
    (dst / "config.yml").write_text(text.replace(f"\ntimestamp: {src.name}\n", f"\ntimestamp: {name}\n"))
    (dst / "dataparser_transforms.json").write_bytes((src / "dataparser_transforms.json").read_bytes())
    for file_name, data in files:
        (dst / "nerfstudio_models" / file_name).write_bytes(data)
    return dst
