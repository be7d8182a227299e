"""On TensorFlow the step the tuner times is the step Keras runs without it.

The tuner's compiled function stands in for Keras' own during each step. It must
do the same work per call: the same eager ops around the compiled call (Keras'
`has_value()` and `get_value()` on the returned Optional cost more than the
step of a small model), and the same graph inside it, with only the stamps
added. A step that did less would train faster with the tuner than without it,
and every figure would describe a step the user does not run.
"""

import collections
import re

import keras
import pytest
from tensorflow.python.framework import op_callbacks

import keras_pipeline_tuner as kpt
from keras_pipeline_tuner.timing import timed_step_function
from tests.helpers.training_data import cached_source
from tests.helpers.training_data import tiny_model

# What the stamps add to the compiled function: the timestamps, the identities
# and control edges that order them, and the rows they are packed into.
STAMP_OPS = frozenset(
    {
        "Const",
        "Identity",
        "NoOp",
        "OptionalHasValue",
        "Pack",
        "Reshape",
        "StridedSlice",
        "TensorListReserve",
        "TensorListSetItem",
        "TensorListStack",
        "Timestamp",
    }
)


class _EagerOps(keras.callbacks.Callback):
    """Records the eager ops TensorFlow runs during one training call.

    Listed last, its batch-begin hook runs after every other callback's; a
    `_StopRecording` listed first ends the recording before any batch-end hook.
    """

    def __init__(self, batch: int):
        super().__init__()
        self.batch = batch
        self.ops = []
        self.recording = False

    def record(self, op_type, inputs, attrs, outputs, op_name=None, graph=None):
        if graph is None:
            # A compiled function's call is an op named after the function.
            self.ops.append(re.sub(r"^__inference_.*$", "<compiled call>", op_type))

    def on_train_batch_begin(self, batch, logs=None):
        if batch == self.batch:
            self.recording = True
            op_callbacks.add_op_callback(self.record)

    def stop(self):
        if self.recording:
            self.recording = False
            op_callbacks.remove_op_callback(self.record)


class _StopRecording(keras.callbacks.Callback):
    def __init__(self, recorder: _EagerOps):
        super().__init__()
        self.recorder = recorder

    def on_train_batch_end(self, batch, logs=None):
        self.recorder.stop()


def _eager_ops_of_one_call(steps_per_execution: int, with_tuner: bool):
    model = tiny_model(steps_per_execution=steps_per_execution)
    recorder = _EagerOps(batch=2 * steps_per_execution)
    callbacks = [_StopRecording(recorder)]
    if with_tuner:
        callbacks.append(kpt.PipelineTuner(verbose=0, profile="off"))
    callbacks.append(recorder)
    model.fit(cached_source(64).batch(4), epochs=1, callbacks=callbacks, verbose=0)
    return recorder.ops


@pytest.mark.parametrize("steps_per_execution", [1, 4])
def test_each_call_runs_the_eager_ops_keras_runs(steps_per_execution):
    plain = _eager_ops_of_one_call(steps_per_execution, with_tuner=False)
    tuned = _eager_ops_of_one_call(steps_per_execution, with_tuner=True)
    # Keras: the compiled call, then the Optional's has_value() and get_value().
    assert plain == ["<compiled call>", "OptionalHasValue", "OptionalGetValue"]
    assert tuned == plain


def _op_counts(concrete_function) -> collections.Counter:
    graph = concrete_function.graph.as_graph_def()
    counts = collections.Counter(node.op for node in graph.node)
    for function in graph.library.function:
        counts.update(node.op for node in function.node_def)
    return counts


def _keras_compiled_function(train_function):
    # Keras' train_function is a Python function around the tf.function it
    # compiles (keras/src/backend/tensorflow/trainer.py, `_make_function`).
    for cell in train_function.__closure__:
        if getattr(cell.cell_contents, "__name__", "") == "multi_step_on_iterator":
            return cell.cell_contents
    raise AssertionError("Keras' compiled function was not found")


@pytest.mark.parametrize("steps_per_execution", [1, 4])
@pytest.mark.parametrize("jit_compile", [False, True])
def test_the_compiled_function_is_keras_own_plus_the_stamps(steps_per_execution, jit_compile):
    model = tiny_model(steps_per_execution=steps_per_execution, jit_compile=jit_compile)
    dataset = cached_source(64).batch(4).repeat()
    model.fit(dataset, steps_per_epoch=8, epochs=1, verbose=0)
    iterator = iter(dataset)
    keras_own = _op_counts(
        _keras_compiled_function(model.train_function).get_concrete_function(iterator)
    )
    timed = timed_step_function.TimedFunction(
        model, model.train_step, model.train_function, on_rows=None, on_error=None
    )
    with_stamps = _op_counts(timed._timed_steps.get_concrete_function(iterator))
    # Every op of Keras' function, as many times; beyond them only the stamps.
    assert not keras_own - with_stamps
    assert set(with_stamps - keras_own) <= STAMP_OPS
    assert with_stamps["Timestamp"] >= 3
    # The step itself, compiled with the model's own options, once per place
    # Keras calls it.
    assert with_stamps["StatefulPartitionedCall"] == keras_own["StatefulPartitionedCall"]
