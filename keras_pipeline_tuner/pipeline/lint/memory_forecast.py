"""The memory forecast: bytes a pipeline's caches and buffers will hold, before it runs.

From the dataset alone, reading no element: each stage's element shapes and
dtypes (`element_spec`) and its cardinality give the bytes a `cache()` will
hold once filled (its input's elements times their size), a shuffle buffer
(its size times its input's element size) and a prefetch buffer of a fixed
size; batching and buffering hand on the same bytes, so a stage whose own
elements have no static size (a batch with a partial last batch) is sized
from the nearest stage below it that has one. These are set against the
memory the job may hold (`timing.memory_budget`): a cache larger than it is an
error (the job will be killed when the cache fills), above half of it a
warning, both with the two sizes.
"""

import dataclasses
import logging
from typing import Dict
from typing import List
from typing import Optional
from typing import Tuple

from keras_pipeline_tuner.pipeline.graph import kinds
from keras_pipeline_tuner.pipeline.lint.catalogue import CACHE_MEMORY
from keras_pipeline_tuner.pipeline.lint.catalogue import SHUFFLE_MEMORY
from keras_pipeline_tuner.pipeline.lint.findings import Finding
from keras_pipeline_tuner.pipeline.lint.findings import Severity
from keras_pipeline_tuner.timing.memory_budget import MemoryBudget
from keras_pipeline_tuner.timing.memory_budget import gib

logger = logging.getLogger("keras_pipeline_tuner")
# Above this share of the budget a buffer is a warning; above all of it, an error.
WARN_SHARE = 0.5
# Python dataset classes by the `tf.data` method, for the ones this forecast reads.
_KINDS = {
    "CacheDataset": kinds.CACHE,
    "_CacheDataset": kinds.CACHE,
    "_ShuffleDataset": kinds.SHUFFLE,
    "_PrefetchDataset": kinds.PREFETCH,
    "_MapDataset": kinds.MAP,
    "_ParallelMapDataset": kinds.MAP,
    "_BatchDataset": kinds.BATCH,
    "_ParallelBatchDataset": kinds.BATCH,
    "_PaddedBatchDataset": kinds.PADDED_BATCH,
}
# Stages that hand on the bytes they read (a batch regroups, a buffer holds).
_SAME_BYTES = ("_BatchDataset", "_ParallelBatchDataset", "_UnbatchDataset", "_PrefetchDataset",
               "_ShuffleDataset", "CacheDataset", "_CacheDataset", "_OptionsDataset",
               "_RebatchDataset", "_ModelDataset", "_MaxIntraOpParallelismDataset",
               "_PrivateThreadPoolDataset")


@dataclasses.dataclass(frozen=True)
class BufferForecast:
    """The bytes one cache or buffer will hold (predicted from shapes and cardinality).

    Attributes:
        stage: the stage as the user wrote it.
        node: its graph node, when matched to the pipeline read.
        kind: "cache", "shuffle" or "prefetch".
        bytes: the bytes it will hold, `None` when the shapes or the
            cardinality are not known before running.
        how: how the figure was made, e.g. "768 elements of 4.0 MiB".
    """

    stage: str
    node: Optional[str]
    kind: str
    bytes: Optional[int]
    how: str


@dataclasses.dataclass(frozen=True)
class MemoryForecast:
    """Every cache and buffer of a pipeline against the job's memory.

    Attributes:
        buffers: one `BufferForecast` per cache, shuffle and prefetch.
        budget: the `MemoryBudget`, or `None` where it was not read.
        output_bytes: per graph node of the main chain, the bytes of one
            pass over that stage's output (what a cache after it would hold),
            where known.
    """

    buffers: Tuple[BufferForecast, ...] = ()
    budget: Optional[MemoryBudget] = None
    output_bytes: Dict[str, int] = dataclasses.field(default_factory=dict)

    def cache_fits(self, node: Optional[str]) -> Optional[bool]:
        """Whether a cache after stage `node` fits in the budget; `None` when unknown."""
        size = self.output_bytes.get(node) if node else None
        if size is None or self.budget is None:
            return None
        return size <= self.budget.limit_bytes


def forecast(dataset, pipeline=None, budget: Optional[MemoryBudget] = None) -> MemoryForecast:
    """The memory forecast of a `tf.data.Dataset`, reading none of its elements.

    Args:
        dataset: the dataset.
        pipeline: the `Pipeline` the graph reader read of it, to name stages.
        budget: the job's `MemoryBudget`.

    Returns:
        The `MemoryForecast`.

    Example:

    >>> ds = tf.data.Dataset.range(1024).map(lambda i: tf.zeros([256])).cache()
    >>> found = forecast(ds)
    >>> found.buffers[0].kind, found.buffers[0].bytes, found.buffers[0].how
    ('cache', 1048576, '1024 elements of 1 KiB')
    """
    chain = _main_chain(dataset)
    stages = _stages_by_kind(pipeline)
    seen: Dict[str, int] = {}
    buffers, output_bytes = [], {}
    for index, item in enumerate(chain):
        name = type(item).__name__
        kind = _KINDS.get(name)
        stage = None
        if kind is not None:
            position = seen.get(kind, 0)
            seen[kind] = position + 1
            matching = stages.get(kind, [])
            stage = matching[position] if position < len(matching) else None
        total = _pass_bytes(chain[index:])
        if stage is not None and total is not None:
            output_bytes[stage.node] = total[0]
        if kind not in (kinds.CACHE, kinds.SHUFFLE, kinds.PREFETCH):
            continue
        label = stage.label if stage is not None else f"{kind}()"
        node = stage.node if stage is not None else None
        buffers.append(_buffer(item, kind, label, node, chain[index + 1:]))
    return MemoryForecast(tuple(reversed(buffers)), budget, output_bytes)


def memory_findings(found: MemoryForecast) -> List[Finding]:
    """Caches and shuffle buffers that will not fit, or take over half, of the job's memory.

    Args:
        found: the `MemoryForecast`.

    Returns:
        The findings: "cache-memory" (error above the budget, warning above
        half of it) and "shuffle-memory" (the same for a shuffle buffer).
    """
    budget = found.budget
    if budget is None:
        return []
    findings = []
    for buffer in found.buffers:
        if buffer.bytes is None or buffer.kind == kinds.PREFETCH:
            continue
        share = buffer.bytes / budget.limit_bytes
        if share <= WARN_SHARE:
            continue
        severity = Severity.ERROR if share > 1.0 else Severity.WARNING
        sizes = f"{gib(buffer.bytes)} ({buffer.how}) against {budget.describe()}"
        if buffer.kind == kinds.CACHE:
            identifier = CACHE_MEMORY
            reason = (
                f"{buffer.stage} will hold {sizes}: "
                + ("more than the job may hold, so the job will be killed when the cache "
                   "fills (in its first pass, maybe hours in)" if share > 1.0 else
                   "over half of the memory the job may hold, beside the model, the "
                   "prefetch buffers and the rest of the process")
                + ". tf.data's own RAM budget is half of the host's free memory and does not "
                "see a container's limit."
            )
            fix = (
                "# cache to a file on local disk instead of memory\n"
                "ds = ds.cache(\"/local/disk/cache\")\n"
                "# or cache the smaller elements before the map that makes them large"
            )
        else:
            identifier = SHUFFLE_MEMORY
            reason = (
                f"{buffer.stage}'s buffer will hold {sizes}. A shuffle buffer holds whole "
                "elements: shuffle small ones (file names, encoded records) before the map "
                "that decodes them."
            )
            fix = "ds = ds.shuffle(smaller_buffer)  # or shuffle before the decoding map"
        findings.append(
            Finding(identifier, severity, buffer.stage, buffer.node or "", buffer.kind, None,
                    reason, fix)
        )
    return findings


def fits(found: Optional[MemoryForecast], recommendation) -> bool:
    """Whether advice is free of a cache that will not fit (what it caches, against the budget).

    Args:
        found: the `MemoryForecast` of the pipeline, or `None`.
        recommendation: a `Recommendation` or a `Finding` (its `fix`, its stage's node).

    Returns:
        False for a fix that adds a `.cache()` after a stage whose output
        will not fit in the job's memory; True otherwise (also when unknown).
    """
    if found is None or ".cache(" not in (getattr(recommendation, "fix", "") or ""):
        return True
    node = getattr(recommendation, "stage_node", None) or getattr(recommendation, "node", None)
    return found.cache_fits(node) is not False


def warn_of_memory(findings) -> None:
    """Logs each memory finding as a warning: said before training, as the job may not end.

    Args:
        findings: the `Findings` of the fit's data.
    """
    for finding in findings or ():
        if finding.id in (CACHE_MEMORY, SHUFFLE_MEMORY):
            logger.warning(
                "keras-pipeline-tuner: %s %s: %s", finding.severity, finding.id, finding.reason
            )


def _main_chain(dataset) -> list:
    """The dataset and those it reads through first inputs, the final one first."""
    chain, current = [], dataset
    while current is not None and len(chain) < 10_000:
        chain.append(current)
        current = getattr(current, "_input_dataset", None)
    return chain


def _stages_by_kind(pipeline) -> Dict[str, list]:
    """The pipeline's main-chain stages per kind, the final one first."""
    if pipeline is None or pipeline.final is None:
        return {}
    ordered = [pipeline.final, *pipeline.main_chain(pipeline.final)]
    found: Dict[str, list] = {}
    for stage in ordered:
        found.setdefault(stage.kind, []).append(stage)
    return found


def _pass_bytes(chain) -> Optional[Tuple[int, int, int]]:
    """`(bytes, elements, element bytes)` of one pass over `chain[0]`'s output, if known.

    Below a stage without static sizes, through stages that hand on their
    bytes, to the first with static sizes and a known cardinality.
    """
    for index, item in enumerate(chain):
        size = _element_bytes(item)
        elements = _cardinality(item)
        if size is not None and elements is not None:
            return size * elements, elements, size
        if type(item).__name__ not in _SAME_BYTES or index + 1 >= len(chain):
            return None
    return None


def _buffer(item, kind: str, label: str, node, below) -> BufferForecast:
    if kind == kinds.CACHE:
        found = _pass_bytes(below)
        if found is None:
            return BufferForecast(label, node, kind, None, "element sizes or count not known")
        total, elements, size = found
        return BufferForecast(label, node, kind, total, f"{elements} elements of {_size(size)}")
    count = _constant(getattr(item, "_buffer_size", None))
    size = _element_bytes(below[0]) if below else None
    if size is None and below:
        # Batches with no static size (a partial last batch): their mean size.
        found, batches = _pass_bytes(below), _cardinality(below[0])
        size = found[0] // batches if found is not None and batches else None
    if count is None or count < 0 or size is None:
        return BufferForecast(label, node, kind, None, "buffer size (AUTOTUNE) or element size "
                              "not known before running")
    elements = _cardinality(below[0]) if below else None
    if elements is not None:
        count = min(count, elements)
    return BufferForecast(label, node, kind, count * size, f"{count} elements of {_size(size)}")


def _element_bytes(dataset) -> Optional[int]:
    import tensorflow as tf

    total = 0
    for spec in tf.nest.flatten(dataset.element_spec):
        if not isinstance(spec, tf.TensorSpec) or not spec.shape.is_fully_defined():
            return None
        if spec.dtype in (tf.string, tf.variant, tf.resource):
            return None
        total += spec.shape.num_elements() * spec.dtype.size
    return total


def _cardinality(dataset) -> Optional[int]:
    try:
        count = int(dataset.cardinality())
    except Exception:  # noqa: BLE001 - a stand-in or a distributed dataset: unknown.
        return None
    return count if count >= 0 else None


def _constant(tensor) -> Optional[int]:
    if tensor is None:
        return None
    try:
        return int(tensor)
    except (TypeError, ValueError):
        return None


def _size(count: int) -> str:
    """Bytes of one element, as people read them.

    Example:

    >>> _size(4 * 2**20), _size(1024), _size(12)
    ('4.0 MiB', '1 KiB', '12 B')
    """
    if count >= 2**20:
        return f"{count / 2**20:.1f} MiB"
    if count >= 2**10:
        return f"{count / 2**10:.0f} KiB"
    return f"{count} B"
