"""An equivalent of Keras' compiled train/test function that also times each step.

In Keras 3 (TensorFlow backend) the batch is fetched *inside* `model.train_function`,
so callbacks alone cannot split input wait from compute. This module builds a
replacement for `model.train_function` / `model.test_function` that runs what
Keras' own runs per call (`make_train_function` in
`keras/src/backend/tensorflow/trainer.py`), and only adds the timestamps:

- the compiled outer function (`tf.function(reduce_retracing=True)`, not
  AutoGraph-converted, never XLA-compiled) fetches the batch and calls the step
  (`model.train_step` / `model.test_step` under the model's distribution
  strategy, in a nested `tf.function` XLA-compiled when the model is), and
  returns the outputs wrapped in a `tf.experimental.Optional`, with one
  while-loop per call of `steps_per_execution > 1` steps, as Keras does;
- the timing gets into the step as three `tf.timestamp()` ops in that outer
  function, before the fetch, after it and after the step (chained with control
  dependencies, so that each stamp observes), and one more output: the three
  stamps (with several steps a call, the (steps, 3) tensor of them). Nothing
  of the step waits on a stamp, except where the executor has one thread (see
  `holds_the_step`);
- the Python around the call is Keras': one call of the compiled function, then
  the Optional's `has_value()` (no value: the epoch ended) and `get_value()`,
  eagerly, as Keras' `function` does on every call; then the stamps are handed
  on, to be read back later (`stamp_rows`).

So a step with the tuner costs what it costs without it, and the input share,
the compute and every figure built on them describe the step the user runs.
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
import weakref
from typing import Callable
from typing import List
from typing import Optional
from typing import Sequence

import numpy as np

from keras_pipeline_tuner._util.tf_import import tensorflow
from keras_pipeline_tuner.timing.cpu_budget import affinity_count

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

# The attribute of Keras' own function under which the timed function built
# for it waits for the next fit (`TimedFunction.remember`).
_REMEMBERED = "_keras_pipeline_tuner_timed"

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


def holds_the_step() -> bool:
    """Whether the step must wait for the "ready" stamp to be timed right.

    Nothing orders the stamp taken when the batch is there before the step's
    compute, which needs the same batch. With two executor threads or more the
    stamp, a cheap op, runs as soon as the batch is there. On an executor of
    one thread (an affinity mask of one CPU, or `inter_op_parallelism_threads`
    set to 1) the thread ran the compute first and stamped "ready" after it,
    so the whole step read as input wait: there the step is held until the
    stamp has run. Elsewhere it is not, because the hold puts the stamp on the
    step's path, 5-10 % of a 1 ms step here (`bench/step_cost.py`).

    Returns:
        `True` when TensorFlow's executor has one thread.

    Example:

    >>> isinstance(holds_the_step(), bool)
    True
    """
    tf = tensorflow()
    threads = tf.config.threading.get_inter_op_parallelism_threads()
    if not threads:
        # TensorFlow's default: the CPUs the process may run on.
        threads = affinity_count()
    return threads < 2


def stamp_rows(calls: Sequence) -> np.ndarray:
    """The (start, ready, end) rows of timed calls, in seconds, one row per step.

    Args:
        calls: what the calls handed on, in order: each the three stamps of a
            call of one step, or the (steps, 3) stamps of a call of several.

    Returns:
        A (steps, 3) float64 array.

    Example:

    >>> stamp_rows([(1.0, 1.5, 2.0), np.array([[2.0, 2.1, 3.0], [3.0, 3.1, 4.0]])])[:, 1]
    array([1.5, 2.1, 3.1])
    """
    if not calls:
        return np.zeros((0, 3))
    # Each tensor's numbers copied out (about 1 us each). Not one concat op:
    # its kernel is made anew for each count of inputs (some 10 ms).
    return np.concatenate([np.asarray(stamps, dtype=np.float64).reshape(-1, 3) for stamps in calls])


class TimedFunction:
    """Callable that replaces `model.train_function` or `model.test_function`.

    Args:
        model: the compiled `keras.Model`.
        step_function: `model.train_step` or `model.test_step`.
        original: the Keras function it replaces (called for inputs that are not
            tf.data iterators, e.g. `train_on_batch`).
        on_rows: called after each call with its stamps (start, ready and end
            in seconds, as tensors: `stamp_rows` reads them back), the call's
            wall time in seconds, and when it began (`time.time()`).
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
        self._model = weakref.ref(model)
        # The model attribute this function stands in for until its call
        # begins (`install`), or `None`.
        self._installed_as: Optional[str] = None
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
        strategy = model.distribute_strategy
        # What the compiled function was built for (`reusable_for`).
        self._built_for = (steps_per_execution, model.jit_compile, model.run_eagerly, strategy)

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

        hold = holds_the_step()

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
                return _timed_one_step(iterator, one_step_on_data, hold)
            return _timed_several_steps(iterator, one_step_on_data, steps_per_execution, hold)

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

    @property
    def called(self) -> bool:
        """Whether a call has run (its first call decided, from the traced step, to train)."""
        return self._called

    def reusable_for(self, model) -> bool:
        """Whether this function still runs what Keras' own does for `model`.

        It is bound to Keras' function it replaces (`original`), which Keras
        makes anew when the model is compiled again; past that, only the
        settings it read from the model when built can have changed.
        """
        built_for = (
            int(model.steps_per_execution),
            model.jit_compile,
            model.run_eagerly,
            model.distribute_strategy,
        )
        return self._model() is model and all(
            a is b or a == b for a, b in zip(self._built_for, built_for)
        )

    def remember(self) -> None:
        """Keeps this function, detached, beside Keras' own for a later fit (`remembered`).

        A function of its own traces the step again, a few tenths of a second
        a fit; kept on Keras' function object rather than on the model, it
        lives as long as that function does, and a model compiled again
        makes a new one.
        """
        self.detach()
        try:
            setattr(self.original, _REMEMBERED, self)
        except (AttributeError, TypeError):  # A callable without attributes.
            pass

    def attach(self, on_rows, on_error, on_first_call=None) -> None:
        """Hands this function's timings to a new fit's callables (a kept function)."""
        self._on_rows, self._on_error = on_rows, on_error
        self._on_first_call = on_first_call

    def detach(self) -> None:
        """Drops the fit's callables: later calls run the step untimed (see `kept`)."""
        self._on_rows = self._on_error = self._on_first_call = None
        self.trace_step = None
        self.armed = False

    def install(self, attribute: str) -> None:
        """Stands in for `model.<attribute>` for the call about to run.

        The call puts `original` back as it begins, Keras having looked this
        function up for it: whatever interrupts fit, Keras' own function is
        left on the model.
        """
        model = self._model()
        if model is not None:
            # Past Keras' and TensorFlow's attribute tracking: there is
            # nothing to track, Keras' own function comes back at the call.
            object.__setattr__(model, attribute, self)
            self._installed_as = attribute

    def uninstall(self) -> None:
        """Puts `original` back if this function still stands in for it (its call did not run)."""
        attribute, self._installed_as = self._installed_as, None
        if attribute is None:
            return
        model = self._model()
        if model is not None and vars(model).get(attribute) is self:
            object.__setattr__(model, attribute, self.original)

    def __call__(self, iterator):
        if self._installed_as is not None:
            self.uninstall()
        if not isinstance(iterator, self._iterator_types):
            return self.original(iterator)
        if not self.armed:
            if self._on_error is not None:
                self._on_error(None)
            if self.kept:
                # Carries the step's random state: Keras' own would start it over.
                optional, _ = self._timed_steps(iterator)
                if not optional.has_value():
                    raise StopIteration
                return optional.get_value()
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
                optional, rows = self._timed_steps(iterator)
            else:
                with marker:
                    optional, rows = self._timed_steps(iterator)
            # What Keras' own function does with its compiled call's Optional,
            # on every call: two eager ops, and the end of the epoch when the
            # first fetch of a call found no data.
            if not optional.has_value():
                raise StopIteration
            outputs = optional.get_value()
            # Inside the `try`: Ctrl-C often lands here, just after the step.
            self._on_rows(rows, time.perf_counter() - began, called_at)
        except BaseException as error:
            # OutOfRangeError and StopIteration are the normal end of an
            # epoch, not a failure.
            if not isinstance(error, (tensorflow().errors.OutOfRangeError, StopIteration)):
                self._on_error(error)
            raise
        return outputs


def remembered(original, model) -> Optional[TimedFunction]:
    """The timed function an earlier fit built for Keras' `original`, if still valid for `model`.

    Args:
        original: Keras' own `train_function` or `test_function`.
        model: the model about to fit.

    Returns:
        The detached `TimedFunction` (`TimedFunction.remember`), or `None`.
    """
    timed = getattr(original, _REMEMBERED, None)
    if isinstance(timed, TimedFunction) and timed.original is original:
        if timed.reusable_for(model):
            return timed
    return None


def _stamp_after(structure):
    """A timestamp that cannot run before `structure` is computed.

    The control edge on a nested function call waits for all its side effects
    (the weight updates), not just its return values.
    """
    tf = tensorflow()
    with tf.control_dependencies(tf.nest.flatten(structure, expand_composites=True)):
        return tf.timestamp()


def _held_until(stamp, structure, hold: bool):
    """`structure`, given to what follows only once `stamp` has run, where `hold`.

    See `holds_the_step`.
    """
    if not hold:
        return structure
    tf = tensorflow()
    with tf.control_dependencies([stamp]):
        return tf.nest.map_structure(tf.identity, structure, expand_composites=True)


def _timed_one_step(iterator, one_step_on_data, hold: bool):
    """One step per call: `(outputs, [start, ready, end])`.

    The outputs come wrapped in an Optional, as Keras' own function returns
    them. The stamps are stacked into one tensor, after the step's end: the
    call then hands out one tensor less, and reading the stamps back costs
    about 0.9 us a call rather than 3.5 us for three scalars (2026-12-05).
    """
    tf = tensorflow()
    start = tf.timestamp()
    with tf.control_dependencies([start]):
        # Raises OutOfRangeError at the end of the data, which Keras' epoch
        # iterator turns into the end of the epoch.
        data = iterator.get_next()
    ready = _stamp_after(data)
    outputs = one_step_on_data(_held_until(ready, data, hold))
    end = _stamp_after(outputs)
    return tf.experimental.Optional.from_value(outputs), tf.stack([start, ready, end])


def _timed_several_steps(iterator, one_step_on_data, steps_per_execution: int, hold: bool):
    """Several steps per call, in Keras' own loop: `(outputs, rows)`, a row per step.

    Keras' `multi_step_on_iterator` op for op: an optional fetch, then a while
    loop whose body runs the step on the fetched batch (in a `tf.cond`) and
    fetches the next batch while nothing waits on it, so that the fetch
    overlaps the step (an implicit one-batch prefetch); an empty first fetch
    runs no step, and the empty Optional ends the epoch. The stamps ride along
    as loop variables: each row is the previous step's end (the call's start
    for the first), when the batch was there, and the step's end.
    """
    tf = tensorflow()
    # As Keras: the spec is set lazily, while the loop's body is traced.
    empty_outputs = tf.experimental.Optional.empty(None)

    def cond(execution_step, optional_outputs, next_optional_inputs, ready, previous_end, rows):
        return tf.logical_and(
            tf.less(execution_step, steps_per_execution),
            next_optional_inputs.has_value(),
        )

    def body(execution_step, optional_outputs, next_optional_inputs, ready, previous_end, rows):
        def has_next():
            step_outputs = one_step_on_data(
                _held_until(ready, next_optional_inputs.get_value(), hold)
            )
            next_optional_outputs = tf.experimental.Optional.from_value(step_outputs)
            empty_outputs._element_spec = next_optional_outputs.element_spec
            return next_optional_outputs, _stamp_after(step_outputs)

        def no_has_next():
            optional_outputs._element_spec = empty_outputs._element_spec
            return optional_outputs, previous_end

        next_optional_outputs, end = tf.cond(
            tf.logical_and(
                tf.less(execution_step, steps_per_execution),
                next_optional_inputs.has_value(),
            ),
            has_next,
            no_has_next,
        )
        rows = rows.write(execution_step, tf.stack([previous_end, ready, end]))
        # Keras fetches no batch past the call's last step.
        following = tf.cond(
            tf.less(execution_step + 1, steps_per_execution),
            lambda: iterator.get_next_as_optional(),
            lambda: next_optional_inputs,
        )
        following_ready = _stamp_after(following.has_value())
        return execution_step + 1, next_optional_outputs, following, following_ready, end, rows

    execution_step = tf.constant(0)
    start = tf.timestamp()
    with tf.control_dependencies([start]):
        next_optional_inputs = iterator.get_next_as_optional()
    ready = _stamp_after(next_optional_inputs.has_value())
    rows = tf.TensorArray(tf.float64, size=steps_per_execution, element_shape=[3])
    steps, final_optional_outputs, _, _, _, rows = tf.while_loop(
        cond,
        body,
        loop_vars=[execution_step, empty_outputs, next_optional_inputs, ready, start, rows],
    )
    final_optional_outputs._element_spec = empty_outputs.element_spec
    return final_optional_outputs, rows.stack()[:steps]
