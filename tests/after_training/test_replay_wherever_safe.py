"""The replay check runs wherever it is safe, and is given the time it needs.

Its hazard test refuses only ops that change state the next fit reads: an
`Assert` changes none; a Keras random layer's seed variable is put back; in-memory
arrays are read, never refused. Each identity test trains twice, tuner then plain
Keras, against plain Keras twice, bit for bit.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_pipeline_tuner as kpt
from keras_pipeline_tuner.after_training import what_if_replay
from keras_pipeline_tuner.pipeline.graph import rerun
from tests.helpers.augmentation_recipe import augmentation_recipe
from tests.helpers.training_data import busy_map
from tests.helpers.training_data import cached_source
from tests.helpers.training_data import tiny_model

# Epochs of the recipe's 16 steps: long enough that the check's shortest form
# (some 18 steps and its set-up) fits its share of the fit at any load.
RECIPE_EPOCHS = 12
# Each step sleeps this long: the augmentation (a few ms a batch) stays far
# under it, so the wait never decides alone, whatever the load.
RECIPE_COMPUTE_S = 0.03


def two_fits(make, tuned, epochs):
    """Fit 1 (with the tuner when `tuned`), then a plain fit 2 of the same model.

    Returns fit 2's history, the weights after it, the state `make` reads after
    both fits, and the tuner's report.
    """
    keras.utils.set_random_seed(5)
    model, fit_data, state = make()
    tuner = kpt.PipelineTuner(verbose=0, profile="off", measure_fixes=False)
    model.fit(*fit_data, epochs=epochs, callbacks=[tuner] if tuned else [], verbose=0)
    history = model.fit(*fit_data, epochs=1, verbose=0).history
    return history, model.get_weights(), state(), tuner.report if tuned else None


def assert_identical_and_checked(make, epochs):
    plain = two_fits(make, tuned=False, epochs=epochs)
    again = two_fits(make, tuned=False, epochs=epochs)
    tuned = two_fits(make, tuned=True, epochs=epochs)
    # Plain Keras is deterministic here, so the tuner's fit must be too.
    assert again[0] == plain[0] and again[2] == plain[2]
    assert tuned[0] == plain[0]
    for a, b in zip(plain[1], tuned[1]):
        np.testing.assert_array_equal(a, b)
    assert tuned[2] == plain[2]
    report = tuned[3]
    assert report.what_if is not None, report.notes
    assert report.what_if.method == what_if_replay.CONTENTION_METHOD
    assert not any("did not run" in note for note in report.notes), report.notes
    return report


@pytest.mark.parametrize(
    "variant",
    [
        {},
        # No shuffle: the check reads the dataset itself, not a copy, so the
        # random layers' seed variables move and must be put back.
        {"shuffle": False},
        # tf.debugging assertions in the map: ops that change no state.
        {"check": True},
    ],
    ids=["recipe", "not-shuffled", "with-asserts"],
)
def test_keras_random_layers_in_a_map_get_the_check_and_the_next_fit_is_unchanged(
    variant, contention_check_due
):
    # A sequential map: with parallel calls plain Keras itself draws the
    # layers' seeds in a different order from run to run.
    def make():
        model, dataset, seeds = augmentation_recipe(
            parallel=False, compute_s=RECIPE_COMPUTE_S, **variant
        )
        return model, (dataset,), seeds

    assert_identical_and_checked(make, RECIPE_EPOCHS)


def test_the_hazard_test_refuses_only_state_the_next_fit_reads():
    model, dataset, seeds = augmentation_recipe(check=True)
    # The random layers write their seed variables: a hazard unless put back.
    assert "AssignVariableOp" in rerun.dataset_rerun_hazard(dataset)
    assert rerun.dataset_rerun_hazard(dataset, restores_variables=True) is None
    saved = rerun.PipelineVariables(dataset)
    assert len(saved.variables) == 2
    before = seeds()
    for _ in dataset.take(2):
        pass
    assert seeds() != before
    saved.restore()
    assert seeds() == before
    # An assertion alone changes nothing.
    def non_negative(x):
        with tf.control_dependencies([tf.debugging.assert_non_negative(x)]):
            return tf.identity(x)

    asserted = tf.data.Dataset.range(8).map(non_negative)
    assert rerun.dataset_rerun_hazard(asserted) is None
    # A variable written by a map and not put back stays a hazard.
    counter = tf.Variable(0, dtype=tf.int64)
    counting = tf.data.Dataset.range(8).map(lambda x: x + counter.assign_add(1))
    assert "AssignAddVariableOp" in rerun.dataset_rerun_hazard(counting)


def test_a_fit_on_large_numpy_arrays_gets_the_check_and_the_next_fit_is_unchanged(
    contention_check_due,
):
    # 18 MB of arrays, more than the graph is read with: the check replays
    # batches of Keras' own dataset over them, never reading its graph.
    def make():
        rng = np.random.default_rng(0)
        x = rng.random((6000, 28, 28, 1), dtype=np.float32)
        y = keras.utils.to_categorical(rng.integers(0, 10, 6000), 10)
        model = keras.Sequential(
            [
                keras.Input((28, 28, 1)),
                keras.layers.Conv2D(4, 3, activation="relu"),
                keras.layers.MaxPooling2D(),
                keras.layers.Flatten(),
                keras.layers.Dropout(0.5),
                keras.layers.Dense(10, activation="softmax"),
            ]
        )
        model.compile("adam", "categorical_crossentropy")
        assert x.nbytes > 16 * 2**20
        # fit(x, y, batch_size).
        return model, (x, y, 256), lambda: None

    # 24 steps an epoch: enough of them for the check's shortest form.
    assert_identical_and_checked(make, epochs=8)


def test_a_check_that_could_change_the_verdict_gets_the_time_it_needs_and_says_so():
    # 50 ms of sleep a step: the check's shortest form (some 18 steps) is
    # about 0.9 s, over its usual cap (0.5 s for a 12 s fit), and well within
    # a quarter of the fit. The wait (a cached source behind a parallel map
    # of some 10 ms a batch) does not decide; the map's CPU could take a
    # fifth of the step from the compute, so the check could change the class.
    tuner = kpt.PipelineTuner(verbose=0, profile="off", measure_fixes=False)
    model = tiny_model(compute_delay_s=0.05)
    dataset = cached_source(240).batch(4).map(busy_map(4), num_parallel_calls=2)
    model.fit(dataset, epochs=4, callbacks=[tuner], verbose=0)
    report = tuner.report
    assert report.what_if is not None, report.notes
    cost = report.tuner_cost
    assert cost.check_cap_s is not None and cost.check_cap_s > 0.5, cost
    assert cost.check_cap_s <= what_if_replay.CONTENTION_NEEDED_FIT_SHARE * cost.fit_s
    (note,) = [note for note in report.notes if note.startswith("The contention check took")]
    assert "it could change the verdict" in note
    assert "could change the verdict" in cost.summary()
    assert cost.within_budget
