"""Stages Keras builds itself for a dataset utility the user called, and advice about them.

`keras.utils.image_dataset_from_directory(...)` (and the text, audio and
time-series utilities) return a tf.data pipeline whose work is a map of a
`lambda` inside Keras: in the graph it is `map(<lambda>)`, which the user never
wrote and cannot change. This module recognises those maps, so that the stage
is named after the call the user wrote (`image_dataset_from_directory(...)`),
and gives the advice that is theirs to follow: the utility's own arguments and
a cache after it, rather than code for Keras' internal function.

A map is taken for Keras' own when its function is a `lambda` holding exactly
the kind of work the utility's loader does, over what the utility builds before
it: a list of file paths (sliced from memory, zipped with the labels,
optionally shuffled) for the directory utilities; ranges and repeated constants
for `timeseries_dataset_from_array`.

Stages here are duck-typed (`kind`, `function`, `params`, `label`), so that the
graph reader can use this module without importing back.
"""

from typing import Iterable
from typing import Optional
from typing import Tuple

from keras_pipeline_tuner.pipeline.graph import kinds

IMAGES = "image_dataset_from_directory"
TEXT = "text_dataset_from_directory"
AUDIO = "audio_dataset_from_directory"
TIMESERIES = "timeseries_dataset_from_array"
UTILITIES = (IMAGES, TEXT, AUDIO, TIMESERIES)

_LAMBDA = "<lambda>"
# What Keras' directory utilities build before their loader map.
_FILE_LIST_KINDS = frozenset({kinds.FROM_TENSOR_SLICES, kinds.ZIP, kinds.SHUFFLE})
# `timeseries_dataset_from_array`: index ranges zipped with repeated constants.
_TIMESERIES_KINDS = frozenset(
    {kinds.FROM_TENSORS, kinds.REPEAT, kinds.RANGE, kinds.ZIP, kinds.MAP, kinds.SHUFFLE}
)
# Keras' image loader decodes with `decode_image(..., expand_animations=False)`
# and always resizes (or crops or pads, which resize too).
_RESIZE_PREFIX = "Resize"
# Keras' text loader reads the file, and cuts it at `max_length` when asked.
_TEXT_OPS = frozenset({"ReadFile", "Identity", "Const", "Substr", "NoOp"})
_BATCH_KINDS = (kinds.BATCH, kinds.PADDED_BATCH)


def utility_of(stage, upstream: Iterable) -> Optional[str]:
    """The Keras dataset utility whose loader `stage` is, or `None`.

    Args:
        stage: a pipeline `Stage`.
        upstream: every stage it reads from, directly or not.

    Returns:
        One of `UTILITIES`, or `None` for a stage the user wrote.

    Example:

    >>> from keras_pipeline_tuner.pipeline.graph.reader import read_pipeline
    >>> ds = keras.utils.timeseries_dataset_from_array(np.arange(20.0), None, 4)
    >>> pipeline = read_pipeline(ds)
    >>> sorted({stage.label for stage in pipeline.stages if stage.kind == "map"})
    ['timeseries_dataset_from_array(...)']
    """
    function = stage.function
    if stage.kind != kinds.MAP or function is None or function.name != _LAMBDA:
        return None
    upstream = list(upstream)
    upstream_kinds = {item.kind for item in upstream}
    ops = set(function.ops)
    if "ReadFile" in ops and upstream_kinds and upstream_kinds <= _FILE_LIST_KINDS:
        if "DecodeImage" in ops and any(op.startswith(_RESIZE_PREFIX) for op in ops):
            return IMAGES
        if "DecodeWav" in ops:
            return AUDIO
        if ops <= _TEXT_OPS:
            return TEXT
        return None
    timeseries_sources = {kinds.RANGE, kinds.FROM_TENSORS, kinds.REPEAT}
    if timeseries_sources <= upstream_kinds and upstream_kinds <= _TIMESERIES_KINDS and all(
        item.function is None or item.function.name == _LAMBDA
        for item in upstream
        if item.kind == kinds.MAP
    ):
        return TIMESERIES
    return None


def label(utility: str) -> str:
    """The stage's label: the call the user wrote.

    Example:

    >>> label(IMAGES)
    'image_dataset_from_directory(...)'
    """
    return f"{utility}(...)"


def cache_advice(pipeline, stage) -> Tuple[str, str]:
    """Why and how to cache the output of a Keras directory utility: `(reason, fix)`.

    The utility shuffles the file list before loading and batches after: a
    cache right after it would replay one order (cache-after-shuffle). So the
    fix asks it for single, unshuffled elements, caches them, then shuffles
    and batches as it did.

    Args:
        pipeline: the `Pipeline` holding `stage`.
        stage: the utility's loader stage (`stage.made_by` is set).

    Returns:
        The reason, in a sentence or two, and the code to write.
    """
    utility = stage.made_by
    shuffle = next(
        (item for item in pipeline.upstream(stage) if item.kind == kinds.SHUFFLE), None
    )
    batch = _batch_after(pipeline, stage)
    then = []
    if shuffle is not None:
        buffer = shuffle.params.get("buffer_size")
        then.append(f"shuffle({buffer if isinstance(buffer, int) else 'buffer_size'})")
    if batch is not None:
        size = batch.params.get("batch_size")
        then.append(f"{batch.kind}({size if isinstance(size, int) else 'batch_size'})")
    fix = (
        f"ds = keras.utils.{utility}(\n"
        "    directory, shuffle=False, batch_size=None)  # with your other arguments\n"
        "ds = ds.cache()  # or .cache('/path/to/cache_file')"
    )
    # Keras ends its pipeline with a prefetch: so does the fix.
    then.append("prefetch(tf.data.AUTOTUNE)")
    fix += f"\nds = ds.{'.'.join(then)}"
    reason = (
        f"{label(utility)} reads and decodes every file again in every epoch. Cache what "
        "it loads: ask it for single, unshuffled elements (shuffle=False, "
        "batch_size=None), cache them, then shuffle and batch after the cache, so that "
        "every epoch still gets a new order (a cache right after it would replay the "
        "first epoch's)."
    )
    return reason, fix


def batching_loader(pipeline, batch):
    """The Keras directory utility's loader whose own batch `batch` is, or `None`.

    Args:
        pipeline: the `Pipeline`.
        batch: a batch stage of it.

    Returns:
        The loader `Stage` (its `made_by` set), or `None` when the user
        wrote the batch.
    """
    for stage in pipeline.stages:
        if stage.made_by in (IMAGES, TEXT, AUDIO) and _batch_after(pipeline, stage) is batch:
            return stage
    return None


def unbatched_shuffle_fix(pipeline, loader, batch, shuffle) -> str:
    """Code that shuffles examples after a Keras utility that batches itself.

    `image_dataset_from_directory(...).cache().shuffle(1000)` shuffles whole
    batches: the utility batched before the shuffle. The fix asks it for
    single elements (`batch_size=None`), keeps the user's stages in between,
    then shuffles and batches.

    Args:
        pipeline: the `Pipeline`.
        loader: the utility's loader stage.
        batch: the utility's own batch.
        shuffle: the user's shuffle after it.

    Returns:
        The code, from the utility's call to the new batch.
    """
    between = []
    for stage in pipeline.main_chain(shuffle):
        if stage is batch:
            break
        if stage.kind != kinds.PREFETCH:
            between.append(stage)
    lines = [
        f"ds = keras.utils.{loader.made_by}(",
        "    directory, batch_size=None)  # with your other arguments",
    ]
    for stage in reversed(between):
        lines.append("ds = ds." + stage.label.replace("=AUTOTUNE", "=tf.data.AUTOTUNE"))
    buffer = shuffle.params.get("buffer_size")
    size = batch.params.get("batch_size")
    lines.append(
        f"ds = ds.shuffle({buffer if isinstance(buffer, int) else 'buffer_size'})"
        f".{batch.kind}({size if isinstance(size, int) else 'batch_size'})"
    )
    return "\n".join(lines)


def _batch_after(pipeline, stage):
    """The batch Keras put after its loader (through its prefetch), if any."""
    readers = {}
    for item in pipeline.stages:
        for node in item.inputs[:1]:
            readers.setdefault(node, []).append(item)
    current = stage
    while True:
        following = readers.get(current.node, [])
        if len(following) != 1:
            return None
        current = following[0]
        if current.kind in _BATCH_KINDS:
            return current
        if current.kind != kinds.PREFETCH:
            return None
