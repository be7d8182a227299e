"""In-memory tensors a dataset holds, and its pipeline without the large ones.

Serialising a dataset's graph copies every tensor its `from_tensor_slices` /
`from_tensors` sources hold (about 1 s per 100 MB here), and so does anything
that reads or rebuilds the pipeline from its graph. This module estimates
those bytes without copying anything, and rebuilds the pipeline over
one-element stand-ins of its large sources, for what needs the pipeline's
structure and functions, not its data.
"""

from typing import Iterator
from typing import Optional
from typing import Tuple

from keras_pipeline_tuner._util.tf_import import tensorflow

# In-memory bytes per second of a time cap that work which reads or rebuilds
# a pipeline from its graph may meet: a timing rebuilds it some six times (its
# graph, the reference, the checks, the passes); 118 MB of encoded images took
# 1.1-1.6 s a copy here, and reading its pipeline 2.7 s.
COPY_BYTES_PER_S = 12 * 2**20
# The names of `without_large_sources`' stand-ins start with this.
_STAND_IN = "kpt_stand_in_"


def too_much_to_copy(dataset, cap_s: float, work: str) -> Optional[str]:
    """Why `work` on the dataset's graph would not fit `cap_s`, or `None` when it would.

    Args:
        dataset: a `tf.data.Dataset`.
        cap_s: the seconds the work may take.
        work: what reads or rebuilds the pipeline, for the reason
            ("rebuilding it to time the change").

    Returns:
        The reason, naming the bytes held and what the cap allows; `None`
        when they are within `COPY_BYTES_PER_S` a second of the cap.

    Example:

    >>> small = tf.data.Dataset.from_tensor_slices(np.zeros((100, 4), np.float32))
    >>> too_much_to_copy(small, 1.0, "rebuilding it") is None
    True
    >>> too_much_to_copy(small, 0.0, "rebuilding it")
    'the pipeline holds 0 MB of in-memory arrays, which rebuilding it would copy \
several times (more than 0 MB within 0 s)'
    """
    held = in_memory_bytes(dataset)
    limit = cap_s * COPY_BYTES_PER_S
    if held <= limit:
        return None
    return (
        f"the pipeline holds {held / 1e6:,.0f} MB of in-memory arrays, which {work} would "
        f"copy several times (more than {limit / 1e6:,.0f} MB within {cap_s:.2g} s)"
    )


class InMemoryDataTooLarge(ValueError):
    """The dataset embeds more in-memory data than its graph should be read with.

    Attributes:
        held_bytes: the bytes of in-memory tensors the dataset holds
            (`in_memory_bytes`), as the read that refused it counted them.
    """

    def __init__(self, message: str, held_bytes: int = 0):
        super().__init__(message)
        self.held_bytes = held_bytes


def in_memory_bytes(dataset) -> int:
    """Estimates the bytes of tensors a dataset holds in memory.

    Counts the tensors of `from_tensor_slices` / `from_tensors` sources and
    those the functions of its transformations capture or hold as constants
    (such as an array sliced inside a `flat_map`), through all its inputs.
    A string tensor held as a value (a source's encoded images, say) is
    counted at its strings' lengths; one that is a constant of a function's
    graph at 64 bytes an element (reading its lengths would copy it).

    Args:
        dataset: a `tf.data.Dataset`.

    Returns:
        The estimate in bytes.

    Example:

    >>> in_memory_bytes(tf.data.Dataset.from_tensor_slices(np.zeros((100, 4), np.float32)))
    1600
    """
    tf = tensorflow()
    total = 0
    for value in dataset_attributes(dataset):
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
                total += _tensor_bytes(tensor, tf)
    return total


def dataset_attributes(dataset) -> Iterator:
    """The attributes of `dataset` and of every dataset it reads, each dataset once.

    Its tensors, and the wrappers of its functions (whose `function` is the
    traced `ConcreteFunction`), are among them.

    Example:

    >>> ds = tf.data.Dataset.range(3).map(lambda x: x + 1)
    >>> any(hasattr(value, "function") for value in dataset_attributes(ds))
    True
    """
    seen, frontier = set(), [dataset]
    while frontier:
        current = frontier.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield from vars(current).values()
        try:
            frontier.extend(current._inputs())  # pylint: disable=protected-access
        except (AttributeError, NotImplementedError):
            pass


def _tensor_bytes(tensor, tf) -> int:
    if tensor.dtype in (tf.resource, tf.variant):
        return 0
    if tensor.dtype != tf.string:
        return tensor.shape.num_elements() * tensor.dtype.size
    if hasattr(tensor, "numpy"):
        # A value: its strings' lengths, summed in TensorFlow (nothing copied).
        return int(tf.reduce_sum(tf.strings.length(tensor)))
    return tensor.shape.num_elements() * 64


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
    stand-in source of the same element structure holding one element. A large
    `from_tensors` source is not replaced: its one element is the whole array.

    Args:
        dataset: a `tf.data.Dataset`.
        limit: sources holding more than this many bytes are replaced.

    Returns:
        The rebuilt dataset, or `None` when a transformation on the way to a
        large source is one this function does not rebuild (the caller then
        refuses as before).

    Example:

    >>> ds = tf.data.Dataset.from_tensor_slices(np.zeros((1000, 4), np.float32)).batch(10)
    >>> light = without_large_sources(ds, limit=1000)
    >>> in_memory_bytes(ds), in_memory_bytes(light), light.element_spec == ds.element_spec
    (16009, 25, True)
    """
    try:
        return _light(dataset, limit, [])
    except _NotRebuilt:
        return None


def real_sources(dataset, limit: int) -> list:
    """The large sources `without_large_sources(dataset, limit)` stands in for, in its order.

    Each stand-in is named `stand_in_name(index, limit)` (the `name` of its
    `from_tensor_slices`), so that a graph of the light pipeline can be turned
    back into a dataset over these real sources (`tune.rebuild`): the data is
    then never serialised or copied.

    Args:
        dataset: a `tf.data.Dataset`.
        limit: as given to `without_large_sources`.

    Returns:
        The source datasets, by the index in their stand-ins' names (none
        when `without_large_sources` would return `None`).

    Example:

    >>> big = tf.data.Dataset.from_tensor_slices(np.zeros((1000, 4), np.float32))
    >>> real_sources(big.batch(10), limit=1000) == [big]
    True
    """
    found: list = []
    try:
        _light(dataset, limit, found)
    except _NotRebuilt:
        return []
    return found


def stand_in_name(index: int, limit: int) -> str:
    """The name of the stand-in for a pipeline's `index`-th large source (see `real_sources`).

    Example:

    >>> stand_in_name(0, 1000), stand_in_of(stand_in_name(0, 1000))
    ('kpt_stand_in_0_over_1000', (0, 1000))
    """
    return f"{_STAND_IN}{index}_over_{limit}"


def stand_in_of(name: str) -> Optional[Tuple[int, int]]:
    """`(index, limit)` of a stand-in's name, or `None` for any other name."""
    if not name.startswith(_STAND_IN):
        return None
    index, _, limit = name[len(_STAND_IN):].partition("_over_")
    if not (index.isdigit() and limit.isdigit()):
        return None
    return int(index), int(limit)


class _NotRebuilt(Exception):
    """A transformation `_light` does not know how to apply again."""


def _light(dataset, limit: int, found: list):
    """`without_large_sources`; appends each source it stands in for to `found`."""
    tf = tensorflow()
    if in_memory_bytes(dataset) <= limit:
        return dataset
    kind = type(dataset).__name__
    if kind == "_TensorDataset":
        # Its one element is the whole array: a stand-in of the same element
        # spec would be as large (Keras' dataset over NumPy arrays: 188 MB of
        # zeros serialised, 2.6 s), so it is not rebuilt.
        raise _NotRebuilt(kind)
    if kind == "_TensorSliceDataset":
        name = stand_in_name(len(found), limit)
        found.append(dataset)
        return tf.data.Dataset.from_tensor_slices(
            tf.nest.map_structure(lambda spec: _zeros(spec, 1), dataset.element_spec),
            name=name,
        )
    if kind == "_ZipDataset":
        inputs = dataset._datasets  # pylint: disable=protected-access
        return tf.data.Dataset.zip(
            tf.nest.map_structure(lambda d: _light(d, limit, found), inputs)
        )
    source = getattr(dataset, "_input_dataset", None)
    if source is None:
        raise _NotRebuilt(kind)
    light = _light(source, limit, found)
    attrs = vars(dataset)
    if kind in ("_MapDataset", "_ParallelMapDataset"):
        return _map_again(dataset, light)
    if kind == "_ShuffleDataset":
        return _shuffle_again(dataset, light)
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


def _map_again(dataset, light):
    """`dataset`, a map or a parallel map, applied again to `light` with its own function."""
    from tensorflow.python.data.ops import dataset_ops
    from tensorflow.python.ops import gen_dataset_ops

    kind = type(dataset).__name__
    attrs = vars(dataset)
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


def _shuffle_again(dataset, light):
    """`dataset`, a shuffle, applied again to `light` with its own seeds.

    `light.shuffle(...)` without a seed would draw one from TensorFlow's
    global seed (moving the user's later random draws on) and shuffle in
    another order than the dataset's.
    """
    from tensorflow.python.data.ops import dataset_ops
    from tensorflow.python.ops import gen_dataset_ops

    attrs = vars(dataset)
    made = gen_dataset_ops.shuffle_dataset_v3(
        light._variant_tensor,  # pylint: disable=protected-access
        buffer_size=attrs["_buffer_size"],
        seed=attrs["_seed"],
        seed2=attrs["_seed2"],
        seed_generator=gen_dataset_ops.dummy_seed_generator(),
        reshuffle_each_iteration=attrs["_reshuffle_each_iteration"],
        **dataset._common_args,  # pylint: disable=protected-access
    )
    return dataset_ops._VariantDataset(made, dataset.element_spec)  # pylint: disable=protected-access


def _zeros(spec, rows: int):
    tf = tensorflow()
    if not isinstance(spec, tf.TensorSpec) or not spec.shape.is_fully_defined():
        raise _NotRebuilt(type(spec).__name__)
    return tf.zeros([rows] + spec.shape.as_list(), spec.dtype)

