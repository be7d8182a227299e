"""Fit interrupted mid-epoch: Ctrl-C, the user's model failing, another callback raising.

In every case Keras' own train and test functions are back on the model at once,
and `report.json` in the log dir holds what was measured up to the interruption.
"""

import gc
import os
import signal

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_pipeline_tuner as kpt
from keras_pipeline_tuner.run import lifecycle
from keras_pipeline_tuner.timing.timed_step_function import TimedFunction
from tests.helpers.fault_injection import run_script
from tests.helpers.training_data import cached_source
from tests.helpers.training_data import failing_source
from tests.helpers.training_data import tiny_model

STEPS_PER_EPOCH = 6
# Interrupted at this (0-based) training step of the second epoch.
AT_STEP = 3


class FailAt(keras.layers.Layer):
    """Identity layer whose forward pass runs `action()` at one training step.

    The step is counted inside the step (a py_function), as the user's own
    model or data would fail.
    """

    def __init__(self, step, action, **kwargs):
        super().__init__(**kwargs)
        self.step = step
        self.action = action
        self.calls = 0

    def call(self, inputs, training=False):
        def count():
            if training:
                self.calls += 1
                if self.calls == self.step + 1:
                    self.action()
            return np.float32(0.0)

        zero = tf.numpy_function(count, [], tf.float32, stateful=True)
        zero.set_shape(())
        return inputs + tf.stop_gradient(zero)


def model_failing_at(step, action):
    model = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(4), FailAt(step, action), keras.layers.Dense(1)]
    )
    model.compile("sgd", "mse")
    return model


def send_ctrl_c():
    # What a terminal's Ctrl-C does: SIGINT to the process, KeyboardInterrupt in
    # the main thread, which is inside fit.
    os.kill(os.getpid(), signal.SIGINT)


def raise_value_error():
    raise ValueError("corrupt batch in the user's model")


def raise_keyboard_interrupt():
    # Raised inside a py_function, TensorFlow turns it into an error of the op.
    raise KeyboardInterrupt


def keras_functions(model, dataset):
    """Makes Keras build its own functions and returns them."""
    model.fit(dataset.take(1), epochs=1, validation_data=dataset.take(1), verbose=0)
    return model.train_function, model.test_function


def stored_report(log_dir):
    return kpt.Report.from_json((log_dir / "report.json").read_text())


@pytest.mark.parametrize(
    "action, raised",
    [
        (send_ctrl_c, KeyboardInterrupt),
        (raise_value_error, tf.errors.InvalidArgumentError),
        (raise_keyboard_interrupt, tf.errors.UnknownError),
    ],
    ids=["ctrl-c", "value-error", "keyboard-interrupt-in-py-function"],
)
def test_interrupted_inside_the_users_step(action, raised, tmp_path):
    dataset = cached_source(4 * STEPS_PER_EPOCH).batch(4)
    # Steps the failing layer sees: the build fit's one, then 6 of epoch 0.
    model = model_failing_at(1 + STEPS_PER_EPOCH + AT_STEP, action)
    keras_train, keras_test = keras_functions(model, dataset)
    tuner = kpt.PipelineTuner(log_dir=tmp_path, verbose=0, profile="off")
    # A signal handled while the garbage collector runs a finalizer (after a
    # long test session there is much to collect) raises inside it, where
    # Python prints and drops the KeyboardInterrupt: collected beforehand,
    # the interrupt reaches the fit as a user's Ctrl-C does.
    gc.collect()
    gc.disable()
    # Python raises KeyboardInterrupt on SIGINT only if SIGINT was not ignored
    # when it started; a shell's background job starts with it ignored. A
    # terminal's process has Python's handler: so does this test.
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(raised):
            model.fit(
                dataset, epochs=3, validation_data=dataset.take(2), callbacks=[tuner], verbose=0
            )
    finally:
        signal.signal(signal.SIGINT, handler)
        gc.enable()
    assert model.train_function is keras_train
    assert model.test_function is keras_test
    stored = stored_report(tmp_path)
    # Epoch 0 (its first step reported apart) and the steps of epoch 1 before the failure.
    assert stored.train.steps == STEPS_PER_EPOCH - 1 + AT_STEP
    assert stored.train.steps == tuner.report.train.steps
    assert stored.validation.steps == 1
    assert sorted((e.kind, e.epoch) for e in stored.epochs) == [("train", 0), ("validation", 0)]
    # And the next fit runs Keras' functions, then the tuner measures again.
    history = model.fit(dataset, epochs=1, callbacks=[tuner], verbose=0)
    assert len(history.history["loss"]) == 1
    assert model.train_function is keras_train
    assert tuner.report.train.steps == STEPS_PER_EPOCH - 1


class RaiseFromCallback(keras.callbacks.Callback):
    def __init__(self, hook, epoch, batch, error):
        super().__init__()
        self.hook, self.epoch, self.batch, self.error = hook, epoch, batch, error
        self.current_epoch = 0
        self.seen = 0

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch
        self._maybe("on_epoch_begin", None)

    def on_train_batch_end(self, batch, logs=None):
        self._maybe("on_train_batch_end", batch)

    def on_test_batch_end(self, batch, logs=None):
        self._maybe("on_test_batch_end", batch)

    def _maybe(self, hook, batch):
        if hook == self.hook and self.current_epoch == self.epoch and batch == self.batch:
            raise self.error


@pytest.mark.parametrize(
    "hook, batch, steps_done",
    [
        ("on_train_batch_end", AT_STEP, STEPS_PER_EPOCH - 1 + AT_STEP + 1),
        ("on_epoch_begin", None, STEPS_PER_EPOCH - 1),
        ("on_test_batch_end", 0, STEPS_PER_EPOCH * 2 - 1),
    ],
)
@pytest.mark.parametrize("error", [KeyboardInterrupt(), RuntimeError("other callback")])
def test_interrupted_by_another_callback(hook, batch, steps_done, error, tmp_path, monkeypatch):
    # Written after every step here; by default every few seconds (see below).
    monkeypatch.setattr(lifecycle, "CHECKPOINT_S", 0.0)
    dataset = cached_source(4 * STEPS_PER_EPOCH).batch(4)
    model = tiny_model()
    keras_train, keras_test = keras_functions(model, dataset)
    tuner = kpt.PipelineTuner(log_dir=tmp_path, verbose=0, profile="off")
    # The failing callback after the tuner: the tuner's hooks of that step ran.
    callbacks = [tuner, RaiseFromCallback(hook, 1, batch, error)]
    with pytest.raises(type(error)):
        model.fit(
            dataset, epochs=3, validation_data=dataset.take(2), callbacks=callbacks, verbose=0
        )
    assert model.train_function is keras_train
    assert model.test_function is keras_test
    assert not isinstance(model.train_function, TimedFunction)
    stored = stored_report(tmp_path)
    assert stored.train.steps == steps_done
    assert stored.train.steps == tuner.report.train.steps


def test_checkpoints_are_a_few_seconds_apart():
    assert 1 <= lifecycle.CHECKPOINT_S <= 10


def test_ctrl_c_in_a_script_keeps_the_report_up_to_that_point(tmp_path):
    """Uncaught KeyboardInterrupt between steps: the report is written at exit."""
    script = """
        import keras
        import keras_pipeline_tuner as kpt
        from tests.helpers.training_data import cached_source, tiny_model

        class CtrlC(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                if self.model.optimizer.iterations.numpy() == 9:
                    raise KeyboardInterrupt

        tuner = kpt.PipelineTuner(log_dir=sys.argv[1], verbose=0, profile="off")
        tiny_model().fit(
            cached_source(24).batch(4), epochs=5, callbacks=[tuner, CtrlC()], verbose=0
        )
        """
    done = run_script(script, tmp_path)
    assert done.returncode != 0
    assert "KeyboardInterrupt" in done.stderr
    assert "Exception ignored" not in done.stderr
    stored = stored_report(tmp_path)
    # 9 steps, the first reported apart; epoch 0 (6 steps) was written at its end.
    assert stored.train.steps == 8
    assert stored.first_steps["train"].wall_ms > 0


def test_failure_inside_the_first_call_of_several_steps_is_not_called_an_empty_dataset():
    # Three steps a call; the third batch fails: two steps trained in that call.
    model = tiny_model(steps_per_execution=3)
    tuner = kpt.PipelineTuner(verbose=0, profile="off")
    with pytest.raises(tf.errors.InvalidArgumentError, match="third batch"):
        model.fit(failing_source(8, 2, "third batch").batch(1), callbacks=[tuner], verbose=0)
    assert int(model.optimizer.iterations.numpy()) == 2
    notes = tuner.report.notes
    assert not any("the dataset gave no batch" in note for note in notes), notes
    assert any(
        "the first training call failed (InvalidArgumentError), after running up to 2 of its "
        "3 steps" in note
        for note in notes
    ), notes
