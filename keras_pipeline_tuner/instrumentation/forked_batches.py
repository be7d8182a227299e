"""A few batches of a pipeline that runs Python, read in a forked copy of the process.

Why: the replay that times the step with input free (`what_if_replay`) needs a
few of the pipeline's batches. Read in the training process, a pipeline whose
Python may keep state (a counter, a NumPy generator) would move that state on,
and a later fit would read other data (`pipeline.graph.rerun`). A forked copy
(`_util.forked_call`) reads them instead and hands back their values, in which
no Python runs. The model's step itself cannot run in the copy: a traced
TensorFlow function called after `fork()` waits for inter-op threads the copy
does not have. So the step is replayed in the training process, on these values.
"""

from typing import List

import numpy as np

from keras_pipeline_tuner._util.forked_call import ForkedCallError
from keras_pipeline_tuner._util.forked_call import forked_call
from keras_pipeline_tuner._util.tf_import import tensorflow


class BatchesUnavailable(ValueError):
    """The batches could not be read in a copy of the process; the message says why."""


def read_in_a_copy(dataset, batches: int, max_bytes: int, timeout_s: float) -> List:
    """The first `batches` batches of a fresh iterator of `dataset`, read in a forked copy.

    Args:
        dataset: a `tf.data.Dataset` of dense tensors.
        batches: how many to read.
        max_bytes: the most their values may hold (they cross a pipe, pickled).
        timeout_s: seconds after which the copy is killed.

    Returns:
        The batches, each a structure of NumPy arrays like `dataset`'s elements.

    Raises:
        BatchesUnavailable: the elements are not all dense tensors, the batches
            hold more than `max_bytes`, or the copy did not answer.

    Example:

    >>> import tensorflow as tf
    >>> found = read_in_a_copy(tf.data.Dataset.range(6).batch(2), 2, 2**20, 30)
    >>> [batch.tolist() for batch in found]
    [[0, 1], [2, 3]]
    """
    tf = tensorflow()
    specs = tf.nest.flatten(dataset.element_spec)
    if not all(type(spec) is tf.TensorSpec for spec in specs):
        raise BatchesUnavailable(
            "Its elements hold ragged, sparse or nested datasets, which it does not copy."
        )

    def read():
        found, held = [], 0
        for batch in dataset.take(batches):
            values = tf.nest.map_structure(lambda tensor: tensor.numpy(), batch)
            held += sum(_bytes(value) for value in tf.nest.flatten(values))
            if held > max_bytes:
                return f"{held / 2**20:.0f} MB or more"
            found.append(values)
        return found

    try:
        found = forked_call(read, timeout_s)
    except ForkedCallError as error:
        raise BatchesUnavailable(f"Reading its batches in a copy of the process failed: {error}.")
    if isinstance(found, str):
        raise BatchesUnavailable(
            f"Its first {batches} batches hold {found}, more than it copies from the copy "
            f"of the process within its cap ({max_bytes / 2**20:.0f} MB)."
        )
    if not found:
        raise BatchesUnavailable("The dataset gave no batch.")
    return found


def replayable(found: List, element_spec):
    """A `tf.data.Dataset` of the batches `found`, with the element spec `element_spec`.

    The same spec as the pipeline's (a batch dimension of `None`, say), so that
    the step traced for the pipeline takes it without tracing again.

    Args:
        found: batches from `read_in_a_copy`.
        element_spec: the pipeline's `element_spec`.

    Returns:
        The dataset, which runs no Python.

    Example:

    >>> import tensorflow as tf
    >>> pipeline = tf.data.Dataset.range(6).batch(2)
    >>> replayable([np.array([0, 1])], pipeline.element_spec).element_spec
    TensorSpec(shape=(None,), dtype=tf.int64, name=None)
    """
    tf = tensorflow()

    specs = tf.nest.flatten(element_spec)

    def as_spec(*values):
        # A map unpacks tuple elements into arguments: flattened, both agree.
        relaxed = [
            tf.compat.v1.placeholder_with_default(value, spec.shape)
            for value, spec in zip(tf.nest.flatten(values), specs)
        ]
        return tf.nest.pack_sequence_as(element_spec, relaxed)

    dataset = None
    for batch in found:
        one = tf.data.Dataset.from_tensors(batch).map(as_spec)
        dataset = one if dataset is None else dataset.concatenate(one)
    return dataset


def _bytes(value: np.ndarray) -> int:
    # Strings are objects: their lengths, not their pointers, cross the pipe.
    if value.dtype == object:
        return sum(len(item) for item in value.flat)
    return value.nbytes
