"""The run's contract, apart from any framework: rows in, a report out.

`Run` is what `model.fit` and custom loops both drive; every timing source hands
it the same thing (`add_rows`). Fed known rows, it must give the report they
imply, on its own: no TensorFlow, Keras, JAX or torch imported.
"""

import json
import subprocess
import sys

from tests.helpers.paths import REPO_ROOT

# Rows as a timing source hands them: 50 ms of input wait, 1 ms of compute, a
# first call that traced for 400 ms. The times are given, not measured, so a
# busy machine cannot change the outcome.
_SCRIPT = r"""
import json, sys
from keras_pipeline_tuner._util.feature_guard import FeatureGuard
from keras_pipeline_tuner.profiling.window import ProfilerWindow
from keras_pipeline_tuner.run.lifecycle import Run, RunSettings

guard = FeatureGuard()
run = Run(RunSettings(log_dir=None, verbose=0), guard, ProfilerWindow("off", None, None, guard))
run.begin(worker_identity=None)
run.begin_epoch("train", 0)
t = 1000.0
run.add_rows("train", (t, t + 0.05, t + 0.451), 0.451, t)  # the first call: it traces
t += 0.451
for step in range(40):
    run.add_rows("train", (t, t + 0.05, t + 0.051), 0.051, t)
    t += 0.051
run.end_epoch("train", 0)
run.epoch_ended()
report = run.finish(summary=False)
print(json.dumps({
    "frameworks": [m for m in ("tensorflow", "keras", "jax", "torch") if m in sys.modules],
    "steps": report.train.steps,
    "verdict": report.verdict.value,
    "wait_ms": report.train.input_wait.median_ms,
    "compute_ms": report.train.compute.median_ms,
    "first_wall_ms": report.first_steps["train"].wall_ms,
    "first_tracing_ms": report.first_steps["train"].tracing_ms,
    "epochs": len(report.epochs),
    "json_round_trips": type(report).from_json(report.to_json()) == report,
}))
"""


def test_rows_in_report_out_without_any_framework():
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["frameworks"] == [], report
    # The first call is kept apart; the 40 steps after it make the figures.
    assert report["steps"] == 40, report
    assert report["verdict"] == "highly input-bound", report
    assert abs(report["wait_ms"] - 50.0) < 0.01 and abs(report["compute_ms"] - 1.0) < 0.01, report
    assert abs(report["first_wall_ms"] - 451.0) < 0.01, report
    assert report["first_tracing_ms"] is not None and report["first_tracing_ms"] < 1.0, report
    assert report["epochs"] == 1 and report["json_round_trips"], report
