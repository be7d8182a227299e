"""The `keras-pipeline-tuner` command, run as a user runs it."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

import keras_pipeline_tuner as kpt
from keras_pipeline_tuner import cli
from keras_pipeline_tuner.outputs.dashboard.summaries import PLUGIN_NAME
from tests.helpers.tensorboard_app import wsgi_client
from tests.helpers.training_data import failing_source
from tests.helpers.training_data import slow_source
from tests.helpers.training_data import tiny_model

COMMAND = shutil.which("keras-pipeline-tuner")
DASHBOARD = f"/data/plugin/{PLUGIN_NAME}"


def run(*args, timeout=300, env=None):
    command = [COMMAND] if COMMAND else [sys.executable, "-m", "keras_pipeline_tuner.cli"]
    return subprocess.run(
        command + list(args), capture_output=True, text=True, timeout=timeout, env=env
    )


def test_help():
    done = run("--help")
    assert done.returncode == 0
    assert "demo" in done.stdout and "report" in done.stdout


def test_report_of_a_real_fit(tmp_path):
    log_dir = tmp_path / "run"
    tuner = kpt.PipelineTuner(log_dir=log_dir, verbose=0, profile="off")
    tiny_model().fit(slow_source(8, 0.015).batch(1), epochs=1, callbacks=[tuner], verbose=0)
    stored = json.loads((log_dir / "report.json").read_text())
    assert stored["verdict"] == "highly input-bound"
    done = run("report", str(log_dir))
    assert done.returncode == 0, done.stderr
    assert "highly input-bound" in done.stdout
    assert f"{tuner.report.input_fraction * 100:.1f} %" in done.stdout


def test_report_of_a_directory_without_report(tmp_path):
    done = run("report", str(tmp_path))
    assert done.returncode == cli.NO_REPORT
    assert "no report" in done.stderr and "report.json" in done.stderr


def test_report_of_a_folder_of_runs_lists_each(tmp_path):
    for name, delay in (("naive", 0.015), ("tuned", 0.0)):
        tuner = kpt.PipelineTuner(log_dir=tmp_path / name, verbose=0, profile="off")
        tiny_model().fit(slow_source(8, delay).batch(1), epochs=1, callbacks=[tuner], verbose=0)
    done = run("report", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.index("== naive ==") < done.stdout.index("== tuned ==")
    assert "highly input-bound" in done.stdout


def test_demo_refuses_a_log_dir_that_is_a_file(tmp_path):
    taken = tmp_path / "taken"
    taken.write_text("")
    done = run("demo", "--quick", "--log-dir", str(taken))
    assert done.returncode == cli.USAGE
    assert "is a file, not a folder" in done.stderr and "Traceback" not in done.stderr


def test_report_of_a_corrupt_report(tmp_path):
    (tmp_path / "report.json").write_text('{"verdict": 3}')
    done = run("report", str(tmp_path))
    assert done.returncode == cli.UNREADABLE
    assert "report.verdict" in done.stderr


# The whole demo, about a minute: CI's slow pass.
@pytest.mark.slow
def test_demo_quick(tmp_path):
    log_dir = tmp_path / "demo"
    # As a user runs it: TensorFlow's native logging at its default level.
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    done = run("demo", "--quick", "--log-dir", str(log_dir), timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Naive pipeline: highly input-bound" in done.stdout
    # Tuned, the pipeline keeps ahead of the model once the first epoch has
    # filled its cache: no speed advice is left for the steady state.
    if re.search(r"^  cache: kept ", done.stdout, re.MULTILINE):
        tuned_line = re.search(r"^Tuned pipeline: .*$", done.stdout, re.MULTILINE)
        assert tuned_line, done.stdout[-4000:]
        tuned = json.loads((log_dir / "tuned" / "report.json").read_text())
        if tuned["verdict"] != "not input-bound":
            # Beside other tests' work the tuned run read 5.4 % once: on the
            # 5 % boundary, said as such; either side is fair there.
            assert tuned["input_fraction"] < 0.07 and "Borderline" in tuned_line.group(), (
                tuned_line.group()
            )
        else:
            assert tuned_line.group().startswith("Tuned pipeline: not input-bound")
            assert [r["id"] for r in tuned["recommendations"]] == ["input-not-bottleneck"]
    # The profiler's own log lines stay out of the output.
    assert "Profiler session" not in done.stderr and "Collecting XSpace" not in done.stderr
    assert f"tensorboard --logdir {log_dir}" in done.stdout
    assert re.search(r"^Tuned: .*list_files", done.stdout, re.MULTILINE)
    # The fit's top recommendation set against what kpt.tune measured largest.
    assert re.search(r"^The fit's (top recommendation|advice)", done.stdout, re.MULTILINE)
    # The speed-up is credited to the rewrites kpt.tune kept; with none kept,
    # the same pipeline is not trained on twice (two fits of one pipeline could
    # only differ by noise).
    if not re.search(r"^  \S+: kept ", done.stdout, re.MULTILINE):
        assert "No speed-up to report" in done.stdout and "Speed-up:" not in done.stdout
        assert "Skipped: kpt.tune kept no rewrite" in done.stdout
        assert not (log_dir / "tuned").exists()
        return
    assert re.search(r"Speed-up: [\d.]+x .* from the rewrites kpt.tune kept", done.stdout)
    assert re.search(r"Accuracy \(training, last epoch\): naive pipeline [\d.]+", done.stdout)
    report = run("report", str(log_dir))
    assert report.returncode == 0
    assert "== naive ==" in report.stdout and "== tuned ==" in report.stdout
    for name in ("naive", "tuned"):
        assert (log_dir / name / "report.json").is_file()
        assert list((log_dir / name).rglob("*tfevents*")), f"no event file under {name}"
    if re.search(r"^  parallel-map: kept ", done.stdout, re.MULTILINE):
        assert re.search(r"^Tuned: .*num_parallel_calls=AUTOTUNE", done.stdout, re.MULTILINE)
    # The Input pipeline tab shows the tune result beside the tuned run.
    client = wsgi_client(log_dir)
    answer = json.loads(client.get(f"{DASHBOARD}/run?run=tuned/pipeline_tuner").get_data())
    assert f"Tuned:    {answer['tune']['tuned_pipeline']}" in done.stdout
    assert answer["tune"]["rewrites"]
    assert f"keras-pipeline-tuner compare {log_dir / 'naive'} {log_dir / 'tuned'}" in done.stdout


def test_report_of_an_unknown_schema_version(tmp_path):
    data = json.loads(kpt.Report().to_json())
    data["schema_version"] = 99
    (tmp_path / "report.json").write_text(json.dumps(data))
    done = run("report", str(tmp_path))
    assert done.returncode == cli.UNREADABLE
    assert "schema_version is 99" in done.stderr and "reads version 1" in done.stderr
    with pytest.raises(ValueError, match="schema_version is 99"):
        kpt.Report.from_json(json.dumps(data))


def test_report_without_training_steps_fails_the_command(tmp_path):
    # What a fit that failed on its first batch leaves: a report with no timed step.
    log_dir = tmp_path / "run"
    tuner = kpt.PipelineTuner(log_dir=log_dir, verbose=0, profile="off")
    with pytest.raises(Exception, match="broken source"):
        tiny_model().fit(
            failing_source(8, 0, "broken source").batch(2), callbacks=[tuner], verbose=0
        )
    assert kpt.Report.from_json((log_dir / "report.json").read_text()).train.steps == 0
    done = run("report", str(log_dir))
    assert done.returncode == cli.NOTHING_MEASURED
    assert "no measured training step" in done.stderr
