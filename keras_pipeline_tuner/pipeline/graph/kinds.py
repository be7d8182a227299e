"""Stage kinds: the `tf.data` method a user writes to get each dataset op.

A `Stage`'s `kind` is what the user wrote (`map`, `TFRecordDataset`,
`from_generator`), whatever op TensorFlow built for it (`MapDataset`,
`ParallelMapDatasetV2`, ...). The rules, the rewrites and the advice compare
stages by kind, with the constants here; an op this module does not know keeps
its op name as its kind.
"""

RANGE = "range"
FROM_TENSORS = "from_tensors"
FROM_TENSOR_SLICES = "from_tensor_slices"
RANDOM = "random"
MAP = "map"
MAP_AND_BATCH = "map_and_batch"
FILTER = "filter"
FLAT_MAP = "flat_map"
INTERLEAVE = "interleave"
BATCH = "batch"
PADDED_BATCH = "padded_batch"
UNBATCH = "unbatch"
REBATCH = "rebatch"
PREFETCH = "prefetch"
CACHE = "cache"
SHUFFLE = "shuffle"
REPEAT = "repeat"
TAKE = "take"
SKIP = "skip"
SHARD = "shard"
ZIP = "zip"
CONCATENATE = "concatenate"
WITH_OPTIONS = "with_options"
SCAN = "scan"
WINDOW = "window"
GROUP_BY_WINDOW = "group_by_window"
SAMPLE_FROM_DATASETS = "sample_from_datasets"
IGNORE_ERRORS = "ignore_errors"
ASSERT_CARDINALITY = "assert_cardinality"
SNAPSHOT = "snapshot"
TFRECORD = "TFRecordDataset"
TEXT_LINE = "TextLineDataset"
FIXED_LENGTH_RECORD = "FixedLengthRecordDataset"
FROM_GENERATOR = "from_generator"
# `from_tensor_slices` of file names (`list_files`), read off the op's `is_files`.
LIST_FILES = "list_files"
# A read from the tf.data service: the function a user applies to get it.
DISTRIBUTE = "distribute"
# Stand-ins for inputs that are not tf.data graphs (see `lint.keras_inputs`).
PY_DATASET = "PyDataset"
DATA_LOADER = "DataLoader"
GENERATOR = "generator"
ARRAYS = "arrays"

# Dataset ops by the `tf.data` method a user writes to get them.
KIND_OF_OP = {
    "RangeDataset": RANGE,
    "TensorDataset": FROM_TENSORS,
    "TensorSliceDataset": FROM_TENSOR_SLICES,
    "SparseTensorSliceDataset": FROM_TENSOR_SLICES,
    "RandomDataset": RANDOM,
    "MapDataset": MAP,
    "ParallelMapDataset": MAP,
    "ParallelMapDatasetV2": MAP,
    "MapAndBatchDataset": MAP_AND_BATCH,
    "FilterDataset": FILTER,
    "ParallelFilterDataset": FILTER,
    "FlatMapDataset": FLAT_MAP,
    "InterleaveDataset": INTERLEAVE,
    "ParallelInterleaveDataset": INTERLEAVE,
    "ParallelInterleaveDatasetV2": INTERLEAVE,
    "ParallelInterleaveDatasetV3": INTERLEAVE,
    "ParallelInterleaveDatasetV4": INTERLEAVE,
    "LegacyParallelInterleaveDatasetV2": INTERLEAVE,
    "BatchDataset": BATCH,
    "BatchDatasetV2": BATCH,
    "ParallelBatchDataset": BATCH,
    "PaddedBatchDataset": PADDED_BATCH,
    "PaddedBatchDatasetV2": PADDED_BATCH,
    "UnbatchDataset": UNBATCH,
    "RebatchDataset": REBATCH,
    "RebatchDatasetV2": REBATCH,
    "PrefetchDataset": PREFETCH,
    "CacheDataset": CACHE,
    "CacheDatasetV2": CACHE,
    "ShuffleDataset": SHUFFLE,
    "ShuffleDatasetV2": SHUFFLE,
    "ShuffleDatasetV3": SHUFFLE,
    "ShuffleAndRepeatDataset": SHUFFLE,
    "ShuffleAndRepeatDatasetV2": SHUFFLE,
    "RepeatDataset": REPEAT,
    "TakeDataset": TAKE,
    "SkipDataset": SKIP,
    "ShardDataset": SHARD,
    "ZipDataset": ZIP,
    "ConcatenateDataset": CONCATENATE,
    "OptionsDataset": WITH_OPTIONS,
    "ScanDataset": SCAN,
    "WindowDataset": WINDOW,
    "GroupByWindowDataset": GROUP_BY_WINDOW,
    "DirectedInterleaveDataset": SAMPLE_FROM_DATASETS,
    "IgnoreErrorsDataset": IGNORE_ERRORS,
    "AssertCardinalityDataset": ASSERT_CARDINALITY,
    "SnapshotDatasetV2": SNAPSHOT,
    "TFRecordDataset": TFRECORD,
    "TFRecordDatasetV2": TFRECORD,
    "TextLineDataset": TEXT_LINE,
    "FixedLengthRecordDataset": FIXED_LENGTH_RECORD,
    "FixedLengthRecordDatasetV2": FIXED_LENGTH_RECORD,
    "GeneratorDataset": FROM_GENERATOR,
}

# Ops of the file readers.
READER_OPS = frozenset(
    {
        "TFRecordDataset",
        "TFRecordDatasetV2",
        "TextLineDataset",
        "FixedLengthRecordDataset",
        "FixedLengthRecordDatasetV2",
    }
)
# Stage kinds of file readers, e.g. "TFRecordDataset".
READER_KINDS = frozenset(KIND_OF_OP[op] for op in READER_OPS)
