"""Timing a decorated step that is traced into a `tf.function`'s graph.

A step placed inside `@tf.function` (the decorator below it) runs in Python only
while it is traced. `begin` adds a timestamp that waits for the step's inputs,
`finish` one that waits for its outputs and side effects, and a `tf.py_function`
hands both back to Python on every call. Some graphs cannot call back into
Python (XLA, a loop compiled whole, a replica function): `untimeable_reason`
says why, and the step then runs untouched.
"""

import dataclasses
import functools
import sys
from typing import Any
from typing import Callable
from typing import Optional

from keras_pipeline_tuner._util.tf_import import tensorflow

_LOOP_GRAPHS = ("WhileBodyFuncGraph", "WhileCondFuncGraph")
# Ops by which a traced step takes batches from a dataset itself.
_FETCH_OPS = frozenset(
    (
        "IteratorGetNext",
        "IteratorGetNextSync",
        "IteratorGetNextAsOptional",
        "MultiDeviceIteratorGetNextFromShard",
        "ReduceDataset",
        "DatasetToSingleElement",
    )
)
_DATASET_FUNCTION_MODULES = "tensorflow.python.data."


@dataclasses.dataclass
class GraphStep:
    """What a traced call needs to finish its timestamps."""

    graph: Any
    start: Any
    ops_before: int
    whole_step: bool


def begin(whole_step: bool, args, kwargs) -> GraphStep:
    """Adds the step's start timestamp to the graph being traced.

    Args:
        whole_step: the step fetches its batches itself.
        args: the step's positional arguments.
        kwargs: its keyword arguments.

    Returns:
        What `finish` needs.
    """
    tf = tensorflow()
    graph = tf.compat.v1.get_default_graph()
    inputs = _graph_tensors(tf, graph, (args, kwargs))
    # The step starts when its inputs are there, so the fetch that feeds it
    # inside the same graph counts as input wait, not compute.
    with tf.control_dependencies(inputs):
        start = tf.timestamp()
    return GraphStep(graph, start, len(graph.get_operations()), whole_step)


def finish(step: GraphStep, outputs, on_step: Callable[[bool, Any, Any], None]) -> None:
    """Adds the end timestamp and the call back to Python with both.

    Args:
        step: what `begin` returned.
        outputs: what the traced step returned.
        on_step: called on every run of the graph as
            `on_step(whole_step, start, end)` with scalar tensors; it runs
            inside the user's graph and must never raise.
    """
    tf = tensorflow()
    created = step.graph.get_operations()[step.ops_before :]
    # The weight updates and other side effects end the step too, not only
    # the returned values; ops nobody needs stay prunable.
    effects = [op for op in created if op.op_def is not None and op.op_def.is_stateful]
    with tf.control_dependencies(effects + _graph_tensors(tf, step.graph, outputs)):
        end = tf.timestamp()
    tf.py_function(functools.partial(on_step, step.whole_step), [step.start, end], [])


def fetches_inside(fn, args, kwargs) -> bool:
    """Whether a freshly traced `tf.function` takes its batches from a dataset itself.

    The call just traced it: this finds the trace, it does not trace again.
    """
    graph = fn.get_concrete_function(*args, **kwargs).graph.as_graph_def()
    ops = {node.op for node in graph.node}
    for function in graph.library.function:
        ops.update(node.op for node in function.node_def)
    return bool(ops & _FETCH_OPS)


def left_to_python(wrapper: Callable) -> Callable:
    """Keeps AutoGraph out of the tuner's own code when a step is traced.

    An AutoGraph "artifact" is called as it is, under the caller's conversion
    status, so the user's step can still be converted exactly when the
    enclosing `tf.function` converts code; `do_not_convert` would turn conversion
    off for the user's step as well.
    """
    try:
        from tensorflow.python.autograph.impl.api import autograph_artifact
    except ImportError:
        return tensorflow().autograph.experimental.do_not_convert(wrapper)
    return autograph_artifact(wrapper)


def converted(fn) -> Callable:
    """`fn` as the enclosing `tf.function` would call it (AutoGraph, if it converts)."""
    autograph = tensorflow().__internal__.autograph
    return autograph.tf_convert(fn, autograph.control_status_ctx())


def untimeable_reason() -> Optional[str]:
    """Why a step traced into the current graph cannot report each call, if so."""
    tf = tensorflow()
    graph = tf.compat.v1.get_default_graph()
    try:
        from tensorflow.python.ops import control_flow_util

        in_xla = control_flow_util.GraphOrParentsInXlaContext(graph)
    except (ImportError, AttributeError):
        return (
            "this TensorFlow version does not say whether the step is XLA-compiled, "
            "and a compiled step cannot call back into Python; put @tuner.instrument "
            "above @tf.function"
        )
    if in_xla:
        return (
            "the step is compiled with XLA (jit_compile=True), which cannot call back "
            "into Python; put @tuner.instrument above @tf.function(jit_compile=True)"
        )
    outer = graph
    while outer is not None:
        if type(outer).__name__ in _LOOP_GRAPHS:
            return "the whole loop is compiled into one tf.function (a graph while loop)"
        outer = getattr(outer, "outer_graph", None)
    if _tracing_dataset_function():
        return (
            "the whole loop is compiled into one tf.function (the dataset is iterated "
            "inside the graph)"
        )
    context = tf.distribute.get_replica_context()
    if context is not None and context.num_replicas_in_sync > 1:
        return (
            "the step runs once per replica inside strategy.run; decorate the function "
            "that calls strategy.run instead"
        )
    return None


def _tracing_dataset_function() -> bool:
    # tf.data traces the functions it runs (a `for` over a dataset inside a
    # tf.function becomes one) from its own modules; no graph attribute says so.
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_globals.get("__name__", "").startswith(_DATASET_FUNCTION_MODULES):
            return True
        frame = frame.f_back
    return False


def _graph_tensors(tf, graph, structure) -> list:
    """The symbolic tensors of `graph` in a nested structure."""
    tensors = []
    for value in tf.nest.flatten(structure, expand_composites=True):
        if isinstance(value, tf.Tensor) and getattr(value, "graph", None) is graph:
            tensors.append(value)
    return tensors
