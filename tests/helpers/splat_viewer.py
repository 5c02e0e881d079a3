"""Web splat viewers from the npm registry, served to headless Chromium (tests/helpers/browser.py) with an export.

Two three.js viewers, each installed once into its own folder of ``NPM_CACHE``: @mkkellogg/gaussian-splats-3d
(PLY, compressed PLY, .splat) and @sparkjsdev/spark (PLY, SPZ, SOG, ...). A page renders one scene file from
one camera given as a nerfstudio/OpenGL camera-to-world matrix (three.js uses the same camera axes), on a black
background, and sets ``window.viewerState`` to ``"rendered"`` once the viewer's own ready signal has come
(gaussian-splats-3d: ``splatRenderReady``, its first depth sort done; Spark: ``SplatMesh.initialized``) and
the drawn frames have settled (Spark sorts in a worker after loading: two consecutive frames identical and not
blank).
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
# name -> the packages (each viewer pins the three.js it supports) and the modules its page imports
VIEWERS = {
    "gaussian-splats-3d": {
        "packages": ["@mkkellogg/gaussian-splats-3d@0.4.7", "three@0.160.0"],
        "imports": {"three": "node_modules/three/build/three.module.js",
                    "viewer": "node_modules/@mkkellogg/gaussian-splats-3d/build/gaussian-splats-3d.module.js"},
    },
    "spark": {
        "packages": ["@sparkjsdev/spark@2.2.0", "three@0.180.0"],
        "imports": {"three": "node_modules/three/build/three.module.js",
                    "three/addons/": "node_modules/three/examples/jsm/",
                    "fflate": "node_modules/fflate/esm/browser.js",
                    "viewer": "node_modules/@sparkjsdev/spark/dist/spark.module.js"},
    },
}


def npm_missing_reason() -> Optional[str]:
    if shutil.which("npm") is None:
        return "npm is not installed (install.sh installs nodejs and npm)"
    return None


def install_viewer(name: str, timeout: float = 300.0) -> Path:
    """Install a viewer's packages into NPM_CACHE/name (once); returns that directory."""
    where, spec = NPM_CACHE / name, VIEWERS[name]
    if all((where / m).exists() for m in spec["imports"].values()):
        return where
    where.mkdir(parents=True, exist_ok=True)
    (where / "package.json").write_text(json.dumps({"name": f"bytesplat-{name}-test", "private": True}))
    result = subprocess.run(["npm", "install", "--no-audit", "--no-fund", *spec["packages"]], cwd=where,
                            capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(f"npm install {' '.join(spec['packages'])} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return where


PAGE_HEAD = """<!doctype html>
<html><head><meta charset="utf-8"><style>html,body{{margin:0;background:#000;overflow:hidden}}</style>
<script type="importmap">{importmap}</script>
</head><body>
<script type="module">
import * as THREE from 'three';
import * as V from 'viewer';
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
if (!cfg.scene) {{
  renderer.render(new THREE.Scene(), camera);  // the blank canvas: the viewer's page with no scene
  window.viewerState = 'rendered';
}}
"""

PAGE_BODY = {
    "gaussian-splats-3d": """
const viewer = new V.Viewer({{
  selfDrivenMode: false, renderer, camera, useBuiltInControls: false, ignoreDevicePixelRatio: true,
  sharedMemoryForWorkers: false, gpuAcceleratedSort: false, sphericalHarmonicsDegree: cfg.shDegree,
  sceneRevealMode: V.SceneRevealMode.Instant,  // no fade-in animation: the first ready frame is final
}});
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
}}
</script></body></html>
""",
    "spark": """
if (cfg.scene) {{
  const scene = new THREE.Scene();
  scene.add(new V.SparkRenderer({{renderer}}));
  const mesh = new V.SplatMesh({{url: cfg.scene}});
  scene.add(mesh);
  let previous = null;
  mesh.initialized.then(() => {{ window.viewerState = 'loaded'; }}).catch((e) => {{ window.viewerState = 'error: ' + e; }});
  renderer.setAnimationLoop(() => {{
    renderer.render(scene, camera);
    if (window.viewerState !== 'loaded') return;
    // the depth sort runs in a worker after loading: done when a drawn, non-blank frame stops changing
    const pixels = new Uint8Array(cfg.width * cfg.height * 4);
    const gl = renderer.getContext();
    gl.readPixels(0, 0, cfg.width, cfg.height, gl.RGBA, gl.UNSIGNED_BYTE, pixels);
    const key = pixels.join(',');
    if (key === previous && pixels.some((v, i) => i % 4 !== 3 && v > 0)) {{
      renderer.setAnimationLoop(null);
      window.viewerState = 'rendered';
    }}
    previous = key;
  }});
}}
</script></body></html>
""",
}


class ViewerServer:
    """Serves ``root`` (the pages and the scene files) and each viewer's node_modules (as /NAME/node_modules)
    on a free local port."""

    def __init__(self, root: Path):
        self.root = Path(root)
        handler = functools.partial(_QuietHandler, directory=str(self.root))
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> "ViewerServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def page(self, viewer: str, name: str, scene: Optional[str], c2w: np.ndarray, fovy_deg: float, width: int,
             height: int, sh_degree: int) -> str:
        """Write the page ``name`` showing ``scene`` (a file in root; None: a blank canvas) in ``viewer``."""
        link = self.root / viewer / "node_modules"
        if not link.exists():
            link.parent.mkdir(exist_ok=True)
            link.symlink_to(install_viewer(viewer) / "node_modules", target_is_directory=True)
        importmap = {"imports": {k: f"/{viewer}/{v}" for k, v in VIEWERS[viewer]["imports"].items()}}
        cfg = {"scene": f"/{scene}" if scene else None, "c2w": np.asarray(c2w, float).T.reshape(-1).tolist(),
               "fovy": fovy_deg, "width": width, "height": height, "shDegree": sh_degree}
        html = (PAGE_HEAD + PAGE_BODY[viewer]).format(importmap=json.dumps(importmap), cfg=json.dumps(cfg))
        (self.root / name).write_text(html)
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
