"""The scripts under examples/ run as they are."""

import os
import re
import subprocess
import sys

import pytest

from keras_pipeline_tuner.outputs.report import Report
from keras_pipeline_tuner.timing.step_stats import Verdict
from tests.helpers.paths import EXAMPLES

# Each example trains for seconds to tens of seconds: CI's slow pass.
pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]




def run_example(name, tmp_path):
    env = dict(os.environ, KPT_EXAMPLE_QUICK="1", TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run(
        [sys.executable, str(EXAMPLES / name)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_custom_loop_example_prints_the_verdict(tmp_path):
    result = run_example("custom_loop.py", tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    verdict = re.search(r"^Verdict: (.+?) \(", result.stdout, re.MULTILINE)
    assert verdict is not None, result.stdout
    # The example's pipeline decodes in Python, one example at a time.
    assert verdict.group(1) == "highly input-bound"
    assert (tmp_path / "logs" / "custom_loop" / "report.json").is_file()


def test_fit_callback_example_prints_the_verdict(tmp_path):
    result = run_example("fit_callback.py", tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Verdict: highly input-bound" in result.stdout
    assert (tmp_path / "logs" / "fit_callback" / "report.json").is_file()


def test_inspect_only_example_lists_the_mistakes(tmp_path):
    result = run_example("inspect_only.py", tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    ids = re.search(r"^Finding ids: (.+)$", result.stdout, re.MULTILINE).group(1).split(", ")
    assert {"cache-after-random", "sequential-map", "py-function-in-map"} <= set(ids)


def test_image_pipeline_example_has_no_warning(tmp_path):
    result = run_example("image_pipeline.py", tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Warnings or errors: 0" in result.stdout
    # Each epoch judged by the run's rule, with its steady state's median step.
    assert re.search(
        r"^Epoch 3: \d+% of step time is input \(not input-bound\), step [\d.]+ ms \(median\)",
        result.stdout,
        re.MULTILINE,
    )
    # The guide's recommended order, cache included: healthy in steady state,
    # so no speed advice (the first epoch, which fills the cache, is apart).
    report = Report.from_json((tmp_path / "logs" / "image_pipeline" / "report.json").read_text())
    assert report.verdict == Verdict.NOT_INPUT_BOUND, report.judgement.line
    assert all(
        r.id == "input-not-bottleneck" or r.expected_gain is None for r in report.recommendations
    ), [r.title for r in report.recommendations]


def test_tune_pipeline_example_keeps_the_elements(tmp_path):
    result = run_example("tune_pipeline.py", tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "map(parse, num_parallel_calls=AUTOTUNE)" in result.stdout
    assert "Same elements in the same order: True" in result.stdout
    assert re.search(r"^Speed-up: \d+\.\d\dx per pass", result.stdout, re.MULTILINE)


def test_data_service_example_trains_on_a_local_service(tmp_path):
    from keras_pipeline_tuner.outputs.report import Report
    from tests.helpers import private_network

    # A dispatcher and two workers in the example's process; they listen on every
    # interface, so the example runs where loopback is the only one.
    private_network.require()
    env = dict(os.environ, KPT_EXAMPLE_QUICK="1", TF_CPP_MIN_LOG_LEVEL="2")
    result = private_network.run_isolated(
        [sys.executable, str(EXAMPLES / "data_service.py")], timeout=300, cwd=tmp_path, env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Dispatcher at grpc://localhost:" in result.stdout
    report = Report.from_json(
        (tmp_path / "logs" / "data_service" / "service" / "report.json").read_text()
    )
    # Training on the service's batches completed, every step timed inside it.
    assert report.train.steps > 0 and "train" in report.first_steps
    assert report.measurement == "in-step" and report.input_fraction is not None
    # The report names the service read as written, without tf.data's own
    # uncompressing map.
    stages = {finding.id: finding.stage for finding in report.findings}
    assert stages["data-service"].startswith("distribute(processing_mode='distributed_epoch'")
    assert "job_name='train'" in stages["data-service"]
    inspected = re.search(r"^The pipeline as the tuner reads it: (.+)$", result.stdout, re.M)
    assert inspected.group(1).startswith("distribute(") and "uncompress" not in inspected.group(1)
