"""A web splat viewer from the npm registry, served to headless Chromium (tests/browser.py) with an export.

The viewer is @mkkellogg/gaussian-splats-3d (on three.js), installed once into ``NPM_CACHE``. The page
renders one scene file from one camera given as a nerfstudio/OpenGL camera-to-world matrix (three.js uses
the same camera axes), on a black background, and sets ``window.viewerState`` to ``"rendered"`` once the
viewer says the splats are ready to draw (its first depth sort is done) and two more frames are drawn.
"""

from __future__ import annotations

import functools
import json
import math
import shutil
import subprocess
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Optional

import numpy as np

NPM_CACHE = Path.home() / ".cache" / "bytesplat_ns" / "npm"
VIEWER_PACKAGES = ["@mkkellogg/gaussian-splats-3d@0.4.7", "three@0.160.0"]
VIEWER_MODULE = "node_modules/@mkkellogg/gaussian-splats-3d/build/gaussian-splats-3d.module.js"
THREE_MODULE = "node_modules/three/build/three.module.js"


def npm_missing_reason() -> Optional[str]:
    if shutil.which("npm") is None:
        return "npm is not installed (install.sh installs nodejs and npm)"
    return None


def install_viewer(timeout: float = 300.0) -> Path:
    """Install the viewer packages into NPM_CACHE (once); returns that directory."""
    if all((NPM_CACHE / m).is_file() for m in (VIEWER_MODULE, THREE_MODULE)):
        return NPM_CACHE
    NPM_CACHE.mkdir(parents=True, exist_ok=True)
    (NPM_CACHE / "package.json").write_text(json.dumps({"name": "bytesplat-viewer-test", "private": True}))
    result = subprocess.run(["npm", "install", "--no-audit", "--no-fund", *VIEWER_PACKAGES], cwd=NPM_CACHE,
                            capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(f"npm install {' '.join(VIEWER_PACKAGES)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return NPM_CACHE


PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><style>html,body{{margin:0;background:#000;overflow:hidden}}</style>
<script type="importmap">{{"imports": {{"three": "/{three}", "gaussian-splats-3d": "/{viewer}"}}}}</script>
</head><body>
<script type="module">
import * as THREE from 'three';
import * as GS from 'gaussian-splats-3d';
const cfg = {cfg};
window.viewerState = 'starting';
const renderer = new THREE.WebGLRenderer({{antialias: false, preserveDrawingBuffer: true}});
renderer.setPixelRatio(1);
renderer.setSize(cfg.width, cfg.height);
renderer.setClearColor(0x000000, 1);
document.body.appendChild(renderer.domElement);
const camera = new THREE.PerspectiveCamera(cfg.fovy, cfg.width / cfg.height, 0.01, 1000);
new THREE.Matrix4().fromArray(cfg.c2w).decompose(camera.position, camera.quaternion, camera.scale);
camera.updateMatrixWorld(true);
const viewer = new GS.Viewer({{
  selfDrivenMode: false, renderer, camera, useBuiltInControls: false, ignoreDevicePixelRatio: true,
  sharedMemoryForWorkers: false, gpuAcceleratedSort: false, sphericalHarmonicsDegree: cfg.shDegree,
  sceneRevealMode: GS.SceneRevealMode.Instant,  // no fade-in animation: the first ready frame is final
}});
window.viewer = viewer;  // for debugging from the test
let frames = 0;
function draw() {{
  viewer.update();
  viewer.render();
  if (window.viewerState === 'loaded' && viewer.splatRenderReady && ++frames >= 3) {{
    window.viewerState = 'rendered';
    return;
  }}
  requestAnimationFrame(draw);
}}
if (cfg.scene) {{
  viewer.addSplatScene(cfg.scene, {{showLoadingUI: false, progressiveLoad: false, splatAlphaRemovalThreshold: 1}})
    .then(() => {{ window.viewerState = 'loaded'; requestAnimationFrame(draw); }})
    .catch((e) => {{ window.viewerState = 'error: ' + e; }});
}} else {{
  renderer.render(new THREE.Scene(), camera);  // the blank canvas: the viewer's page with no scene
  window.viewerState = 'rendered';
}}
</script></body></html>
"""


class ViewerServer:
    """Serves ``root`` (the page and the scene files) and the npm cache's node_modules on a free local port."""

    def __init__(self, root: Path, npm_dir: Path):
        self.root = Path(root)
        link = self.root / "node_modules"
        if not link.exists():
            link.symlink_to(npm_dir / "node_modules", target_is_directory=True)
        handler = functools.partial(_QuietHandler, directory=str(self.root))
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> "ViewerServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def page(self, name: str, scene: Optional[str], c2w: np.ndarray, fovy_deg: float, width: int, height: int,
             sh_degree: int) -> str:
        cfg = {"scene": f"/{scene}" if scene else None, "c2w": np.asarray(c2w, float).T.reshape(-1).tolist(),
               "fovy": fovy_deg, "width": width, "height": height, "shDegree": sh_degree}
        (self.root / name).write_text(PAGE.format(three=THREE_MODULE, viewer=VIEWER_MODULE, cfg=json.dumps(cfg)))
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/{name}"


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def look_at(eye, target, up=(0.0, 0.0, 1.0)) -> np.ndarray:
    """OpenGL/nerfstudio camera-to-world (x right, y up, looking down -z) at ``eye`` facing ``target``."""
    eye, target, up = (np.asarray(v, float) for v in (eye, target, up))
    back = eye - target
    back /= np.linalg.norm(back)
    right = np.cross(up, back)
    right /= np.linalg.norm(right)
    c2w = np.eye(4)
    c2w[:3, 0], c2w[:3, 1], c2w[:3, 2], c2w[:3, 3] = right, np.cross(back, right), back, eye
    return c2w


def focal_from_fovy(fovy_deg: float, height: int) -> float:
    return 0.5 * height / math.tan(math.radians(fovy_deg) / 2.0)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((np.asarray(a, float) - np.asarray(b, float)) ** 2))
    return 10.0 * math.log10(1.0 / max(mse, 1e-12))
