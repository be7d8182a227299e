"""The "Input pipeline" tab over a log dir holding bad files, served by a real `tensorboard`.

A malformed report or tag marks its run unreadable, with the reason, in the
listing and on its page; the other runs are listed and shown as ever.
"""

import json
import urllib.error

import numpy as np
import pytest
import tensorflow as tf

from keras_pipeline_tuner.outputs.dashboard import summaries
from keras_pipeline_tuner.outputs.report import Report
from keras_pipeline_tuner.outputs.report import write_report
from keras_pipeline_tuner.timing.step_stats import StepStats
from keras_pipeline_tuner.timing.step_stats import verdict_for
from tests.helpers.browser import get
from tests.helpers.browser import tensorboard_server

ROUTE = f"/data/plugin/{summaries.PLUGIN_NAME}"
GOOD = f"good/{summaries.RUN}"
WITH_SUMMARIES = f"with_summaries/{summaries.RUN}"
# report.json files that are JSON but not reports, and the field each names.
BAD_FILES = {
    "a_list": ("[1, 2, 3]", "not an object"),
    "recommendations_5": ('{"recommendations": 5}', "recommendations"),
    "wrong_nesting": ('{"train": [1, 2]}', "train"),
    "not_json": ("{'verdict': ", "invalid JSON"),
}
BAD_TAG = f"bad_tag/{summaries.RUN}"


def good_report() -> Report:
    stats = StepStats.from_arrays(np.full(10, 0.001), np.full(10, 0.05))
    fraction = stats.input_fraction
    return Report(verdict=verdict_for(fraction), input_fraction=fraction, train=stats)


def write_summaries(run_dir, report_text: str) -> None:
    rows = summaries.widened(np.array([[n, 0, n * 0.05, 0.001, 0.05] for n in range(1, 11)]))
    with tf.summary.create_file_writer(str(run_dir)).as_default():
        summaries.write_json(summaries.REPORT_TAG, report_text, 10)
        summaries.write_step_block(0, rows)
        tf.summary.flush()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("bad_data")
    write_report(good_report(), str(log_dir / "good"))
    write_summaries(log_dir / "with_summaries" / summaries.RUN, good_report().to_json())
    for name, (text, _) in BAD_FILES.items():
        (log_dir / name).mkdir()
        (log_dir / name / "report.json").write_text(text)
    write_summaries(log_dir / "bad_tag" / summaries.RUN, "this is not JSON")
    scratch = tmp_path_factory.mktemp("bad_data_server")
    with tensorboard_server(log_dir, scratch, run=WITH_SUMMARIES) as url:
        yield url


def get_json(url):
    return json.loads(get(url))


def test_the_run_listing_answers_with_the_good_runs_and_names_the_bad_ones(served):
    listed = {run["run"]: run for run in get_json(f"{served}{ROUTE}/runs")["runs"]}
    for good in (GOOD, WITH_SUMMARIES):
        assert listed[good]["unreadable"] is None
        assert listed[good]["verdict"] == "not input-bound"
    for name, (_, field) in BAD_FILES.items():
        run = listed[f"{name}/{summaries.RUN}"]
        assert run["verdict"] is None
        assert field in run["unreadable"], run
    assert (
        "not JSON" in listed[BAD_TAG]["unreadable"]
        or "invalid JSON" in listed[BAD_TAG]["unreadable"]
    )


@pytest.mark.parametrize("run", [f"a_list/{summaries.RUN}", BAD_TAG])
def test_an_unreadable_run_answers_with_what_is_wrong(served, run):
    detail = get_json(f"{served}{ROUTE}/run?run={run}")
    assert detail["report"] is None and detail["problems"], detail
    steps = get_json(f"{served}{ROUTE}/steps?run={run}")
    if run == BAD_TAG:
        # Its step rows are fine: they are drawn.
        assert steps["step"] == list(range(1, 11))


def test_a_good_run_beside_bad_ones_is_shown_in_full(served):
    detail = get_json(f"{served}{ROUTE}/run?run={WITH_SUMMARIES}")
    assert detail["problems"] == [] and detail["report"]["verdict"] == "not input-bound"


def test_an_unknown_run_is_still_a_bad_request(served):
    with pytest.raises(urllib.error.HTTPError) as raised:
        get(f"{served}{ROUTE}/run?run=nowhere")
    assert raised.value.code == 400
