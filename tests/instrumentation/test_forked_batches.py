"""A few batches of a pipeline read in a forked copy of the process, replayable here."""

import numpy as np
import pytest
import tensorflow as tf

from keras_pipeline_tuner.instrumentation import forked_batches


def test_batches_come_back_with_the_pipelines_spec_and_its_python_ran_in_the_copy_only():
    calls = []

    def counted(x):
        calls.append(1)
        return x * 2

    def python(x):
        y = tf.py_function(counted, [x], tf.int64)
        y.set_shape(())
        return {"x": y, "label": tf.cast(x, tf.float32)}

    pipeline = tf.data.Dataset.range(10).map(python).batch(3)
    found = forked_batches.read_in_a_copy(pipeline, 2, 2**20, 30)
    assert calls == []
    assert [batch["x"].tolist() for batch in found] == [[0, 2, 4], [6, 8, 10]]
    replayed = forked_batches.replayable(found, pipeline.element_spec)
    # The spec the step was traced for (a batch dimension of None), so it is
    # not traced again.
    assert replayed.element_spec == pipeline.element_spec
    assert [batch["label"].numpy().tolist() for batch in replayed] == [[0, 1, 2], [3, 4, 5]]


def test_tuples_keep_their_structure():
    pipeline = tf.data.Dataset.from_tensor_slices((np.ones((6, 2)), np.zeros(6))).batch(4)
    replayed = forked_batches.replayable(
        forked_batches.read_in_a_copy(pipeline, 4, 2**20, 30), pipeline.element_spec
    )
    assert replayed.element_spec == pipeline.element_spec
    assert [tuple(part.shape for part in batch) for batch in replayed] == [
        ((4, 2), (4,)),
        ((2, 2), (2,)),
    ]


def test_batches_over_the_limit_are_refused_and_say_how_large():
    pipeline = tf.data.Dataset.from_tensors(np.zeros((2**20,), np.float32)).repeat(3)
    with pytest.raises(forked_batches.BatchesUnavailable, match="hold 8 MB or more"):
        forked_batches.read_in_a_copy(pipeline, 3, 5 * 2**20, 30)


def test_ragged_elements_are_refused():
    pipeline = tf.data.Dataset.from_tensor_slices(tf.ragged.constant([[1], [2, 3]]))
    with pytest.raises(forked_batches.BatchesUnavailable, match="ragged"):
        forked_batches.read_in_a_copy(pipeline, 1, 2**20, 30)
