"""The real TensorBoard server over a real fit's log dir, looked at in headless Chromium.

TensorBoard's UI is a single-page app whose dashboards live in shadow DOM, so the
page is driven over the Chrome DevTools Protocol: navigate to a tab, read the
text the page renders (walking shadow roots), list the images it loaded, and
take a screenshot, kept under the test's temp dir.
"""

import base64
import io
import json
import os
import urllib.parse

import numpy as np
import pytest
from matplotlib import image as matplotlib_image

from keras_pipeline_tuner.outputs import tensorboard as tensorboard_sink
from keras_pipeline_tuner.outputs import timeline_image
from tests.helpers import advised_fits
from tests.helpers.browser import PAGE_IMAGES
from tests.helpers.browser import PAGE_TEXT
from tests.helpers.browser import chromium
from tests.helpers.browser import get
from tests.helpers.browser import needs_chromium
from tests.helpers.browser import tensorboard_server

pytestmark = [needs_chromium, pytest.mark.browser]


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
        text = browser.open_until(f"{url}/#text", PAGE_TEXT, lambda text: verdict in text)
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
        images = browser.open_until(f"{url}/#images", PAGE_IMAGES, timeline_loaded)
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
