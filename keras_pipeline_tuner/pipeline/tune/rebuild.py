"""A dataset rebuilt from its (rewritten) graph, in this process.

`tf.raw_ops.DatasetFromGraph` turns a dataset's GraphDef back into a working
dataset, the user's Python functions (`tf.py_function`, `from_generator`)
included as long as the original dataset lives. A rebuilt dataset gets memory
caches and random seed generators of its own, so that passes over it leave the
user's dataset as it was.
"""

from typing import Any

from keras_pipeline_tuner._util.tf_import import tensorflow
from keras_pipeline_tuner.pipeline.graph.in_memory import in_memory_bytes
from keras_pipeline_tuner.pipeline.graph.in_memory import without_large_sources
from keras_pipeline_tuner.pipeline.graph.reader import graph_def_of
from keras_pipeline_tuner.pipeline.tune.graph_editing import GraphEditor

# Datasets holding more in-memory tensors than this are not copied to run
# extra passes: their graph would copy the data (about 1 s per 100 MB).
COPY_MAX_IN_MEMORY_BYTES = 64 * 2**20


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
    variant = tf.raw_ops.DatasetFromGraph(graph_def=fresh.SerializeToString())
    dataset = tf.data.experimental.from_variant(variant, element_spec)
    dataset._kpt_rebuilt_from = keep_alive  # pylint: disable=protected-access
    return dataset


def independent_copy(dataset):
    """The dataset with random seeds of its own, for passes that must leave it as it was.

    A dataset that reshuffles every epoch draws each new iterator's seed from a
    generator it holds, so any extra pass over it (or over a dataset built on
    it) changes the order the next `fit` on it sees. The copy is rebuilt from
    the dataset's graph with fresh seed generators, which start where a new
    dataset's would; its caches stay shared, so a cache training filled is
    read, not filled again.

    Args:
        dataset: a `tf.data.Dataset`.

    Returns:
        The copy, or `dataset` itself when it holds no seed generator (extra
        passes then change nothing later passes see), or `None` when it holds
        one but also too many in-memory tensors to copy cheaply
        (`COPY_MAX_IN_MEMORY_BYTES`).

    Example:

    >>> ds = tf.data.Dataset.range(4).shuffle(4, seed=1)
    >>> expected = [list(ds.as_numpy_iterator()) for _ in range(2)]
    >>> ds = tf.data.Dataset.range(4).shuffle(4, seed=1)
    >>> _ = list(independent_copy(ds))  # not seen by `ds`
    >>> [list(ds.as_numpy_iterator()) for _ in range(2)] == expected
    True
    """
    tf = tensorflow()
    if in_memory_bytes(dataset) > COPY_MAX_IN_MEMORY_BYTES:
        light = without_large_sources(dataset, COPY_MAX_IN_MEMORY_BYTES)
        if light is None or GraphEditor(graph_def_of(light)).seed_generator_inputs():
            return None
        return dataset
    graph_def = graph_def_of(dataset)
    editor = GraphEditor(graph_def)
    if not editor.seed_generator_inputs():
        return dataset
    editor.renew_seed_generators()
    variant = tf.raw_ops.DatasetFromGraph(graph_def=graph_def.SerializeToString())
    copy = tf.data.experimental.from_variant(variant, dataset.element_spec)
    # The Python functions its graph calls live as long as the original.
    copy._kpt_rebuilt_from = dataset  # pylint: disable=protected-access
    return copy
