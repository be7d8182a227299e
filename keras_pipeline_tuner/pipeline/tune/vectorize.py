"""Whether a map can run on whole batches instead of each element (vectorisation).

A cheap map right before a batch runs once per element; run on the batch, it
runs once per batch. That gives the same elements only when the map's function
is made of element-wise ops, and its graph, traced again on batches, gives
batches of its per-element outputs. The graph tells the first; tracing the
rewritten function tells the second; the tuner then checks the real elements.
"""

from typing import Optional

from keras_pipeline_tuner._util.tf_import import tensorflow
from keras_pipeline_tuner.pipeline.graph.model import StageFunction
from keras_pipeline_tuner.pipeline.tune.graph_editing import GraphEditor
from keras_pipeline_tuner.pipeline.tune.graph_editing import apply_rewrites
from keras_pipeline_tuner.pipeline.tune.rewrites import Rewrite

# Ops that compute each output element from the elements at the same position
# of their inputs (broadcasting scalars), whatever the shapes: a function made
# only of these gives, on a batch, the batch of its results.
ELEMENTWISE_OPS = frozenset(
    {
        "Abs", "Acos", "Acosh", "Add", "AddV2", "Asin", "Asinh", "Atan", "Atan2", "Atanh",
        "BitwiseAnd", "BitwiseOr", "BitwiseXor", "Cast", "Ceil", "ClipByValue", "Cos",
        "Cosh", "Div", "DivNoNan", "Elu", "Equal", "Erf", "Erfc", "Exp", "Expm1", "Floor",
        "FloorDiv", "FloorMod", "Greater", "GreaterEqual", "Inv", "Invert", "IsFinite",
        "IsInf", "IsNan", "LeakyRelu", "LeftShift", "Less", "LessEqual", "Log", "Log1p",
        "LogicalAnd", "LogicalNot", "LogicalOr", "Maximum", "Minimum", "Mod", "Mul",
        "MulNoNan", "Neg", "NotEqual", "Pow", "RealDiv", "Reciprocal", "Relu", "Relu6",
        "RightShift", "Rint", "Round", "Rsqrt", "SelectV2", "Selu", "Sigmoid", "Sign",
        "Sin", "Sinh", "Softplus", "Softsign", "Sqrt", "Square", "SquaredDifference",
        "Sub", "Tan", "Tanh", "TruncateDiv", "TruncateMod", "Xdivy", "Xlogy",
        # Bookkeeping: no computation.
        "Const", "Identity", "IdentityN", "NoOp", "StopGradient", "Placeholder",
    }
)


def vectorize_blocker(function: StageFunction) -> Optional[str]:
    """Why a map's function cannot be applied to a batch instead of each element.

    Args:
        function: the map's `StageFunction`.

    Returns:
        The reason in words, or `None` when its graph is made only of
        element-wise ops (then it is still checked on the real elements).

    Example:

    >>> vectorize_blocker(StageFunction("scale", "", ops=["Const", "Mul"], compute_ops=1))
    >>> vectorize_blocker(StageFunction("total", "", ops=["Sum"], compute_ops=1)).split(":")[0]
    'total has shape-dependent logic or ops that are not element-wise (Sum)'
    """
    if function.py_function_ops:
        return (
            f"{function.name} runs Python ({', '.join(function.py_function_ops)}): what it "
            "does with a batch instead of an element cannot be known from its graph"
        )
    if function.random:
        return (
            f"{function.name} draws random numbers ({', '.join(function.random_ops)}): on a "
            "batch it would draw them in other shapes, so the values would change"
        )
    if function.stateful_ops:
        return f"{function.name} has stateful ops ({', '.join(function.stateful_ops)})"
    other = sorted(set(function.ops) - ELEMENTWISE_OPS)
    if other:
        return (
            f"{function.name} has shape-dependent logic or ops that are not element-wise "
            f"({', '.join(other[:6])}{', ...' if len(other) > 6 else ''}): on a batch it "
            "could compute something else"
        )
    return None


def vectorized_trace_problem(graph_def, rewrite: Rewrite) -> Optional[str]:
    """Traces a vectorised map's function on batches; says why it does not fit.

    The function's graph is rebuilt with the batched element spec as its
    input shapes, and its output shapes must be those of a batch of its
    per-element outputs.

    Args:
        graph_def: the pipeline's `tf.compat.v1.GraphDef`.
        rewrite: a "vectorize" `Rewrite` for it.

    Returns:
        `None` when the traced outputs are batches of the per-element
        outputs, else the reason in words.
    """
    tf = tensorflow()
    from tensorflow.python.framework import function_def_to_graph

    rewritten = apply_rewrites(graph_def, [rewrite])
    editor = GraphEditor(rewritten)
    node = editor.node(rewrite.node)
    library = {f.signature.name: f for f in rewritten.library.function}
    definition = library.get(node.attr["f"].func.name)
    if definition is None:
        return "its function is not in the pipeline's graph"
    shapes = []
    for index in range(len(definition.signature.input_arg)):
        attrs = definition.arg_attr[index].attr if index in definition.arg_attr else {}
        listed = attrs["_output_shapes"].list.shape if "_output_shapes" in attrs else []
        shapes.append(tf.TensorShape(listed[0]) if listed else None)
    try:
        traced = function_def_to_graph.function_def_to_graph(definition, input_shapes=shapes)
    except Exception as error:  # noqa: BLE001 - then it is not vectorisable.
        return f"it cannot be traced on batches: {type(error).__name__}: {error}"
    wanted = [tf.TensorShape(shape) for shape in node.attr["output_shapes"].list.shape]
    got = [output.shape for output in traced.outputs]
    if len(got) != len(wanted) or not all(
        one.is_compatible_with(other) for one, other in zip(got, wanted)
    ):
        return (
            f"traced on batches it gives shapes {[str(s) for s in got]} instead of "
            f"batches of its per-element outputs {[str(s) for s in wanted]}"
        )
    return None
