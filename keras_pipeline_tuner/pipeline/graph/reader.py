"""A tf.data pipeline read from its graph: ordered stages, sources first.

`tf.data` keeps no Python-side record of how a dataset was built, but every
dataset can serialise itself to a GraphDef: one node per transformation, the
parameters as `Const` inputs, and the user's functions in the graph's function
library. This module turns that graph into a `Pipeline` of `Stage`s a person
can read (`map(augment, num_parallel_calls=AUTOTUNE)`), with what each user
function does (see `functions`), and reads the pipeline TensorFlow actually
runs after its default rewrites, so advice never asks for what TensorFlow
already does.
"""

import re
from typing import Any
from typing import Dict
from typing import List
from typing import Optional

from keras_pipeline_tuner._util.tf_import import tensorflow
from keras_pipeline_tuner.pipeline.graph import keras_made
from keras_pipeline_tuner.pipeline.graph import kinds
from keras_pipeline_tuner.pipeline.graph.functions import FunctionReader
from keras_pipeline_tuner.pipeline.graph.functions import op_arguments
from keras_pipeline_tuner.pipeline.graph.functions import user_name
from keras_pipeline_tuner.pipeline.graph.in_memory import InMemoryDataTooLarge
from keras_pipeline_tuner.pipeline.graph.in_memory import in_memory_bytes
from keras_pipeline_tuner.pipeline.graph.in_memory import without_large_sources
from keras_pipeline_tuner.pipeline.graph.model import AUTOTUNE
from keras_pipeline_tuner.pipeline.graph.model import ParamValue
from keras_pipeline_tuner.pipeline.graph.model import Pipeline
from keras_pipeline_tuner.pipeline.graph.model import Stage
from keras_pipeline_tuner.pipeline.graph.service_folding import fold_service_stages

# Ops TensorFlow wraps around a pipeline to run it; they are not the user's stages.
_RUNTIME_HARNESS = {
    "ModelDataset",
    "MaxIntraOpParallelismDataset",
    "PrivateThreadPoolDataset",
    "ExperimentalMaxIntraOpParallelismDataset",
    "ExperimentalPrivateThreadPoolDataset",
}

# Parameters where -1 means tf.data.AUTOTUNE.
_AUTOTUNABLE = {"num_parallel_calls", "cycle_length", "block_length"}
_DATASET_OP = re.compile(r"Dataset(V\d+)?$")
# Element sizes above this are not estimated (unknown or pathological shapes).
_MAX_ELEMENT_BYTES = 1 << 50


def read_pipeline(dataset, max_in_memory_bytes: Optional[int] = None) -> Pipeline:
    """Reads a dataset's pipeline from its graph, and the one TensorFlow runs.

    Args:
        dataset: a `tf.data.Dataset`.
        max_in_memory_bytes: refuse datasets holding more in-memory tensors
            than this (see `in_memory_bytes`): their graph holds a copy of
            them, so reading it costs time and memory in proportion. `None`
            reads any dataset.

    Returns:
        The `Pipeline`. Its `runtime` is `None` (with `runtime_error` set)
        when TensorFlow cannot finalise the dataset here.

    Raises:
        TypeError: if `dataset` is not a `tf.data.Dataset`.
        RuntimeError: if called while tracing a `tf.function`.
        ValueError: if the dataset holds more than `max_in_memory_bytes`.

    Example:

    ```python
    pipeline = read_pipeline(train_ds)
    print(pipeline)   # range(...) -> map(parse, num_parallel_calls=AUTOTUNE) -> ...
    ```
    """
    tf = tensorflow()
    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError(
            f"read_pipeline() takes a tf.data.Dataset, got {type(dataset).__name__}."
        )
    if not tf.executing_eagerly():
        raise RuntimeError(
            "The pipeline can only be read eagerly: call it outside tf.function."
        )
    # Of the dataset as written: the stand-ins below change its sources.
    cardinality = int(dataset.cardinality())
    if max_in_memory_bytes is not None:
        held = in_memory_bytes(dataset)
        light = (
            without_large_sources(dataset, max_in_memory_bytes)
            if held > max_in_memory_bytes
            else None
        )
        if light is not None:
            # The same transformations over one-element stand-ins of the large
            # in-memory sources: the graph holds no copy of the data.
            dataset, held = light, 0
        if held > max_in_memory_bytes:
            raise InMemoryDataTooLarge(
                f"The dataset holds about {held / 2**20:.0f} MB of in-memory tensors "
                "(from_tensor_slices / from_tensors), and its graph would copy all of "
                "them (about 2 s and 4x the memory per 100 MB). Inspect the same "
                "pipeline built on a slice of the data, e.g. x[:1000], or raise the "
                "limit (max_in_memory_bytes=None reads it anyway).",
                held,
            )
    pipeline = pipeline_from_graph_def(graph_def_of(dataset))
    pipeline.cardinality = cardinality
    try:
        runtime = pipeline_from_graph_def(_graph_def(_finalized_graph(dataset)))
    except Exception as error:  # noqa: BLE001 - the static view stands on its own.
        pipeline.runtime_error = f"{type(error).__name__}: {error}"
    else:
        _link_runtime(pipeline, runtime)
    return pipeline


def pipeline_from_graph_def(graph_def) -> Pipeline:
    """Builds a `Pipeline` from a dataset's GraphDef.

    Args:
        graph_def: a `tf.compat.v1.GraphDef` as written by
            `dataset._as_serialized_graph()` (the final dataset feeds `_Retval`).

    Returns:
        The `Pipeline`, without the runtime view.

    Raises:
        ValueError: if the graph has no `_Retval` node (not a dataset graph).
    """
    return _GraphReader(graph_def).pipeline()


def graph_def_of(dataset, light_over: Optional[int] = None):
    """The GraphDef of a dataset, as TensorFlow serialises it.

    Args:
        dataset: a `tf.data.Dataset`.
        light_over: when given, sources holding more in-memory bytes than
            this are serialised as named one-element stand-ins
            (`in_memory.without_large_sources`), not copied into the graph;
            `tune.rebuild` turns such a graph back into a dataset over the
            real sources. `None` serialises everything.

    Returns:
        A `tf.compat.v1.GraphDef`; the final dataset feeds its `_Retval` node.

    Example:

    >>> graph_def = graph_def_of(tf.data.Dataset.range(4))
    >>> sorted({node.op for node in graph_def.node})
    ['Const', 'RangeDataset', '_Retval']
    """
    tf = tensorflow()
    if light_over is not None and in_memory_bytes(dataset) > light_over:
        light = without_large_sources(dataset, light_over)
        dataset = dataset if light is None else light
    return _graph_def(
        dataset._as_serialized_graph(  # pylint: disable=protected-access
            external_state_policy=tf.data.experimental.ExternalStatePolicy.IGNORE
        )
    )


def _graph_def(serialized):
    tf = tensorflow()
    graph_def = tf.compat.v1.GraphDef()
    graph_def.ParseFromString(serialized.numpy())
    return graph_def


def _finalized_graph(dataset):
    # What iterating the dataset runs: options applied, default static
    # optimisations (map parallelisation, fusion, prefetch injection) done.
    tf = tensorflow()
    from tensorflow.python.ops import gen_dataset_ops

    variant = gen_dataset_ops.finalize_dataset(
        dataset._variant_tensor,  # pylint: disable=protected-access
        has_captured_ref=False,
        **dataset._flat_structure,  # pylint: disable=protected-access
    )
    return gen_dataset_ops.dataset_to_graph_v2(
        variant,
        external_state_policy=tf.data.experimental.ExternalStatePolicy.IGNORE.value,
        strip_device_assignment=True,
    )


def _link_runtime(pipeline: Pipeline, runtime: Pipeline) -> None:
    pipeline.runtime = runtime
    by_function = {
        stage.function.graph_name: stage
        for stage in runtime.stages
        if stage.function is not None
    }
    for stage in pipeline.stages:
        if stage.function is None:
            continue
        ran = by_function.get(stage.function.graph_name)
        if ran is None:
            # Removed (e.g. an identity map) or fused beyond recognition.
            continue
        stage.parallel_at_runtime = ran.parallel
        if ran.label != stage.label:
            stage.runs_as = ran.label


class _GraphReader:
    """Reads one dataset GraphDef; holds the lookups the walk needs."""

    def __init__(self, graph_def):
        from tensorflow.python.framework import op_def_registry

        self._op_def = op_def_registry.get
        self._nodes = {node.name: node for node in graph_def.node}
        self._functions = FunctionReader(graph_def, self._op_def)

    def pipeline(self) -> Pipeline:
        """The `Pipeline` of the graph, without the runtime view.

        Returns:
            The stages in topological order, the options set on them, readers
            and `from_generator` shown as the one source written, tf.data
            service reads as `distribute(...)`, Keras' own loaders named.

        Raises:
            ValueError: if the graph has no `_Retval` node fed by a dataset op.
        """
        sink = next((node for node in self._nodes.values() if node.op == "_Retval"), None)
        if sink is None or not sink.input:
            raise ValueError(
                "Not a dataset graph: it has no `_Retval` node. Pass the GraphDef "
                "from `dataset._as_serialized_graph()`."
            )
        final = self._dataset_input(sink.input[0])
        if final is None:
            raise ValueError("Not a dataset graph: `_Retval` is not fed by a dataset op.")
        stages = {}
        order = []
        # Iterative depth-first walk: long pipelines must not hit the recursion limit.
        stack = [(final, False)]
        while stack:
            name, expanded = stack.pop()
            if name in stages and not expanded:
                continue
            if expanded:
                order.append(name)
                continue
            stage = self._stage(self._nodes[name])
            stages[name] = stage
            stack.append((name, True))
            for upstream in reversed(stage.inputs):
                if upstream not in stages:
                    stack.append((upstream, False))
        # A node reached twice is appended twice; keep its first (earliest) place.
        seen = set()
        ordered = []
        for name in order:
            if name not in seen:
                seen.add(name)
                ordered.append(stages[name])
        pipeline = Pipeline(stages=ordered, options=self._options(ordered))
        _collapse_sources(pipeline)
        fold_service_stages(pipeline)
        for stage in pipeline.stages:
            # Keras' own loader of a dataset utility: named as the user's call.
            stage.made_by = keras_made.utility_of(stage, pipeline.upstream(stage))
        return pipeline

    # Nodes.

    def _dataset_input(self, name: str) -> Optional[str]:
        """Follows `name` through identities and runtime wrappers to a dataset op."""
        seen = set()
        while name not in seen:
            seen.add(name)
            node = self._nodes.get(name.split(":")[0].lstrip("^"))
            if node is None:
                return None
            if node.op == "Identity" or node.op in _RUNTIME_HARNESS:
                if not node.input:
                    return None
                name = node.input[0]
                continue
            return node.name if _DATASET_OP.search(node.op) else None
        return None

    def _stage(self, node) -> Stage:
        kind = kinds.KIND_OF_OP.get(node.op)
        stage = Stage(node=node.name, op=node.op, kind=kind or node.op, opaque=kind is None)
        for arg, value in op_arguments(self._op_def, node, node.input):
            upstream = self._dataset_input(value)
            if upstream is not None:
                if upstream not in stage.inputs:
                    stage.inputs.append(upstream)
                continue
            constant = self._constant(value)
            if constant is not None and arg is not None:
                stage.params[arg] = _param(arg, constant, node.op)
        for name in ("deterministic", "reshuffle_each_iteration"):
            if name in node.attr:
                attr = node.attr[name]
                stage.params[name] = attr.s.decode() if attr.WhichOneof("value") == "s" else attr.b
        if node.op == "TensorSliceDataset" and node.attr["is_files"].b:
            stage.kind = kinds.LIST_FILES
            stage.files = self._file_count(node)
        stage.element_bytes = _element_bytes(node)
        for attr_name in ("f", "predicate"):
            if attr_name in node.attr and node.attr[attr_name].func.name:
                function = node.attr[attr_name].func.name
                stage.function = self._functions.function(function, tainted=False)
                break
        return stage

    def _constant(self, name: str) -> Optional[Any]:
        node = self._nodes.get(name.split(":")[0])
        if node is None or node.op != "Const":
            return None
        tensor = node.attr["value"].tensor
        tf = tensorflow()
        if tensor.dtype in (tf.resource.as_datatype_enum, tf.variant.as_datatype_enum):
            return None
        if tensor.tensor_shape.dim:
            # A vector (e.g. file names): only its length matters here.
            return [dim.size for dim in tensor.tensor_shape.dim]
        return tf.make_ndarray(tensor).item()

    def _file_count(self, node) -> Optional[int]:
        for _, value in op_arguments(self._op_def, node, node.input):
            shape = self._constant(value)
            if isinstance(shape, list) and shape:
                return int(shape[0])
            if isinstance(shape, (str, bytes)):
                return 1
        return None

    def _options(self, stages: List[Stage]) -> Dict[str, ParamValue]:
        from google.protobuf import message
        from tensorflow.core.framework import dataset_options_pb2

        merged = dataset_options_pb2.Options()
        for stage in stages:
            if stage.op == "OptionsDataset":
                options = dataset_options_pb2.Options()
                options.ParseFromString(self._nodes[stage.node].attr["serialized_options"].s)
                merged.MergeFrom(options)

        def flatten(proto, prefix):
            for field, value in proto.ListFields():
                if isinstance(value, message.Message):
                    yield from flatten(value, f"{prefix}{field.name}.")
                elif isinstance(value, (bool, int, float, str)):
                    yield f"{prefix}{field.name}", value

        return dict(flatten(merged, ""))


def _param(name: str, value: Any, op: str) -> ParamValue:
    if isinstance(value, list):
        return f"<{'x'.join(str(dim) for dim in value)} values>"
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    prefetch_buffer = name == "buffer_size" and op == "PrefetchDataset"
    if value == -1 and (name in _AUTOTUNABLE or prefetch_buffer):
        return AUTOTUNE
    if name == "filename" and value == "":
        return "memory"
    return value


def _element_bytes(node) -> Optional[int]:
    tf = tensorflow()
    # Sources name their types attribute after their inputs (e.g. Toutput_types).
    types_attr = next(
        (name for name in ("output_types", "Toutput_types") if name in node.attr), None
    )
    types = node.attr[types_attr].list.type if types_attr else []
    shapes = node.attr["output_shapes"].list.shape if "output_shapes" in node.attr else []
    if not types or len(types) != len(shapes):
        return None
    total = 0
    for dtype, shape in zip(types, shapes):
        dtype = tf.dtypes.as_dtype(dtype)
        if shape.unknown_rank or dtype in (tf.string, tf.variant, tf.resource):
            return None
        count = 1
        for dim in shape.dim:
            if dim.size < 0:
                return None
            count *= dim.size
        total += count * dtype.size
    return total if total < _MAX_ELEMENT_BYTES else None


def _collapse_sources(pipeline: Pipeline) -> None:
    """Shows readers and `from_generator` as the one source the user wrote.

    `TFRecordDataset(files)` is built as `from_tensor_slices(files)` +
    `flat_map(read_one_file)` (or an interleave when reads are parallel), and
    `from_generator` as `from_tensors(0)` + `flat_map(flat_map_fn)`.
    """
    by_node = {stage.node: stage for stage in pipeline.stages}
    absorbed = set()
    for stage in pipeline.stages:
        function = stage.function
        if function is None or stage.kind not in (kinds.FLAT_MAP, kinds.INTERLEAVE):
            continue
        if len(stage.inputs) != 1:
            continue
        graph_name = user_name(function.graph_name)
        feeder = by_node.get(stage.inputs[0])
        if graph_name == "read_one_file" and function.name != graph_name:
            if stage.kind == kinds.INTERLEAVE:
                reads = stage.params.get("num_parallel_calls", stage.params.get("cycle_length"))
                stage.params = {"num_parallel_reads": reads}
            else:
                stage.params = {}
            stage.kind = function.name
            listed = feeder is not None and feeder.kind == kinds.LIST_FILES
            if listed and _read_only_by(pipeline, feeder, stage):
                stage.files = feeder.files
                stage.inputs = list(feeder.inputs)
                absorbed.add(feeder.node)
            elif feeder is not None:
                stage.files = feeder.files
        elif (
            function.name == kinds.FROM_GENERATOR
            and feeder is not None
            and feeder.kind == kinds.FROM_TENSORS
            and _read_only_by(pipeline, feeder, stage)
        ):
            stage.kind = kinds.FROM_GENERATOR
            stage.params = {}
            stage.inputs = []
            absorbed.add(feeder.node)
    pipeline.stages = [stage for stage in pipeline.stages if stage.node not in absorbed]


def _read_only_by(pipeline: Pipeline, feeder: Stage, reader: Stage) -> bool:
    return all(
        stage is reader or feeder.node not in stage.inputs for stage in pipeline.stages
    )

