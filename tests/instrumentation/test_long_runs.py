"""Long runs: the tuner's memory stays bounded, and the report survives a crash."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing import event_accumulator

import keras_pipeline_tuner as kpt
from keras_pipeline_tuner.outputs import tensorboard as tensorboard_sink
from tests.helpers.fault_injection import run_script
from tests.helpers.training_data import failing_source
from tests.helpers.training_data import tiny_model

pytestmark = pytest.mark.slow


def test_thousands_of_steps_keep_the_buffers_bounded():
    steps = 3000
    x = np.zeros((steps, 8), np.float32)
    y = np.zeros((steps, 1), np.float32)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(1)
    tuner = kpt.PipelineTuner(verbose=0, profile="off", buffer_steps=500)
    model = tiny_model()
    model.fit(dataset, epochs=1, callbacks=[tuner], verbose=0)
    sizes = [a.nbytes for a in (tuner.clock._start, tuner.clock._wait, tuner.clock._gap)]
    model.fit(dataset, epochs=1, callbacks=[tuner], verbose=0)
    assert tuner.clock.retained_steps == 500
    assert [a.nbytes for a in (tuner.clock._start, tuner.clock._wait, tuner.clock._gap)] == sizes
    assert sizes[0] == 500 * 8
    assert tuner.report.train.steps == steps - 1
    assert len(tuner.clock.steps("train")["wait"]) == 500


class _FailAtEpoch(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        if epoch == 2:
            raise RuntimeError("machine lost")


def test_report_file_is_written_at_epoch_ends(tmp_path):
    dataset = tf.data.Dataset.from_tensor_slices(
        (np.zeros((16, 8), np.float32), np.zeros((16, 1), np.float32))
    ).batch(4)
    tuner = kpt.PipelineTuner(log_dir=tmp_path, verbose=0, profile="off")
    with pytest.raises(RuntimeError, match="machine lost"):
        tiny_model().fit(dataset, epochs=4, callbacks=[tuner, _FailAtEpoch()], verbose=0)
    stored = kpt.Report.from_json((tmp_path / "report.json").read_text())
    # The first epoch's end always writes it; the second's only when that keeps
    # the outputs within 1 % of training time (these epochs are a few ms).
    epochs = [e.epoch for e in stored.epochs]
    assert epochs in ([0], [0, 1]), epochs
    assert stored.train.steps == (3 if epochs == [0] else 7)


def test_report_file_is_written_when_a_step_fails(tmp_path):
    dataset = failing_source(12, fail_at=9, message="corrupt record").batch(2)
    tuner = kpt.PipelineTuner(log_dir=tmp_path, verbose=0, profile="off")
    with pytest.raises(Exception, match="corrupt record"):
        tiny_model().fit(dataset, epochs=1, callbacks=[tuner], verbose=0)
    stored = json.loads((tmp_path / "report.json").read_text())
    assert stored["train"]["steps"] == 3


def test_a_killed_process_keeps_the_summaries_of_the_last_seconds(tmp_path):
    """SIGKILL mid-epoch (no Python cleanup at all): what is on disk is what counts."""
    script = """
        import signal, time
        import keras
        import keras_pipeline_tuner as kpt
        from keras_pipeline_tuner.run import lifecycle
        from tests.helpers.training_data import cached_source, tiny_model

        # Checkpoints every 0.2 s instead of every few seconds, to keep the test short.
        lifecycle.CHECKPOINT_S = 0.2

        class SlowThenKill(keras.callbacks.Callback):
            def on_epoch_begin(self, epoch, logs=None):
                self.epoch = epoch

            def on_train_batch_end(self, batch, logs=None):
                if self.epoch == 3:
                    time.sleep(0.025)  # the loop's own work: wall time passes
                    if batch == 30:
                        os.kill(os.getpid(), signal.SIGKILL)

        tuner = kpt.PipelineTuner(log_dir=sys.argv[1], verbose=0, profile="off")
        tiny_model().fit(
            cached_source(160).batch(4), epochs=5, callbacks=[tuner, SlowThenKill()], verbose=0
        )
        """
    done = run_script(script, tmp_path)
    assert done.returncode == -9, done.stderr[-3000:]
    keep_all = {event_accumulator.TENSORS: 0}
    events = event_accumulator.EventAccumulator(
        str(tmp_path / tensorboard_sink.RUN), size_guidance=keep_all
    )
    events.Reload()
    steps = {event.step for event in events.Tensors(tensorboard_sink.SCALAR_TAGS[0])}
    # Every step of the three epochs done (the first step of the run reported apart).
    assert set(range(1, 3 * 40)) <= steps
    # And of the killed epoch, all but the last few tenths of a second (~0.03 s a step).
    killed_at = 3 * 40 + 30
    assert max(steps) >= killed_at - 20, max(steps)
    stored = kpt.Report.from_json((tmp_path / "report.json").read_text())
    assert [e.epoch for e in stored.epochs if e.kind == "train"] == [0, 1, 2]
    assert stored.train.steps >= killed_at - 20
