"""ns-viewer on a trained bytesplat model: it serves viser's web client, and headless Chromium shows a rendered scene.

The model is a tiny CPU run (reference rasterizer). The browser part drives /usr/bin/chromium over the Chrome DevTools
Protocol (tests/helpers/browser.py), screenshots the page until the viewer's 3D canvas shows the render nerfstudio streams as
the scene's background image, and checks the pixels. As a negative control (run first: it needs no training) the same
pixel check must reject a viser page that looks like nerfstudio's viewer (dark theme, camera frustums with images) but
has no render in it, or only a render of the empty background.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import List, Optional, Tuple

import numpy as np
import pytest
import requests

from tests.helpers.browser import Chromium, kill_group
from tests.helpers.cli import cli_env, describe, run_cli, tool

pytestmark = pytest.mark.slow

ITERATIONS = 60
VIEWER_START_TIMEOUT = 120.0  # load the checkpoint and open the HTTP/websocket port
RENDER_TIMEOUT = 90.0  # page load + first frames rendered on CPU
POLL_INTERVAL = 2.0
# ns-viewer serves until killed: teardown kills its process group, and coreutils' timeout also ends it should this
# test process itself be killed before teardown runs.
HARD_LIMIT = ["timeout", "--kill-after=10", "900"] if shutil.which("timeout") else []

WINDOW = (960, 720)
# What a canvas with nothing of the model on it looks like. Measured from screenshots:
# - viser 0.2.7's 3D canvas in the dark theme nerfstudio uses, before any render arrives;
EMPTY_CANVAS = np.array([20, 20, 20], dtype=np.float64)
# - the render itself where no Gaussian covers a pixel: splatfacto's eval background [0.149, 0.165, 0.216] (chosen by
#   nerfstudio to match viser's default background), which the viewer streams as the scene's background image.
RENDER_BACKGROUND = np.array([38, 42, 55], dtype=np.float64)
# nerfstudio's "Max res" slider default: the static (full-resolution) render has this as its longer side.
NERFSTUDIO_MAX_RES = 512

# Pixel criteria for "the canvas shows a rendered scene", checked on the 3D canvas. The 60-iteration model's render
# measures about 0.50 / 32 / 390; the negative-control pages (frustums only) about 0.01 / 10-13 / 105.
MIN_FAR_FRACTION = 0.25  # pixels far (> FAR_DISTANCE in some channel) from both colours above
FAR_DISTANCE = 40.0
MIN_CHANNEL_STD = 20.0  # mean over RGB of the per-channel standard deviation
MIN_DISTINCT_COLOURS = 150  # distinct colours after quantising each channel to 16 levels


# ---------------------------------------------------------------------------------------------------------------
# fixtures: a tiny trained model, and ns-viewer serving it
# ---------------------------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def trained_config(workdir) -> Path:
    args = [
        "ns-train", "bytesplat",
        "--output-dir", str(workdir / "outputs"),
        "--experiment-name", "viewer",
        "--timestamp", "run",
        "--vis", "tensorboard",
        "--max-num-iterations", str(ITERATIONS),
        "--steps-per-save", str(ITERATIONS),
        "--steps-per-eval-image", "100000",
        "--steps-per-eval-all-images", "100000",
        "--machine.device-type", "cpu",
        "--pipeline.model.rasterizer", "reference",
        "--pipeline.model.num-downscales", "0",
    ]
    result = run_cli(args, cli_env(workdir / "cache"), timeout=600)
    assert result.returncode == 0, describe(result)
    config = workdir / "outputs" / "viewer" / "bytesplat" / "run" / "config.yml"
    assert config.exists(), describe(result)
    return config


class Viewer:
    def __init__(self, proc: subprocess.Popen, url: str, log_path: Path):
        self.proc, self.url, self.log_path = proc, url, log_path

    def log(self, tail: int = 6000) -> str:
        return self.log_path.read_text(errors="replace")[-tail:]


@pytest.fixture(scope="module")
def viewer(trained_config, workdir):
    port = free_port()
    log_path = workdir / "ns-viewer.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [*HARD_LIMIT, tool("ns-viewer"), "--load-config", str(trained_config), "--viewer.websocket-port", str(port)],
            env=cli_env(workdir / "cache"),
            cwd=workdir,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # own process group: teardown kills it and anything it spawned
        )
    v = Viewer(proc, f"http://127.0.0.1:{port}/", log_path)
    try:
        deadline = time.monotonic() + VIEWER_START_TIMEOUT
        while True:
            if proc.poll() is not None:
                pytest.fail(f"ns-viewer exited with {proc.returncode} before serving:\n{v.log()}")
            try:
                if requests.get(v.url, timeout=5).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"ns-viewer did not answer on {v.url} within {VIEWER_START_TIMEOUT:.0f} s:\n{v.log()}")
            time.sleep(1.0)
        yield v
    finally:
        kill_group(proc)


# ---------------------------------------------------------------------------------------------------------------
# headless browser
# ---------------------------------------------------------------------------------------------------------------

# The 3D view is the largest <canvas> that takes pointer events (viser also lays a pointer-events:none overlay canvas
# over the whole window).
CANVAS_RECT_JS = """JSON.stringify([...document.querySelectorAll('canvas')]
  .filter(c => getComputedStyle(c).pointerEvents !== 'none')
  .map(c => { const r = c.getBoundingClientRect(); return [r.left, r.top, r.width, r.height]; })
  .sort((a, b) => b[2] * b[3] - a[2] * a[3])[0] || null)"""
RESOLUTION_JS = "(document.body.innerText.match(/Resolution:\\s*(\\d+)x(\\d+)px/) || []).slice(1).join('x')"
CONNECTED_JS = "/\\bConnected\\b/.test(document.body.innerText)"
TWO_FRAMES_JS = "new Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => r(true))))"


def canvas_crop(browser: Chromium) -> Tuple[Optional[np.ndarray], bytes, Optional[list]]:
    """Screenshot the page; return the 3D canvas' pixels (inset 5% from its edges), the PNG, and the canvas rect."""
    from PIL import Image

    rect = json.loads(browser.evaluate(CANVAS_RECT_JS) or "null")
    png = browser.screenshot_png()
    if not rect or rect[2] < 200 or rect[3] < 200:
        return None, png, rect
    img = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(np.float64)
    left, top, width, height = rect
    x0, x1 = int(left + 0.05 * width), int(left + 0.95 * width)
    y0, y1 = int(top + 0.05 * height), int(top + 0.95 * height)
    return img[y0:y1, x0:x1], png, rect


def scene_problems(crop: Optional[np.ndarray]) -> List[str]:
    """Why these canvas pixels are not a rendered scene; [] when they are."""
    if crop is None or crop.size == 0:
        return ["no 3D canvas on the page yet"]
    pixels = crop.reshape(-1, 3)
    problems = []
    far = np.ones(len(pixels), dtype=bool)
    for blank in (EMPTY_CANVAS, RENDER_BACKGROUND):
        far &= np.abs(pixels - blank).max(axis=1) > FAR_DISTANCE
    if far.mean() < MIN_FAR_FRACTION:
        problems.append(
            f"only {far.mean():.1%} of the canvas differs from the empty canvas and the render background "
            f"(need {MIN_FAR_FRACTION:.0%})"
        )
    std = float(pixels.std(axis=0).mean())
    if std < MIN_CHANNEL_STD:
        problems.append(f"colour std {std:.1f} (need {MIN_CHANNEL_STD}): nearly a single colour")
    q = (pixels // 16).astype(np.int64)
    distinct = len(np.unique(q[:, 0] * 256 + q[:, 1] * 16 + q[:, 2]))
    if distinct < MIN_DISTINCT_COLOURS:
        problems.append(f"{distinct} distinct colours (need {MIN_DISTINCT_COLOURS})")
    return problems


def wait_until(predicate, timeout: float, interval: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


def median_colour(crop: Optional[np.ndarray]) -> Optional[np.ndarray]:
    return None if crop is None else np.median(crop.reshape(-1, 3), axis=0)


def test_scene_check_rejects_a_viewer_without_a_render(browser, tmp_path):
    """Negative control for the pixel check. A viser page dressed like nerfstudio's viewer (dark theme, camera
    frustums with textured images) must fail it (1) with nothing rendered and (2) with a render that is all
    background (a model that draws nothing); and the canvas must show the two "blank" colours the check assumes."""
    import viser

    server = viser.ViserServer(host="127.0.0.1", port=free_port(), verbose=False)
    try:
        server.gui.configure_theme(control_layout="collapsible", dark_mode=True, brand_color=(255, 211, 105))
        rng = np.random.default_rng(0)
        for i in range(16):
            angle = 2 * np.pi * i / 16
            server.scene.add_camera_frustum(
                f"/cameras/camera_{i:05d}", fov=0.9, aspect=4 / 3, scale=0.1,
                image=rng.integers(0, 256, (75, 100, 3), dtype=np.uint8),
                position=(np.cos(angle), np.sin(angle), 0.5),
            )
        browser.navigate(f"http://127.0.0.1:{server.get_port()}/")
        assert wait_until(lambda: browser.evaluate(CONNECTED_JS), 60), browser.console_messages()

        for name, background in (("nothing-rendered", None), ("empty-render", RENDER_BACKGROUND)):
            if background is not None:
                server.scene.set_background_image(np.broadcast_to(background.astype(np.uint8), (480, 640, 3)).copy())
            expected = EMPTY_CANVAS if background is None else background
            shot = tmp_path / f"viser-{name}.png"
            state = {}

            def shows_expected_colour() -> bool:
                browser.evaluate(TWO_FRAMES_JS, await_promise=True)
                state["crop"], png, _ = canvas_crop(browser)
                shot.write_bytes(png)
                median = median_colour(state["crop"])
                return median is not None and np.abs(median - expected).max() <= 6

            assert wait_until(shows_expected_colour, 30), (
                f"{name}: canvas median {median_colour(state.get('crop'))}, expected {expected}: {shot}\n"
                f"{browser.console_messages()}"
            )
            print(f"negative control ({name}): {shot}")
            assert scene_problems(state["crop"]), f"the scene check accepted a canvas with no scene ({name}): {shot}"
    finally:
        try:
            browser.navigate("about:blank")  # disconnect first: viser logs errors for clients of a stopped server
        except Exception:
            pass
        server.stop()


# ---------------------------------------------------------------------------------------------------------------
# HTTP
# ---------------------------------------------------------------------------------------------------------------


def test_viewer_serves_viser_client(viewer):
    page = requests.get(viewer.url, timeout=30)
    assert page.status_code == 200, page.status_code
    assert "text/html" in page.headers.get("content-type", ""), page.headers
    html = page.text
    assert "<title>Viser</title>" in html, html[:2000]
    assert '<div id="root"></div>' in html, html[:2000]  # the React app's mount point
    scripts = re.findall(r'<script[^>]*type="module"[^>]*src="([^"]+)"', html)
    assert scripts, f"no module <script src=...> in the page:\n{html[:2000]}"
    # The client bundle it points at is served too (a missing build would give a page that never starts).
    bundle = requests.get(viewer.url.rstrip("/") + "/" + scripts[0].lstrip("/"), timeout=30)
    assert bundle.status_code == 200, (scripts[0], bundle.status_code)
    assert "javascript" in bundle.headers.get("content-type", ""), bundle.headers
    assert len(bundle.content) > 100_000, len(bundle.content)
    assert viewer.proc.poll() is None, f"ns-viewer exited:\n{viewer.log()}"


def test_browser_shows_rendered_scene(viewer, browser, tmp_path):
    browser.navigate(viewer.url)
    shot = tmp_path / "ns-viewer.png"
    deadline = time.monotonic() + RENDER_TIMEOUT
    problems: List[str] = ["no screenshot taken"]
    resolution = ""
    while True:
        started = time.monotonic()
        # Read the reported render size before the screenshot, so the pixels are at least that frame.
        resolution = browser.evaluate(RESOLUTION_JS) or ""
        crop, png, rect = canvas_crop(browser)
        shot.write_bytes(png)
        problems = scene_problems(crop)
        sizes = [int(n) for n in resolution.split("x")] if resolution else [0, 0]
        if max(sizes) < NERFSTUDIO_MAX_RES:
            problems.append(f"viewer reports render resolution {resolution or 'none'}, not yet the full-res frame")
        if not problems:
            break
        if viewer.proc.poll() is not None:
            pytest.fail(f"ns-viewer exited with {viewer.proc.returncode}:\n{viewer.log()}")
        if time.monotonic() > deadline:
            pytest.fail(
                f"no rendered scene within {RENDER_TIMEOUT:.0f} s: {'; '.join(problems)}\n"
                f"last screenshot: {shot}\ncanvas rect: {rect}\n"
                f"--- browser console ---\n{browser.console_messages()}\n--- ns-viewer log ---\n{viewer.log()}"
            )
        time.sleep(max(0.0, POLL_INTERVAL - (time.monotonic() - started)))
    print(f"ns-viewer screenshot ({resolution} render): {shot}")
    assert viewer.proc.poll() is None, viewer.log()
    assert "Traceback" not in viewer.log(tail=10**7), f"ns-viewer logged an exception:\n{viewer.log()}"
