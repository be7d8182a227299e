"""A tf.data pipeline read from its graph: ordered stages, sources first.

`tf.data` keeps no Python-side record of how a dataset was built, but every
dataset can serialise itself to a GraphDef: one node per transformation, the
parameters as `Const` inputs, and the user's functions in the graph's function
library. This module turns that graph into a `Pipeline` of `Stage`s a person
can read (`map(augment, num_parallel_calls=AUTOTUNE)`), with what each user
function does (random ops, `tf.py_function`, decoding, file reads), and reads
the pipeline TensorFlow actually runs after its default rewrites, so advice
never asks for what TensorFlow already does.
"""

import dataclasses
import re
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

from keras_pipeline_tuner._util.tf_import import tensorflow
from keras_pipeline_tuner.pipeline import keras_made

AUTOTUNE = "AUTOTUNE"

ParamValue = Union[int, float, bool, str]

# Dataset ops by the `tf.data` method a user writes to get them.
_KINDS = {
    "RangeDataset": "range",
    "TensorDataset": "from_tensors",
    "TensorSliceDataset": "from_tensor_slices",
    "SparseTensorSliceDataset": "from_tensor_slices",
    "RandomDataset": "random",
    "MapDataset": "map",
    "ParallelMapDataset": "map",
    "ParallelMapDatasetV2": "map",
    "MapAndBatchDataset": "map_and_batch",
    "FilterDataset": "filter",
    "ParallelFilterDataset": "filter",
    "FlatMapDataset": "flat_map",
    "InterleaveDataset": "interleave",
    "ParallelInterleaveDataset": "interleave",
    "ParallelInterleaveDatasetV2": "interleave",
    "ParallelInterleaveDatasetV3": "interleave",
    "ParallelInterleaveDatasetV4": "interleave",
    "LegacyParallelInterleaveDatasetV2": "interleave",
    "BatchDataset": "batch",
    "BatchDatasetV2": "batch",
    "ParallelBatchDataset": "batch",
    "PaddedBatchDataset": "padded_batch",
    "PaddedBatchDatasetV2": "padded_batch",
    "UnbatchDataset": "unbatch",
    "RebatchDataset": "rebatch",
    "RebatchDatasetV2": "rebatch",
    "PrefetchDataset": "prefetch",
    "CacheDataset": "cache",
    "CacheDatasetV2": "cache",
    "ShuffleDataset": "shuffle",
    "ShuffleDatasetV2": "shuffle",
    "ShuffleDatasetV3": "shuffle",
    "ShuffleAndRepeatDataset": "shuffle",
    "ShuffleAndRepeatDatasetV2": "shuffle",
    "RepeatDataset": "repeat",
    "TakeDataset": "take",
    "SkipDataset": "skip",
    "ShardDataset": "shard",
    "ZipDataset": "zip",
    "ConcatenateDataset": "concatenate",
    "OptionsDataset": "with_options",
    "ScanDataset": "scan",
    "WindowDataset": "window",
    "GroupByWindowDataset": "group_by_window",
    "DirectedInterleaveDataset": "sample_from_datasets",
    "IgnoreErrorsDataset": "ignore_errors",
    "AssertCardinalityDataset": "assert_cardinality",
    "SnapshotDatasetV2": "snapshot",
    "TFRecordDataset": "TFRecordDataset",
    "TFRecordDatasetV2": "TFRecordDataset",
    "TextLineDataset": "TextLineDataset",
    "FixedLengthRecordDataset": "FixedLengthRecordDataset",
    "FixedLengthRecordDatasetV2": "FixedLengthRecordDataset",
    "GeneratorDataset": "from_generator",
}

# Ops TensorFlow wraps around a pipeline to run it; they are not the user's stages.
_RUNTIME_HARNESS = {
    "ModelDataset",
    "MaxIntraOpParallelismDataset",
    "PrivateThreadPoolDataset",
    "ExperimentalMaxIntraOpParallelismDataset",
    "ExperimentalPrivateThreadPoolDataset",
}

_READERS = {
    "TFRecordDataset",
    "TFRecordDatasetV2",
    "TextLineDataset",
    "FixedLengthRecordDataset",
    "FixedLengthRecordDatasetV2",
}

# Stage kinds of file readers, e.g. "TFRecordDataset".
READER_KINDS = frozenset(_KINDS[op] for op in _READERS)

_ASYNCHRONOUS = {
    "PrefetchDataset",
    "ParallelMapDataset",
    "ParallelMapDatasetV2",
    "MapAndBatchDataset",
    "ParallelInterleaveDataset",
    "ParallelInterleaveDatasetV2",
    "ParallelInterleaveDatasetV3",
    "ParallelInterleaveDatasetV4",
    "LegacyParallelInterleaveDatasetV2",
    "ParallelBatchDataset",
    "ParallelFilterDataset",
    # The tf.data service read keeps requests to the service's workers in flight.
    "DataServiceDataset",
    "DataServiceDatasetV2",
    "DataServiceDatasetV3",
    "DataServiceDatasetV4",
}

# Parameters shown without their name when they come first, as users write them.
_POSITIONAL = ("start", "stop", "step")
_FIRST_POSITIONAL = ("batch_size", "buffer_size", "count", "filename")

# Parameters where -1 means tf.data.AUTOTUNE.
_AUTOTUNABLE = {"num_parallel_calls", "cycle_length", "block_length"}

# What a stage's label shows, per kind, in this order.
_LABEL_PARAMS = {
    "map": ("num_parallel_calls", "deterministic"),
    "filter": ("num_parallel_calls",),
    "map_and_batch": ("batch_size", "num_parallel_calls"),
    "interleave": ("cycle_length", "block_length", "num_parallel_calls"),
    "batch": ("batch_size", "drop_remainder", "num_parallel_calls"),
    "padded_batch": ("batch_size", "drop_remainder"),
    "prefetch": ("buffer_size",),
    "shuffle": ("buffer_size", "reshuffle_each_iteration"),
    "repeat": ("count",),
    "take": ("count",),
    "skip": ("count",),
    "shard": ("num_shards", "index"),
    "range": ("start", "stop", "step"),
    "cache": ("filename",),
    "PyDataset": ("workers", "use_multiprocessing"),
    "distribute": ("processing_mode", "service", "job_name"),
}

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
_DATASET_OP = re.compile(r"Dataset(V\d+)?$")
_INFERENCE_NAME = re.compile(r"^__inference_(?P<body>.+?)_\d+$")
# Prefixes tf.data puts before the Python name of a traced function.
_TRANSFORMATION_PREFIX = re.compile(
    r"^(?:Dataset|tf_data_experimental|tf_data_Dataset)_"
    r"(?:flat_map|interleave|map|filter|scan|group_by_window|group_by_reducer|"
    r"from_generator|parallel_interleave|map_and_batch|reduce|"
    r"bucket_by_sequence_length|choose_from_datasets|sample_from_datasets)_"
)
# Element sizes above this are not estimated (unknown or pathological shapes).
_MAX_ELEMENT_BYTES = 1 << 50
# A function this small (in ops that compute) is cheap to run per element.
CHEAP_FUNCTION_OPS = 25


class InMemoryDataTooLarge(ValueError):
    """The dataset embeds more in-memory data than its graph should be read with."""


@dataclasses.dataclass
class StageFunction:
    """What a user function in a stage does, from its traced graph.

    Attributes:
        name: the name the user wrote (`"augment"`, `"<lambda>"`, the class of a
            Keras layer such as `"RandomFlip"`).
        graph_name: the function's name in the graph library.
        ops: distinct op types inside, nested functions included.
        random_ops: ops whose values change between epochs (stateful random
            ops, and stateless ones seeded from a variable, like Keras layers).
        py_function_ops: `tf.py_function` / `tf.numpy_function` ops.
        heavy_ops: decoding, parsing and resizing ops.
        io_ops: file reads, and datasets created inside (readers, generators).
        stateful_ops: ops TensorFlow marks stateful; a function holding one is
            never parallelised automatically.
        compute_ops: how many ops do work (constants and identities aside).
    """

    name: str
    graph_name: str
    ops: List[str] = dataclasses.field(default_factory=list)
    random_ops: List[str] = dataclasses.field(default_factory=list)
    py_function_ops: List[str] = dataclasses.field(default_factory=list)
    heavy_ops: List[str] = dataclasses.field(default_factory=list)
    io_ops: List[str] = dataclasses.field(default_factory=list)
    stateful_ops: List[str] = dataclasses.field(default_factory=list)
    compute_ops: int = 0

    @property
    def random(self) -> bool:
        """Whether the function gives different results in different epochs."""
        return bool(self.random_ops)

    @property
    def expensive(self) -> bool:
        """Whether it runs Python, decodes / parses / resizes, or reads files."""
        return bool(self.py_function_ops or self.heavy_ops or self.io_ops)

    @property
    def trivial(self) -> bool:
        """Whether it computes nothing (e.g. only reshapes the structure)."""
        return self.compute_ops == 0

    @property
    def cheap(self) -> bool:
        """Whether it is a few plain TensorFlow ops, cheap per element."""
        return (
            not self.trivial
            and not self.expensive
            and not self.random
            and not self.stateful_ops
            and self.compute_ops <= CHEAP_FUNCTION_OPS
        )


@dataclasses.dataclass
class Stage:
    """One transformation (or source) of a pipeline.

    Attributes:
        node: the node's name in the dataset graph; unique in the pipeline.
        op: the dataset op, e.g. "ParallelMapDatasetV2".
        kind: the `tf.data` method it comes from, e.g. "map", "TFRecordDataset",
            "from_generator"; the op name for ops this module does not know.
        params: its arguments, e.g. `{"num_parallel_calls": "AUTOTUNE"}`
            (AUTOTUNE is written as the word).
        function: the user function it applies, if any.
        inputs: `node`s of the stages it reads from.
        files: how many files a reader or `list_files` stage covers.
        element_bytes: size of one output element when all shapes are static.
        opaque: True for ops this module does not know; shown, not judged.
        runs_as: the label of the stage TensorFlow runs in its place after its
            default rewrites, when it differs (e.g. a fused `map_and_batch`).
        parallel_at_runtime: whether it runs in parallel after those rewrites;
            `None` when the rewritten pipeline could not be read.
        made_by: the Keras utility whose own work the stage is, e.g.
            "image_dataset_from_directory" for its loader map (see
            `keras_made`); the stage is then labelled, and its function
            named, as the call the user wrote.
    """

    node: str
    op: str
    kind: str
    params: Dict[str, ParamValue] = dataclasses.field(default_factory=dict)
    function: Optional[StageFunction] = None
    inputs: List[str] = dataclasses.field(default_factory=list)
    files: Optional[int] = None
    element_bytes: Optional[int] = None
    opaque: bool = False
    runs_as: Optional[str] = None
    parallel_at_runtime: Optional[bool] = None
    made_by: Optional[str] = None

    @property
    def function_name(self) -> Optional[str]:
        """The user function's name (or the Keras utility they called), or `None`."""
        if self.made_by is not None:
            return self.made_by
        return self.function.name if self.function is not None else None

    @property
    def parallel(self) -> bool:
        """Whether the stage, as written, runs its work on several threads."""
        if self.op not in _ASYNCHRONOUS or self.op == "PrefetchDataset":
            return False
        if self.op == "LegacyParallelInterleaveDatasetV2":
            return self.params.get("cycle_length") != 1
        return self.params.get("num_parallel_calls") != 1

    @property
    def asynchronous(self) -> bool:
        """Whether the stage produces ahead of its consumer on its own threads."""
        return self.op in _ASYNCHRONOUS

    @property
    def label(self) -> str:
        """The stage as code, e.g. `map(augment, num_parallel_calls=AUTOTUNE)`."""
        if self.made_by is not None:
            return keras_made.label(self.made_by)
        if self.opaque:
            return f"{self.op} (opaque)"
        arguments = []
        if self.kind in READER_KINDS or self.kind == "list_files":
            if self.files is not None:
                arguments.append(f"{self.files} file{'s' if self.files != 1 else ''}")
            if "num_parallel_reads" in self.params:
                arguments.append(f"num_parallel_reads={self.params['num_parallel_reads']}")
        elif self.function is not None and self.kind != "from_generator":
            arguments.append(self.function.name)
        for name in _LABEL_PARAMS.get(self.kind, ()):
            if name not in self.params:
                continue
            value = self.params[name]
            if name in ("drop_remainder", "reshuffle_each_iteration") and value == (
                name == "reshuffle_each_iteration"
            ):
                continue
            if name == "deterministic" and value != "false":
                continue
            if name == "filename" and value in ("", "memory"):
                continue
            if name == "deterministic":
                text = "False"
            elif isinstance(value, str) and value != AUTOTUNE:
                text = repr(value)
            else:
                text = str(value)
            positional = (name in _FIRST_POSITIONAL and not arguments) or (
                name in _POSITIONAL and len(arguments) == _POSITIONAL.index(name)
            )
            arguments.append(text if positional else f"{name}={text}")
        return f"{self.kind}({', '.join(arguments)})"


@dataclasses.dataclass
class Pipeline:
    """A dataset's stages in order, sources first and the final dataset last.

    Attributes:
        stages: the stages in topological order: every stage comes after the
            stages it reads from; the last one is the dataset itself.
        options: the `tf.data.Options` set on the pipeline, flattened to
            `{"autotune_options.enabled": False, ...}` (only what was set).
        runtime: the pipeline TensorFlow runs after its default rewrites, or
            `None` when it could not be read (see `runtime_error`).
        runtime_error: why the rewritten pipeline could not be read.

    Example:

    >>> pipeline = read_pipeline(tf.data.Dataset.range(8).batch(2))
    >>> str(pipeline)
    'range(0, 8, 1) -> batch(2)'
    """

    stages: List[Stage] = dataclasses.field(default_factory=list)
    options: Dict[str, ParamValue] = dataclasses.field(default_factory=dict)
    runtime: Optional["Pipeline"] = None
    runtime_error: Optional[str] = None

    def __str__(self) -> str:
        return " -> ".join(stage.label for stage in self.stages)

    @property
    def final(self) -> Optional[Stage]:
        """The stage that produces the dataset's elements."""
        return self.stages[-1] if self.stages else None

    def stage(self, node: str) -> Stage:
        """The stage whose graph node is `node`.

        Raises:
            KeyError: if no stage has that node.
        """
        for stage in self.stages:
            if stage.node == node:
                return stage
        raise KeyError(f"No stage {node!r} in the pipeline.")

    def upstream(self, stage: Stage) -> Iterator[Stage]:
        """Every stage `stage` reads from, directly or not, nearest first."""
        by_node = {item.node: item for item in self.stages}
        seen = set()
        frontier = list(stage.inputs)
        while frontier:
            node = frontier.pop(0)
            if node in seen or node not in by_node:
                continue
            seen.add(node)
            yield by_node[node]
            frontier.extend(by_node[node].inputs)

    def main_chain(self, stage: Stage) -> Iterator[Stage]:
        """The stages `stage` reads from through first inputs, nearest first.

        The first input is the data a transformation works on (the others are
        e.g. the datasets an interleave or zip also reads).
        """
        by_node = {item.node: item for item in self.stages}
        current = by_node.get(stage.inputs[0]) if stage.inputs else None
        while current is not None:
            yield current
            current = by_node.get(current.inputs[0]) if current.inputs else None

    def downstream(self, stage: Stage) -> Iterator[Stage]:
        """Every stage that reads from `stage`, directly or not, nearest first."""
        readers: Dict[str, List[Stage]] = {}
        for item in self.stages:
            for node in item.inputs:
                readers.setdefault(node, []).append(item)
        seen = set()
        frontier = list(readers.get(stage.node, []))
        while frontier:
            item = frontier.pop(0)
            if item.node in seen:
                continue
            seen.add(item.node)
            yield item
            frontier.extend(readers.get(item.node, []))

    @property
    def runtime_final(self) -> Optional[Stage]:
        """The final stage TensorFlow runs, when the rewritten pipeline is known."""
        return self.runtime.final if self.runtime is not None else None


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
                "limit (max_in_memory_bytes=None reads it anyway)."
            )
    graph_def = _graph_def(
        dataset._as_serialized_graph(  # pylint: disable=protected-access
            external_state_policy=tf.data.experimental.ExternalStatePolicy.IGNORE
        )
    )
    pipeline = pipeline_from_graph_def(graph_def)
    try:
        runtime = pipeline_from_graph_def(_graph_def(_finalized_graph(dataset)))
    except Exception as error:  # noqa: BLE001 - the static view stands on its own.
        pipeline.runtime_error = f"{type(error).__name__}: {error}"
    else:
        _link_runtime(pipeline, runtime)
    return pipeline


def in_memory_bytes(dataset) -> int:
    """Estimates the bytes of tensors a dataset holds in memory.

    Counts the tensors of `from_tensor_slices` / `from_tensors` sources and
    those the functions of its transformations capture or hold as constants
    (such as an array sliced inside a `flat_map`), through all its inputs.
    String tensors are counted at 64 bytes an element.

    Args:
        dataset: a `tf.data.Dataset`.

    Returns:
        The estimate in bytes.
    """
    tf = tensorflow()
    total, seen, frontier = 0, set(), [dataset]
    while frontier:
        current = frontier.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        for value in vars(current).values():
            function = getattr(value, "function", None)
            # Arrays a function uses are constants of its graph (e.g. the
            # `from_tensor_slices(array)` inside a `flat_map`), not captures.
            total += _constant_bytes(getattr(function, "graph", None), tf)
            captured = getattr(function, "captured_inputs", None)
            tensors = captured if captured is not None else value
            if not isinstance(tensors, (tf.Tensor, list, tuple, dict, tf.SparseTensor)):
                continue
            for tensor in tf.nest.flatten(tensors, expand_composites=True):
                if isinstance(tensor, tf.Tensor) and tensor.shape.is_fully_defined():
                    size = 64 if tensor.dtype == tf.string else tensor.dtype.size
                    if tensor.dtype not in (tf.resource, tf.variant):
                        total += tensor.shape.num_elements() * size
        try:
            frontier.extend(current._inputs())  # pylint: disable=protected-access
        except (AttributeError, NotImplementedError):
            pass
    return total


def _constant_bytes(graph, tf) -> int:
    # Read from the ops' output shapes: no constant is copied or serialised.
    if not isinstance(graph, tf.Graph):
        return 0
    total = 0
    for operation in graph.get_operations():
        if operation.type != "Const":
            continue
        output = operation.outputs[0]
        if output.dtype in (tf.resource, tf.variant) or not output.shape.is_fully_defined():
            continue
        size = 64 if output.dtype == tf.string else output.dtype.size
        total += output.shape.num_elements() * size
    return total
def without_large_sources(dataset, limit: int):
    """The pipeline rebuilt over one-element stand-ins of its large in-memory sources.

    Serialising a dataset's graph copies every tensor of its
    `from_tensor_slices` / `from_tensors` sources (about 1 s per 100 MB here).
    The lint needs the pipeline's structure and functions, not the data: each
    transformation is applied again, with its own function and arguments, to a
    stand-in source of the same element structure holding one element.

    Args:
        dataset: a `tf.data.Dataset`.
        limit: sources holding more than this many bytes are replaced.

    Returns:
        The rebuilt dataset, or `None` when a transformation on the way to a
        large source is one this function does not rebuild (the caller then
        refuses as before).
    """
    try:
        return _light(dataset, limit)
    except _NotRebuilt:
        return None


class _NotRebuilt(Exception):
    """A transformation `_light` does not know how to apply again."""


def _light(dataset, limit: int):
    tf = tensorflow()
    if in_memory_bytes(dataset) <= limit:
        return dataset
    kind = type(dataset).__name__
    if kind == "_TensorSliceDataset":
        return tf.data.Dataset.from_tensor_slices(
            tf.nest.map_structure(lambda spec: _zeros(spec, 1), dataset.element_spec)
        )
    if kind == "_TensorDataset":
        return tf.data.Dataset.from_tensors(
            tf.nest.map_structure(lambda spec: _zeros(spec, None), dataset.element_spec)
        )
    if kind == "_ZipDataset":
        inputs = dataset._datasets  # pylint: disable=protected-access
        return tf.data.Dataset.zip(tf.nest.map_structure(lambda d: _light(d, limit), inputs))
    source = getattr(dataset, "_input_dataset", None)
    if source is None:
        raise _NotRebuilt(kind)
    light = _light(source, limit)
    attrs = vars(dataset)
    if kind in ("_MapDataset", "_ParallelMapDataset"):
        from tensorflow.python.data.ops import dataset_ops
        from tensorflow.python.ops import gen_dataset_ops

        function = attrs["_map_func"].function
        common = dict(
            f=function,
            use_inter_op_parallelism=attrs["_use_inter_op_parallelism"],
            preserve_cardinality=attrs["_preserve_cardinality"],
            **dataset._common_args,  # pylint: disable=protected-access
        )
        variant = light._variant_tensor  # pylint: disable=protected-access
        if kind == "_MapDataset":
            made = gen_dataset_ops.map_dataset(
                variant,
                function.captured_inputs,
                force_synchronous=attrs.get("_force_synchronous", False),
                **common,
            )
        else:
            made = gen_dataset_ops.parallel_map_dataset_v2(
                variant,
                function.captured_inputs,
                num_parallel_calls=attrs["_num_parallel_calls"],
                deterministic=attrs["_deterministic"],
                use_unbounded_threadpool=attrs.get("_use_unbounded_threadpool", False),
                **common,
            )
        return dataset_ops._VariantDataset(made, dataset.element_spec)  # pylint: disable=protected-access
    if kind == "_ShuffleDataset":
        return light.shuffle(
            int(attrs["_buffer_size"]),
            reshuffle_each_iteration=attrs["_reshuffle_each_iteration"],
        )
    if kind in ("_BatchDataset", "_ParallelBatchDataset"):
        return light.batch(
            int(attrs["_batch_size"]),
            drop_remainder=bool(attrs["_drop_remainder"]),
            num_parallel_calls=(
                int(attrs["_num_parallel_calls"]) if "_num_parallel_calls" in attrs else None
            ),
        )
    if kind == "_PrefetchDataset":
        return light.prefetch(int(attrs["_buffer_size"]))
    if kind == "CacheDataset":
        return light.cache(attrs["_filename"].numpy().decode())
    if kind == "_RepeatDataset":
        return light.repeat(int(attrs["_count"]))
    if kind in ("_TakeDataset", "_SkipDataset"):
        count = int(attrs["_count"])
        return light.take(count) if kind == "_TakeDataset" else light.skip(count)
    if kind == "_OptionsDataset":
        return light.with_options(attrs["_options_attr"])
    raise _NotRebuilt(kind)


def _zeros(spec, rows: Optional[int]):
    tf = tensorflow()
    if not isinstance(spec, tf.TensorSpec) or not spec.shape.is_fully_defined():
        raise _NotRebuilt(type(spec).__name__)
    shape = ([rows] if rows is not None else []) + spec.shape.as_list()
    return tf.zeros(shape, spec.dtype)


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
        self._library = {
            function.signature.name: function for function in graph_def.library.function
        }
        self._functions: Dict[Tuple[str, bool], StageFunction] = {}

    def pipeline(self) -> Pipeline:
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
        _fold_service_stages(pipeline)
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
        kind = _KINDS.get(node.op)
        stage = Stage(node=node.name, op=node.op, kind=kind or node.op, opaque=kind is None)
        for arg, value in self._arguments(node, node.input):
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
            stage.kind = "list_files"
            stage.files = self._file_count(node)
        stage.element_bytes = _element_bytes(node)
        for attr_name in ("f", "predicate"):
            if attr_name in node.attr and node.attr[attr_name].func.name:
                stage.function = self._function(node.attr[attr_name].func.name, tainted=False)
                break
        return stage

    def _arguments(self, node, inputs) -> List[Tuple[Optional[str], str]]:
        """Pairs each data input of `node` with its argument name in the op's definition."""
        inputs = [name for name in inputs if not name.startswith("^")]
        op_def = self._op_def(node.op)
        if op_def is None:
            return [(None, name) for name in inputs]
        names: List[Optional[str]] = []
        for arg in op_def.input_arg:
            if arg.number_attr:
                count = node.attr[arg.number_attr].i
            elif arg.type_list_attr:
                count = len(node.attr[arg.type_list_attr].list.type)
            else:
                count = 1
            names.extend([arg.name] * count)
        names.extend([None] * (len(inputs) - len(names)))
        return list(zip(names, inputs))

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
        for _, value in self._arguments(node, node.input):
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

    # Functions.

    def _function(self, name: str, tainted: bool) -> StageFunction:
        key = (name, tainted)
        if key not in self._functions:
            self._functions[key] = self._analyse(name, tainted)
        return self._functions[key]

    def _analyse(self, name: str, tainted_args: bool) -> StageFunction:
        result = StageFunction(name=_user_name(name), graph_name=name)
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
                (arg, value.split(":")[0]) for arg, value in self._arguments(node, node.input)
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
                    nested = self._function(nested_name, any_tainted)
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
            if node.op in _IO_OPS or node.op in _READERS or node.op == "GeneratorDataset":
                io.add(node.op)
            tainted[node.name] = is_tainted
        result.ops = sorted(ops)
        result.random_ops = sorted(random)
        result.py_function_ops = sorted(py)
        result.heavy_ops = sorted(heavy)
        result.io_ops = sorted(io)
        result.stateful_ops = sorted(stateful)
        result.compute_ops = compute
        if result.name in ("ABCMeta", "read_one_file", "flat_map_fn"):
            # A dataset class passed as the function (interleave(TFRecordDataset)):
            # name it by what it creates.
            created = [op for op in result.io_ops if op in _READERS or op == "GeneratorDataset"]
            if created:
                result.name = _KINDS[created[0]]
        return result


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


def _user_name(graph_name: str) -> str:
    """The Python name of a traced function, from its name in the graph library."""
    match = _INFERENCE_NAME.match(graph_name)
    name = match.group("body") if match else graph_name
    name = _TRANSFORMATION_PREFIX.sub("", name, count=1)
    if name.startswith("class"):
        # A callable object: tf.data writes its class path, e.g. a Keras layer.
        name = name[len("class"):].rsplit(".", 1)[-1]
    return "<lambda>" if name == "lambda" else name


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
        if function is None or stage.kind not in ("flat_map", "interleave"):
            continue
        if len(stage.inputs) != 1:
            continue
        graph_name = _user_name(function.graph_name)
        feeder = by_node.get(stage.inputs[0])
        if graph_name == "read_one_file" and function.name != graph_name:
            if stage.kind == "interleave":
                reads = stage.params.get("num_parallel_calls", stage.params.get("cycle_length"))
                stage.params = {"num_parallel_reads": reads}
            else:
                stage.params = {}
            stage.kind = function.name
            listed = feeder is not None and feeder.kind == "list_files"
            if listed and _read_only_by(pipeline, feeder, stage):
                stage.files = feeder.files
                stage.inputs = list(feeder.inputs)
                absorbed.add(feeder.node)
            elif feeder is not None:
                stage.files = feeder.files
        elif (
            function.name == "from_generator"
            and feeder is not None
            and feeder.kind == "from_tensors"
            and _read_only_by(pipeline, feeder, stage)
        ):
            stage.kind = "from_generator"
            stage.params = {}
            stage.inputs = []
            absorbed.add(feeder.node)
    pipeline.stages = [stage for stage in pipeline.stages if stage.node not in absorbed]


def _read_only_by(pipeline: Pipeline, feeder: Stage, reader: Stage) -> bool:
    return all(
        stage is reader or feeder.node not in stage.inputs for stage in pipeline.stages
    )


# The tf.data service: `distribute(...)` leaves a read op (with the dispatcher's
# address and the job's name) followed by a map tf.data adds to uncompress.
_SERVICE_OPS = frozenset(
    {"DataServiceDataset", "DataServiceDatasetV2", "DataServiceDatasetV3", "DataServiceDatasetV4"}
)
# The stage kind: the function a user applies to get it.
SERVICE_KIND = "distribute"
# tf.data names the function of the map it adds after the read.
_UNCOMPRESS = "DataServiceDataset_uncompress"
# `processing_mode` as users write it, by sharding policy.
_MODES = {
    0: "parallel_epochs",
    1: "distributed_epoch",
    2: "ShardingPolicy.FILE",
    3: "ShardingPolicy.DATA",
    4: "ShardingPolicy.FILE_OR_DATA",
    5: "ShardingPolicy.HINT",
}


def _fold_service_stages(pipeline: Pipeline) -> None:
    """Shows each tf.data service read as the `distribute(...)` stage written.

    Names the stage by its processing mode, service address and job name, and
    removes the uncompressing map tf.data adds after it (an implementation
    detail, not a stage of the user's).

    Args:
        pipeline: the `Pipeline` to change in place.
    """
    absorbed = {}
    for stage in pipeline.stages:
        if stage.op in _SERVICE_OPS:
            stage.kind = SERVICE_KIND
            stage.opaque = False
            stage.params = _service_params(stage.params)
    for stage in pipeline.stages:
        function = stage.function
        if (
            stage.kind == "map"
            and function is not None
            and _UNCOMPRESS in function.graph_name
            and len(stage.inputs) == 1
            and any(s.node == stage.inputs[0] and s.kind == SERVICE_KIND for s in pipeline.stages)
        ):
            absorbed[stage.node] = stage.inputs[0]
    if not absorbed:
        return
    pipeline.stages = [stage for stage in pipeline.stages if stage.node not in absorbed]
    for stage in pipeline.stages:
        stage.inputs = [absorbed.get(node, node) for node in stage.inputs]


def _service_params(params):
    mode = params.get("processing_mode")
    result = {}
    if isinstance(mode, str):
        result["processing_mode"] = _processing_mode(mode)
    address, protocol = params.get("address"), params.get("protocol")
    if isinstance(address, str) and address:
        result["service"] = f"{protocol}://{address}" if protocol else address
    job_name = params.get("job_name")
    if isinstance(job_name, str) and job_name:
        result["job_name"] = job_name
    return result


def _processing_mode(serialized: str) -> str:
    # The graph holds a serialized ProcessingModeDef, read back as text by
    # this module (lossless for its few small bytes).
    from tensorflow.core.protobuf import data_service_pb2

    try:
        mode = data_service_pb2.ProcessingModeDef.FromString(serialized.encode("utf-8"))
    except Exception:  # noqa: BLE001 - an unknown encoding only loses the label.
        return "unknown"
    return _MODES.get(mode.sharding_policy, f"sharding_policy={mode.sharding_policy}")
