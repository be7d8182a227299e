"""What a user function in a stage does, read from its traced graph.

Every function a dataset applies (a map's, an interleave's, a filter's) is in
the graph's function library, with the functions it calls. Its ops tell what
it does: draws random numbers (stateful random ops, or stateless ones seeded
from a variable, as Keras' random layers are), runs Python (`tf.py_function`),
decodes, parses or resizes, reads files, changes state. The graph reader
(`reader`) asks this module about each stage's function.
"""

import re
from typing import Any
from typing import Dict
from typing import List
from typing import Optional
from typing import Tuple

from keras_pipeline_tuner.pipeline.graph import kinds
from keras_pipeline_tuner.pipeline.graph.model import StageFunction

_PY_FUNCTION_OPS = {"EagerPyFunc", "PyFunc", "PyFuncStateless"}
_STATEFUL_RANDOM_OPS = {
    "TruncatedNormal",
    "Multinomial",
    "ParameterizedTruncatedNormal",
    "SampleDistortedBoundingBox",
    "SampleDistortedBoundingBoxV2",
    "RngReadAndSkip",
    "RngSkip",
    "NonDeterministicInts",
}
# Stateless ops that turn a seed into keys: they pass randomness on, draw none.
_SEED_DERIVATION_OPS = {
    "StatelessRandomGetKeyCounter",
    "StatelessRandomGetKeyCounterAlg",
    "StatelessRandomGetAlg",
}
# Inputs of stateless random ops that carry the seed.
_SEED_ARGS = {"seed", "seeds", "key", "counter"}
# Values that differ between epochs: a stateless random op seeded from them is random.
_ENTROPY_OPS = {"ReadVariableOp", "ResourceGather", "VarHandleOp"}
_HEAVY_PREFIXES = (
    "Decode",
    "Parse",
    "Resize",
    "CropAndResize",
    "ScaleAndTranslate",
    "ImageProjectiveTransform",
    "ExtractJpegShape",
)
_IO_OPS = {"ReadFile", "MatchingFiles", "WriteFile"}
_BOOKKEEPING_OPS = {"Const", "Identity", "IdentityN", "NoOp", "Placeholder", "StopGradient"}
_INFERENCE_NAME = re.compile(r"^__inference_(?P<body>.+?)_\d+$")
# Prefixes tf.data puts before the Python name of a traced function.
_TRANSFORMATION_PREFIX = re.compile(
    r"^(?:Dataset|tf_data_experimental|tf_data_Dataset)_"
    r"(?:flat_map|interleave|map|filter|scan|group_by_window|group_by_reducer|"
    r"from_generator|parallel_interleave|map_and_batch|reduce|"
    r"bucket_by_sequence_length|choose_from_datasets|sample_from_datasets)_"
)
# Functions tf.data writes around a dataset class passed as the function.
_DATASET_MAKERS = ("ABCMeta", "read_one_file", "flat_map_fn")


class FunctionReader:
    """Reads the functions of one dataset graph's library; each is read once.

    Args:
        graph_def: the dataset's `tf.compat.v1.GraphDef`.
        op_def: looks up an op's definition by name (`op_def_registry.get`).

    Example:

    >>> from keras_pipeline_tuner.pipeline.graph.reader import graph_def_of
    >>> from tensorflow.python.framework import op_def_registry
    >>> graph_def = graph_def_of(tf.data.Dataset.range(4).map(tf.math.square))
    >>> functions = FunctionReader(graph_def, op_def_registry.get)
    >>> name = graph_def.library.function[0].signature.name
    >>> functions.function(name, tainted=False).ops
    ['Identity', 'Square']
    """

    def __init__(self, graph_def, op_def):
        self._op_def = op_def
        self._library = {
            function.signature.name: function for function in graph_def.library.function
        }
        self._functions: Dict[Tuple[str, bool], StageFunction] = {}

    def function(self, name: str, tainted: bool) -> StageFunction:
        """What the library's function `name` does.

        Args:
            name: the function's name in the graph library.
            tainted: whether its arguments differ between epochs (then a
                stateless random op seeded from them draws randomly).

        Returns:
            Its `StageFunction`, nested functions included.
        """
        key = (name, tainted)
        if key not in self._functions:
            self._functions[key] = self._analyse(name, tainted)
        return self._functions[key]

    def _analyse(self, name: str, tainted_args: bool) -> StageFunction:
        result = StageFunction(name=user_name(name), graph_name=name)
        definition = self._library.get(name)
        if definition is None:
            return result
        ops, random, py, heavy, io, stateful = set(), set(), set(), set(), set(), set()
        compute = 0
        nodes = {node.name: node for node in definition.node_def}
        tainted: Dict[str, bool] = {
            arg.name: tainted_args for arg in definition.signature.input_arg
        }
        for node in _topological(nodes):
            inputs = [
                (arg, value.split(":")[0])
                for arg, value in op_arguments(self._op_def, node, node.input)
            ]
            any_tainted = any(tainted.get(source, False) for _, source in inputs)
            is_tainted = any_tainted
            ops.add(node.op)
            if node.op not in _BOOKKEEPING_OPS:
                compute += 1
            op_def = self._op_def(node.op)
            if op_def is not None and op_def.is_stateful:
                stateful.add(node.op)
            for attr in node.attr.values():
                called = [attr.func.name] if attr.func.name else [f.name for f in attr.list.func]
                for nested_name in called:
                    nested = self.function(nested_name, any_tainted)
                    ops.update(nested.ops)
                    random.update(nested.random_ops)
                    py.update(nested.py_function_ops)
                    heavy.update(nested.heavy_ops)
                    io.update(nested.io_ops)
                    stateful.update(nested.stateful_ops)
                    compute += nested.compute_ops
                    is_tainted = is_tainted or nested.random
            if _is_stateful_random(node.op):
                random.add(node.op)
                is_tainted = True
            elif node.op in _SEED_DERIVATION_OPS:
                pass
            elif node.op.startswith("Stateless") or node.op == "RandomIndexShuffle":
                if any(tainted.get(source, False) for arg, source in inputs if arg in _SEED_ARGS):
                    random.add(node.op)
            elif node.op in _ENTROPY_OPS:
                is_tainted = True
            if node.op in _PY_FUNCTION_OPS:
                py.add(node.op)
            if node.op.startswith(_HEAVY_PREFIXES):
                heavy.add(node.op)
            if node.op in _IO_OPS or node.op in kinds.READER_OPS or node.op == "GeneratorDataset":
                io.add(node.op)
            tainted[node.name] = is_tainted
        result.ops = sorted(ops)
        result.random_ops = sorted(random)
        result.py_function_ops = sorted(py)
        result.heavy_ops = sorted(heavy)
        result.io_ops = sorted(io)
        result.stateful_ops = sorted(stateful)
        result.compute_ops = compute
        if result.name in _DATASET_MAKERS:
            # A dataset class passed as the function (interleave(TFRecordDataset)):
            # name it by what it creates.
            created = [
                op for op in result.io_ops if op in kinds.READER_OPS or op == "GeneratorDataset"
            ]
            if created:
                result.name = kinds.KIND_OF_OP[created[0]]
        return result


def op_arguments(op_def, node, inputs) -> List[Tuple[Optional[str], str]]:
    """Pairs each data input of `node` with its argument name in the op's definition.

    Args:
        op_def: looks up an op's definition by name (`op_def_registry.get`).
        node: a `NodeDef`.
        inputs: its inputs (control inputs, `^name`, are left out).

    Returns:
        `(argument name, input)` pairs; the name is `None` for an op without
        a definition here, or inputs beyond those it defines.

    Example:

    >>> from keras_pipeline_tuner.pipeline.graph.reader import graph_def_of
    >>> from tensorflow.python.framework import op_def_registry
    >>> graph_def = graph_def_of(tf.data.Dataset.range(4).batch(2))
    >>> batch = next(node for node in graph_def.node if node.op == "BatchDatasetV2")
    >>> [name for name, _ in op_arguments(op_def_registry.get, batch, batch.input)]
    ['input_dataset', 'batch_size', 'drop_remainder']
    """
    inputs = [name for name in inputs if not name.startswith("^")]
    definition = op_def(node.op)
    if definition is None:
        return [(None, name) for name in inputs]
    names: List[Optional[str]] = []
    for arg in definition.input_arg:
        if arg.number_attr:
            count = node.attr[arg.number_attr].i
        elif arg.type_list_attr:
            count = len(node.attr[arg.type_list_attr].list.type)
        else:
            count = 1
        names.extend([arg.name] * count)
    names.extend([None] * (len(inputs) - len(names)))
    return list(zip(names, inputs))


def _topological(nodes: Dict[str, Any]) -> List[Any]:
    """Function body nodes, each after its data and control inputs."""
    order, done, stack = [], set(), [(name, False) for name in nodes]
    while stack:
        name, expanded = stack.pop()
        if expanded:
            if name not in done:
                done.add(name)
                order.append(nodes[name])
            continue
        if name in done:
            continue
        stack.append((name, True))
        for value in nodes[name].input:
            source = value.lstrip("^").split(":")[0]
            if source in nodes and source not in done:
                stack.append((source, False))
    return order


def _is_stateful_random(op: str) -> bool:
    if op in _STATEFUL_RANDOM_OPS:
        return True
    if op.startswith("Random") and op not in ("RandomIndexShuffle", "RandomDataset"):
        return True
    return op.startswith("Stateful") and op not in (
        "StatefulPartitionedCall",
    )


def user_name(graph_name: str) -> str:
    """The Python name of a traced function, from its name in the graph library.

    Args:
        graph_name: the function's name in the graph library.

    Returns:
        The name the user wrote: the function's, `"<lambda>"`, or the class
        of a callable object (e.g. a Keras layer).

    Example:

    >>> user_name("__inference_Dataset_map_augment_42")
    'augment'
    >>> user_name("__inference_Dataset_map_lambda_7")
    '<lambda>'
    """
    match = _INFERENCE_NAME.match(graph_name)
    name = match.group("body") if match else graph_name
    name = _TRANSFORMATION_PREFIX.sub("", name, count=1)
    if name.startswith("class"):
        # A callable object: tf.data writes its class path, e.g. a Keras layer.
        name = name[len("class"):].rsplit(".", 1)[-1]
    return "<lambda>" if name == "lambda" else name
