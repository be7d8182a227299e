"""The real TensorBoard server over a real fit's log dir, looked at in headless Chromium.

TensorBoard's UI is a single-page app whose dashboards live in shadow DOM, so the
page is driven over the Chrome DevTools Protocol: navigate to a tab, read the
text the page renders (walking shadow roots), list the images it loaded, and
take a screenshot, kept under the test's temp dir.
"""

import base64
import contextlib
import gzip
import io
import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

import numpy as np
import pytest
import websocket
from matplotlib import image as matplotlib_image

from keras_pipeline_tuner.outputs import tensorboard as tensorboard_sink
from keras_pipeline_tuner.outputs import timeline_image
from tests.helpers import advised_fits

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

pytestmark = [pytest.mark.browser, pytest.mark.skipif(
    CHROMIUM is None,
    reason="Chromium is not installed (Debian: `apt-get install -y chromium`, which .ci/run does)",
)]

# Collects the text of the page, shadow roots included.
_PAGE_TEXT = """(() => {
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
_PAGE_IMAGES = """(() => {
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
def tensorboard_server(log_dir, scratch):
    """Serves `log_dir` on a free loopback port until the block ends."""
    for attempt in range(3):
        port = free_loopback_port()
        log = open(scratch / f"tensorboard-{attempt}.log", "wb")
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tensorboard.main",
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
                    if tensorboard_sink.RUN in json.loads(get(f"{url}/data/runs")):
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
        deadline = time.monotonic() + RENDER_TIMEOUT_S
        value = None
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value and shown(value):
                return value
            time.sleep(0.5)
        return value

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


def colour_share(png: bytes, colour: str) -> float:
    pixels = matplotlib_image.imread(io.BytesIO(png), format="png")[..., :3]
    rgb = np.array([int(colour[i : i + 2], 16) for i in (1, 3, 5)]) / 255.0
    return float(np.mean(np.abs(pixels - rgb).sum(axis=-1) < 0.12))


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    run = advised_fits.input_bound_run(tmp_path_factory)
    scratch = tmp_path_factory.mktemp("browser")
    with tensorboard_server(run.log_dir, scratch) as url:
        yield run, url, scratch


def test_text_tab_shows_the_verdict_and_the_advice(served):
    run, url, scratch = served
    verdict = "Input pipeline: highly input-bound"
    with chromium(scratch) as browser:
        text = browser.open_until(f"{url}/#text", _PAGE_TEXT, lambda text: verdict in text)
        browser.screenshot(scratch / "text_tab.png")
    assert text and verdict in text, f"the Text tab did not show the verdict; see {scratch}"
    top = run.report.recommendations[0]
    assert top.title in text
    assert "num_parallel_calls=tf.data.AUTOTUNE" in text
    # The same text, straight from the text plugin's data API.
    query = urllib.parse.urlencode(
        {"run": tensorboard_sink.RUN, "tag": tensorboard_sink.REPORT_TAG}
    )
    entries = json.loads(get(f"{url}/data/plugin/text/text?{query}"))
    assert verdict in entries[-1]["text"]


def test_images_tab_shows_the_timeline(served):
    run, url, scratch = served

    def timeline_loaded(images):
        return any("individualImage" in src for src, _ in images)

    with chromium(scratch) as browser:
        images = browser.open_until(f"{url}/#images", _PAGE_IMAGES, timeline_loaded)
        screenshot = browser.screenshot(scratch / "images_tab.png")
    assert images and timeline_loaded(images), f"no timeline image loaded; see {scratch}"
    src, width = next((src, width) for src, width in images if "individualImage" in src)
    blob_key = urllib.parse.parse_qs(urllib.parse.urlparse(src).query)["blob_key"][0]
    # The key is base64 JSON naming the experiment, run, tag, step and sample.
    key = json.loads(base64.urlsafe_b64decode(blob_key + "=" * (-len(blob_key) % 4)))
    assert key[1:3] == [tensorboard_sink.RUN, tensorboard_sink.TIMELINE_TAG]
    assert width == 1000  # the timeline PNG, at its own size
    # On screen, the input-bound run's timeline is mostly input-wait bars.
    assert colour_share(screenshot, timeline_image.WAIT_COLOUR) > 0.002


def test_profile_tab_lists_the_capture(served):
    run, url, _ = served
    sessions = json.loads(get(f"{url}/data/plugin/profile/runs"))
    session = os.path.basename(run.report.profile.run_dir)
    assert f"{tensorboard_sink.RUN}/{session}" in sessions
