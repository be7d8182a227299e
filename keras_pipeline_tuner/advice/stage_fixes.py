"""What speeds up a stage of each kind: the stage-fix table, and the kind of change each fix is.

A bottleneck no finding explains gets the change that usually speeds up a
stage of its kind; the kind of change (parallel calls, work spread over
workers, a cache) is what the gain model predicts the gain of.
"""

from typing import TYPE_CHECKING
from typing import Optional

from keras_pipeline_tuner.pipeline.graph import keras_made
from keras_pipeline_tuner.pipeline.graph import kinds
from keras_pipeline_tuner.pipeline.lint.catalogue import CACHE_MISSING
from keras_pipeline_tuner.pipeline.lint.catalogue import PY_DATASET_WORKERS
from keras_pipeline_tuner.pipeline.lint.catalogue import SEQUENTIAL_INTERLEAVE
from keras_pipeline_tuner.pipeline.lint.catalogue import SEQUENTIAL_MAP
from keras_pipeline_tuner.pipeline.lint.catalogue import TORCH_DATALOADER_WORKERS

if TYPE_CHECKING:
    pass


# The changes whose gain the stage's profiled time predicts.
PARALLEL = "parallel calls"


# Work spread over parallel readers or workers (an interleave, a generator's
# work moved into a parallel map, a PyDataset's or a DataLoader's workers): predicted over the
# cores like a map's parallel calls, but its ceiling is not capped by them
# (waiting reads overlap beyond the cores).
SPREAD = "spread over workers"


CACHE = "cache"


# Findings whose fix gives a sequential map AUTOTUNE parallel calls: at most
# one per core. (An interleave's parallelism is its cycle length, which may
# be larger: waiting reads get more than the cores, and keep their bound.)
_AUTOTUNED = frozenset({SEQUENTIAL_MAP})


_SPREAD = frozenset({SEQUENTIAL_INTERLEAVE, PY_DATASET_WORKERS, TORCH_DATALOADER_WORKERS})


PARALLEL_KINDS = frozenset(
    {kinds.MAP, kinds.INTERLEAVE, kinds.TFRECORD, kinds.TEXT_LINE, kinds.FILTER}
)


KERAS_DIRECTORY_UTILITIES = (keras_made.IMAGES, keras_made.TEXT, keras_made.AUDIO)


# What usually speeds up a stage of each kind, for a bottleneck no finding
# explains. Keys are the transformation as `stage_names` labels it.
STAGE_FIXES = {
    kinds.MAP: (
        "Run the map on parallel threads (a Python function inside it, via "
        "tf.py_function, stays bound by the GIL: prefer TensorFlow ops).",
        "ds = ds.map({function}, num_parallel_calls=tf.data.AUTOTUNE)",
    ),
    kinds.INTERLEAVE: (
        "Read the interleaved inputs in parallel.",
        "ds = ds.interleave({function}, cycle_length=tf.data.AUTOTUNE,\n"
        "                   num_parallel_calls=tf.data.AUTOTUNE)",
    ),
    kinds.FROM_GENERATOR: (
        "The Python generator produces elements one at a time, holding the GIL. "
        "Yield only cheap items (file names, indices) and do the work in a parallel map.",
        "ds = tf.data.Dataset.from_generator(list_items, output_signature=...)\n"
        "ds = ds.map(load_item, num_parallel_calls=tf.data.AUTOTUNE)",
    ),
    kinds.TFRECORD: (
        "Read several files at once.",
        "ds = tf.data.Dataset.from_tensor_slices(files).interleave(\n"
        "    tf.data.TFRecordDataset, num_parallel_calls=tf.data.AUTOTUNE)",
    ),
    kinds.TEXT_LINE: (
        "Read several files at once.",
        "ds = tf.data.Dataset.from_tensor_slices(files).interleave(\n"
        "    tf.data.TextLineDataset, num_parallel_calls=tf.data.AUTOTUNE)",
    ),
    kinds.FILTER: (
        "Filter on parallel threads, or filter before expensive work.",
        "ds = ds.filter({function})  # before the expensive map",
    ),
    kinds.BATCH: (
        "Batch in parallel, and batch before cheap per-element maps (vectorise them).",
        "ds = ds.batch(batch_size, num_parallel_calls=tf.data.AUTOTUNE)",
    ),
}


GENERIC_FIX = (
    "If this stage's output is the same every epoch and fits in memory or on disk, "
    "cache after it; otherwise make its work cheaper or run it in parallel.",
    "ds = ds.cache()  # right after {stage}, before any random transformation",
)


def runs_parallel(stage) -> bool:
    return bool(stage.parallel or stage.parallel_at_runtime)


def parallel_stage_fix(stage):
    function = stage.function
    name = function.name if function is not None else "fn"
    if function is not None and function.py_function_ops:
        reason = (
            f"{stage.label} already runs in parallel, but {name} calls Python "
            f"({', '.join(function.py_function_ops)}), which holds the GIL: more threads "
            "do not make it faster. Write it with TensorFlow ops, or, if its output is "
            "the same every epoch, cache after it."
        )
    else:
        reason = (
            f"{stage.label} already runs in parallel on every core it can get: make "
            f"{name} do less work, or, if its output is the same every epoch, cache "
            "after it."
        )
    if function is not None and function.random:
        return reason, f"# {name} is random: make it cheaper (TensorFlow ops, smaller inputs)"
    return reason, GENERIC_FIX[1].format(stage=stage.label)


def change_of(finding_id: str) -> Optional[str]:
    if finding_id in _AUTOTUNED:
        return PARALLEL
    if finding_id in _SPREAD:
        return SPREAD
    return CACHE if finding_id == CACHE_MISSING else None
