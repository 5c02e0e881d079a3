"""A minimal headless-Chromium driver over the Chrome DevTools Protocol (no selenium/playwright).

Chromium is started with ``--remote-debugging-port=0`` so that it picks a free port itself and writes it to
``<user-data-dir>/DevToolsActivePort``; we read it from there (no port race), find the page target through the
``/json/list`` HTTP endpoint, and talk CDP to that page over a websocket with ``websockets``' sync client.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Dict, Optional

import requests
from websockets.sync.client import connect

CHROMIUM = "/usr/bin/chromium"

FLAGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--use-angle=swiftshader",
    "--enable-unsafe-swiftshader",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-quic",
    "--mute-audio",
    "--hide-scrollbars",
]


# If the test process dies before close() runs, coreutils' timeout still ends the browser.
HARD_LIMIT = ["timeout", "--kill-after=5", "600"] if shutil.which("timeout") else []


class BrowserError(RuntimeError):
    pass


def kill_group(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """SIGTERM the process group that ``proc`` leads (it was started with start_new_session), then SIGKILL."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, grace)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


class Chromium:
    """Headless Chromium with one page, driven over CDP. Use as a context manager: it always kills the browser."""

    def __init__(self, user_data_dir: Path, width: int = 960, height: int = 720, startup_timeout: float = 60.0):
        self.user_data_dir = Path(user_data_dir)
        self.user_data_dir.mkdir(parents=True, exist_ok=True)
        self.width, self.height = width, height
        self.startup_timeout = startup_timeout
        self.log_path = self.user_data_dir.parent / f"{self.user_data_dir.name}.log"
        self.proc: Optional[subprocess.Popen] = None
        self.ws = None
        self._ids = itertools.count(1)
        self.events: list = []  # CDP events seen while waiting for replies (console messages, exceptions, ...)

    # -- lifecycle -------------------------------------------------------------------------------------------

    def __enter__(self) -> "Chromium":
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _start(self) -> None:
        port_file = self.user_data_dir / "DevToolsActivePort"
        port_file.unlink(missing_ok=True)
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [
                *HARD_LIMIT,
                CHROMIUM,
                *FLAGS,
                f"--user-data-dir={self.user_data_dir}",
                "--remote-debugging-port=0",
                f"--window-size={self.width},{self.height}",
                "about:blank",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group, so kill_group takes the renderer/GPU children too
        )
        deadline = time.monotonic() + self.startup_timeout
        port = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BrowserError(f"chromium exited with {self.proc.returncode}:\n{self.log()}")
            if port_file.exists():
                lines = port_file.read_text().split()
                if lines and lines[0].isdigit():
                    port = int(lines[0])
                    break
            time.sleep(0.2)
        if port is None:
            raise BrowserError(f"chromium did not open its DevTools port in {self.startup_timeout:.0f} s:\n{self.log()}")
        self.port = port

        page_url = None
        while time.monotonic() < deadline:
            try:
                targets = requests.get(f"http://127.0.0.1:{port}/json/list", timeout=5).json()
                pages = [t for t in targets if t.get("type") == "page" and t.get("webSocketDebuggerUrl")]
                if pages:
                    page_url = pages[0]["webSocketDebuggerUrl"]
                    break
            except (requests.RequestException, ValueError):
                pass
            time.sleep(0.2)
        if page_url is None:
            raise BrowserError(f"chromium exposed no page target:\n{self.log()}")
        # Screenshots are base64 PNGs of a few hundred KiB to a few MiB: lift the 1 MiB default frame limit.
        self.ws = connect(page_url, max_size=64 * 2**20, open_timeout=30, close_timeout=5)
        self.send("Page.enable")
        self.send("Runtime.enable")
        self.send(
            "Emulation.setDeviceMetricsOverride",
            width=self.width, height=self.height, deviceScaleFactor=1, mobile=False,
        )

    def close(self) -> None:
        if self.ws is not None:
            try:
                self.ws.close()
            except Exception:
                pass
            self.ws = None
        if self.proc is not None:
            kill_group(self.proc)
        if getattr(self, "_log", None) is not None:
            self._log.close()
            self._log = None

    def log(self, tail: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-tail:]
        except OSError:
            return ""

    # -- CDP ---------------------------------------------------------------------------------------------------

    def send(self, method: str, timeout: float = 30.0, **params: Any) -> Dict[str, Any]:
        """Send one CDP command and return its result, keeping any events that arrive meanwhile."""
        assert self.ws is not None, "browser not started"
        msg_id = next(self._ids)
        self.ws.send(json.dumps({"id": msg_id, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError(f"CDP {method} got no reply in {timeout:.0f} s")
            try:
                message = json.loads(self.ws.recv(timeout=left))
            except TimeoutError:
                raise BrowserError(f"CDP {method} got no reply in {timeout:.0f} s") from None
            if message.get("id") == msg_id:
                if "error" in message:
                    raise BrowserError(f"CDP {method} failed: {message['error']}")
                return message.get("result", {})
            if "method" in message:
                self.events.append(message)

    def wait_for_event(self, method: str, timeout: float) -> Dict[str, Any]:
        """Wait for the next CDP event named ``method`` (also checks the events already received)."""
        assert self.ws is not None, "browser not started"
        for event in self.events:
            if event["method"] == method:
                return event
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError(f"no CDP event {method} in {timeout:.0f} s")
            try:
                message = json.loads(self.ws.recv(timeout=left))
            except TimeoutError:
                raise BrowserError(f"no CDP event {method} in {timeout:.0f} s") from None
            if "method" in message:
                self.events.append(message)
                if message["method"] == method:
                    return message

    def navigate(self, url: str, timeout: float = 60.0) -> None:
        """Navigate the page and wait for its load event (scripts loaded; not that the app has drawn anything)."""
        self.events = [e for e in self.events if e["method"] != "Page.loadEventFired"]
        result = self.send("Page.navigate", url=url)
        if result.get("errorText"):
            raise BrowserError(f"navigation to {url} failed: {result['errorText']}")
        self.wait_for_event("Page.loadEventFired", timeout)

    def evaluate(self, expression: str, await_promise: bool = False, timeout: float = 30.0) -> Any:
        result = self.send(
            "Runtime.evaluate", timeout=timeout, expression=expression, returnByValue=True, awaitPromise=await_promise
        )
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression!r} raised {result['exceptionDetails']}")
        return result.get("result", {}).get("value")

    def screenshot_png(self) -> bytes:
        result = self.send("Page.captureScreenshot", timeout=60.0, format="png")
        return base64.b64decode(result["data"])

    def console_messages(self, limit: int = 40) -> str:
        """Console output and uncaught exceptions of the page so far, for failure messages."""
        lines = []
        for event in self.events:
            if event["method"] == "Runtime.consoleAPICalled":
                p = event["params"]
                args = " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", []))
                lines.append(f"console.{p.get('type')}: {args}")
            elif event["method"] == "Runtime.exceptionThrown":
                d = event["params"]["exceptionDetails"]
                lines.append(f"exception: {d.get('exception', {}).get('description', d.get('text'))}")
        return "\n".join(lines[-limit:])
