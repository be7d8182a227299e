"""Rewrites of a tf.data pipeline's graph: their kinds, and what one change says.

A dataset serialises itself to a GraphDef (one node per transformation, the
parameters as `Const` inputs, the user's functions in the graph's library), and
`tf.raw_ops.DatasetFromGraph` turns a GraphDef back into a working dataset in the
same process, `tf.py_function` and `from_generator` included. So the fixes the
tf.data performance guide asks users to write by hand can be made on the graph
itself: a sequential map becomes a parallel one, a prefetch is appended, a cache
is inserted, with the user's functions untouched.

Which rewrites a pipeline admits is `planning`'s job, making them
`graph_editing`'s, rebuilding the dataset `rebuild`'s; whether one is worth it
is measured (`tuning`).
"""

import dataclasses
from typing import Any
from typing import Dict
from typing import Optional

PARALLEL_MAP = "parallel-map"
PARALLEL_INTERLEAVE = "parallel-interleave"
AUTOTUNE_PARALLELISM = "autotune"
CACHE = "cache"
PREFETCH = "prefetch"
VECTORIZE = "vectorize"
PARALLEL_BATCH = "parallel-batch"
MAP_FUSION = "map-fusion"
REORDER = "nondeterministic"
THREADPOOL = "private-threadpool"
AUTOTUNE_BUDGET = "autotune-cpu-budget"
AUTOTUNE_OFF = "autotune-off"
# Not a fix but a replay, for timing a fix only the user can write: copies of
# a `from_generator` source read at once, as its work would run in a parallel
# map. Its elements repeat, so `kpt.tune` never plans or keeps it.
GENERATOR_COPIES = "generator-copies"

# The order in which rewrites are tried: vectorisation first (it changes how
# much work there is), then parallelism (it helps every epoch), then the cache
# (it helps from the second epoch), then the prefetch that overlaps whatever is
# left with the consumer; smaller refinements (parallel batch copies, map
# fusion, reordering, AUTOTUNE's CPU budget, the thread pool) last, when the budget is left.
KINDS = (
    VECTORIZE,
    PARALLEL_INTERLEAVE,
    PARALLEL_MAP,
    AUTOTUNE_PARALLELISM,
    CACHE,
    PREFETCH,
    PARALLEL_BATCH,
    MAP_FUSION,
    REORDER,
    AUTOTUNE_BUDGET,
    THREADPOOL,
    AUTOTUNE_OFF,
)
# Rewrites made by setting `tf.data.Options` on the final dataset.
OPTION_KINDS = (MAP_FUSION, AUTOTUNE_BUDGET, THREADPOOL, AUTOTUNE_OFF)

# Where each op with a tunable degree of parallelism keeps it, counted from the
# end of its data inputs: op -> (index from the end, argument name).
TUNABLE_INPUT = {
    "ParallelMapDatasetV2": (-1, "num_parallel_calls"),
    "ParallelInterleaveDatasetV4": (-1, "num_parallel_calls"),
    "ParallelFilterDataset": (-1, "num_parallel_calls"),
    "ParallelBatchDataset": (-2, "num_parallel_calls"),
    "MapAndBatchDataset": (-2, "num_parallel_calls"),
    "PrefetchDataset": (-1, "buffer_size"),
}


@dataclasses.dataclass
class Rewrite:
    """One change to a pipeline's graph.

    Attributes:
        kind: one of `KINDS`: "vectorize", "parallel-map",
            "parallel-interleave", "autotune", "cache", "prefetch",
            "parallel-batch", "map-fusion", "nondeterministic",
            "private-threadpool" or "autotune-off".
        node: the graph node the rewrite changes, or after which it inserts
            a stage (for "prefetch" and options, the final node).
        stage: the stage as the user wrote it, e.g. "map(load)".
        change: the stage after the rewrite, as code, e.g.
            "map(load, num_parallel_calls=AUTOTUNE)".
        changes_order: whether the elements can come in a different order.
        changes_determinism: whether the elements' values can differ from
            one run to another where they did not before (e.g. random numbers
            drawn by parallel calls in a different order).
        caveat: what the rewrite assumes about the user's code, if anything.
        filename: for "cache": "" for memory, else the cache file's path.
        batch_node: for "vectorize", the batch node the map moves after.
        options: for option rewrites, `tf.data.Options` fields to set, by
            dotted path, e.g. `{"threading.private_threadpool_size": 2}`.
        unverified: why the rewrite's elements cannot be proven equal to the
            original's by comparing them (e.g. a Python function that may keep
            state, called from several threads), or `None`.
        fill_elements: for "cache", in a timed pass only: cache the first
            this many elements (a `take` before the cache), so that filling it
            costs a few batches, not an epoch; `None` for all of them.
        copies: for "generator-copies", how many copies of the generator
            are read at once.
    """

    kind: str
    node: str
    stage: str
    change: str
    changes_order: bool = False
    changes_determinism: bool = False
    caveat: Optional[str] = None
    filename: Optional[str] = None
    batch_node: Optional[str] = None
    options: Dict[str, Any] = dataclasses.field(default_factory=dict)
    unverified: Optional[str] = None
    fill_elements: Optional[int] = None
    copies: Optional[int] = None


@dataclasses.dataclass
class Skipped:
    """A rewrite that was considered for a stage and not made, and why.

    Attributes:
        kind: the rewrite's kind, as in `Rewrite.kind`.
        stage: the stage it was considered for.
        reason: why it is not made.
    """

    kind: str
    stage: str
    reason: str

