"""The catalogue of findings: every id the inspection can give, in one place.

Each kind says what it is about (for the inspection's table), what to do about
it (the advisor's title) and whether its fix runs a stage on parallel threads
(which the advisor and the scale-out rules need to know).
"""

import dataclasses
from typing import Dict

# Finding ids: stable, they are what users and reports compare.
MISSING_PREFETCH = "missing-prefetch"
SEQUENTIAL_MAP = "sequential-map"
FIXED_PARALLELISM = "fixed-parallelism"
SEQUENTIAL_INTERLEAVE = "sequential-interleave"
SEQUENTIAL_FILE_READ = "sequential-file-read"
PY_FUNCTION_IN_MAP = "py-function-in-map"
CACHE_AFTER_RANDOM = "cache-after-random"
CACHE_AFTER_SHUFFLE = "cache-after-shuffle"
CACHE_MISSING = "cache-missing"
VECTORIZE_MAP = "vectorize-map"
SHUFFLE_AFTER_BATCH = "shuffle-after-batch"
MEMORY_ORDER = "memory-order"
AUTOTUNE_DISABLED = "autotune-disabled"
PY_DATASET_WORKERS = "py-dataset-workers"
PY_DATASET_THREADS = "py-dataset-threads"
TORCH_DATALOADER_WORKERS = "torch-dataloader-workers"
TORCH_DATALOADER_RESPAWN = "torch-dataloader-respawn"
GRAIN_SEQUENTIAL_STAGE = "grain-sequential-stage"
GRAIN_READ_THREADS = "grain-read-threads"
PYTHON_GENERATOR = "python-generator"
KERAS_ARRAY_INPUT = "keras-array-input"
DATA_SERVICE = "data-service"
CACHE_MEMORY = "cache-memory"
SHUFFLE_MEMORY = "shuffle-memory"


@dataclasses.dataclass(frozen=True)
class FindingKind:
    """One kind of finding.

    Attributes:
        id: the stable identifier, e.g. "sequential-map".
        about: what is wrong, in a line.
        title: what to do, in a line; "{stage}" is replaced by the stage.
        parallelises: whether the fix runs the stage on parallel threads.

    Example:

    >>> KINDS[SEQUENTIAL_MAP].title.format(stage="map(load)")
    'Parallelise map(load)'
    """

    id: str
    about: str
    title: str
    parallelises: bool = False


KINDS: Dict[str, FindingKind] = {
    kind.id: kind
    for kind in (
    FindingKind(
        CACHE_MEMORY,
        "a cache() that will hold more than (or over half of) the job's memory",
        "Cache {stage} to a file, or before the stage that makes elements large",
        parallelises=False,
    ),
    FindingKind(
        SHUFFLE_MEMORY,
        "a shuffle buffer that will hold over half of the job's memory",
        "Shuffle smaller elements than in {stage}",
        parallelises=False,
    ),
    FindingKind(
        MISSING_PREFETCH,
        "the pipeline does not end with prefetch",
        "Prefetch at the end of the pipeline",
        parallelises=False,
    ),
    FindingKind(
        SEQUENTIAL_MAP,
        "map without num_parallel_calls on an expensive or stateful function",
        "Parallelise {stage}",
        parallelises=True,
    ),
    FindingKind(
        FIXED_PARALLELISM,
        "hard-coded num_parallel_calls / buffer sizes instead of AUTOTUNE",
        "Let tf.data tune the parallelism of {stage}",
        parallelises=True,
    ),
    FindingKind(
        SEQUENTIAL_INTERLEAVE,
        "interleave (or flat_map over files) without parallel calls",
        "Parallelise {stage}",
        parallelises=True,
    ),
    FindingKind(
        SEQUENTIAL_FILE_READ,
        "a reader given many files reads them one after another",
        "Read the files of {stage} in parallel",
        parallelises=True,
    ),
    FindingKind(
        PY_FUNCTION_IN_MAP,
        "tf.py_function / numpy_function in a map",
        "Replace the Python function of {stage} with TensorFlow ops",
        parallelises=True,
    ),
    FindingKind(
        CACHE_AFTER_RANDOM,
        "cache placed after random augmentation (frozen augmentations)",
        "Cache before the random augmentation in {stage}",
        parallelises=False,
    ),
    FindingKind(
        CACHE_AFTER_SHUFFLE,
        "cache after shuffle: the same order every epoch",
        "Cache before shuffling, not after ({stage})",
        parallelises=False,
    ),
    FindingKind(
        CACHE_MISSING,
        "expensive deterministic work repeated every epoch with no cache",
        "Cache the deterministic work of {stage}",
        parallelises=False,
    ),
    FindingKind(
        VECTORIZE_MAP,
        "cheap per-element map right before batch",
        "Batch before {stage} and map whole batches",
        parallelises=False,
    ),
    FindingKind(
        SHUFFLE_AFTER_BATCH,
        "shuffle placed after batch (shuffles batches, not examples)",
        "Shuffle examples before batching ({stage})",
        parallelises=False,
    ),
    FindingKind(
        MEMORY_ORDER,
        "shuffle buffer placed after a map that grows elements",
        "Put buffers before {stage}, which grows elements",
        parallelises=False,
    ),
    FindingKind(
        AUTOTUNE_DISABLED,
        "options turn off autotune or the default static optimisations",
        "Turn tf.data autotuning back on",
        parallelises=False,
    ),
    FindingKind(
        PY_DATASET_WORKERS,
        "a Keras PyDataset loads batches on one thread",
        "Load the batches of {stage} on several workers",
        parallelises=True,
    ),
    FindingKind(
        PY_DATASET_THREADS,
        "a Keras PyDataset uses threads, which share the GIL",
        "Load the batches of {stage} in processes, not threads",
        parallelises=False,
    ),
    FindingKind(
        TORCH_DATALOADER_WORKERS,
        "a torch DataLoader loads batches on the training thread (num_workers=0)",
        "Load the batches of {stage} in worker processes (num_workers)",
        parallelises=True,
    ),
    FindingKind(
        TORCH_DATALOADER_RESPAWN,
        "a torch DataLoader starts its worker processes again every epoch",
        "Keep the workers of {stage} between epochs (persistent_workers=True)",
        parallelises=False,
    ),
    FindingKind(
        GRAIN_SEQUENTIAL_STAGE,
        "a slow Grain stage after to_iter_dataset runs on the reading thread",
        "Move {stage} before to_iter_dataset, read on ReadOptions.num_threads threads",
        parallelises=True,
    ),
    FindingKind(
        GRAIN_READ_THREADS,
        "a slow Grain stage is read on too few threads (ReadOptions.num_threads)",
        "Read {stage} on more threads (grain.ReadOptions(num_threads=...))",
        parallelises=True,
    ),
    FindingKind(
        PYTHON_GENERATOR,
        "fit reads a Python generator on one thread",
        "Replace the Python generator {stage} with a PyDataset or tf.data",
        parallelises=False,
    ),
    FindingKind(
        KERAS_ARRAY_INPUT,
        "fit builds the pipeline itself from in-memory arrays",
        "Keep in-memory arrays: Keras builds their pipeline",
        parallelises=False,
    ),
    FindingKind(
        DATA_SERVICE,
        "the pipeline reads from the tf.data service, whose workers run its start",
        "Give the tf.data service more workers, or workers with idle CPUs",
        parallelises=False,
    ),
    )
}
# Every id with what it is about, as the inspection's table shows it.
CATALOGUE: Dict[str, str] = {kind.id: kind.about for kind in KINDS.values()}
# Ids whose fix runs a stage on parallel threads.
PARALLELISING = frozenset(kind.id for kind in KINDS.values() if kind.parallelises)
