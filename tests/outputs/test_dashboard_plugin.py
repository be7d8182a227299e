"""The "Input pipeline" plugin inside TensorBoard's own WSGI app, over real fits' log dirs."""

import json
import shutil

import numpy as np
import pytest

from keras_pipeline_tuner.advice.recommendation import describe_gain
from keras_pipeline_tuner.outputs.dashboard import plugin as dashboard_plugin
from keras_pipeline_tuner.outputs.dashboard import summaries
from keras_pipeline_tuner.outputs.report import REPORT_FILENAME
from keras_pipeline_tuner.timing.step_clock import TRAIN
from tests.helpers import dashboard_runs
from tests.helpers.tensorboard_app import declared_plugin
from tests.helpers.tensorboard_app import wsgi_client

ROUTE = f"/data/plugin/{summaries.PLUGIN_NAME}"
NAIVE = dashboard_runs.run_name(dashboard_runs.NAIVE)
TUNED = dashboard_runs.run_name(dashboard_runs.TUNED)
WORKERS = dashboard_runs.run_name(dashboard_runs.WORKERS)
GRAIN = dashboard_runs.run_name(dashboard_runs.GRAIN)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return dashboard_runs.two_runs(tmp_path_factory)


@pytest.fixture(scope="module")
def client(runs):
    return wsgi_client(runs.log_dir)


def get_json(client, path, status=200):
    response = client.get(path)
    assert response.status_code == status, response.get_data(as_text=True)
    return json.loads(response.get_data())


def test_setup_cfg_declares_the_plugin():
    assert declared_plugin() is dashboard_plugin.InputPipelinePlugin


def test_the_tab_is_listed_for_a_tuner_log_dir(client):
    listing = get_json(client, "/data/plugins_listing")[summaries.PLUGIN_NAME]
    assert listing["enabled"] is True
    assert listing["tab_name"] == "Input pipeline"
    assert listing["loading_mechanism"] == {
        "type": "IFRAME",
        "module_path": f"{ROUTE}/index.js",
    }


def test_script_and_style_are_served_by_the_plugin(client):
    script = client.get(f"{ROUTE}/index.js")
    assert script.status_code == 200
    assert script.headers["Content-Type"].startswith("text/javascript")
    body = script.get_data(as_text=True)
    assert "export async function render()" in body
    # Nothing fetched from elsewhere: TensorBoard's CSP would block it, offline too.
    assert "http://" not in body.replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in body
    style = client.get(f"{ROUTE}/style.css")
    assert style.status_code == 200 and style.headers["Content-Type"].startswith("text/css")


def test_runs_lists_both_runs_with_their_verdicts(client, runs):
    listed = {run["run"]: run for run in get_json(client, f"{ROUTE}/runs")["runs"]}
    assert set(listed) == {NAIVE, TUNED, WORKERS, GRAIN}
    # A run with only a report.json (as written before the dashboard) is listed too.
    assert listed[WORKERS]["source"] == "report.json" and not listed[WORKERS]["has_steps"]
    naive = listed[NAIVE]
    assert naive["source"] == "summaries"
    assert naive["verdict"] == runs.naive.report.verdict.value == "highly input-bound"
    assert naive["input_fraction"] == pytest.approx(runs.naive.report.input_fraction)
    assert naive["has_steps"] and not naive["has_tune"]
    # What the tab watches to redraw while a fit runs.
    assert naive["last_step"] == runs.naive.clock.step_numbers(TRAIN)[-1]
    assert listed[TUNED]["has_tune"]


def test_run_returns_the_report_the_profile_rows_and_the_tune_result(client, runs):
    naive = get_json(client, f"{ROUTE}/run?run={NAIVE}")
    served = naive["report"]
    # Each gain comes with the words the terminal shows for it, worked out once.
    gains = [r.expected_gain for r in runs.naive.report.recommendations]
    assert any(gain is not None for gain in gains)
    for recommendation, gain in zip(served["recommendations"], gains):
        if gain is not None:
            assert recommendation["expected_gain"].pop("described") == describe_gain(gain)
    # The one "input free" figure, in the same words.
    report = runs.naive.report
    free = served["figures"]["input_free"]
    assert free.pop("described") == describe_gain(report.figures.input_free)
    # Runs side by side compare the steady state the figures are of.
    assert served["figures"]["scope"] == report.figures.scope
    assert served["figures"]["scope"].startswith("steady state: epoch 2,")
    # The copy written to TensorBoard holds the tuner's cost up to its writing;
    # the final report adds the outputs written after it.
    expected = json.loads(report.to_json())
    served_cost, final_cost = served.pop("tuner_cost"), expected.pop("tuner_cost")
    assert served_cost["fit_s"] == final_cost["fit_s"]
    assert served_cost["after_training_s"] <= final_cost["after_training_s"]
    assert served == expected
    profile = naive["profile"]
    assert profile["title"].startswith("Profiler window")
    labels = [row["label"] for row in profile["rows"]]
    assert any("sleep_then_pass" in label or "map" in label for label in labels), labels
    assert naive["tune"] is None
    tuned = get_json(client, f"{ROUTE}/run?run={TUNED}")
    assert tuned["tune"]["ratio"] == pytest.approx(runs.tune_result.ratio)
    assert [rewrite["kind"] for rewrite in tuned["tune"]["rewrites"]] == [
        outcome.kind for outcome in runs.tune_result.rewrites
    ]


def test_steps_are_the_clock_rows_one_mark_per_step(client, runs):
    clock = runs.naive.clock
    steps = get_json(client, f"{ROUTE}/steps?run={NAIVE}")
    assert steps["source"] == "summaries"
    assert steps["bucket_steps"] == 1
    assert steps["step"] == clock.step_numbers(TRAIN).tolist()
    assert steps["last"] == steps["step"]
    rows = clock.steps(TRAIN)
    np.testing.assert_allclose(steps["start_s"], rows["start"])
    np.testing.assert_allclose(steps["wait_ms"], rows["wait"] * 1e3, atol=1e-3)
    np.testing.assert_allclose(steps["compute_ms"], rows["compute"] * 1e3, atol=1e-3)
    assert [epoch["epoch"] for epoch in steps["epochs"]] == list(range(dashboard_runs.EPOCHS))


def test_steps_are_downsampled_on_the_server_and_detailed_when_zoomed(client, runs):
    numbers = runs.naive.clock.step_numbers(TRAIN)
    few = get_json(client, f"{ROUTE}/steps?run={NAIVE}&points=10")
    assert len(few["step"]) <= 10 and few["bucket_steps"] > 1
    assert few["step"][0] == numbers[0] and few["last"][-1] == numbers[-1]
    first, last = int(numbers[5]), int(numbers[14])
    zoomed = get_json(client, f"{ROUTE}/steps?run={NAIVE}&points=10&first={first}&last={last}")
    assert zoomed["step"] == list(range(first, last + 1))
    assert zoomed["bucket_steps"] == 1


@pytest.mark.parametrize(
    "query, message",
    [
        ("steps", "Missing `run`"),
        (f"steps?run={NAIVE}&points=0", "`points` must be between"),
        (f"steps?run={NAIVE}&first=ten", "`first` must be an integer"),
        ("run?run=nowhere", "No report for run 'nowhere'"),
    ],
)
def test_bad_requests_say_what_to_send(client, query, message):
    assert message in get_json(client, f"{ROUTE}/{query}", status=400)["error"]


def test_runs_older_than_the_dashboard_are_read_from_report_json(runs, tmp_path):
    # What a run written before the dashboard holds: report.json and the scalars.
    old = tmp_path / "old"
    old.mkdir()
    shutil.copy(runs.log_dir / dashboard_runs.TUNED / REPORT_FILENAME, old / REPORT_FILENAME)
    client = wsgi_client(tmp_path)
    assert get_json(client, "/data/plugins_listing")[summaries.PLUGIN_NAME]["enabled"]
    listed = get_json(client, f"{ROUTE}/runs")["runs"]
    assert [(run["run"], run["source"]) for run in listed] == [
        (f"old/{summaries.RUN}", "report.json")
    ]
    detail = get_json(client, f"{ROUTE}/run?run=old/{summaries.RUN}")
    for recommendation in detail["report"]["recommendations"]:
        if recommendation.get("expected_gain"):
            recommendation["expected_gain"].pop("described")
    detail["report"]["figures"]["input_free"].pop("described")
    # The log dir's report is the run's, listing the log dir's runs besides.
    expected = json.loads(runs.tuned.report.to_json())
    assert [entry["run"] for entry in detail["report"]["runs"]] == [summaries.RUN]
    expected["runs"] = detail["report"]["runs"]
    # report.json holds the final report, its cost too.
    assert detail["report"] == expected


def test_an_empty_log_dir_does_not_list_the_tab(tmp_path):
    client = wsgi_client(tmp_path)
    assert not get_json(client, "/data/plugins_listing")[summaries.PLUGIN_NAME]["enabled"]
    assert get_json(client, f"{ROUTE}/runs")["runs"] == []
