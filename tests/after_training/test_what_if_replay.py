"""What-if replay: the step with free input, measured without changing training."""

import subprocess
import sys
import textwrap
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_pipeline_tuner as kpt
from keras_pipeline_tuner.after_training import replay_rounds
from keras_pipeline_tuner.after_training import what_if_replay
from tests.helpers import advising
from tests.helpers.paths import REPO_ROOT
from tests.helpers.training_data import FEATURES
from tests.helpers.training_data import replayable_source
from tests.helpers.training_data import tiny_model

# Each batch of 2 takes 2 x 10 ms to produce; the step computes in about 1 ms.
ELEMENT_S = 0.01


def model_with_dropout():
    model = keras.Sequential(
        [keras.Input((FEATURES,)), keras.layers.Dense(4), keras.layers.Dropout(0.5),
         keras.layers.Dense(1)]
    )
    model.compile(optimizer="adam", loss="mse", metrics=["mae"])
    return model


def state(model):
    return [np.array(v.numpy()) for v in model.variables + model.optimizer.variables]


def test_replay_does_not_change_training():
    dataset = replayable_source(16, 0.0).batch(2)
    first, second = model_with_dropout(), model_with_dropout()
    second.set_weights(first.get_weights())
    for variable, value in zip(second.variables, first.variables):
        variable.assign(value)  # seed generator state included
    replaying = kpt.PipelineTuner(what_if=5, verbose=0, profile="off")
    plain = kpt.PipelineTuner(verbose=0, profile="off", check_contention=False)
    first.fit(dataset, epochs=2, verbose=0, callbacks=[replaying])
    second.fit(dataset, epochs=2, verbose=0, callbacks=[plain])

    assert replaying.report.what_if is not None and plain.report.what_if is None
    assert replaying.report.what_if.replay_steps == 5
    for after_replay, without in zip(state(first), state(second)):
        np.testing.assert_array_equal(after_replay, without)
    # And training goes on identically after it.
    first.fit(dataset, epochs=1, verbose=0)
    second.fit(dataset, epochs=1, verbose=0)
    for after_replay, without in zip(state(first), state(second)):
        np.testing.assert_array_equal(after_replay, without)


def test_input_bound_fit_reports_a_large_ceiling():
    tuner = kpt.PipelineTuner(what_if=True, verbose=0, profile="off")
    model = tiny_model()
    model.fit(replayable_source(24, ELEMENT_S).batch(2), epochs=1, verbose=0, callbacks=[tuner])
    result = tuner.report.what_if
    assert result.pipeline_source == "training"
    assert result.replay_steps == 20 and result.cached_batches == 8
    # Input is ~20 ms a step and compute ~1 ms: free input is several times faster.
    assert result.speedup_if_input_free > 3
    assert result.replay_input_wait.median_ms < result.pipeline_step.median_ms / 5
    assert result.pipeline_step == tuner.report.train.step
    assert "after training" in result.method
    again = kpt.Report.from_json(tuner.report.to_json())
    assert again.what_if == result
    assert isinstance(again.what_if, kpt.WhatIfResult)


def test_standalone_replay_measures_the_pipeline_too():
    model = tiny_model()
    dataset = replayable_source(12, ELEMENT_S).batch(2)
    model.fit(dataset, epochs=1, verbose=0)
    before = state(model)
    result = kpt.what_if(model, dataset, steps=10, cached_batches=3)
    assert result.pipeline_source == "measured"
    assert result.cached_batches == 3 and result.replay_steps == 10
    assert result.speedup_if_input_free > 3
    for value, now in zip(before, state(model)):
        np.testing.assert_array_equal(value, now)


@pytest.mark.parametrize("shown, rounds", [(False, 1), (True, replay_rounds.MAX_ROUNDS)])
def test_contention_check_runs_another_round_when_one_shows_contention(shown, rounds):
    asked, checked = [], {}

    def shows_contention(pipeline_ms, replay_ms):
        asked.append((pipeline_ms, replay_ms))
        return shown

    class CheckAtTheEnd(keras.callbacks.Callback):
        # As the tuner runs it: from on_train_end, while fit's data is at hand.
        def on_train_end(self, logs=None):
            checked["before"] = state(self.model)
            plan = what_if_replay.ContentionPlan(steps=20, estimate_s=1.0, round_s=0.5)
            checked["result"] = what_if_replay.contention_check(
                self.model, shows_contention, plan, deadline=time.monotonic() + 60
            )
            checked["after"] = state(self.model)

    model = tiny_model()
    model.fit(replayable_source(12, 0.0).batch(2), epochs=1, verbose=0, callbacks=[CheckAtTheEnd()])
    result = checked["result"]
    assert len(result.rounds) == rounds
    # Asked after each round but the last one possible.
    assert asked == [(found.pipeline_ms, found.replay_ms) for found in result.rounds[:1]]
    steps = 20
    assert result.replay_steps == steps + (rounds - 1) * (steps // 2)
    # Each round's figures are means of its own steps: equal blocks pool to the whole.
    assert result.pipeline_step.mean_ms == pytest.approx(
        np.mean([found.pipeline_ms for found in result.rounds]), rel=1e-6
    )
    assert all(found.pipeline_ms > 0 and found.replay_ms > 0 for found in result.rounds)
    for value, now in zip(checked["before"], checked["after"]):
        np.testing.assert_array_equal(value, now)


def test_fit_on_arrays_replays_the_dataset_keras_built_from_them():
    tuner = kpt.PipelineTuner(what_if=True, verbose=0, profile="off")
    model = tiny_model()
    x = np.linspace(0, 1, 16 * FEATURES, dtype=np.float32).reshape(16, FEATURES)
    history = model.fit(x, x[:, 0], batch_size=4, epochs=1, verbose=0, callbacks=[tuner])
    assert len(history.history["loss"]) == 1
    result = tuner.report.what_if
    assert result is not None, tuner.report.notes
    assert result.pipeline_source == "training" and result.replay_steps == 20
    assert result.cached_batches == 4


def test_fit_on_a_generator_keeps_training_and_says_why_there_is_no_replay():
    def batches():
        for _ in range(4):
            yield np.zeros((4, FEATURES), np.float32), np.zeros((4,), np.float32)

    tuner = kpt.PipelineTuner(what_if=True, verbose=0, profile="off")
    history = tiny_model().fit(batches(), epochs=1, verbose=0, callbacks=[tuner])
    assert len(history.history["loss"]) == 1
    assert tuner.report.what_if is None
    assert any(
        "what-if replay" in note and "tf.data" in note and "generator data" in note
        for note in tuner.report.notes
    ), tuner.report.notes


@pytest.mark.parametrize("what_if", [0, -3, 2.5, "yes", None])
def test_bad_what_if_argument(what_if):
    with pytest.raises(ValueError, match="what_if"):
        kpt.PipelineTuner(what_if=what_if)


def test_standalone_arguments():
    model = tiny_model()
    with pytest.raises(TypeError, match="tf.data.Dataset"):
        kpt.what_if(model, np.zeros((4, FEATURES)))
    with pytest.raises(ValueError, match="steps"):
        kpt.what_if(model, replayable_source(4, 0.0).batch(2), steps=0)
    with pytest.raises(ValueError, match="empty"):
        kpt.what_if(model, replayable_source(4, 0.0).batch(2).take(0))


class NoisyModel(keras.Sequential):
    """A custom `train_step` that draws input noise from its own `tf.random.Generator`."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.noise = tf.random.Generator.from_seed(11)

    def train_step(self, data):
        x, y = data
        return super().train_step((x + self.noise.normal(tf.shape(x)), y))


class RunningOffset(keras.layers.Layer):
    """A stateful layer: a plain `tf.Variable` Keras does not track, updated every call."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.calls = tf.Variable(0.0, trainable=False)

    def call(self, inputs, training=False):
        if training:
            self.calls.assign_add(1.0)
        return inputs + 0.01 * self.calls


def _model_with_outside_state(kind):
    keras.utils.set_random_seed(5)
    if kind == "generator":
        model = NoisyModel([keras.Input((FEATURES,)), keras.layers.Dense(4), keras.layers.Dense(1)])
        outside = model.noise.state
    else:
        offset = RunningOffset()
        model = keras.Sequential(
            [keras.Input((FEATURES,)), keras.layers.Dense(4), offset, keras.layers.Dense(1)]
        )
        outside = offset.calls
    assert all(outside is not variable for variable in model.variables)
    model.compile(optimizer="adam", loss="mse")
    return model, outside


def _two_fits(kind, with_replay):
    model, outside = _model_with_outside_state(kind)
    dataset = replayable_source(16, 0.0).batch(2)
    callbacks = [kpt.PipelineTuner(what_if=5, verbose=0, profile="off")] if with_replay else []
    first = model.fit(dataset, epochs=1, verbose=0, callbacks=callbacks)
    if with_replay:
        assert callbacks[0].report.what_if.replay_steps == 5
    second = model.fit(dataset, epochs=2, verbose=0)
    state = [np.array(v.numpy()) for v in model.variables]
    return first.history, second.history, state + [outside.numpy()]


@pytest.mark.parametrize("kind", ["generator", "stateful-layer"])
def test_replay_restores_state_kept_outside_the_model_and_optimizer(kind):
    plain = _two_fits(kind, with_replay=False)
    replayed = _two_fits(kind, with_replay=True)
    assert replayed[0] == plain[0] and replayed[1] == plain[1]
    for without, after_replay in zip(plain[2], replayed[2]):
        np.testing.assert_array_equal(without, after_replay)


def test_replay_under_a_distribution_strategy_is_a_note_not_a_failure():
    script = textwrap.dedent(
        """
        import logging, os, sys
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
        sys.path.insert(0, sys.argv[1])
        import tensorflow as tf
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        import keras_pipeline_tuner as kpt
        from tests.helpers.training_data import replayable_source, tiny_model
        warnings = []
        handler = logging.Handler(logging.WARNING)
        handler.emit = lambda record: warnings.append(record.getMessage())
        logging.getLogger("keras_pipeline_tuner").addHandler(handler)
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
        with strategy.scope():
            model = tiny_model()
        tuner = kpt.PipelineTuner(verbose=0, profile="off", what_if=True)
        model.fit(replayable_source(12, 0.0).batch(2), epochs=1, callbacks=[tuner], verbose=0)
        print("WARNINGS", len(warnings), warnings)
        print("REPORT" + tuner.report.to_json(indent=None))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(REPO_ROOT)],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "WARNINGS 0 []" in done.stdout, done.stdout
    line = next(row for row in done.stdout.splitlines() if row.startswith("REPORT"))
    report = kpt.Report.from_json(line[len("REPORT"):])
    assert report.what_if is None
    assert any(
        note.startswith("The what-if replay did not run.") and "distribution strategy" in note
        for note in report.notes
    ), report.notes
    assert not any("turned off after a failure" in note for note in report.notes)


def test_a_replay_slower_than_training_is_explained_not_shown_as_a_gain():
    from keras_pipeline_tuner.advice.recommendation import describe_gain

    # Real steps of a cheap model waiting 8 ms a batch (input-bound beyond any
    # fetch's cost, so that the advice is about input), then the replay of a
    # model whose step sleeps 20 ms: the replay is slower for sure, as noise
    # can make it on a busy machine.
    quick = kpt.PipelineTuner(verbose=0, profile="off")
    source = replayable_source(24, 0.004).batch(2)
    tiny_model().fit(source, epochs=1, verbose=0, callbacks=[quick])
    slow = tiny_model(compute_delay_s=0.02)
    dataset = replayable_source(24, 0.0).batch(2)
    result = kpt.what_if(
        slow, dataset, steps=4, cached_batches=2, pipeline_stats=quick.report.train
    )
    assert result.speedup_if_input_free < 1
    assert any("below 1" in note and "No input-pipeline change" in note for note in result.notes)

    ranked = advising.advise(quick.report.train, None, [], what_if=result)
    gain = ranked[0].expected_gain
    assert gain.speedup == 1.0 and gain.step_ms_after == gain.step_ms
    assert "no faster than" in gain.statement and "at most" not in gain.statement
    assert describe_gain(gain) == "no gain (measured)"


@pytest.mark.parametrize("capped", [True, False], ids=["its-cap", "the-budget"])
def test_a_check_whose_set_up_used_its_time_names_what_ran_out(capped):
    # The check's own cap (1 % of the fit) is not lifted by a larger budget:
    # the note must not send the user to cost_budget_s when the cap ran out.
    now = time.monotonic()
    control = what_if_replay.RoundControl(
        shows_contention=lambda pipeline_ms, replay_ms: False,
        deadline=now + (60.0 if capped else 0.0),
        pipeline_step_s=0.01,
        first_round_by=now if capped else now + 60.0,
    )
    with pytest.raises(what_if_replay.ReplayUnsupported) as raised:
        control.steps_for(20, call_s=0.01)
    message = str(raised.value)
    assert ("the check's own cap" in message) == capped, message
    assert ("cost_budget_s" in message) != capped, message
