"""Headless Chromium and a real TensorBoard server, for the browser tests.

TensorBoard's UI is a single-page app whose dashboards live in shadow DOM, so the
page is driven over the Chrome DevTools Protocol: navigate, evaluate JavaScript
in the page, take screenshots.
"""

import base64
import contextlib
import gzip
import json
import pathlib
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import pytest
import websocket

from keras_pipeline_tuner.outputs import tensorboard as tensorboard_sink

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,1000",
)
START_TIMEOUT_S = 60
RENDER_TIMEOUT_S = 45

needs_chromium = pytest.mark.skipif(
    CHROMIUM is None,
    reason="Chromium is not installed (Debian: `apt-get install -y chromium`, which .ci/run does)",
)

# Collects the text of the page, shadow roots included.
PAGE_TEXT = """(() => {
  if (!document.body) return "";
  const parts = [];
  const walk = (node) => {
    if (node.shadowRoot) walk(node.shadowRoot);
    for (const child of node.childNodes) {
      if (child.nodeType === Node.TEXT_NODE) parts.push(child.textContent);
      else walk(child);
    }
  };
  walk(document.body);
  return parts.join(" ");
})()"""
# Lists the images on the page that finished loading: [src, natural width].
PAGE_IMAGES = """(() => {
  if (!document.body) return [];
  const images = [];
  const walk = (node) => {
    if (node.shadowRoot) walk(node.shadowRoot);
    for (const child of node.children || []) {
      if (child.tagName === "IMG" && child.complete && child.naturalWidth > 0)
        images.push([child.src, child.naturalWidth]);
      walk(child);
    }
  };
  walk(document.body);
  return images;
})()"""


def free_loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def get(url: str, timeout: float = 10) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        body = response.read()
        # The profile plugin answers gzip-compressed whatever was asked.
        if response.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        return body


@contextlib.contextmanager
def stopped_at_exit(process: subprocess.Popen):
    try:
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


@contextlib.contextmanager
def tensorboard_server(log_dir, scratch, command=None, run=tensorboard_sink.RUN):
    """Serves `log_dir` on a free loopback port until the block ends.

    Args:
        log_dir: the log dir.
        scratch: where the server's log goes.
        command: the server's command line before its flags; `python -m
            tensorboard.main` by default.
        run: a run the server must list before the block starts.
    """
    command = list(command or [sys.executable, "-m", "tensorboard.main"])
    for attempt in range(3):
        port = free_loopback_port()
        log = open(scratch / f"tensorboard-{attempt}.log", "wb")
        process = subprocess.Popen(
            [
                *command,
                "--logdir",
                str(log_dir),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        with stopped_at_exit(process), log:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + START_TIMEOUT_S
            while time.monotonic() < deadline and process.poll() is None:
                with contextlib.suppress(OSError):
                    if run in json.loads(get(f"{url}/data/runs")):
                        break
                time.sleep(0.5)
            if process.poll() is None and time.monotonic() < deadline:
                yield url
                return
        # Most likely the port was taken between probing and binding: try another.
    pytest.fail(f"TensorBoard did not serve {log_dir}; see {scratch}/tensorboard-*.log")


class Browser:
    """Headless Chromium driven over the DevTools Protocol."""

    def __init__(self, socket_url: str):
        self._socket = websocket.create_connection(
            socket_url, timeout=RENDER_TIMEOUT_S, suppress_origin=True
        )
        self._ids = iter(range(1, 1 << 30))
        self.call("Page.enable")

    def call(self, method: str, **params):
        message_id = next(self._ids)
        self._socket.send(json.dumps({"id": message_id, "method": method, "params": params}))
        while True:
            message = json.loads(self._socket.recv())
            if message.get("id") == message_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result["result"].get("value")

    def open_until(self, url: str, expression: str, shown):
        """Opens `url` and waits until `shown(value of expression)` holds."""
        self.call("Page.navigate", url=url)
        return self.wait_until(expression, shown)

    def wait_until(self, expression: str, shown):
        """Waits until `shown(value of expression)` holds; returns the last value."""
        deadline = time.monotonic() + RENDER_TIMEOUT_S
        value = None
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value and shown(value):
                return value
            time.sleep(0.5)
        return value

    def resize(self, width: int, height: int) -> None:
        """Sets the page's viewport size (e.g. taller, for a screenshot of a long page)."""
        self.call(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )

    def screenshot(self, path) -> bytes:
        png = base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"])
        path.write_bytes(png)
        return png

    def close(self):
        self._socket.close()


@contextlib.contextmanager
def chromium(scratch):
    # A new, empty profile for every launch.
    profile_dir = pathlib.Path(tempfile.mkdtemp(prefix="chromium-profile-", dir=scratch))
    process = subprocess.Popen(
        [
            CHROMIUM,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={profile_dir}",
            "--remote-debugging-address=127.0.0.1",
            "--remote-debugging-port=0",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    with stopped_at_exit(process):
        # Chromium writes the port it picked to this file once it listens.
        port_file = profile_dir / "DevToolsActivePort"
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline and not (
            port_file.exists() and port_file.read_text().strip()
        ):
            if process.poll() is not None:
                pytest.fail(f"Chromium exited with status {process.returncode}")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        targets = json.loads(get(f"http://127.0.0.1:{port}/json/list"))
        page = next(target for target in targets if target["type"] == "page")
        browser = Browser(page["webSocketDebuggerUrl"])
        try:
            yield browser
        finally:
            browser.close()


