"""What the tuner writes for the "Input pipeline" tab, read back as the tab reads it."""

import json
import logging

import keras
import numpy as np
import pytest
from tensorboard import context
from tensorboard.backend.event_processing import data_provider
from tensorboard.backend.event_processing import plugin_event_multiplexer

import keras_pipeline_tuner as kpt
from keras_pipeline_tuner._util.feature_guard import FeatureGuard
from keras_pipeline_tuner.outputs import tensorboard as tensorboard_sink
from keras_pipeline_tuner.outputs.dashboard import run_data
from keras_pipeline_tuner.outputs.dashboard import summaries
from keras_pipeline_tuner.timing.step_clock import StepClock
from tests.helpers.tensorboard_app import wsgi_client
from tests.helpers.training_data import slow_source
from tests.helpers.training_data import tiny_model

ROUTE = f"/data/plugin/{summaries.PLUGIN_NAME}"
CONTEXT = context.RequestContext()


def reader(log_dir) -> run_data.RunData:
    # TensorBoard's own reader with its defaults: a few samples per tag.
    multiplexer = plugin_event_multiplexer.EventMultiplexer(
        tensor_size_guidance={summaries.PLUGIN_NAME: 10}
    )
    multiplexer.AddRunsFromDirectory(str(log_dir))
    multiplexer.Reload()
    return run_data.RunData(data_provider.MultiplexerDataProvider(multiplexer, str(log_dir)))


def synthetic_steps(clock: StepClock, first: int, count: int) -> np.ndarray:
    """Records `count` steps whose wait is 1 ms times their number modulo 7."""
    numbers = np.arange(first, first + count, dtype=np.float64)
    start = numbers * 0.1
    wait = (numbers % 7) * 1e-3
    rows = np.stack([start, start + wait, start + wait + 0.002], axis=1)
    clock.record("train", rows)
    return numbers


def test_every_step_counts_once_however_long_the_run(tmp_path):
    # A ring far smaller than the run, and more steps than blocks hold: TensorBoard
    # keeps 10 samples of each tag, and every step must still count once: as a
    # row of its own up to `full_steps`, then in its block's mean (the event
    # file stays bounded, as for the scalars).
    clock = StepClock(capacity=300)
    sink = tensorboard_sink.TensorBoardSink(str(tmp_path), FeatureGuard(), flush_every=120)
    written = []
    for epoch in range(3):
        clock.begin_epoch(epoch)
        for _ in range(9):
            written.append(synthetic_steps(clock, len(np.concatenate(written or [[]])) + 1, 100))
            sink.step_ended(clock, 100)
        clock.end_epoch("train", epoch)
        sink.epoch_ended(clock, kpt.Report())
    sink.finish(clock, kpt.Report())
    assert sink.guard.failures == {}
    numbers = np.concatenate(written)
    rows, source = reader(tmp_path).steps(CONTEXT, "", summaries.RUN)
    assert source == "summaries"
    full = tensorboard_sink.FULL_RESOLUTION_STEPS
    points = np.r_[np.arange(1, full + 1), np.arange(full + 10, numbers.size + 1, 10)]
    assert rows[:, 0].tolist() == points.tolist()
    bounds = np.r_[0, points]
    waits = (numbers % 7) * 1e-3
    means = [waits[lo:hi].mean() for lo, hi in zip(bounds[:-1], bounds[1:])]
    np.testing.assert_allclose(rows[:, 3], means, atol=1e-9)
    np.testing.assert_allclose(rows[:, 4], 0.002, atol=1e-9)
    epochs = [int(numbers[hi - 1] - 1) // 900 for hi in bounds[1:]]
    assert rows[:, 1].tolist() == epochs
    tags = reader(tmp_path).tagged_runs(CONTEXT, "")[summaries.RUN]
    blocks = sorted(tag for tag in tags if tag.startswith(summaries.STEPS_TAG_PREFIX))
    assert blocks == [summaries.steps_tag(block) for block in range(3)]


def test_the_tab_follows_a_running_fit(tmp_path):
    seen = {}

    class LookAtTheTab(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 1:
                client = wsgi_client(tmp_path)
                answer = client.get(f"{ROUTE}/steps?run={summaries.RUN}")
                seen["steps"] = json.loads(answer.get_data())
                answer = client.get(f"{ROUTE}/run?run={summaries.RUN}")
                seen["run"] = json.loads(answer.get_data())
                seen["runs"] = json.loads(client.get(f"{ROUTE}/runs").get_data())["runs"]

    tuner = kpt.PipelineTuner(log_dir=tmp_path, verbose=0, profile="off")
    tiny_model().fit(
        slow_source(12, 0.01).batch(1).repeat(2),
        steps_per_epoch=12,
        epochs=2,
        callbacks=[tuner, LookAtTheTab()],
        verbose=0,
    )
    # After the first epoch, before the second: its steps and its report.
    assert seen["steps"]["step"] == list(range(1, 12))
    assert seen["run"]["report"]["epochs"][0]["epoch"] == 0
    assert seen["run"]["report"]["verdict"] == "highly input-bound"
    assert seen["runs"][0]["last_step"] == 11
    rows, _ = reader(tmp_path).steps(CONTEXT, "", summaries.RUN)
    assert rows[:, 0].tolist() == list(range(1, 24))


def test_a_failing_dashboard_write_turns_off_alone(tmp_path, monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(summaries, "write_step_block", broken)
    guard = FeatureGuard()
    sink = tensorboard_sink.TensorBoardSink(str(tmp_path), guard)
    clock = StepClock()
    clock.begin_epoch(0)
    synthetic_steps(clock, 1, 5)
    with caplog.at_level(logging.WARNING, logger="keras_pipeline_tuner"):
        sink.finish(clock, kpt.Report())
        sink.finish(clock, kpt.Report())
    assert set(guard.failures) == {tensorboard_sink.DASHBOARD}
    assert len(caplog.records) == 1 and "disk full" in caplog.records[0].getMessage()
    # The fallback outputs are all there; the dashboard reads no half-written run.
    data = reader(tmp_path)
    assert data.tagged_runs(CONTEXT, "") == {}
    rows, source = data.steps(CONTEXT, "", summaries.RUN)
    assert source == "scalars" and rows[:, 0].tolist() == [1, 2, 3, 4, 5]


def test_write_tune_result_refuses_what_tune_did_not_return(tmp_path):
    with pytest.raises(TypeError, match=r"TuneResult that kpt.tune returned.*result = kpt.tune"):
        kpt.write_tune_result(tmp_path, {"ratio": 2.0})
