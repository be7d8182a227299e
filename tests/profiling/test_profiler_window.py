"""The TF Profiler window: real captures, converted by xprof, on pipelines with known delays."""

import argparse
import glob
import json
import logging
import os
import shutil
import statistics
import tempfile
import time

import keras
import pytest
import tensorflow as tf
from tensorboard.plugins import base_plugin
from xprof import profile_plugin

import keras_pipeline_tuner as kpt
from keras_pipeline_tuner.advice import advisor
from keras_pipeline_tuner.profiling import evidence as profile_evidence
from keras_pipeline_tuner.profiling import window as profiler_window
from keras_pipeline_tuner.profiling.capture import PROFILE_RUN
from tests.helpers.training_data import cached_source
from tests.helpers.training_data import slow_source
from tests.helpers.training_data import tiny_model

GENERATOR_DELAY_S = 0.015
MAP_DELAY_S = 0.02
# The compute-bound jobs' step sleeps this long: a fetch of cached batches that
# a busy machine stretches to a few milliseconds stays far under 5 % of it.
COMPUTE_DELAY_S = 0.1
# Per element, two a batch, where the user's TensorBoard callback profiles.
USERS_WINDOW_DELAY_S = 0.05


def load_image(x, y):
    """An expensive map function: a py_function that sleeps `MAP_DELAY_S` per element."""

    def slow_identity(value):
        time.sleep(MAP_DELAY_S)
        return value

    x = tf.py_function(slow_identity, [x], tf.float32)
    x.set_shape((8,))
    return x, y


def fit(tuner, dataset, steps, model=None, epochs=1, callbacks=()):
    model = model or tiny_model()
    history = model.fit(
        dataset,
        epochs=epochs,
        steps_per_epoch=steps,
        callbacks=[*callbacks, tuner],
        verbose=0,
    )
    # The window's conversion may still run when fit returns.
    return tuner.wait_for_profile(), history


def captures_under(directory) -> list:
    return glob.glob(os.path.join(directory, "**", "plugins", "profile", "*", "*.xplane.pb"),
                     recursive=True)


def assert_no_profiler_left_running(tmp_path):
    # The TF Profiler is process-wide: a session left open would block the next one.
    tf.profiler.experimental.start(str(tmp_path / "after"))
    tf.profiler.experimental.stop()


@pytest.fixture(scope="module")
def generator_run(tmp_path_factory):
    """auto: a slow generator with no prefetch, profiled for 12 steps after the warm-up."""
    log_dir = tmp_path_factory.mktemp("generator")
    tuner = kpt.PipelineTuner(log_dir=log_dir, verbose=0, profile_steps=12)
    report, _ = fit(tuner, slow_source(200, GENERATOR_DELAY_S).batch(2), steps=26)
    return report, log_dir


def test_slow_generator_is_input_bound_and_the_generator_is_the_bottleneck(generator_run):
    report, _ = generator_run
    evidence = report.profile
    assert evidence is not None, report.notes
    assert evidence.source == profile_evidence.ANALYZER
    assert evidence.trigger.startswith("auto")
    assert evidence.first_step == 10 and evidence.cost.steps == 12
    assert len(evidence.steps) >= 10
    assert evidence.input_fraction > 0.5
    assert "input-bound" in evidence.conclusion
    # Two elements per batch, each generated after a 15 ms sleep.
    assert statistics.median(step.input_ms for step in evidence.steps) > 20
    assert evidence.bottleneck_iterator.endswith("::Generator")
    assert evidence.bottleneck == "from_generator()"
    generator = [it for it in evidence.iterators if it.iterator == evidence.bottleneck_iterator]
    assert generator[0].self_share > 0.9  # of the pipeline's work
    prefetch = [it for it in evidence.iterators if it.iterator.endswith("::Prefetch")]
    assert prefetch and all(it.waiting for it in prefetch)
    assert evidence.input_fraction >= 0.2 and report.verdict == kpt.Verdict.HIGHLY_INPUT_BOUND


def test_cost_is_stated(generator_run):
    evidence = generator_run[0].profile
    assert os.path.getsize(evidence.xplane_path) == evidence.cost.file_bytes > 0
    assert 0 < evidence.cost.conversion_s < 60
    assert evidence.cost.window_s > evidence.cost.start_s + evidence.cost.stop_s > 0


def test_capture_is_where_tensorboards_profile_plugin_looks(generator_run):
    report, log_dir = generator_run
    run_dir = report.profile.run_dir
    assert os.path.dirname(run_dir) == os.path.join(log_dir, PROFILE_RUN, "plugins", "profile")
    assert report.profile.xplane_path.startswith(run_dir + os.sep)
    assert report.profile.xplane_path.endswith(".xplane.pb")
    context = base_plugin.TBContext(
        logdir=str(log_dir), flags=argparse.Namespace(master_tpu_unsecure_channel="")
    )
    plugin = profile_plugin.ProfilePlugin(context)
    run = f"{PROFILE_RUN}/{os.path.basename(run_dir)}"
    assert run in list(plugin.generate_runs())
    assert "input_pipeline_analyzer" in plugin.generate_tools_of_run(run, run_dir)


def test_report_and_its_json_carry_the_evidence(generator_run):
    report, log_dir = generator_run
    assert kpt.Report.from_json(report.to_json()).profile == report.profile
    with open(os.path.join(log_dir, "report.json"), encoding="utf-8") as file:
        written = json.load(file)
    assert written["profile"]["bottleneck_iterator"] == report.profile.bottleneck_iterator
    assert report.profile.summary().startswith("slowest stage ")
    # The window's figures are of the steps it analysed: one range, in the report's figures.
    window = report.figures.window
    assert (window.first_step, window.last_step, window.steps) == report.profile.window_range()
    assert 10 <= window.first_step <= window.last_step <= 21


def test_trace_figures_agree_with_the_analyzer(generator_run):
    evidence = generator_run[0].profile
    steps = profile_evidence.trace_steps(profile_evidence.trace_events(evidence.xplane_path))
    assert len(steps) == evidence.cost.steps
    from_trace = sum(step.input_ms for step in steps) / sum(step.step_ms for step in steps)
    assert from_trace == pytest.approx(evidence.input_fraction, abs=0.1)


def test_sequential_py_function_map_is_named_by_its_function(tmp_path):
    tuner = kpt.PipelineTuner(log_dir=tmp_path, verbose=0, profile=(2, 12))
    report, _ = fit(tuner, cached_source(64).map(load_image).batch(2), steps=14)
    evidence = report.profile
    assert evidence.trigger == "requested: profile=(2, 12)"
    assert evidence.input_fraction > 0.5
    assert evidence.bottleneck == "map(load_image)"
    assert evidence.bottleneck_node is not None
    assert evidence.input_fraction >= 0.2 and report.verdict == kpt.Verdict.HIGHLY_INPUT_BOUND


def test_parallel_map_waiting_for_its_input_is_not_the_bottleneck(tmp_path):
    dataset = slow_source(200, GENERATOR_DELAY_S).map(
        lambda x, y: (x * 2.0, y), num_parallel_calls=2
    )
    tuner = kpt.PipelineTuner(log_dir=tmp_path, verbose=0, profile=(2, 12))
    report, _ = fit(tuner, dataset.batch(2), steps=14)
    evidence = report.profile
    # tf.data fuses the parallel map with the batch after it.
    parallel_map = [it for it in evidence.iterators if it.iterator.endswith("::MapAndBatch")]
    assert parallel_map and parallel_map[0].waiting
    assert parallel_map[0].stage == "map(<lambda>, num_parallel_calls=2)"
    assert evidence.bottleneck == "from_generator()"


def test_parallel_map_running_a_slow_function_is_the_bottleneck(tmp_path):
    tuner = kpt.PipelineTuner(log_dir=tmp_path, verbose=0, profile=(2, 12))
    dataset = cached_source(64).repeat().map(load_image, num_parallel_calls=2)
    report, _ = fit(tuner, dataset.batch(4), steps=14)
    evidence = report.profile
    assert evidence.bottleneck_iterator.endswith("::MapAndBatch")
    assert evidence.bottleneck == "map(load_image, num_parallel_calls=2)"
    assert evidence.input_fraction > 0.5


def test_auto_leaves_a_compute_bound_job_alone(tmp_path):
    tuner = kpt.PipelineTuner(log_dir=tmp_path, verbose=0)
    report, _ = fit(tuner, cached_source(64).batch(4).repeat(), steps=24,
                    model=tiny_model(compute_delay_s=COMPUTE_DELAY_S))
    assert report.verdict == kpt.Verdict.NOT_INPUT_BOUND
    assert report.profile is None
    assert captures_under(tmp_path) == []


def test_compute_bound_model_has_a_small_input_share(tmp_path):
    tuner = kpt.PipelineTuner(log_dir=tmp_path, verbose=0, profile=(2, 12))
    report, _ = fit(tuner, cached_source(64).batch(4).repeat(), steps=14,
                    model=tiny_model(compute_delay_s=COMPUTE_DELAY_S))
    evidence = report.profile
    assert evidence.source == profile_evidence.ANALYZER
    assert evidence.input_fraction < 0.05
    assert evidence.input_fraction < 0.05 and report.verdict == kpt.Verdict.NOT_INPUT_BOUND


def test_steps_per_execution_figures_come_from_the_trace(tmp_path):
    tuner = kpt.PipelineTuner(log_dir=tmp_path, verbose=0, profile=(4, 20))
    report, _ = fit(tuner, slow_source(200, GENERATOR_DELAY_S / 2).batch(2), steps=24,
                    model=tiny_model(steps_per_execution=4))
    evidence = report.profile
    assert evidence.source == profile_evidence.TRACE
    assert any("steps_per_execution > 1" in note for note in evidence.notes)
    assert len(evidence.steps) == 4  # one per call of four steps
    assert evidence.input_fraction > 0.5
    assert evidence.bottleneck == "from_generator()"
    assert evidence.input_fraction >= 0.2 and report.verdict == kpt.Verdict.HIGHLY_INPUT_BOUND


def _assert_users_capture_is_the_evidence(report, tensorboard_dir, tuner_dir, first, last):
    evidence = report.profile
    assert evidence is not None, report.notes
    assert evidence.trigger == (
        f"requested by the user: keras.callbacks.TensorBoard(profile_batch=({first}, {last}))"
    )
    assert evidence.xplane_path in captures_under(tensorboard_dir)
    assert not captures_under(tuner_dir)
    # Batches counted from 1 by Keras' callback are steps from 0 here.
    assert evidence.first_step == first - 1 and evidence.stop_step == last
    assert evidence.source == profile_evidence.ANALYZER  # it found the tuner's step markers
    assert len(evidence.steps) >= last - first  # the analyzer may drop an edge step
    # 100 ms of sleep a batch against a step of a few ms, profiled, on a busy
    # machine too (20 ms read 0.29 once, beside Keras' TensorBoard callback).
    assert evidence.input_fraction > 0.5
    assert any("the user asked for" in note for note in evidence.notes)


@pytest.mark.parametrize("users_first", [True, False])
def test_users_tensorboard_profile_wins_over_the_automatic_window(tmp_path, caplog, users_first):
    tensorboard_dir = tmp_path / "tensorboard"
    tensorboard = keras.callbacks.TensorBoard(log_dir=str(tensorboard_dir), profile_batch=(13, 16))
    # "auto" would open a window at step 10 on this input-bound job.
    tuner = kpt.PipelineTuner(log_dir=tmp_path / "tuner", verbose=0)
    model = tiny_model()
    callbacks = [tensorboard, tuner] if users_first else [tuner, tensorboard]
    with caplog.at_level(logging.WARNING):
        history = model.fit(
            slow_source(100, USERS_WINDOW_DELAY_S).batch(2), epochs=1, steps_per_epoch=20,
            callbacks=callbacks, verbose=0,
        )
    assert len(history.history["loss"]) == 1
    assert not [r for r in caplog.records if "profiler" in r.getMessage().lower()]
    _assert_users_capture_is_the_evidence(
        tuner.wait_for_profile(), tensorboard_dir, tmp_path / "tuner", 13, 16
    )
    assert_no_profiler_left_running(tmp_path)


def test_users_tensorboard_profile_wins_over_an_overlapping_requested_window(tmp_path, caplog):
    tensorboard_dir = tmp_path / "tensorboard"
    tensorboard = keras.callbacks.TensorBoard(log_dir=str(tensorboard_dir), profile_batch=(5, 9))
    tuner = kpt.PipelineTuner(log_dir=tmp_path / "tuner", verbose=0, profile=(1, 12))
    with caplog.at_level(logging.WARNING):
        report, history = fit(tuner, slow_source(100, USERS_WINDOW_DELAY_S).batch(2), steps=14,
                              callbacks=[tensorboard])
    assert len(history.history["loss"]) == 1
    assert not [r for r in caplog.records if "profiler" in r.getMessage().lower()]
    _assert_users_capture_is_the_evidence(report, tensorboard_dir, tmp_path / "tuner", 5, 9)
    assert any("profile=(1, 12)) was not opened" in note for note in report.notes)
    assert_no_profiler_left_running(tmp_path)


def test_users_tensorboard_profile_apart_from_the_requested_window(tmp_path):
    tensorboard_dir = tmp_path / "tensorboard"
    tensorboard = keras.callbacks.TensorBoard(log_dir=str(tensorboard_dir), profile_batch=(10, 12))
    tuner = kpt.PipelineTuner(log_dir=tmp_path / "tuner", verbose=0, profile=(1, 5))
    report, _ = fit(tuner, slow_source(100, 0.005).batch(2), steps=14, callbacks=[tensorboard])
    # Both windows ran, one after the other; the tuner's own is its evidence.
    assert report.profile.trigger == "requested: profile=(1, 5)"
    assert captures_under(tmp_path / "tuner") and captures_under(tensorboard_dir)
    assert_no_profiler_left_running(tmp_path)


def test_captures_in_the_same_second_do_not_collide(tmp_path):
    # Occupy the run folders the TF Profiler would name for the coming minute.
    profile_dir = tmp_path / PROFILE_RUN / "plugins" / "profile"
    now = time.time()
    taken = set()
    for second in range(-2, 60):
        for clock in (time.localtime, time.gmtime):
            taken.add(time.strftime("%Y_%m_%d_%H_%M_%S", clock(now + second)))
    for name in taken:
        (profile_dir / name).mkdir(parents=True)
        (profile_dir / name / "earlier.xplane.pb").write_bytes(b"earlier capture")
    tuner = kpt.PipelineTuner(log_dir=tmp_path, verbose=0, profile=(1, 3))
    report, _ = fit(tuner, slow_source(20, 0.002).batch(2), steps=4)
    run = os.path.basename(report.profile.run_dir)
    assert run not in taken and run.rsplit("_", 1)[0] in taken
    for name in taken:
        assert os.listdir(profile_dir / name) == ["earlier.xplane.pb"]
    assert report.profile.input_fraction is not None


def test_without_log_dir_the_capture_goes_to_a_temporary_directory(tmp_path):
    tuner = kpt.PipelineTuner(verbose=0, profile=(1, 4))
    report, _ = fit(tuner, slow_source(20, 0.002).batch(2), steps=5)
    evidence = report.profile
    root = os.path.dirname(os.path.dirname(os.path.dirname(evidence.run_dir)))
    try:
        assert evidence.temporary
        assert os.path.isfile(evidence.xplane_path)
        assert any(root in note and "temporary" in note for note in evidence.notes)
    finally:
        shutil.rmtree(root)


def test_whole_step_mode_marks_steps_from_the_batch_hooks(tmp_path):
    tuner = kpt.PipelineTuner(log_dir=tmp_path, verbose=0, profile=(2, 8))
    # An eager step costs tens of ms of Python on a busy machine, more while
    # profiled (200 ms a batch read 16 % input once beside two busy loops): a
    # source of 500 ms a batch keeps the input share clear of it.
    report, _ = fit(tuner, slow_source(40, 0.25).batch(2), steps=10,
                    model=tiny_model(run_eagerly=True))
    assert report.measurement == "whole-step"
    evidence = report.profile
    assert evidence.source == profile_evidence.ANALYZER  # it found our step markers
    assert len(evidence.steps) >= 4
    assert evidence.input_fraction >= 0.2, evidence.input_fraction


def test_a_window_does_not_span_an_epoch_end(tmp_path):
    tuner = kpt.PipelineTuner(log_dir=tmp_path, verbose=0, profile=(3, 30))
    report, history = fit(tuner, slow_source(100, 0.002).batch(2).repeat(), steps=8, epochs=2)
    assert len(history.history["loss"]) == 2
    assert report.profile.first_step == 3 and report.profile.cost.steps == 5
    assert any("closed after 5 of 27 steps" in note for note in report.profile.notes)


def test_a_window_after_the_last_step_is_reported(tmp_path):
    tuner = kpt.PipelineTuner(log_dir=tmp_path, verbose=0, profile=(100, 110))
    report, _ = fit(tuner, slow_source(20, 0.001).batch(2), steps=6)
    assert report.profile is None
    assert any("starts after the last step of this fit (6 steps)" in n for n in report.notes)


def test_a_failing_window_turns_itself_off_and_training_goes_on(tmp_path, monkeypatch):
    # A file where the run folder must go: publishing the capture fails.
    (tmp_path / PROFILE_RUN).write_text("in the way")
    staging = tmp_path / "staging"
    staging.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(staging))
    tuner = kpt.PipelineTuner(log_dir=tmp_path, verbose=0, profile=(1, 4))
    report, history = fit(tuner, slow_source(20, 0.002).batch(2), steps=6)
    assert len(history.history["loss"]) == 1
    assert report.profile is None
    assert any(note.startswith("profiler window was turned off") for note in report.notes)
    assert report.train.steps == 5  # the step clock carried on
    assert os.listdir(staging) == []  # the capture's staging directory is gone
    assert_no_profiler_left_running(tmp_path)


@pytest.mark.parametrize("profile_steps", [0, -3, True, 2.5, "10"])
def test_profile_steps_must_be_a_positive_integer(profile_steps):
    with pytest.raises(ValueError, match="profile_steps.*positive integer"):
        kpt.PipelineTuner(profile_steps=profile_steps)


def test_profile_steps_with_a_step_range_is_refused():
    with pytest.raises(ValueError, match="profile_steps.*profile='auto' only"):
        kpt.PipelineTuner(profile=(2, 6), profile_steps=5)


def test_a_window_opened_at_the_last_step_names_no_bottleneck(tmp_path):
    # "auto" first judges the job after AUTO_WARMUP_STEPS steps: a loop of that
    # many steps plus one opens its window at its very last step.
    tuner = kpt.PipelineTuner(log_dir=tmp_path, verbose=0)

    @tuner.instrument
    def train_step(x, y):
        return tf.reduce_sum(x) + tf.reduce_sum(y)

    steps = profiler_window.AUTO_WARMUP_STEPS + 1
    for x, y in tuner.iterate(slow_source(steps, GENERATOR_DELAY_S)):
        train_step(x, y)
    report = tuner.close()
    assert report.verdict == kpt.Verdict.HIGHLY_INPUT_BOUND
    evidence = report.profile
    assert evidence is not None, report.notes
    assert evidence.bottleneck is None
    assert any("fewer than" in note for note in evidence.notes), evidence.notes
    # The slow stage is named from tf.data's live model of the loop's passes,
    # never from a window too short to tell.
    for recommendation in report.recommendations:
        if recommendation.id == advisor.BOTTLENECK_STAGE:
            assert "live model" in recommendation.title, recommendation.title


def test_a_window_that_measured_no_input_wait_puts_no_stage_first(tmp_path):
    tuner = kpt.PipelineTuner(log_dir=tmp_path, verbose=0, profile=(2, 12))
    report, _ = fit(tuner, cached_source(64).batch(4).repeat(), steps=14,
                    model=tiny_model(compute_delay_s=COMPUTE_DELAY_S))
    assert report.profile.input_fraction < 0.05
    assert report.profile.bottleneck is None
    assert report.recommendations[0].id == advisor.NOT_THE_BOTTLENECK
