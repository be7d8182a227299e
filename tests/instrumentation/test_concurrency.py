"""Several tuners, several fits, and other callbacks that share the log dir."""

import os
import subprocess
import sys
import threading

import keras
import pytest

import keras_pipeline_tuner as kpt
from tests.helpers.paths import REPO_ROOT
from tests.helpers.training_data import cached_source
from tests.helpers.training_data import slow_source
from tests.helpers.training_data import tiny_model


def test_two_tuners_on_two_models_in_one_process():
    fast_model, slow_model = tiny_model(), tiny_model()
    fast_tuner = kpt.PipelineTuner(verbose=0, profile="off")
    slow_tuner = kpt.PipelineTuner(verbose=0, profile="off")
    for _ in range(2):
        fast_model.fit(cached_source(32).batch(4), epochs=1, callbacks=[fast_tuner], verbose=0)
        slow_model.fit(
            slow_source(8, 0.015).batch(1), epochs=1, callbacks=[slow_tuner], verbose=0
        )
    assert fast_tuner.report.train.steps == 7
    assert slow_tuner.report.train.steps == 7
    assert slow_tuner.report.train.input_wait.median_ms > 10
    assert fast_tuner.report.train.input_wait.median_ms < 10


def test_one_tuner_on_two_models():
    tuner = kpt.PipelineTuner(verbose=0, profile="off")
    first, second = tiny_model(), tiny_model()
    first.fit(cached_source(16).batch(4), epochs=1, callbacks=[tuner], verbose=0)
    second.fit(cached_source(32).batch(4), epochs=1, callbacks=[tuner], verbose=0)
    assert tuner.report.train.steps == 7
    first.fit(cached_source(16).batch(4), epochs=1, callbacks=[tuner], verbose=0)
    assert tuner.report.train.steps == 3


def test_alongside_keras_tensorboard_on_the_same_log_dir(tmp_path):
    tensorboard = keras.callbacks.TensorBoard(log_dir=str(tmp_path))
    tuner = kpt.PipelineTuner(log_dir=tmp_path, verbose=0, profile="off")
    history = tiny_model().fit(
        slow_source(8, 0.01).batch(1),
        validation_data=cached_source(8).batch(4),
        epochs=2,
        callbacks=[tensorboard, tuner],
        verbose=0,
    )
    assert len(history.history["loss"]) == 2
    assert (tmp_path / "report.json").is_file()
    event_files = [
        name for _, _, files in os.walk(tmp_path) for name in files if "tfevents" in name
    ]
    assert event_files
    assert tuner.report.verdict is kpt.Verdict.HIGHLY_INPUT_BOUND


class _StopAt(keras.callbacks.Callback):
    def __init__(self, epoch):
        super().__init__()
        self.epoch = epoch

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.epoch:
            raise RuntimeError("preempted")


def test_backup_and_restore_resumes_a_run(tmp_path):
    backup = keras.callbacks.BackupAndRestore(str(tmp_path / "backup"))
    tuner = kpt.PipelineTuner(log_dir=tmp_path / "logs", verbose=0, profile="off")
    model = tiny_model()
    dataset = cached_source(16).batch(4)
    with pytest.raises(RuntimeError, match="preempted"):
        model.fit(dataset, epochs=4, callbacks=[backup, tuner, _StopAt(2)], verbose=0)
    model = tiny_model()
    history = model.fit(dataset, epochs=4, callbacks=[backup, tuner], verbose=0)
    assert len(history.history["loss"]) == 2
    assert [e.epoch for e in tuner.report.epochs] == [2, 3]
    assert tuner.report.train.steps == 7


def _in_threads(*targets):
    """Runs each target in a thread of its own; returns what each raised (or None)."""
    raised = [None] * len(targets)

    def run(index, target):
        try:
            target()
        except Exception as error:  # noqa: BLE001 - the test reads it.
            raised[index] = error

    threads = [threading.Thread(target=run, args=item) for item in enumerate(targets)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return raised


def test_one_tuner_in_two_threads_fits_is_refused_with_a_clear_error():
    tuner = kpt.PipelineTuner(verbose=0, profile="off")
    started = threading.Event()

    class Started(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            started.set()

    def first():
        tiny_model().fit(slow_source(12, 0.05).batch(1), epochs=1,
                         callbacks=[tuner, Started()], verbose=0)

    def second():
        started.wait(30)
        tiny_model().fit(cached_source(8).batch(4), epochs=1, callbacks=[tuner], verbose=0)

    raised = _in_threads(first, second)
    assert raised[0] is None
    assert isinstance(raised[1], RuntimeError) and "another thread" in str(raised[1])
    # The first fit counted every one of its steps.
    assert tuner.report.train.steps == 11


def test_one_tuner_in_two_threads_loops_is_refused_with_a_clear_error():
    tuner = kpt.PipelineTuner(verbose=0, profile="off")
    step = tuner.instrument(lambda x, y: x)
    started = threading.Event()

    def first():
        for x, y in tuner.iterate(slow_source(12, 0.05).batch(1)):
            step(x, y)
            started.set()

    def second():
        started.wait(30)
        for x, y in cached_source(8).batch(4):
            step(x, y)

    raised = _in_threads(first, second)
    assert raised[0] is None
    assert isinstance(raised[1], RuntimeError) and "another thread" in str(raised[1])
    assert tuner.close().train.steps == 11


def test_evaluate_after_fit_keeps_the_fits_report_where_report_and_check_look(tmp_path):
    tuner = kpt.PipelineTuner(log_dir=tmp_path, verbose=0, profile="off")
    model = tiny_model(compute_delay_s=0.1)
    model.fit(cached_source(32).batch(4), epochs=2, callbacks=[tuner], verbose=0)
    fitted = tuner.report
    model.evaluate(cached_source(16).batch(4), callbacks=[tuner], verbose=0)
    root = kpt.Report.from_json((tmp_path / "report.json").read_text())
    # The fit's report, not the evaluate's (which has no training steps).
    assert root.train.steps == 15 and root.verdict == fitted.verdict
    assert root.verdict != kpt.Verdict.UNKNOWN
    assert root.run == "pipeline_tuner"
    assert [(entry.run, entry.kind, entry.finished) for entry in root.runs] == [
        ("pipeline_tuner", "fit", True),
        ("pipeline_tuner/evaluate-2", "evaluate", True),
    ]
    # The evaluate run's own report sits in its own folder.
    own_path = tmp_path / "pipeline_tuner" / "evaluate-2" / "report.json"
    own = kpt.Report.from_json(own_path.read_text())
    assert own.validation.steps == 3 and not own.train.steps
    check = subprocess.run(
        [sys.executable, "-m", "keras_pipeline_tuner.cli", "check", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    report = subprocess.run(
        [sys.executable, "-m", "keras_pipeline_tuner.cli", "report", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert report.returncode == 0
    assert "This log dir holds 2 runs" in report.stdout


TWO_PROCESSES = """
import sys, time
import keras_pipeline_tuner as kpt
from tests.helpers.paths import REPO_ROOT
from tests.helpers.training_data import cached_source, tiny_model
tuner = kpt.PipelineTuner(log_dir=sys.argv[1], verbose=0, profile="off")
# Both fits overlap: each waits for the other's run folder to be claimed.
model = tiny_model(compute_delay_s=0.1)
model.fit(cached_source(40).batch(4), epochs=1, callbacks=[tuner], verbose=0)
print(tuner.report.run)
"""


@pytest.mark.multiprocess
def test_two_processes_on_one_log_dir_each_get_a_run_of_their_own(tmp_path):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(REPO_ROOT))
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", TWO_PROCESSES, str(tmp_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=REPO_ROOT,
        )
        for _ in range(2)
    ]
    outputs = [process.communicate(timeout=300) for process in processes]
    assert all(process.returncode == 0 for process in processes), outputs
    runs = sorted(out.strip().splitlines()[-1] for out, _ in outputs)
    # One took the log dir's first run; the other, finding it live, a folder
    # named with its host and process id.
    assert runs[0] == "pipeline_tuner"
    assert runs[1].startswith("pipeline_tuner/fit-2-"), runs
    pids = {str(process.pid) for process in processes}
    assert runs[1].rsplit("-", 1)[1] in pids
    root = kpt.Report.from_json((tmp_path / "report.json").read_text())
    assert sorted(entry.run for entry in root.runs) == runs
    assert len({entry.process for entry in root.runs}) == 2
    for run in runs:
        own = kpt.Report.from_json((tmp_path / run / "report.json").read_text())
        assert own.train.steps == 9
