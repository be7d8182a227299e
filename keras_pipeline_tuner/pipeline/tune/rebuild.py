"""A dataset rebuilt from its (rewritten) graph, in this process.

`tf.raw_ops.DatasetFromGraph` turns a dataset's GraphDef back into a working
dataset, the user's Python functions (`tf.py_function`, `from_generator`)
included as long as the original dataset lives. A rebuilt dataset gets memory
caches and random seed generators of its own, so that passes over it leave the
user's dataset as it was.

A graph read light (`reader.graph_def_of(dataset, light_over=...)`) holds
named one-element stand-ins of the dataset's large in-memory sources: it is
imported into a function whose arguments are the real sources, so that the
data is never serialised or copied (118 MB of encoded images: 0.05 s against
some 3 s through `DatasetFromGraph`). The stand-ins' pipeline keeps the
dataset's shuffle seeds, so such a rebuild shuffles as a new dataset would.
"""

from typing import Any
from typing import Dict
from typing import Tuple

from keras_pipeline_tuner._util.tf_import import tensorflow
from keras_pipeline_tuner.pipeline.graph.in_memory import in_memory_bytes
from keras_pipeline_tuner.pipeline.graph.in_memory import real_sources
from keras_pipeline_tuner.pipeline.graph.in_memory import stand_in_of
from keras_pipeline_tuner.pipeline.graph.in_memory import without_large_sources
from keras_pipeline_tuner.pipeline.graph.reader import graph_def_of
from keras_pipeline_tuner.pipeline.graph.reader import read_pipeline
from keras_pipeline_tuner.pipeline.tune.graph_editing import GraphEditor

# Datasets holding more in-memory tensors than this are not copied to run
# extra passes: their graph would copy the data (about 1 s per 100 MB).
COPY_MAX_IN_MEMORY_BYTES = 64 * 2**20
# Sources holding more than this are read as stand-ins and rebuilt over the
# real ones (see the module's docstring), rather than serialised.
LIGHT_OVER_BYTES = 16 * 2**20


def graph_for_rebuild(dataset):
    """The dataset's GraphDef as the timing rebuilds it: its large sources as stand-ins.

    Example:

    >>> sorted({node.op for node in graph_for_rebuild(tf.data.Dataset.range(4)).node})
    ['Const', 'RangeDataset', '_Retval']
    """
    return graph_def_of(dataset, light_over=LIGHT_OVER_BYTES)


def pipeline_for_rebuild(dataset):
    """The dataset's `Pipeline`, with the node names of `graph_for_rebuild`'s graph."""
    light = copied_by_rebuild(dataset) is not dataset
    return read_pipeline(dataset, LIGHT_OVER_BYTES if light else None)


def copied_by_rebuild(dataset):
    """What of `dataset` its rebuilds copy: its pipeline over stand-ins, or all of it.

    Example:

    >>> small = tf.data.Dataset.range(4)
    >>> copied_by_rebuild(small) is small
    True
    """
    if in_memory_bytes(dataset) <= LIGHT_OVER_BYTES:
        return dataset
    light = without_large_sources(dataset, LIGHT_OVER_BYTES)
    return dataset if light is None else light


def rebuild(graph_def, element_spec, keep_alive: Any):
    """Turns a dataset GraphDef back into a dataset, in this process.

    Every memory cache in the graph gets a fresh, unshared buffer, so a rebuilt
    dataset starts empty as a new dataset would, and several rebuilds of one
    graph do not fill each other's caches; every random seed generator (a
    shuffle's) is fresh too, so the rebuilt dataset draws as a new dataset
    would and leaves the original's draws alone.

    Args:
        graph_def: a dataset `tf.compat.v1.GraphDef` (from
            `graph_editing.apply_rewrites`).
        element_spec: the element spec of its elements.
        keep_alive: the dataset the graph came from. The rebuilt dataset holds
            on to it: the Python functions its graph calls (`tf.py_function`,
            `from_generator`) live only as long as the original dataset.

    Returns:
        A `tf.data.Dataset`.

    Example:

    >>> ds = tf.data.Dataset.range(4).cache()
    >>> copy = rebuild(graph_def_of(ds), ds.element_spec, ds)
    >>> list(copy.as_numpy_iterator()) == [0, 1, 2, 3]
    True
    """
    tf = tensorflow()
    fresh = tf.compat.v1.GraphDef()
    fresh.CopyFrom(graph_def)
    editor = GraphEditor(fresh)
    editor.renew_caches()
    # Its own random seeds too: iterating it leaves the original's shuffle
    # order as it was, and it shuffles as a newly built dataset would.
    editor.renew_seed_generators()
    return _dataset_of(fresh, element_spec, keep_alive)


def _dataset_of(graph_def, element_spec, keep_alive):
    """The dataset of a (light or full) graph, over the real sources of `keep_alive`."""
    tf = tensorflow()
    stand_ins = _stand_ins(graph_def)
    if stand_ins:
        variant, built_by = _over_real_sources(graph_def, stand_ins, keep_alive)
    else:
        variant = tf.raw_ops.DatasetFromGraph(graph_def=graph_def.SerializeToString())
        built_by = None
    dataset = tf.data.experimental.from_variant(variant, element_spec)
    # It runs the functions of the graph it came from: they live as long as
    # the objects that hold them.
    dataset._kpt_rebuilt_from = (keep_alive, built_by)  # pylint: disable=protected-access
    return dataset


def _stand_ins(graph_def) -> Dict[str, Tuple[int, int]]:
    """The nodes of a light graph that stand in for large sources: `{name: (index, limit)}`."""
    from tensorflow.core.framework import dataset_metadata_pb2

    found = {}
    for node in graph_def.node:
        if "metadata" not in node.attr or not node.attr["metadata"].s:
            continue
        metadata = dataset_metadata_pb2.Metadata()
        metadata.ParseFromString(node.attr["metadata"].s)
        name = metadata.name
        place = stand_in_of(name.decode() if isinstance(name, bytes) else name)
        if place is not None:
            found[node.name] = place
    return found


def _over_real_sources(graph_def, stand_ins: Dict[str, Tuple[int, int]], keep_alive):
    """The light graph's dataset variant with its stand-ins' outputs replaced by the real sources'.

    `DatasetFromGraph` takes no inputs: the graph is imported into a function
    instead, whose arguments are the real sources' variants (no data copied).
    """
    tf = tensorflow()
    limit = next(iter(stand_ins.values()))[1]
    sources = real_sources(keep_alive, limit)
    if len(sources) != len(stand_ins):
        raise ValueError(
            f"the graph stands in for {len(stand_ins)} large sources, and the dataset it "
            f"came from holds {len(sources)}"
        )
    graph_def, output_name = _without_retval(graph_def)
    names = sorted(stand_ins, key=lambda name: stand_ins[name][0])

    def imported(*variants):
        (output,) = tf.compat.v1.import_graph_def(
            graph_def,
            input_map={f"{name}:0": variant for name, variant in zip(names, variants)},
            return_elements=[output_name],
            name="",
        )
        return output

    signature = [tf.TensorSpec([], tf.variant)] * len(names)
    function = tf.function(imported).get_concrete_function(*signature)
    variants = [sources[stand_ins[name][0]]._variant_tensor for name in names]  # pylint: disable=protected-access
    return function(*variants), function


def _without_retval(graph_def):
    """`(graph_def without its _Retval node, the tensor name that fed it)`."""
    (retval,) = [node for node in graph_def.node if node.op == "_Retval"]
    kept = type(graph_def)()
    kept.CopyFrom(graph_def)
    del kept.node[:]
    kept.node.extend(node for node in graph_def.node if node.op != "_Retval")
    output = retval.input[0]
    return kept, output if ":" in output else f"{output}:0"


def independent_copy(dataset):
    """The dataset with random seeds of its own, for passes that must leave it as it was.

    A dataset that reshuffles every epoch draws each new iterator's seed from a
    generator it holds, so any extra pass over it (or over a dataset built on
    it) changes the order the next `fit` on it sees. The copy is rebuilt from
    the dataset's graph with fresh seed generators; its caches stay shared, so
    a cache training filled is read, not filled again. Large in-memory sources
    are not copied: the copy is rebuilt over them (see the module's docstring).

    Args:
        dataset: a `tf.data.Dataset`.

    Returns:
        The copy, or `dataset` itself when it holds no seed generator (extra
        passes then change nothing later passes see), or `None` when it holds
        one but also more small in-memory tensors than a copy should hold
        (`COPY_MAX_IN_MEMORY_BYTES`), or large sources and a cache (a copy
        over stand-ins would not share the cache).

    Example:

    >>> ds = tf.data.Dataset.range(4).shuffle(4, seed=1)
    >>> expected = [list(ds.as_numpy_iterator()) for _ in range(2)]
    >>> ds = tf.data.Dataset.range(4).shuffle(4, seed=1)
    >>> _ = list(independent_copy(ds))  # not seen by `ds`
    >>> [list(ds.as_numpy_iterator()) for _ in range(2)] == expected
    True
    """
    # Over stand-ins of its large sources: those are never copied.
    read = copied_by_rebuild(dataset)
    if in_memory_bytes(read) > COPY_MAX_IN_MEMORY_BYTES:
        return None
    graph_def = graph_def_of(read)
    editor = GraphEditor(graph_def)
    if not editor.seed_generator_inputs():
        # Most pipelines hold none, and then need no copy at all.
        return dataset
    if read is not dataset and any(node.op == "CacheDatasetV2" for node in graph_def.node):
        # The stand-ins' pipeline applied `cache()` again: a buffer of its own.
        return None
    editor.renew_seed_generators()
    return _dataset_of(graph_def, dataset.element_spec, dataset)
