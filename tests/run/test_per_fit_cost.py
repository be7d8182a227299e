"""The tuner's work once per fit: stated in the report, and none that nothing reads."""

import keras

import keras_pipeline_tuner as kpt
from keras_pipeline_tuner.run import lifecycle
from tests.helpers.training_data import cached_source
from tests.helpers.training_data import tiny_model


class _ReportsBuiltDuringTraining(keras.callbacks.Callback):
    """Counts the reports the run builds from the first step to the end of training.

    Listed before the tuner: its `on_train_end` stops the count before the
    tuner's runs.
    """

    def __init__(self, monkeypatch):
        super().__init__()
        self.count = 0
        self.training = False
        built = lifecycle.Run.built_report

        def counted(run):
            self.count += self.training
            return built(run)

        monkeypatch.setattr(lifecycle.Run, "built_report", counted)

    def on_train_batch_begin(self, batch, logs=None):
        self.training = True

    def on_train_end(self, logs=None):
        self.training = False


def test_the_report_states_the_work_once_per_fit(tmp_path):
    tuner = kpt.PipelineTuner(log_dir=tmp_path, verbose=0, profile="off")
    tiny_model().fit(cached_source(64).batch(4), epochs=2, callbacks=[tuner], verbose=0)
    cost = tuner.report.tuner_cost
    # Reading the pipeline before the first step; the first epoch's outputs.
    assert cost.before_training_s > 0
    assert cost.outputs_during_training_s > 0
    assert cost.per_fit_s == (
        cost.before_training_s + cost.outputs_during_training_s + cost.after_training_s
    )
    assert f"Once per fit it took {cost.per_fit_s:.2f} s in all" in cost.summary()
    assert kpt.Report.from_json(tuner.report.to_json()).tuner_cost == cost


def test_without_a_log_dir_no_report_is_built_during_training_but_the_early_verdicts(
    monkeypatch,
):
    counter = _ReportsBuiltDuringTraining(monkeypatch)
    tuner = kpt.PipelineTuner(verbose=0, profile="off", check_contention=False)
    tiny_model().fit(
        cached_source(256).batch(4), epochs=4, callbacks=[counter, tuner], verbose=0
    )
    # Epoch ends and checkpoints have nowhere to write it; the early verdict's
    # line is said once.
    assert counter.count <= 1
    cost = tuner.report.tuner_cost
    assert cost.outputs_during_training_s == 0
    assert cost.before_training_s > 0
