"""An equivalent of Keras' compiled train/test function that also times each step.

In Keras 3 (TensorFlow backend) the batch is fetched *inside* `model.train_function`,
so callbacks alone cannot split input wait from compute. This module builds a
replacement for `model.train_function` / `model.test_function` that runs the same
step (`model.train_step` / `model.test_step`, under the model's distribution
strategy, XLA-compiled when the model is) and takes `tf.timestamp()` around the
batch fetch and after the step, in the outer, never XLA-compiled function.

Each call returns Keras' logs unchanged; the timestamps are handed to a callback
as rows of (start, ready, end), the format of `StepClock.record`.

TensorFlow's legacy random ops (`tf.random.normal` and the like, with no
generator) keep their state in the kernels of the compiled function that runs
them, not in variables: a second function over the same step draws the same
numbers again from the start. So a step holding them is told apart at the
first call (`kernel_random_ops`), and the caller decides which function trains:
the replacement, kept on the model from then on so that later fits continue its
random state as they would Keras' own, or Keras' own when it has already run.
"""

import logging
import time
from typing import Callable
from typing import List
from typing import Optional

from keras_pipeline_tuner._util.tf_import import tensorflow

logger = logging.getLogger(__name__)

# Random ops whose state lives in the kernel of the function that runs them.
KERNEL_RANDOM_OPS = frozenset(
    {
        "Multinomial",
        "ParameterizedTruncatedNormal",
        "RandomCrop",
        "RandomGamma",
        "RandomPoisson",
        "RandomPoissonV2",
        "RandomShuffle",
        "RandomStandardNormal",
        "RandomUniform",
        "RandomUniformInt",
        "TruncatedNormal",
    }
)

# Keras internals this module relies on, checked before anything is swapped.
_REQUIRED_MODEL_ATTRIBUTES = (
    "train_step",
    "test_step",
    "distribute_strategy",
    "steps_per_execution",
    "jit_compile",
    "run_eagerly",
    "_autoconvert_optionals",
)


def unsupported_reason(model) -> Optional[str]:
    """Says why the step cannot be split into input wait and compute, if it cannot.

    Args:
        model: a compiled `keras.Model`.

    Returns:
        `None` when the timed replacement can be built, else a sentence saying
        what differs from the Keras internals it was written for.
    """
    import keras

    if keras.backend.backend() != "tensorflow":
        return (
            f"the Keras backend is {keras.backend.backend()!r}; input wait is only "
            "measured inside the step on the TensorFlow backend"
        )
    missing = [name for name in _REQUIRED_MODEL_ATTRIBUTES if not hasattr(model, name)]
    if missing:
        return f"this Keras version ({keras.__version__}) has no model.{missing[0]}"
    if getattr(model, "unrolled_steps_per_execution", 1) != 1:
        return "unrolled_steps_per_execution != 1 is not supported"
    try:
        from keras.src.backend.tensorflow import trainer  # noqa: F401

        if not hasattr(trainer, "reduce_per_replica"):
            return f"this Keras version ({keras.__version__}) has no reduce_per_replica"
    except ImportError:
        return f"this Keras version ({keras.__version__}) has no TensorFlow trainer module"
    return None


class TimedFunction:
    """Callable that replaces `model.train_function` or `model.test_function`.

    Args:
        model: the compiled `keras.Model`.
        step_function: `model.train_step` or `model.test_step`.
        original: the Keras function it replaces (called for inputs that are not
            tf.data iterators, e.g. `train_on_batch`).
        on_rows: called after each call with the (steps, 3) tensor of (start,
            ready, end) seconds, the call's wall time in seconds, and when it
            began (`time.time()`).
        on_error: called with the exception when the user's step raises, before
            it propagates (so the caller can restore Keras' functions).
        on_first_call: called once, at the first call, with the
            `kernel_random_ops` of the traced step; returns False to have that
            call run Keras' own function instead (the caller then times whole
            steps).

    Attributes:
        armed: set by the caller before each call it expects. A call that finds
            it unset comes from a fit that does not use the tuner any more (an
            earlier fit was interrupted outside a step): it reports itself
            through `on_error(None)` and runs Keras' own function, or its own
            when `kept`.
        kept: set by the caller when this function stays on the model after
            the fit (its step holds legacy random ops whose state it carries).
            Detached (`detach()`), it then runs its own compiled step and
            returns Keras' logs, as Keras' own function would.
    """

    def __init__(
        self,
        model,
        step_function: Callable,
        original: Callable,
        on_rows: Optional[Callable[[object, float, float], None]],
        on_error: Optional[Callable[[Optional[BaseException]], None]],
        on_first_call: Optional[Callable[[List[str]], bool]] = None,
    ):
        tf = tensorflow()
        from keras.src.backend.tensorflow.trainer import reduce_per_replica

        self.original = original
        self.armed = False
        self.kept = False
        self._on_first_call = on_first_call
        self._called = False
        # Set by the profiler window: called with the call's iterator (whose
        # dataset names the profiled stages), returns a context manager that
        # marks one step for the TF Profiler's step detection, or None.
        self.trace_step: Optional[Callable[[object], object]] = None
        self._on_rows = on_rows
        self._on_error = on_error
        self._iterator_types = (tf.data.Iterator, tf.distribute.DistributedIterator)
        steps_per_execution = int(model.steps_per_execution)
        self._steps_per_execution = steps_per_execution
        strategy = model.distribute_strategy

        # As Keras: neither function is converted by AutoGraph (`strategy.run`
        # converts the user's step itself).
        @tf.autograph.experimental.do_not_convert
        def one_step_on_data(data):
            outputs = strategy.run(step_function, args=(data,))
            return reduce_per_replica(outputs, strategy, reduction="auto")

        if not model.run_eagerly:
            one_step_on_data = tf.function(
                one_step_on_data, reduce_retracing=True, jit_compile=model.jit_compile
            )
        one_step_on_data = model._autoconvert_optionals(one_step_on_data)

        @tf.autograph.experimental.do_not_convert
        def timed_steps(iterator):
            # The graph mirrors Keras' own `_make_function` op for op, because
            # its races are part of what training computes: with one step per
            # call, the step's data-independent updates (the optimizer's
            # iteration counter, gradient-accumulation counters) may run while
            # the last `get_next` of an unknown-length dataset fails, and Keras
            # counts that step. Timestamps only observe: nothing of the step
            # waits on them, so the step starts exactly when Keras' would.
            if steps_per_execution == 1:
                return _timed_one_step(iterator, one_step_on_data)
            return _timed_several_steps(iterator, one_step_on_data, steps_per_execution)

        if not model.run_eagerly:
            timed_steps = tf.function(timed_steps, reduce_retracing=True)
        self._timed_steps = timed_steps

    def variables_touched(self, iterator) -> list:
        """The variables a call on `iterator` reads or writes, found without running it.

        Traces the call (a later call with the same kind of iterator reuses the
        trace) and lists every variable the traced graph uses: the model's and
        the optimizer's, and any other state the step keeps, such as a
        `tf.random.Generator` of a custom `train_step` or a layer's own
        `tf.Variable`.

        Args:
            iterator: an iterator of the data the calls will get.

        Returns:
            The variables, each once; empty when the step runs eagerly.
        """
        get_concrete_function = getattr(self._timed_steps, "get_concrete_function", None)
        if get_concrete_function is None:
            return []
        return list(get_concrete_function(iterator).variables)

    def kernel_random_ops(self, iterator) -> List[str]:
        """The legacy random ops of the step a call on `iterator` runs (traced, not run).

        Args:
            iterator: an iterator of the data the calls will get.

        Returns:
            Their op types, sorted; empty when the step runs eagerly.
        """
        get_concrete_function = getattr(self._timed_steps, "get_concrete_function", None)
        if get_concrete_function is None:
            return []
        graph_def = get_concrete_function(iterator).graph.as_graph_def()
        found = {node.op for node in graph_def.node if node.op in KERNEL_RANDOM_OPS}
        for function in graph_def.library.function:
            found.update(node.op for node in function.node_def if node.op in KERNEL_RANDOM_OPS)
        return sorted(found)

    def attach(self, on_rows, on_error, on_first_call=None) -> None:
        """Hands this function's timings to a new fit's callables (a kept function)."""
        self._on_rows, self._on_error = on_rows, on_error
        self._on_first_call = on_first_call

    def detach(self) -> None:
        """Drops the fit's callables: later calls run the step untimed (see `kept`)."""
        self._on_rows = self._on_error = self._on_first_call = None
        self.trace_step = None
        self.armed = False

    def __call__(self, iterator):
        if not isinstance(iterator, self._iterator_types):
            return self.original(iterator)
        if not self.armed:
            if self._on_error is not None:
                self._on_error(None)
            if self.kept:
                # Carries the step's random state: Keras' own would start it over.
                outputs, _ = self._timed_steps(iterator)
                return self._keras_outputs(outputs)
            return self.original(iterator)
        self.armed = False
        if not self._called:
            self._called = True
            decide = self._on_first_call
            if decide is not None and not decide(self.kernel_random_ops(iterator)):
                return self.original(iterator)
        called_at = time.time()
        began = time.perf_counter()
        try:
            marker = self.trace_step(iterator) if self.trace_step is not None else None
            if marker is None:
                outputs, rows = self._timed_steps(iterator)
            else:
                with marker:
                    outputs, rows = self._timed_steps(iterator)
            outputs = self._keras_outputs(outputs)
            # Inside the `try`: Ctrl-C often lands here, just after the step.
            self._on_rows(rows, time.perf_counter() - began, called_at)
        except BaseException as error:
            # OutOfRangeError and StopIteration are the normal end of an
            # epoch, not a failure.
            if not isinstance(error, (tensorflow().errors.OutOfRangeError, StopIteration)):
                self._on_error(error)
            raise
        return outputs

    def _keras_outputs(self, outputs):
        if self._steps_per_execution > 1:
            # Keras' own function ends the epoch this way when the first fetch
            # of a call finds no data.
            if not outputs.has_value():
                raise StopIteration
            outputs = outputs.get_value()
        return outputs


def _stamp_after(structure):
    """A timestamp that cannot run before `structure` is computed.

    The control edge on a nested function call waits for all its side effects
    (the weight updates), not just its return values.
    """
    tf = tensorflow()
    with tf.control_dependencies(tf.nest.flatten(structure, expand_composites=True)):
        return tf.timestamp()


def _held_until(stamp, structure):
    """`structure`, given to what follows only once `stamp` has run.

    Nothing else orders a timestamp before the step's compute: on a single
    CPU (an affinity mask of one) the executor's one thread ran the compute
    first and stamped "ready" after it, so the whole step read as input wait
    and compute as zero.
    """
    tf = tensorflow()
    with tf.control_dependencies([stamp]):
        return tf.nest.map_structure(tf.identity, structure, expand_composites=True)


def _timed_one_step(iterator, one_step_on_data):
    """One step per call: `(outputs, rows)`, one `(start, ready, end)` row."""
    tf = tensorflow()
    start = tf.timestamp()
    with tf.control_dependencies([start]):
        # Raises OutOfRangeError at the end of the data, which Keras' epoch
        # iterator turns into the end of the epoch.
        data = iterator.get_next()
    ready = _stamp_after(data)
    outputs = one_step_on_data(_held_until(ready, data))
    end = _stamp_after(outputs)
    return outputs, tf.reshape(tf.stack([start, ready, end]), [1, 3])


def _timed_several_steps(iterator, one_step_on_data, steps_per_execution: int):
    """Several steps per call, as Keras runs them: `(outputs, rows)`, a row per step.

    As Keras: optional fetches, and the next batch fetched while nothing waits
    on it so that it overlaps the step (an implicit one-batch prefetch). An
    empty first fetch ends the epoch.
    """
    tf = tensorflow()
    start = tf.timestamp()
    with tf.control_dependencies([start]):
        first_inputs = iterator.get_next_as_optional()
    first_ready = _stamp_after(first_inputs.has_value())
    output_spec = []

    def first_step():
        step_outputs = one_step_on_data(_held_until(first_ready, first_inputs.get_value()))
        first = tf.experimental.Optional.from_value(step_outputs)
        # tf.cond traces this branch first; the empty branch needs its spec.
        output_spec.append(first.element_spec)
        return first, _stamp_after(step_outputs)

    def no_step():
        return tf.experimental.Optional.empty(output_spec[0]), first_ready

    outputs, first_end = tf.cond(first_inputs.has_value(), first_step, no_step)
    rows = tf.TensorArray(tf.float64, size=steps_per_execution)
    rows = rows.write(0, tf.stack([start, first_ready, first_end]))
    # After an empty first fetch, Keras fetches no more (nor do we).
    next_inputs = tf.cond(
        first_inputs.has_value(), iterator.get_next_as_optional, lambda: first_inputs
    )
    next_ready = _stamp_after(next_inputs.has_value())

    def cond(step, outputs, next_inputs, next_ready, previous_end, rows):
        return tf.logical_and(step < steps_per_execution, next_inputs.has_value())

    def body(step, outputs, next_inputs, next_ready, previous_end, rows):
        step_outputs = one_step_on_data(_held_until(next_ready, next_inputs.get_value()))
        outputs = tf.experimental.Optional.from_value(step_outputs)
        end = _stamp_after(step_outputs)
        rows = rows.write(step, tf.stack([previous_end, next_ready, end]))
        following = tf.cond(
            step + 1 < steps_per_execution,
            iterator.get_next_as_optional,
            lambda: next_inputs,
        )
        return step + 1, outputs, following, _stamp_after(following.has_value()), end, rows

    steps, outputs, _, _, _, rows = tf.while_loop(
        cond,
        body,
        loop_vars=[tf.constant(1), outputs, next_inputs, next_ready, first_end, rows],
    )
    steps = tf.where(first_inputs.has_value(), steps, 0)
    return outputs, rows.stack()[:steps]
