"""Where a dataset's Python calls sit: each `py_function` token, by stage.

TensorFlow runs every `tf.py_function`, `tf.numpy_function` and
`Dataset.from_generator` callback through one registry of Python functions,
keyed by a token; the op that calls one holds its token in a `token` attr. In a
dataset's graph these ops sit inside the functions of its stages (a map's
function, or for `from_generator` the `GeneratorDataset` inside its flat_map,
whose `init_func`, `next_func` and `finalize_func` each call one). This module
reads the tokens of each stage, so that a call timed by its token is named as
the lint names its stage (`reader`).
"""

import dataclasses
from typing import Dict
from typing import List
from typing import Optional

from keras_pipeline_tuner.pipeline.graph.reader import pipeline_from_graph_def

# The ops that call the registry, and what the user wrote to get each.
PY_FUNCTION_OPS = {
    "EagerPyFunc": "tf.py_function",
    "PyFunc": "tf.numpy_function",
    "PyFuncStateless": "tf.numpy_function",
}
# What a call does, by the attr of `GeneratorDataset` whose function makes it.
ELEMENT = "element"
GENERATOR_NEXT = "next"
GENERATOR_START = "start"
GENERATOR_END = "end"
# A stage's calls in this order: per element, then a pass's start and end.
_ORDER = {ELEMENT: 0, GENERATOR_NEXT: 0, GENERATOR_START: 1, GENERATOR_END: 2}
_GENERATOR_ROLES = {
    "init_func": GENERATOR_START,
    "next_func": GENERATOR_NEXT,
    "finalize_func": GENERATOR_END,
}


@dataclasses.dataclass(frozen=True)
class PyCall:
    """One Python callback of a dataset, as its graph places it.

    Attributes:
        token: the callback's key in TensorFlow's registry, e.g. "pyfunc_3".
        stage: the label of the stage whose function calls it, as the lint
            shows it (e.g. "map(load)", "from_generator()").
        op: the calling op: "EagerPyFunc" (`tf.py_function`), "PyFunc" or
            "PyFuncStateless" (`tf.numpy_function`).
        role: "element" for a function called per element (or per batch);
            for `from_generator`, "next" (the generator's `next`), "start"
            and "end" (once per pass over the data).

    Example:

    >>> from keras_pipeline_tuner.pipeline.graph.reader import graph_def_of
    >>> ds = tf.data.Dataset.range(3).map(
    ...     lambda x: tf.py_function(lambda v: v, [x], tf.int64))
    >>> [(call.stage, call.op, call.role) for call in py_calls_of(graph_def_of(ds))]
    [('map(<lambda>)', 'EagerPyFunc', 'element')]
    """

    token: str
    stage: str
    op: str
    role: str = ELEMENT


def py_calls_of(graph_def) -> List[PyCall]:
    """The Python callbacks of a dataset's graph, each with its stage.

    Args:
        graph_def: the dataset's `tf.compat.v1.GraphDef` (see
            `reader.graph_def_of`).

    Returns:
        One `PyCall` per token, in the order of the stages (sources first);
        within a stage, per-element calls before a pass's start and end.
    """
    pipeline = pipeline_from_graph_def(graph_def)
    library = {function.signature.name: function for function in graph_def.library.function}
    found: Dict[str, PyCall] = {}
    for stage in pipeline.stages:
        if stage.function is None:
            continue
        calls = sorted(
            _calls_in(library, stage.function.graph_name), key=lambda call: _ORDER[call[2]]
        )
        for token, op, role in calls:
            found.setdefault(token, PyCall(token, stage.label, op, role))
    return list(found.values())


def registered_function(token: str):
    """The Python function TensorFlow registered under `token`, unwrapped, or `None`.

    A `py_function` is held in an `EagerFunc`; both are wrapped by autograph.

    Example:

    >>> registered_function("no such token") is None
    True
    """
    import inspect

    from tensorflow.python.ops import script_ops

    function = script_ops._py_funcs.get(token)  # pylint: disable=protected-access
    if function is None:
        return None
    return inspect.unwrap(getattr(function, "_func", function))


def generator_state(token: str):
    """The state of the `from_generator` one of whose callbacks is registered under `token`.

    TensorFlow keeps a `from_generator` dataset's generator, and the iterators
    it made of it, in one state object (`DatasetV2._GeneratorState`: the
    generator is its `_generator`, the live iterators its `_iterators`); its
    callbacks hold it: the pass's start is its bound `get_next_id`, the other
    two close over it.

    Args:
        token: a token of a `PyCall` whose role is "start", "next" or "end".

    Returns:
        The state object, or `None` when the token's function holds none.
    """
    function = registered_function(token)
    state = getattr(function, "__self__", None)
    if state is not None and hasattr(state, "_generator"):
        return state
    code = getattr(function, "__code__", None)
    cells = dict(zip(code.co_freevars, function.__closure__ or ())) if code else {}
    holder = cells.get("generator_state")
    try:
        state = holder.cell_contents if holder is not None else None
    except ValueError:  # an empty cell
        return None
    return state if hasattr(state, "_generator") else None


def _calls_in(library, name: str, role: Optional[str] = None):
    """`(token, op, role)` of every registry call in function `name` and those it calls."""
    seen, stack = set(), [(name, role)]
    while stack:
        name, role = stack.pop()
        if name in seen or name not in library:
            continue
        seen.add(name)
        for node in library[name].node_def:
            if node.op in PY_FUNCTION_OPS and "token" in node.attr:
                token = node.attr["token"].s.decode("utf-8", "replace")
                yield token, node.op, role or ELEMENT
            for attr_name, attr in node.attr.items():
                called = [attr.func.name] if attr.func.name else [f.name for f in attr.list.func]
                nested_role = role
                if node.op == "GeneratorDataset":
                    nested_role = _GENERATOR_ROLES.get(attr_name, role)
                stack.extend((nested, nested_role) for nested in called if nested)
