"""What a fit writes to log_dir, read back with TensorBoard's own event reader."""

import json
import logging
import os

import numpy as np
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing import event_accumulator

import keras_pipeline_tuner as kpt
from keras_pipeline_tuner._util.feature_guard import FeatureGuard
from keras_pipeline_tuner.outputs import tensorboard as tensorboard_sink
from keras_pipeline_tuner.outputs import timeline_image
from keras_pipeline_tuner.outputs import trace as trace_export
from keras_pipeline_tuner.outputs.markdown import render_markdown
from keras_pipeline_tuner.profiling.evidence import trace_events
from keras_pipeline_tuner.timing.step_clock import StepClock
from tests.helpers import advised_fits
from tests.helpers.training_data import cached_source
from tests.helpers.training_data import tiny_model


def accumulator(run_dir) -> event_accumulator.EventAccumulator:
    # Keep every event: the default size guidance samples them.
    keep_all = {event_accumulator.TENSORS: 0, event_accumulator.SCALARS: 0}
    events = event_accumulator.EventAccumulator(str(run_dir), size_guidance=keep_all)
    events.Reload()
    return events


def values(events, tag):
    return [(e.step, tf.make_ndarray(e.tensor_proto)) for e in events.Tensors(tag)]


def texts(events):
    rows = values(events, tensorboard_sink.REPORT_TAG)
    return [(step, value.item().decode()) for step, value in rows]


def decoded_timeline(events) -> np.ndarray:
    # An image summary holds [width, height, png bytes].
    step, image = values(events, tensorboard_sink.TIMELINE_TAG)[-1]
    return tf.io.decode_png(image[2], channels=3).numpy()


def colour_share(image: np.ndarray, colour: str) -> float:
    rgb = np.array([int(colour[i : i + 2], 16) for i in (1, 3, 5)])
    return float(np.mean(np.abs(image.astype(int) - rgb).sum(axis=-1) < 30))


@pytest.fixture(scope="module")
def input_bound(tmp_path_factory):
    return advised_fits.input_bound_run(tmp_path_factory)


@pytest.fixture(scope="module")
def compute_bound(tmp_path_factory):
    return advised_fits.compute_bound_run(tmp_path_factory)


def test_scalars_are_the_step_clock_per_step(input_bound):
    events = accumulator(input_bound.log_dir / tensorboard_sink.RUN)
    tags = set(events.Tags()["tensors"])
    assert set(tensorboard_sink.SCALAR_TAGS) <= tags
    assert all(tag.startswith("input_pipeline/") for tag in tags)
    steps = input_bound.report.train.steps
    columns = {}
    for tag in tensorboard_sink.SCALAR_TAGS:
        assert events.SummaryMetadata(tag).plugin_data.plugin_name == "scalars"
        rows = values(events, tag)
        assert [step for step, _ in rows] == list(range(1, steps + 1)), tag
        columns[tag.split("/")[1]] = np.array([float(value) for _, value in rows])
    # Each py_function call sleeps 30 ms, a batch: most of a step is waiting
    # (TensorFlow's prefetch overlaps the next batch with the step, and with
    # Keras' loop between steps, which a busy machine stretches to several
    # ms: a step itself read 26 ms there).
    wait = columns["input_wait_ms"]
    delay_ms = advised_fits.MAP_DELAY_S * 1e3
    assert np.median(wait + columns["compute_ms"]) >= 0.6 * delay_ms
    assert 0.5 * delay_ms <= np.median(wait) < 20 * delay_ms
    np.testing.assert_allclose(
        columns["step_ms"], wait + columns["compute_ms"], rtol=1e-5, atol=1e-3
    )
    fraction = columns["input_fraction"]
    assert np.all((fraction >= 0) & (fraction <= 1))
    assert np.median(fraction) > 0.8
    assert np.median(wait) == pytest.approx(input_bound.report.train.input_wait.median_ms, rel=1e-4)


def test_text_tab_holds_the_report_as_markdown(input_bound):
    events = accumulator(input_bound.log_dir / tensorboard_sink.RUN)
    step, text = texts(events)[-1]
    assert step == input_bound.report.train.steps
    assert text.startswith("## Input pipeline: highly input-bound")
    assert f"**{input_bound.report.input_fraction * 100:.1f} %**" in text
    assert "| train |" in text
    assert "### Recommendations" in text
    top = input_bound.report.recommendations[0]
    assert f"#### 1. {top.title}" in text.replace("\\_", "_")
    assert f"```python\n{top.fix}\n```" in text
    assert "### Profiler window" in text


def test_text_tab_is_updated_at_epoch_ends(compute_bound):
    events = accumulator(compute_bound.log_dir / tensorboard_sink.RUN)
    written = texts(events)
    steps = [step for step, _ in written]
    # The first epoch's end, the early verdict's, later epochs' ends while
    # their outputs stay within 1 % of training time, and the final report
    # (which adds the contention check's replay) at the last step.
    assert steps == sorted(steps) and len(set(steps)) >= len(steps) - 1, steps
    assert steps[-1] == compute_bound.report.train.steps, steps
    assert "after epoch 1" in written[0][1]
    assert written[-1][1].startswith("## Input pipeline: not input-bound")
    assert "The input pipeline is not the bottleneck" in written[-1][1]


def test_images_tab_holds_a_timeline_of_waits_and_compute(input_bound, compute_bound):
    waiting = decoded_timeline(accumulator(input_bound.log_dir / tensorboard_sink.RUN))
    computing = decoded_timeline(accumulator(compute_bound.log_dir / tensorboard_sink.RUN))
    assert waiting.shape[1] == computing.shape[1] == 1000
    # With a profile, a second panel: one row per tf.data stage.
    assert waiting.shape[0] > computing.shape[0]
    wait, compute = timeline_image.WAIT_COLOUR, timeline_image.COMPUTE_COLOUR
    assert colour_share(waiting, wait) > 3 * colour_share(waiting, compute)
    assert colour_share(computing, compute) > 3 * colour_share(computing, wait)
    # The latest timeline is also a plain PNG file in the run.
    png = (input_bound.log_dir / tensorboard_sink.RUN / tensorboard_sink.TIMELINE_FILENAME)
    np.testing.assert_array_equal(tf.io.decode_png(png.read_bytes(), channels=3).numpy(), waiting)


def test_keras_tensorboard_callback_keeps_its_own_runs(input_bound):
    train = accumulator(input_bound.log_dir / "train")
    assert "epoch_loss" in train.Tags()["tensors"]
    assert not any(tag.startswith("input_pipeline/") for tag in train.Tags()["tensors"])


def test_profile_capture_sits_in_the_run(input_bound):
    profile = input_bound.report.profile
    run_dir = input_bound.log_dir / tensorboard_sink.RUN
    captures = list((run_dir / "plugins" / "profile").glob("*/*.xplane.pb"))
    assert [str(path) for path in captures] == [profile.xplane_path]


def test_profile_rows_name_the_bottleneck_stage(input_bound):
    profile = input_bound.report.profile
    stages = {it.iterator: it.stage for it in profile.iterators if not it.waiting}
    rows = timeline_image.profile_rows(trace_events(profile.xplane_path), stages)
    labels = [row.label for row in rows]
    assert labels[:2] == ["train step", "get_next"]
    assert profile.bottleneck in labels
    # Each profiled step waits while the map works for it: bars of about the
    # map's 30 ms sleep (17-33 ms, median 22, beside two busy loops).
    map_row = rows[labels.index(profile.bottleneck)]
    durations = [duration for _, duration in map_row.spans_ms]
    assert np.median(durations) >= 0.5 * advised_fits.MAP_DELAY_S * 1e3


def test_chrome_trace_has_a_slice_per_wait_and_compute(input_bound):
    trace = json.loads((input_bound.log_dir / trace_export.TRACE_FILENAME).read_text())
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    waits = [e for e in slices if e["name"] == "input wait"]
    computes = [e for e in slices if e["name"] == "compute"]
    steps = input_bound.report.train.steps
    assert len(waits) == len(computes) == steps
    assert [e["args"]["step"] for e in waits] == list(range(1, steps + 1))
    median_wait_ms = np.median([e["dur"] for e in waits]) / 1e3
    assert median_wait_ms == pytest.approx(input_bound.report.train.input_wait.median_ms, rel=1e-3)
    for wait, compute in zip(waits, computes):
        assert compute["ts"] == pytest.approx(wait["ts"] + wait["dur"], abs=0.01)
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M"}
    assert "training steps" in names


def test_report_json_round_trips_with_its_recommendations(input_bound):
    stored = kpt.Report.from_json((input_bound.log_dir / "report.json").read_text())
    assert stored.recommendations == input_bound.report.recommendations
    assert stored.recommendations[0].expected_gain.speedup > 1


def test_scalars_are_written_before_the_ring_drops_them(tmp_path):
    clock = StepClock(capacity=50)
    sink = tensorboard_sink.TensorBoardSink(str(tmp_path), FeatureGuard(), flush_every=40)
    clock.begin_epoch(0)
    clock.record_first_step("train", 0.5, np.array([[0.0, 0.2, 0.3]]))
    for step in range(1, 131):
        start = float(step)
        clock.record("train", np.array([[start, start + 0.003, start + 0.004]]))
        sink.step_ended(clock)
    sink.finish(clock, kpt.Report())
    events = accumulator(tmp_path / tensorboard_sink.RUN)
    rows = values(events, "input_pipeline/input_wait_ms")
    assert [step for step, _ in rows] == list(range(1, 131))
    assert all(float(value) == pytest.approx(3.0, abs=1e-3) for _, value in rows)
    assert sink.guard.failures == {}


def test_scalars_written_a_few_at_a_time_reach_tensorboard_once_each_in_one_file(tmp_path):
    # 400 steps, written 40 at a time: the first 250 one by one, then (past
    # what tracing the compiled writer costs) compiled; every step once, in one file.
    clock = StepClock()
    sink = tensorboard_sink.TensorBoardSink(str(tmp_path), FeatureGuard(), flush_every=40)
    clock.begin_epoch(0)
    waits = np.arange(1, 401) * 1e-5
    _record_steps(clock, sink, waits, np.full(waits.size, 2e-3), chunk=1)
    sink.finish(clock, kpt.Report())
    run_dir = tmp_path / tensorboard_sink.RUN
    events = accumulator(run_dir)
    rows = values(events, "input_pipeline/input_wait_ms")
    assert [step for step, _ in rows] == list(range(1, 401))
    np.testing.assert_allclose([float(value) for _, value in rows], waits * 1e3, rtol=1e-5)
    assert len([name for name in os.listdir(run_dir) if "tfevents" in name]) == 1
    assert sink.guard.failures == {}


def test_bulk_scalars_match_the_clock(tmp_path):
    # Enough rows at once for the compiled writer.
    clock = StepClock()
    clock.begin_epoch(0)
    rng = np.random.default_rng(0)
    wait, compute = rng.uniform(0.001, 0.05, 450), rng.uniform(0.001, 0.05, 450)
    start = np.cumsum(wait + compute + 0.001)
    clock.record("train", np.stack([start, start + wait, start + wait + compute], axis=1))
    sink = tensorboard_sink.TensorBoardSink(str(tmp_path), FeatureGuard())
    assert sink.write_scalars(clock) == 450
    assert sink.write_scalars(clock) == 0  # nothing new
    sink.flush()
    events = accumulator(tmp_path / tensorboard_sink.RUN)
    written = np.array([float(v) for _, v in values(events, "input_pipeline/input_wait_ms")])
    np.testing.assert_allclose(written, clock.steps("train")["wait"] * 1e3, rtol=1e-6)
    fraction = np.array([float(v) for _, v in values(events, "input_pipeline/input_fraction")])
    np.testing.assert_allclose(fraction, wait / (wait + compute), rtol=1e-4)
    for tag in tensorboard_sink.SCALAR_TAGS:
        assert events.SummaryMetadata(tag).plugin_data.plugin_name == "scalars"


def test_many_fits_with_a_log_dir_do_not_warn_of_retracing(tmp_path, caplog):
    # A writer per fit, each compiled writer traced once: past five in one
    # process TensorFlow would warn of frequent retracing, as if the user's
    # code retraced.
    clock = StepClock()
    clock.begin_epoch(0)
    start = np.arange(450) * 0.01
    clock.record("train", np.stack([start, start + 0.001, start + 0.003], axis=1))
    with caplog.at_level(logging.WARNING):
        for fit in range(7):
            sink = tensorboard_sink.TensorBoardSink(str(tmp_path / str(fit)), FeatureGuard())
            assert sink.write_scalars(clock) == 450
            sink.flush()
    assert not [r for r in caplog.records if "retracing" in r.getMessage()]
    # The filter drops that warning about the tuner's writer only.
    other = logging.LogRecord("tensorflow", logging.WARNING, __file__, 1, "5 out of the last "
                              "6 calls to <function user_step> triggered tf.function "
                              "retracing.", None, None)
    assert all(f.filter(other) for f in logging.getLogger("tensorflow").filters)


def test_markdown_escapes_user_text():
    report = kpt.Report(notes=["map_fn *really* [slow] | here"])
    text = render_markdown(report)
    assert r"map\_fn \*really\* \[slow\] \| here" in text
    assert "None: no evidence points at a change." in text


def test_timeline_png_without_steps_says_so():
    png = timeline_image.timeline_png([], "")
    image = tf.io.decode_png(png).numpy()
    assert image.shape[0] > 50 and image.shape[1] == 1000


def test_a_failing_output_turns_off_alone(tmp_path, monkeypatch):
    guard = FeatureGuard()
    sink = tensorboard_sink.TensorBoardSink(str(tmp_path), guard)
    clock = StepClock()
    clock.begin_epoch(0)
    clock.record("train", np.array([[0.0, 0.01, 0.02], [0.02, 0.03, 0.04]]))

    def broken(*args, **kwargs):
        raise RuntimeError("no fonts")

    monkeypatch.setattr(timeline_image, "timeline_png", broken)
    sink.finish(clock, kpt.Report())
    assert set(guard.failures) == {tensorboard_sink.TIMELINE}
    events = accumulator(tmp_path / tensorboard_sink.RUN)
    assert len(values(events, "input_pipeline/step_ms")) == 2
    assert len(texts(events)) == 1


def test_a_decorator_only_loop_over_two_epochs_writes_no_nan_scalar(tmp_path):
    # The first step of each epoch has no observed wait (nothing says when it
    # began): it gets a step time, and no NaN wait, compute or fraction.
    tuner = kpt.PipelineTuner(log_dir=tmp_path, verbose=0, profile="off")

    @tuner.instrument
    def train_step(x):
        return tf.reduce_sum(x * 2.0)

    for _ in range(2):
        for batch in tf.data.Dataset.range(6).map(lambda i: tf.cast(i, tf.float32)).batch(2):
            train_step(batch)
        tuner.end_epoch()
    report = tuner.close()
    assert report.measurement == "decorator"
    events = accumulator(tmp_path / tensorboard_sink.RUN)
    tags = events.Tags()["tensors"]
    assert f"{tensorboard_sink.TAG_PREFIX}/step_ms" in tags
    written = 0
    for tag in (*tensorboard_sink.SCALAR_TAGS, tensorboard_sink.WHOLE_STEP_TAG):
        if tag not in tags:
            continue
        numbers = np.array([float(value) for _, value in values(events, tag)])
        written += len(numbers)
        assert np.isfinite(numbers).all(), (tag, numbers)
    # Every step after the run's first has its step time written, both epochs.
    assert len(values(events, f"{tensorboard_sink.TAG_PREFIX}/step_ms")) == report.train.steps
    assert written > report.train.steps
def _record_steps(clock, sink, waits, computes, chunk):
    """Records steps of known wait and compute, `chunk` rows a call, as fit hands them over."""
    start = 0.0
    for first in range(0, waits.size, chunk):
        wait, compute = waits[first : first + chunk], computes[first : first + chunk]
        ends = start + np.cumsum(wait + compute)
        begins = ends - wait - compute
        clock.record("train", np.stack([begins, begins + wait, ends], axis=1))
        sink.step_ended(clock, steps=int(wait.size))
        start = float(ends[-1])


def test_long_runs_are_summarised_in_blocks_of_steps(tmp_path):
    # A ring smaller than a block, flushes every 7 steps: blocks span flushes and
    # outlive the rows they were summed from.
    clock = StepClock(capacity=30)
    clock.begin_epoch(0)
    clock.record_first_step("train", 0.5, np.array([[0.0, 0.2, 0.3]]))
    sink = tensorboard_sink.TensorBoardSink(
        str(tmp_path), FeatureGuard(), flush_every=7, full_steps=10
    )
    numbers = np.arange(1, 251)
    waits, computes = numbers * 1e-4, np.full(numbers.size, 2e-3)
    _record_steps(clock, sink, waits, computes, chunk=3)
    sink.finish(clock, kpt.Report())
    events = accumulator(tmp_path / tensorboard_sink.RUN)
    rows = values(events, "input_pipeline/input_wait_ms")
    # Every step to 10, blocks of 10 to 100, of 100 after; the last block is
    # partial at the end of the fit.
    expected = list(range(1, 11)) + list(range(20, 101, 10)) + [200, 250]
    assert [step for step, _ in rows] == expected
    bounds = [0] + expected
    means = [numbers[lo:hi].mean() * 0.1 for lo, hi in zip(bounds, bounds[1:])]
    np.testing.assert_allclose([float(v) for _, v in rows], means, rtol=1e-5)
    fraction = [float(v) for _, v in values(events, "input_pipeline/input_fraction")]
    totals = [
        waits[lo:hi].sum() / (waits[lo:hi] + computes[lo:hi]).sum()
        for lo, hi in zip(bounds, bounds[1:])
    ]
    np.testing.assert_allclose(fraction, totals, rtol=1e-5)
    assert sink.guard.failures == {}


def test_event_file_stays_small_on_a_long_run_of_tiny_steps(tmp_path):
    clock = StepClock()
    clock.begin_epoch(0)
    sink = tensorboard_sink.TensorBoardSink(str(tmp_path), FeatureGuard())
    steps = 100_000
    waits = np.full(steps, 2e-5)
    _record_steps(clock, sink, waits, np.full(steps, 1e-4), chunk=500)
    sink.finish(clock, kpt.Report())
    events = accumulator(tmp_path / tensorboard_sink.RUN)
    written = [step for step, _ in values(events, "input_pipeline/step_ms")]
    # 1000 single steps, 900 blocks of 10, 900 blocks of 100: not 100 000 points.
    assert len(written) == 2800 and written[-1] == steps
    size = sum(path.stat().st_size for path in (tmp_path / tensorboard_sink.RUN).glob("*tfevents*"))
    assert size < 2_000_000  # one point a step would be about 34 MB


def test_each_fit_and_evaluate_gets_its_own_numbered_run(tmp_path):
    tuner = kpt.PipelineTuner(log_dir=tmp_path, verbose=0, profile="off", check_contention=False)
    model = tiny_model()
    model.fit(cached_source(24).batch(4), epochs=1, callbacks=[tuner], verbose=0)
    model.fit(cached_source(40).batch(4), epochs=1, callbacks=[tuner], verbose=0)
    model.evaluate(cached_source(16).batch(4), callbacks=[tuner], verbose=0)
    root = tmp_path / tensorboard_sink.RUN
    assert sorted(p.name for p in root.iterdir() if p.is_dir() and p.name != "plugins") == [
        "evaluate-3",
        "fit-2",
    ]
    first = [step for step, _ in values(accumulator(root), "input_pipeline/step_ms")]
    second = [step for step, _ in values(accumulator(root / "fit-2"), "input_pipeline/step_ms")]
    # Each run counts its own steps from 1: none restarts inside another.
    assert first == list(range(1, 6)) and second == list(range(1, 10))
    # The log dir's report is its latest training run's; each run has its own.
    stored = kpt.Report.from_json((tmp_path / "report.json").read_text())
    assert stored.run == "pipeline_tuner/fit-2" and stored.train.steps == 9
    assert [entry.run for entry in stored.runs] == [
        "pipeline_tuner", "pipeline_tuner/fit-2", "pipeline_tuner/evaluate-3"
    ]
    evaluated = kpt.Report.from_json((root / "evaluate-3" / "report.json").read_text())
    assert evaluated.run == "pipeline_tuner/evaluate-3"
    assert evaluated.validation is not None and evaluated.validation.steps == 3
    assert tuner.report.run == "pipeline_tuner/evaluate-3"


def test_short_epochs_write_their_outputs_within_a_share_of_training(tmp_path):
    # Epochs of a few milliseconds: writing the report, the Text tab and the
    # dashboard after each (tens of ms) would cost more than the epochs.
    tuner = kpt.PipelineTuner(log_dir=tmp_path, verbose=0, profile="off")
    tiny_model().fit(cached_source(20).batch(4), epochs=12, callbacks=[tuner], verbose=0)
    epoch_texts = [
        text for _, text in texts(accumulator(tmp_path / tensorboard_sink.RUN))
        if "after epoch" in text
    ]
    assert "after epoch 1" in epoch_texts[0]
    assert len(epoch_texts) < 12 // 2, [text.splitlines()[0] for text in epoch_texts]
    # The final outputs hold every step all the same.
    report = kpt.Report.from_json((tmp_path / "report.json").read_text())
    assert report.train.steps == tuner.report.train.steps == 12 * 5 - 1
