"""The "Input pipeline" tab in a real TensorBoard server, rendered by headless Chromium.

The server is `tensorboard`'s own command line (with the dashboard plugin from
setup.cfg's entry point), on 127.0.0.1, over the log dir of two real fits, a
naive pipeline and the one `kpt.tune` returned. Everything the tab needs is
served by TensorBoard; Chromium runs without network. Its screenshot is the one
the README shows, copied to docs/ when `KPT_UPDATE_SCREENSHOT=1` is set.
"""

import os
import shutil
import sys

import pytest

from keras_pipeline_tuner.outputs.dashboard import summaries
from keras_pipeline_tuner.timing.step_clock import TRAIN
from tests.helpers import dashboard_runs
from tests.helpers.browser import chromium
from tests.helpers.browser import needs_chromium
from tests.helpers.browser import tensorboard_server
from tests.helpers.paths import REPO_ROOT

# Its two runs and a TensorBoard server take about a minute: CI's slow pass.
pytestmark = [pytest.mark.slow, needs_chromium, pytest.mark.browser]

NAIVE = dashboard_runs.run_name(dashboard_runs.NAIVE)
TUNED = dashboard_runs.run_name(dashboard_runs.TUNED)
WORKERS = dashboard_runs.run_name(dashboard_runs.WORKERS)
GRAIN = dashboard_runs.run_name(dashboard_runs.GRAIN)
UNREADABLE = dashboard_runs.run_name("unreadable")
SCREENSHOT = REPO_ROOT / "docs" / "dashboard.png"

# The tab's document: TensorBoard shows it in an iframe (found through shadow roots).
_TAB = """(() => {
  const find = (node) => {
    if (node.shadowRoot) { const found = find(node.shadowRoot); if (found) return found; }
    for (const child of node.children || []) {
      if (child.tagName === "IFRAME") return child;
      const found = find(child);
      if (found) return found;
    }
    return null;
  };
  const frame = document.body && find(document.body);
  return frame && frame.contentDocument;
})()"""
# What the tab shows, read from its DOM.
_SHOWN = f"""(() => {{
  const doc = {_TAB};
  if (!doc || !doc.querySelector(".kpt-recommendation")) return null;
  const all = (selector, root) => Array.from((root || doc).querySelectorAll(selector));
  return {{
    banners: all(".kpt-verdict").map((banner) =>
        [banner.dataset.run, banner.querySelector(".kpt-verdict-text").textContent]),
    marks: Object.fromEntries(all(".kpt-timeline").map((timeline) =>
        [timeline.dataset.run, all(".kpt-step-mark", timeline).map((mark) =>
            Number(mark.dataset.step))])),
    epochs: all(".kpt-epoch").length,
    stageRows: all(".kpt-stage-row").map((row) => row.dataset.label),
    recommendations: all(".kpt-recommendation").map((card) => [card.dataset.id,
        (card.querySelector("pre code") || {{}}).textContent || "",
        Boolean(card.querySelector("button.kpt-copy"))]),
    comparison: all(".kpt-compare-table th").map((cell) => cell.textContent),
    tuneRows: all(".kpt-tune tr").length - 1,
    epochRows: all(".kpt-epochs tr").slice(1).map((row) =>
        [row.cells[0].textContent, row.cells[1].textContent, row.cells[2].textContent]),
    stageTable: all(".kpt-stage-section:not(.kpt-live-stages) .kpt-stages-table tr")
        .slice(1).map((row) =>
        [row.cells[0].textContent, row.classList.contains("kpt-bottleneck")]),
    liveStages: all(".kpt-live-stages .kpt-stages-table tr").slice(1).map((row) =>
        row.cells[0].textContent),
    compareWith: (doc.querySelector("#kpt-compare") || {{}}).value,
  }};
}})()"""
# Where the first recommendation's copy button is on screen (brought into view first).
_COPY_BUTTON = """(() => {
  const find = (node) => {
    if (node.shadowRoot) { const found = find(node.shadowRoot); if (found) return found; }
    for (const child of node.children || []) {
      if (child.tagName === "IFRAME") return child;
      const found = find(child);
      if (found) return found;
    }
    return null;
  };
  const frame = find(document.body);
  const button = frame.contentDocument.querySelector(".kpt-recommendation button.kpt-copy");
  button.scrollIntoView({block: "center"});
  const outer = frame.getBoundingClientRect();
  const inner = button.getBoundingClientRect();
  return [outer.left + inner.left + inner.width / 2, outer.top + inner.top + inner.height / 2];
})()"""
_COPY_LABEL = f"""(() => {{
  const label = {_TAB}.querySelector(".kpt-recommendation button.kpt-copy").textContent;
  return label === "Copy" ? null : label;
}})()"""
# Hovers the fifth step mark of the first timeline; returns the tip's text.
_HOVER = f"""(() => {{
  const doc = {_TAB};
  const mark = doc.querySelectorAll(".kpt-timeline")[0].querySelectorAll(".kpt-step-mark")[4];
  const box = mark.getBoundingClientRect();
  mark.dispatchEvent(new MouseEvent("mousemove", {{bubbles: true,
      clientX: box.left + 1, clientY: box.bottom - 1}}));
  const tip = doc.querySelector(".kpt-tip");
  return [mark.dataset.step, tip.textContent, tip.style.display];
}})()"""
# Drags across the first timeline from its 3rd step mark to its 12th.
_DRAG = f"""(() => {{
  const doc = {_TAB};
  const svg = doc.querySelector(".kpt-timeline .kpt-steps");
  const marks = svg.querySelectorAll(".kpt-step-mark");
  const box = svg.getBoundingClientRect();
  const send = (type, mark) => svg.dispatchEvent(new MouseEvent(type, {{bubbles: true,
      clientX: marks[mark].getBoundingClientRect().left + 0.5, clientY: box.top + 60}}));
  send("mousedown", 2); send("mousemove", 11); send("mouseup", 11);
  return [Number(marks[2].dataset.step), Number(marks[11].dataset.step)];
}})()"""
_ZOOMED = f"""(() => {{
  const doc = {_TAB};
  if (!doc.querySelector(".kpt-reset")) return null;
  return Array.from(doc.querySelectorAll(".kpt-timeline")[0]
      .querySelectorAll(".kpt-step-mark")).map((mark) => Number(mark.dataset.step));
}})()"""



def _pick(run: str, picker: str = "kpt-run") -> str:
    """Picks `run` as the tab's main run (or, with picker="kpt-compare", the one beside it)."""
    return f"""(() => {{
  const picker = {_TAB}.querySelector("#{picker}");
  picker.value = {run!r};
  picker.dispatchEvent(new Event("change"));
  return true;
}})()"""


# The kpt.tune table: [rewrite, kept or why not].
_TUNE_ROWS = f"""(() => {{
  const rows = Array.from({_TAB}.querySelectorAll(".kpt-tune tr")).slice(1);
  return rows.length ? rows.map((row) => [row.cells[0].textContent, row.cells[3].textContent])
      : null;
}})()"""
# The main run's banner, once it is the unreadable run's: [verdict text, problem];
# and whether the run beside it is still drawn.
_UNREADABLE_BANNER = f"""(() => {{
  const doc = {_TAB};
  const banner = doc.querySelector(".kpt-verdict[data-run='{UNREADABLE}']");
  if (!banner) return null;
  return [banner.querySelector(".kpt-verdict-text").textContent,
      (banner.querySelector(".kpt-problem") || {{}}).textContent || "",
      doc.querySelectorAll(".kpt-timeline .kpt-step-mark").length];
}})()"""
# The workers' table: [worker, straggler mark], and the main run's banner note.
# The stage table's heading and rows [stage, bottleneck mark], once it is Grain's.
_GRAIN_STAGES = f"""(() => {{
  const section = {_TAB}.querySelector(".kpt-stage-section");
  const heading = section ? section.querySelector("h2").textContent : "";
  if (!heading.includes("Grain")) return null;
  return {{heading: heading, note: section.querySelector("p").textContent,
    rows: Array.from(section.querySelectorAll(".kpt-stages-table tr")).slice(1).map((row) =>
      [row.cells[0].textContent, row.classList.contains("kpt-bottleneck")])}};
}})()"""
_WORKER_ROWS = f"""(() => {{
  const doc = {_TAB};
  const rows = Array.from(doc.querySelectorAll(".kpt-workers tr")).slice(1);
  return rows.length ? {{
    rows: rows.map((row) => [row.cells[0].textContent, row.cells[7].textContent,
        row.classList.contains("kpt-straggler")]),
    note: doc.querySelector(".kpt-verdict .kpt-source").textContent,
  }} : null;
}})()"""


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    runs = dashboard_runs.two_runs(tmp_path_factory)
    scratch = tmp_path_factory.mktemp("dashboard_browser")
    # The runs' log dir, and a run whose report.json is not a report.
    log_dir = scratch / "logs"
    shutil.copytree(runs.log_dir, log_dir)
    (log_dir / "unreadable").mkdir()
    (log_dir / "unreadable" / "report.json").write_text("[1, 2]")
    command = [sys.executable, "-m", "tests.helpers.tensorboard_app"]
    with tensorboard_server(log_dir, scratch, command=command, run=NAIVE) as url:
        yield runs, url, scratch


def _walk_the_tab(url, scratch) -> dict:
    """Opens the tab in Chromium, hovers, copies, zooms and picks each run; what it saw."""
    seen = {}
    with chromium(scratch) as browser:
        seen["shown"] = browser.open_until(
            f"{url}/#{summaries.PLUGIN_NAME}", _SHOWN, lambda value: len(value["marks"]) == 2
        )
        assert seen["shown"], f"the Input pipeline tab did not render; see {scratch}"
        # Tall enough to show the timelines, the profiler rows and the first advice.
        browser.resize(1400, 1500)
        browser.wait_until(_SHOWN, lambda value: len(value["marks"]) == 2)
        browser.screenshot(scratch / "dashboard.png")
        seen["hovered"] = browser.evaluate(_HOVER)
        # A real click (copying needs a user's gesture), then the label it leaves.
        x, y = browser.evaluate(_COPY_BUTTON)
        for kind in ("mousePressed", "mouseReleased"):
            browser.call(
                "Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1
            )
        seen["copied"] = browser.wait_until(_COPY_LABEL, bool)
        seen["dragged"] = browser.evaluate(_DRAG)
        seen["zoomed"] = browser.wait_until(_ZOOMED, bool)
        for name, run, found in (
            ("tune_rows", TUNED, _TUNE_ROWS),
            ("workers", WORKERS, _WORKER_ROWS),
            ("grain_stages", GRAIN, _GRAIN_STAGES),
            (None, UNREADABLE, _UNREADABLE_BANNER),
        ):
            browser.evaluate(_pick(run))
            value = browser.wait_until(found, bool)
            if name:
                seen[name] = value
        browser.evaluate(_pick(NAIVE, picker="kpt-compare"))
        seen["unreadable"] = browser.wait_until(
            _UNREADABLE_BANNER, lambda found: found and found[2] > 0
        )
    return seen


def test_the_tab_shows_verdicts_timelines_advice_and_the_comparison(served):
    runs, url, scratch = served
    seen = _walk_the_tab(url, scratch)
    shown, copied = seen["shown"], seen["copied"]
    if os.environ.get("KPT_UPDATE_SCREENSHOT"):
        # The README's picture, refreshed on request only: a test run leaves
        # the checkout as it found it.
        shutil.copy(scratch / "dashboard.png", SCREENSHOT)
    _check_the_naive_run(shown, copied, runs)
    _check_the_other_runs(shown, seen, runs)


def _check_the_naive_run(shown, copied, runs):
    # A verdict banner per run, the naive run's as the report says.
    assert dict(shown["banners"]) == {
        NAIVE: f"Input pipeline: {runs.naive.report.verdict.value}",
        TUNED: f"Input pipeline: {runs.tuned.report.verdict.value}",
    }
    # The timelines, one above the other, one mark per retained step.
    assert shown["marks"][NAIVE] == runs.naive.clock.step_numbers(TRAIN).tolist()
    assert shown["marks"][TUNED] == runs.tuned.clock.step_numbers(TRAIN).tolist()
    assert shown["epochs"] >= dashboard_runs.EPOCHS
    # The profiler window's stages under the naive run's timeline.
    assert shown["stageRows"] and any("map" in label for label in shown["stageRows"])
    # The recommendations, ranked as in the report, each fix as code with a copy button.
    report = runs.naive.report
    assert [item[0] for item in shown["recommendations"]] == [
        recommendation.id for recommendation in report.recommendations
    ]
    assert all(copy for _, _, copy in shown["recommendations"])
    assert "num_parallel_calls=tf.data.AUTOTUNE" in shown["recommendations"][0][1]
    assert copied == "Copied"
    # The epochs as the report's figures judge them (their steady steps), and the
    # profiler window's stage table, the bottleneck marked.
    assert shown["epochRows"] == [
        [str(epoch.epoch + 1), epoch.kind, str(epoch.steps)] for epoch in report.figures.epochs
    ]
    iterators = report.profile.iterators
    assert [stage for stage, _ in shown["stageTable"]] == [item.stage for item in iterators]
    marked = [stage for stage, bottleneck in shown["stageTable"] if bottleneck]
    assert marked == [
        item.stage for item in iterators if item.iterator == report.profile.bottleneck_iterator
    ]
    assert marked, "the bottleneck stage is not marked"
    # tf.data's live model of the fit's iterator, in a table of its own.
    live = report.stage_table
    assert shown["liveStages"] == ([row.stage for row in live.rows] if live else [])


def _check_the_other_runs(shown, seen, runs):
    # The two runs side by side, and the tuned run's kpt.tune result.
    assert shown["compareWith"] == TUNED
    assert shown["comparison"][:4] == ["", NAIVE, TUNED, f"{TUNED} / {NAIVE}"]
    assert shown["tuneRows"] == -1  # the naive run has no tune result: no table
    assert seen["tune_rows"] == [
        [outcome.kind, "kept" if outcome.applied else outcome.status]
        for outcome in runs.tune_result.rewrites
    ]
    # Hover: the step's own numbers.
    step, tip, display = seen["hovered"]
    assert display == "block" and tip.startswith(f"Step {step}, epoch")
    assert "input wait" in tip and "compute" in tip
    # Zoom: a narrower range of the same steps.
    dragged = seen["dragged"]
    assert seen["zoomed"] == list(range(dragged[0], dragged[1] + 1))
    # A multi-worker job's report (a report.json only): the straggler marked.
    workers = seen["workers"]
    assert workers["rows"] == [
        ["worker:0 (chief)", "", False],
        ["worker:1", "straggler", True],
    ]
    assert "Read from report.json" in workers["note"]
    # A Grain run: its stages as Grain timed them during training, the map marked.
    grain_stages = seen["grain_stages"]
    assert grain_stages["heading"] == "Grain stages, timed by Grain"
    assert "during training" in grain_stages["note"]
    assert ["map(slow_parse)", True] in grain_stages["rows"]
    assert [stage for stage, marked in grain_stages["rows"] if marked] == ["map(slow_parse)"]
    # A run whose report.json is not a report: said on its page, the rest still drawn.
    text, problem, marks = seen["unreadable"]
    assert text == "Input pipeline: report unreadable"
    assert "not an object" in problem
    assert marks > 0  # the run compared with it keeps its timeline
