"""Side-by-side timing of real datasets: what a pass consumes, and the rotation."""

import gc
import time

import pytest
import tensorflow as tf

from keras_pipeline_tuner.pipeline.tune import paired_timing


class CountingDataset:
    """Wraps a dataset to count the iterators and batches a pass takes from it."""

    def __init__(self, dataset):
        self.dataset = dataset
        self.iterators = 0
        self.batches = 0

    def __iter__(self):
        self.iterators += 1
        for element in self.dataset:
            self.batches += 1
            yield element


@pytest.mark.parametrize(
    "plan, iterators, batches",
    [
        # Whole epochs: one iterator each, as model.fit makes.
        (paired_timing.PassPlan(epochs=3), 3, 15),
        # Epochs of num_batches continue one iterator, as with steps_per_epoch,
        # and a new one starts when it runs out.
        (paired_timing.PassPlan(epochs=3, num_batches=2), 2, 6),
        (paired_timing.PassPlan(epochs=2, num_batches=4), 2, 8),
    ],
)
def test_a_pass_consumes_what_fit_would(plan, iterators, batches):
    counted = CountingDataset(tf.data.Dataset.range(5))
    paired_timing.time_pass(counted, plan)
    assert (counted.iterators, counted.batches) == (iterators, batches)


def test_consumer_step_is_part_of_the_pass():
    plan = paired_timing.PassPlan(epochs=1, consumer_step_s=0.01)
    assert paired_timing.time_pass(tf.data.Dataset.range(5), plan) >= 0.05


def _slow_to_destroy(seconds: float) -> tf.data.Dataset:
    """A generator's dataset whose iterator takes `seconds` to destroy (its generator closes)."""

    def generate():
        try:
            yield from range(1_000_000)
        finally:
            time.sleep(seconds)

    return tf.data.Dataset.from_generator(
        generate, output_signature=tf.TensorSpec((), tf.int64)
    ).batch(2)


def test_a_pass_of_num_batches_stops_its_clock_before_its_iterator_is_destroyed():
    # Training goes on reading that iterator: its destruction (seen at 8 to
    # 640 ms, at random, for a generator's) is no batch's cost.
    plan = paired_timing.PassPlan(epochs=2, num_batches=3, warmup_batches=1)
    began = time.perf_counter()
    timed = paired_timing.time_pass(_slow_to_destroy(1.0), plan)
    assert time.perf_counter() - began >= 1.0, "the iterator was destroyed within the call"
    assert timed < 0.5


def test_whole_epochs_time_their_generators_to_the_end():
    # fit ends each whole epoch's iterator before the next epoch starts: a
    # generator that takes 0.3 s to close at its end costs each epoch 0.3 s.
    plan = paired_timing.PassPlan(epochs=2)
    assert paired_timing.time_pass(_slow_to_destroy(0.3).take(2).unbatch(), plan) >= 0.6


def test_side_by_side_builds_fresh_datasets_and_rotates_the_order():
    order = []

    def factory(name):
        def build():
            order.append(name)
            return tf.data.Dataset.range(2)

        return build

    times = paired_timing.side_by_side(
        {"a": factory("a"), "b": factory("b"), "c": factory("c")},
        paired_timing.PassPlan(epochs=1),
        rounds=3,
    )
    assert order == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert {name: len(values) for name, values in times.items()} == {"a": 3, "b": 3, "c": 3}


def test_deadline_stops_after_the_first_round():
    times = paired_timing.side_by_side(
        {"a": lambda: tf.data.Dataset.range(2)},
        paired_timing.PassPlan(epochs=1),
        rounds=5,
        deadline=time.perf_counter() - 1,
    )
    assert len(times["a"]) == 1


def test_a_pass_still_running_at_stop_at_drops_its_round_and_keeps_the_whole_ones():
    rounds = []

    def factory():
        rounds.append(time.perf_counter())
        # The second round's dataset is slow: 200 batches of 20 ms, four seconds.
        slow = len(rounds) > 1
        return tf.data.Dataset.range(200 if slow else 2).map(
            lambda i: tf.numpy_function(lambda v: time.sleep(0.02) or v, [i], tf.int64)
            if slow
            else i
        )

    began = time.perf_counter()
    # Room for the first round on a busy machine (and the full collection
    # before the rounds, in a test worker's large heap).
    times = paired_timing.side_by_side(
        {"one": factory}, paired_timing.PassPlan(epochs=1), rounds=3, stop_at=began + 1.5
    )
    # Stopped within a few batches of stop_at, not after the second round's four seconds.
    assert time.perf_counter() - began < 3.0
    assert len(times["one"]) == 1


def test_a_first_round_past_stop_at_is_out_of_time():
    with pytest.raises(paired_timing.OutOfTime, match="still running"):
        paired_timing.side_by_side(
            {"one": lambda: tf.data.Dataset.range(3)},
            paired_timing.PassPlan(epochs=1),
            rounds=3,
            stop_at=time.perf_counter() - 1,
        )


def test_median_ratio():
    assert paired_timing.median_ratio([1.0, 3.0, 2.0], [2.0, 2.0, 2.0]) == 1.0
    with pytest.raises(ValueError, match="positive"):
        paired_timing.median_ratio([1.0], [0.0])


class _Finalised:
    """A reference cycle that logs its finaliser: garbage only a collection frees."""

    def __init__(self, log, name):
        self.log, self.name, self.cycle = log, name, self

    def __del__(self):
        self.log.append(self.name)


def test_between_rounds_only_what_the_rounds_made_is_collected():
    log = []

    def factory():
        _Finalised(log, "made by a round")
        return tf.data.Dataset.range(4)

    # Garbage the process already held, in the oldest generation: its
    # finaliser (an old iterator's threads joining, say) is not the timing's
    # to run.
    old = _Finalised(log, "old")
    gc.collect(1)
    del old
    try:
        paired_timing.side_by_side({"one": factory}, paired_timing.PassPlan(epochs=1), rounds=3)
        assert "old" not in log
        assert "made by a round" in log
        assert gc.isenabled() and gc.get_freeze_count() == 0
    finally:
        gc.collect()
    assert "old" in log
