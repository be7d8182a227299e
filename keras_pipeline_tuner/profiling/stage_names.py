"""Names tf.data stages the way the user wrote them, e.g. "map(load_image)".

The TF Profiler names iterators by their position in the running pipeline
("Iterator::Root::Prefetch::MapAndBatch::FlatMap") and, in the trace, by the
dataset op each came from ("MapDataset:1", "fused(MapDataset:1,BatchDatasetV2:2)").
Those op names are the datasets' metadata names, which the dataset's GraphDef
carries on its nodes; `pipeline.graph.reader` reads the same graph into stages with the
user's functions. This module joins the two, and nothing else.
"""

import re
from typing import Dict
from typing import Iterable
from typing import Optional

from keras_pipeline_tuner._util.tf_import import tensorflow
from keras_pipeline_tuner.pipeline.graph.in_memory import without_large_sources
from keras_pipeline_tuner.pipeline.graph.model import Stage
from keras_pipeline_tuner.pipeline.graph.reader import read_pipeline

# In-memory sources above this are read as one-element stand-ins (no copy).
MAX_IN_MEMORY_BYTES = 16 * 2**20

# Iterator kinds (version suffix removed) and the Dataset method that creates them.
_TRANSFORMATIONS = {
    "Batch": "batch",
    "Cache": "cache",
    "Concatenate": "concatenate",
    "Filter": "filter",
    "FlatMap": "flat_map",
    "FromTensor": "from_tensors",
    "Generator": "from_generator",
    "Interleave": "interleave",
    "LegacyParallelInterleave": "interleave",
    "Map": "map",
    "MapAndBatch": "map",
    "MemoryCache": "cache",
    "MemoryCacheImpl": "cache",
    "FileCache": "cache",
    "FileCacheImpl": "cache",
    "PaddedBatch": "padded_batch",
    "ParallelBatch": "batch",
    "ParallelFilter": "filter",
    "ParallelInterleave": "interleave",
    "ParallelMap": "map",
    "Prefetch": "prefetch",
    "Range": "range",
    "Repeat": "repeat",
    "Root": "iterator root",
    "ForeverRepeat": "repeat",
    "Shuffle": "shuffle",
    "ShuffleAndRepeat": "shuffle",
    "Skip": "skip",
    "Take": "take",
    "TensorSlice": "from_tensor_slices",
    "TextLine": "TextLineDataset",
    "TFRecord": "TFRecordDataset",
    "Unbatch": "unbatch",
    "Zip": "zip",
}

# Iterators that hand work to background threads: their consumer-side self time
# can be pure waiting for what those threads produce.
_ASYNCHRONOUS_KINDS = frozenset(
    {
        "Prefetch",
        "ParallelMap",
        "MapAndBatch",
        "ParallelInterleave",
        "LegacyParallelInterleave",
        "ParallelBatch",
        "ParallelFilter",
        "DataService",
    }
)
# Of those, the ones that run no user function: their self time is only waiting
# (and copying), never the work itself.
_BUFFER_KINDS = frozenset({"Prefetch", "ParallelBatch", "DataService"})

_SEGMENT_INDEX = re.compile(r"\[\d+\]$")
_VERSION = re.compile(r"V\d+$")
_FUSED = re.compile(r"^fused\((.*)\)$")


def iterator_kind(iterator: str) -> str:
    """The kind of an iterator, from its profiler name.

    Args:
        iterator: a profiler iterator name, e.g.
            "Iterator::Root::Prefetch::BatchV2::FlatMap[0]::Generator".

    Returns:
        The last segment without index or version suffix, e.g. "Generator";
        "ParallelMapV2" gives "ParallelMap".

    Example:

    >>> iterator_kind("Iterator::Root::Prefetch::BatchV2")
    'Batch'
    """
    segment = _SEGMENT_INDEX.sub("", iterator.split("::")[-1])
    return _VERSION.sub("", segment)


def is_asynchronous(kind: str) -> bool:
    """Whether iterators of `kind` produce their elements on background threads."""
    return kind in _ASYNCHRONOUS_KINDS


def runs_user_function(kind: str) -> bool:
    """Whether an asynchronous iterator's own time includes a user function."""
    return kind in _ASYNCHRONOUS_KINDS and kind not in _BUFFER_KINDS


def pipeline_stages(dataset) -> Dict[str, Stage]:
    """The pipeline's stages by the dataset op names the profiler shows.

    Args:
        dataset: the profiled `tf.data.Dataset`.

    Returns:
        A dict from dataset op name as the trace shows it (the op's metadata
        name, e.g. "MapDataset:1", or the `name=` the user gave) to the
        `Stage` of that op.
    """
    from tensorflow.core.framework import dataset_metadata_pb2

    tf = tensorflow()
    # Over stand-ins of large in-memory arrays, as the lint reads it: the maps
    # keep their op names (the user's functions), other stages may be named
    # by kind only.
    light = without_large_sources(dataset, MAX_IN_MEMORY_BYTES)
    rebuilt = light is not None and light is not dataset
    dataset = light if light is not None else dataset
    pipeline = read_pipeline(dataset)
    by_node = {stage.node: stage for stage in pipeline.stages}
    # The Stages are keyed by graph node; the metadata names are in the nodes.
    graph = tf.compat.v1.GraphDef()
    graph.ParseFromString(
        dataset._as_serialized_graph(
            external_state_policy=tf.data.experimental.ExternalStatePolicy.IGNORE
        ).numpy()
    )
    stages = {}
    for node in graph.node:
        if node.name not in by_node or "metadata" not in node.attr:
            continue
        metadata = dataset_metadata_pb2.Metadata()
        metadata.ParseFromString(node.attr["metadata"].s)
        if metadata.name:
            stages[metadata.name.decode("utf-8", "replace")] = by_node[node.name]
    if rebuilt:
        # A rebuilt pipeline's ops have names of their own, not the ones the
        # trace shows: stages are found by their kind where it is unique.
        return RebuiltStages(stages, pipeline.stages)
    return stages


class RebuiltStages(dict):
    """Stages of a pipeline read over stand-ins of its in-memory arrays.

    Its op names differ from those of the pipeline that ran, so a profiled
    iterator is matched by what it does: the one stage of its kind.

    Attributes:
        by_kind: the `tf.data` method (e.g. "map") to the stage of that kind,
            for kinds that occur once.
    """

    def __init__(self, stages, all_stages):
        super().__init__(stages)
        counts: Dict[str, list] = {}
        for stage in all_stages:
            counts.setdefault(stage.kind, []).append(stage)
        self.by_kind = {kind: found[0] for kind, found in counts.items() if len(found) == 1}


def stage_of_kind(iterator_kind_name: str, stages) -> Optional[Stage]:
    """The stage an iterator of a rebuilt pipeline's kind stands for, when unique.

    Args:
        iterator_kind_name: the iterator's kind (see `iterator_kind`), e.g. "ParallelMap".
        stages: `pipeline_stages` of the pipeline.

    Returns:
        The stage, or `None` when `stages` is not a `RebuiltStages` or the kind
        is not unique.
    """
    by_kind = getattr(stages, "by_kind", None)
    if by_kind is None or iterator_kind_name == "Root":
        return None
    return by_kind.get(_TRANSFORMATIONS.get(iterator_kind_name, ""))


class KerasInputStages(dict):
    """Stages of a pipeline Keras built, all named as the user's input.

    Keras wraps a `PyDataset`, a Python generator or NumPy arrays in tf.data
    ops of its own (`from_generator` and the flat_map holding the generator,
    index slicing maps, a prefetch). Every op of that pipeline, including the
    ones inside its functions that the top-level graph does not list, stands
    for what the user wrote.

    Attributes:
        keras_input: the `Stage` of the user's input.
    """

    def __init__(self, stages: Dict[str, Stage], keras_input):
        super().__init__({name: keras_input for name in stages})
        self.keras_input = keras_input


def as_keras_input(stages: Dict[str, Stage], keras_input) -> KerasInputStages:
    """Renames a pipeline Keras built after the input the user gave `fit`.

    Args:
        stages: `pipeline_stages` of Keras' pipeline.
        keras_input: the `Stage` standing for the user's input
            (e.g. the PyDataset's, as `lint_py_dataset` names it).

    Returns:
        A `KerasInputStages` mapping every op (also ops not listed) to it.
    """
    return KerasInputStages(stages, keras_input)


def stage_of(dataset_op: Optional[str], stages: Dict[str, Stage]):
    """The user's stage behind a dataset op of the trace, if known.

    Args:
        dataset_op: the op name the trace gives, e.g. "MapDataset:1" or
            "fused(MapDataset:1,BatchDatasetV2:2)" for ops tf.data fused.
        stages: `pipeline_stages` of the pipeline.

    Returns:
        The `Stage`; of fused ops, the first that runs a user
        function (the map of a map-and-batch). `None` when unknown.
    """
    found = [stages[name] for name in _op_names(dataset_op) if name in stages]
    with_function = [stage for stage in found if stage.function is not None]
    # In a pipeline Keras built, any op (even one the trace names no dataset
    # op for) is Keras working for the user's input.
    return (with_function or found or [getattr(stages, "keras_input", None)])[0]


def stage_label(iterator: str, dataset_op: Optional[str] = None, stage=None) -> str:
    """Names the transformation an iterator runs, as the user wrote it.

    Args:
        iterator: the profiler iterator name.
        dataset_op: the dataset op name the trace gives for it, if known.
        stage: its `Stage` (see `stage_of`), if known.

    Returns:
        The stage as code when known, e.g. "map(load_image)"; otherwise the
        `tf.data` method of the iterator's kind, e.g. "batch", or "prefetch
        (added by tf.data)" for a prefetch the runtime injected.

    Example:

    >>> stage_label("Iterator::Root::Prefetch::BatchV2")
    'batch'
    """
    kind = iterator_kind(iterator)
    transformation = _TRANSFORMATIONS.get(kind) or _snake_case(kind)
    if kind == "Root":
        # Named after the pipeline's last op, which it is not.
        return transformation
    if stage is not None:
        return stage.label
    if dataset_op and dataset_op.startswith("inject/"):
        return f"{transformation} (added by tf.data)"
    return transformation


def _op_names(dataset_op: Optional[str]) -> Iterable[str]:
    if not dataset_op:
        return ()
    fused = _FUSED.match(dataset_op)
    return fused.group(1).split(",") if fused else (dataset_op,)


def _snake_case(kind: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", kind).lower()
