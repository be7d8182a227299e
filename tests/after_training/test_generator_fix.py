"""A slow `from_generator` source: its advised fix (the work in a parallel map)
changes the user's code, so the fix timing replays it with copies of the
generator read at once, only when the user vouches that the generator can be
read again (`measure_fixes` with `allow_unverified=True`); otherwise it is never
read again after training, and its figure is predicted from its calls timed
during training, with how to have it timed.

The generator sleeps 6 ms per element, 24 ms a batch, against well under a
millisecond of compute.
"""

import time

import numpy as np
import pytest
import tensorflow as tf

import keras_pipeline_tuner as kpt
from keras_pipeline_tuner.advice.recommendation import Recommendation
from keras_pipeline_tuner.advice.recommendation import describe_gain
from keras_pipeline_tuner.advice.recommendation import free_input_gain
from keras_pipeline_tuner.after_training import fix_timing
from keras_pipeline_tuner.pipeline.graph.reader import read_pipeline
from keras_pipeline_tuner.timing.cpu_budget import read_cpu_budget
from keras_pipeline_tuner.timing.step_stats import StepStats
from tests.helpers.training_data import FEATURES
from tests.helpers.training_data import tiny_model

BATCH = 4
DELAY_S = 0.006


class CountedGenerator:
    """A generator over in-memory data that counts the elements it yields."""

    def __init__(self, elements: int = 10_000):
        self.yielded = 0
        self.elements = elements

    def __call__(self):
        for i in range(self.elements):
            time.sleep(DELAY_S)
            self.yielded += 1
            yield np.full((FEATURES,), i % 7, np.float32), np.float32(i % 2)


def _batches(source: CountedGenerator) -> tf.data.Dataset:
    signature = (tf.TensorSpec((FEATURES,), tf.float32), tf.TensorSpec((), tf.float32))
    return tf.data.Dataset.from_generator(source, output_signature=signature).batch(BATCH)


def _fit(**tuner_kwargs):
    source = CountedGenerator()
    dataset = _batches(source)
    tuner_kwargs.setdefault("profile", (3, 12))
    # A cap, not a plan: quiet, the timing takes a few seconds of it; beside
    # three busy loops a timed pass had not ended within 10 s.
    tuner = kpt.PipelineTuner(verbose=0, measure_fixes=30.0, **tuner_kwargs)
    tiny_model().fit(dataset, epochs=2, steps_per_epoch=25, callbacks=[tuner], verbose=0)
    return tuner.report, source


def _generator_advice(report):
    (advice,) = [r for r in report.recommendations if r.stage == "from_generator()"]
    assert advice.id == "bottleneck-stage", advice
    assert "parallel map" in advice.reason
    return advice


@pytest.mark.skipif(read_cpu_budget().cpus < 2, reason="the replay reads one copy per CPU")
def test_a_vouched_for_generator_s_fix_is_timed_by_copies_read_at_once():
    report, source = _fit(allow_unverified=True)
    assert report.verdict.input_bound
    advice = _generator_advice(report)
    gain = advice.expected_gain
    assert gain.basis == "measured", gain.statement
    # Two copies of a generator that sleeps read about 2x as fast; a timed
    # pass once included destroying its iterator (8 to 640 ms, at random),
    # which read this figure anywhere from 0.96x to 4.2x.
    assert gain.likely_speedup >= 1.4, gain.statement
    assert gain.likely_speedup <= free_input_gain(report.train).speedup
    cpus = read_cpu_budget().cpus
    assert f"with {cpus} copies of from_generator() read at once" in gain.statement
    assert "a replay stands in for it" in gain.statement
    assert "(measured: a replay of the change" in describe_gain(gain)
    assert report.recommendations[0] is advice
    # The copies read past what the fit trained on: the generator ran again.
    assert source.yielded > 2 * 25 * BATCH


@pytest.mark.skipif(read_cpu_budget().cpus < 2, reason="the replay reads one copy per CPU")
def test_with_no_profile_the_generator_named_by_its_timed_calls_is_timed_when_vouched_for():
    # No profiler window: the generator's calls timed in training name it the
    # bottleneck, with its graph node, and the vouched-for fix is timed.
    report, _ = _fit(allow_unverified=True, profile="off")
    advice = _generator_advice(report)
    assert advice.stage_node, advice
    assert advice.expected_gain.basis == "measured", advice.expected_gain.statement


def test_by_default_a_generator_is_not_read_again_and_says_how_to_time_it():
    report, source = _fit()
    advice = _generator_advice(report)
    gain = advice.expected_gain
    assert gain.basis == "bound", gain.statement
    assert "may be a queue or a live feed" in gain.statement
    assert "pass measure_fixes=True and allow_unverified=True to PipelineTuner" in gain.statement
    # What fit read, and a prefetch's few batches more: no timed pass ran it.
    assert source.yielded <= (2 * 25 + 8) * BATCH


def test_a_generator_fit_read_to_its_end_and_again_is_not_read_after_training():
    # Whole epochs (no steps_per_epoch): fit itself called the generator again
    # after it ran out. The tuner still never calls it: its figure is predicted
    # from the generator's calls timed during training.
    source = CountedGenerator(elements=25 * BATCH)
    tuner = kpt.PipelineTuner(verbose=0, profile="off", measure_fixes=10.0)
    tiny_model().fit(_batches(source), epochs=2, callbacks=[tuner], verbose=0)
    gain = _generator_advice(tuner.report).expected_gain
    assert gain.basis != "measured", gain.statement
    assert gain.predicted_speedup >= 1.4, gain.statement
    assert "timed during training" in gain.statement, gain.statement
    assert source.yielded == 2 * 25 * BATCH


def test_on_one_cpu_a_generator_s_fix_has_no_replay_and_says_why():
    source = CountedGenerator()
    dataset = _batches(source)
    (stage, _) = read_pipeline(dataset).stages
    advice = Recommendation(
        id="bottleneck-stage", title="", severity="warning", stage=stage.label,
        stage_node=stage.node, fix="ds = ds.map(load_item, num_parallel_calls=tf.data.AUTOTUNE)",
    )
    stats = StepStats.from_arrays(np.full(20, 0.03), np.full(20, 0.02))
    (timing,) = fix_timing.time_fixes(dataset, [advice], stats, allow_unverified=True, cpus=1)
    assert timing.status == "not applicable" and not timing.measured
    assert "the run may use one CPU" in timing.reason
    assert source.yielded == 0
