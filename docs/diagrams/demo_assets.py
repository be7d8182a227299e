"""Refreshes what the README and the docs show of a real demo run.

    keras-pipeline-tuner demo --log-dir logs/demo      # from the repository's root
    python docs/diagrams/demo_assets.py logs/demo

It copies the naive run's report to docs/demo-report.json and its timeline
image to docs/timeline.png, prints its terminal
summary (paste it into README.md and docs/reading-the-report.md, between the
`terminal-summary` comments; tests/docs/test_readme.py checks that they match),
and takes docs/dashboard.png: TensorBoard serving the log dir, its Input
pipeline tab opened in headless Chromium (Debian's `chromium`), the tuned run
beside the naive one. Use a relative log dir: the summary shows its path.
"""

import io
import os
import pathlib
import shutil
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
# TensorBoard's process loads the plugin from this checkout too.
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))

from keras_pipeline_tuner.outputs.dashboard import summaries  # noqa: E402
from keras_pipeline_tuner.outputs.report import Report  # noqa: E402
from keras_pipeline_tuner.outputs.terminal import print_summary  # noqa: E402
from tests.helpers.browser import chromium  # noqa: E402
from tests.helpers.browser import tensorboard_server  # noqa: E402
from tests.outputs.test_dashboard_browser import _SHOWN  # noqa: E402
from tests.outputs.test_dashboard_browser import _pick  # noqa: E402

NAIVE = "naive/pipeline_tuner"
TUNED = "tuned/pipeline_tuner"


def main(log_dir: pathlib.Path) -> None:
    report_file = ROOT / "docs" / "demo-report.json"
    shutil.copy(log_dir / "naive" / "report.json", report_file)
    shutil.copy(log_dir / NAIVE / "timeline.png", ROOT / "docs" / "timeline.png")
    text = io.StringIO()
    print_summary(Report.from_json(report_file.read_text()), file=text)
    print(text.getvalue())
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="demo-assets-"))
    command = [sys.executable, "-m", "tests.helpers.tensorboard_app"]
    with tensorboard_server(log_dir, scratch, command=command, run=NAIVE) as url:
        with chromium(scratch) as browser:
            browser.open_until(f"{url}/#{summaries.PLUGIN_NAME}", _SHOWN, bool)
            browser.evaluate(_pick(TUNED, picker="kpt-compare"))
            browser.resize(1400, 1500)
            browser.wait_until(_SHOWN, lambda shown: len(shown["marks"]) == 2)
            time.sleep(1)  # the timelines' last layout pass
            browser.screenshot(ROOT / "docs" / "dashboard.png")
    print(f"wrote {report_file} and {ROOT / 'docs' / 'dashboard.png'}")


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]))
