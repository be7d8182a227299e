"""Grain's own per-stage timing: which transformation of a Grain pipeline is slow.

Keras 3 trains on Grain datasets (`grain.MapDataset`, `grain.IterDataset`)
directly. TensorFlow's profiler cannot see inside them, but Grain times its own
stages: with `ExecutionTrackingMode.STAGE_TIMING` each transformation records
the time it takes to produce an element, its inputs excluded, and Grain's
`get_execution_summary` returns them as an `ExecutionSummary`.

The iterator Keras makes for `fit` cannot be reached from a callback, so the
stages are timed in a separate, bounded pass over a few batches of the same
dataset, after training (the evidence says so). Grain folds the recorded
times into its summary from a background thread every few seconds; the pass
stops reading after its batches and waits for that, idle, at most
`MAX_WAIT_S`.

The stages come out as the profiler window's `IteratorTime` rows, in a
`ProfileEvidence` whose `source` is `GRAIN`, so that the advice and every
output show them as they show a profiled tf.data pipeline.
"""

import dataclasses
import re
import sys
import time
from typing import Dict
from typing import List
from typing import Optional
from typing import Tuple

from keras_pipeline_tuner.profiling.evidence import GRAIN
from keras_pipeline_tuner.profiling.evidence import IteratorTime
from keras_pipeline_tuner.profiling.evidence import ProfileEvidence

# Batches the separate pass reads, and the longest it reads for.
PASS_BATCHES = 8
MAX_PASS_S = 5.0
# Grain aggregates the recorded times every 5 s (`stats._REPORTING_PERIOD_SEC`).
MAX_WAIT_S = 7.0
_POLL_S = 0.1

# "MapDatasetIterator(transform=slow_parse @ .../data.py:12)" -> class, arguments.
_NODE = re.compile(r"^(?P<cls>\w+?)\((?P<args>.*)\)$", re.S)
_TRANSFORM = re.compile(r"transform=(?P<name>[^\s,@()]+)")
_NUM_THREADS = re.compile(r"num_threads=(?P<threads>\d+)")
_SUFFIXES = ("DatasetIterator", "MapDataset", "IterDataset")
# Grain class name prefixes whose method is spelled otherwise.
_METHODS = {
    "Prefetch": "to_iter_dataset",
    "MultiprocessPrefetch": "mp_prefetch",
    "ThreadPrefetch": "prefetch",
    "Source": "source",
}


@dataclasses.dataclass
class GrainStage:
    """Where a Grain stage runs, read from Grain's name for it.

    Attributes:
        label: the stage as code, e.g. "map(slow_parse)".
        on_read_threads: a `MapDataset` stage under `to_iter_dataset`, read on
            `ReadOptions.num_threads` threads; `False` for an `IterDataset`
            stage, which runs on the thread that reads the batches.
        read_threads: `ReadOptions.num_threads` of the pipeline's
            `to_iter_dataset`, if it has one.
    """

    label: str
    on_read_threads: bool
    read_threads: Optional[int] = None


def is_grain_dataset(value) -> bool:
    """Whether `value` is a Grain `MapDataset` or `IterDataset` (Grain not imported here).

    Args:
        value: anything.

    Returns:
        `True` for a Grain dataset, when Grain is installed and imported.

    Example:

    >>> is_grain_dataset([1, 2, 3])
    False
    """
    grain = sys.modules.get("grain")
    if grain is None:
        return False
    return isinstance(value, (grain.MapDataset, grain.IterDataset))


def stage_label(name: str) -> str:
    """A Grain node's name as the user wrote the stage.

    Args:
        name: Grain's name for a dataset or iterator node.

    Returns:
        The stage as code, e.g. "map(slow_parse)" or "batch".

    Example:

    >>> stage_label("MapDatasetIterator(transform=slow_parse @ .../data.py:3)")
    'map(slow_parse)'
    >>> stage_label("BatchMapDataset(batch_size=4, drop_remainder=False)")
    'batch'
    """
    match = _NODE.match(name.strip())
    if match is None:
        return name
    cls = match.group("cls")
    for suffix in _SUFFIXES:
        if cls.endswith(suffix) and cls != suffix:
            cls = cls[: -len(suffix)]
            break
    method = _METHODS.get(cls) or re.sub(r"(?<!^)(?=[A-Z])", "_", cls).lower()
    transform = _TRANSFORM.search(match.group("args"))
    return f"{method}({transform.group('name')})" if transform else method


def placement(evidence: ProfileEvidence) -> Optional[GrainStage]:
    """Where the bottleneck of Grain stage timing runs.

    Args:
        evidence: a `ProfileEvidence` from `time_stages`.

    Returns:
        The `GrainStage` of its bottleneck, or `None` when none was named.

    Example:

    ```python
    stage = placement(tuner.report.profile)
    print(stage.label, stage.on_read_threads, stage.read_threads)
    ```
    """
    slowest = next(
        (row for row in evidence.iterators if row.iterator == evidence.bottleneck_iterator),
        None,
    )
    if slowest is None:
        return None
    threads = None
    for row in evidence.iterators:
        match = _NUM_THREADS.search(row.iterator)
        if row.stage == "to_iter_dataset" and match is not None:
            threads = int(match.group("threads"))
    on_read_threads = slowest.iterator.split("(", 1)[0].endswith("MapDataset") and bool(threads)
    return GrainStage(slowest.stage, on_read_threads, threads)


def time_stages(
    dataset,
    batches: int = PASS_BATCHES,
    max_pass_s: float = MAX_PASS_S,
    max_wait_s: float = MAX_WAIT_S,
) -> ProfileEvidence:
    """Times each stage of a Grain pipeline with Grain's own stage timing.

    Reads up to `batches` elements of `dataset` (for a `fit` input, batches)
    in a pass of its own, with `STAGE_TIMING` on, then reads Grain's execution
    summary. The dataset itself is not changed; its functions run again for
    the elements read.

    Args:
        dataset: a `grain.MapDataset` or `grain.IterDataset` (a `MapDataset`
            is read through `to_iter_dataset()`, as `iter()` and Keras read it).
        batches: elements the pass reads at most.
        max_pass_s: seconds the pass reads for at most.
        max_wait_s: seconds to wait at most for Grain to fold the times in.

    Returns:
        A `ProfileEvidence` with `source` `GRAIN`: one `IteratorTime` per
        stage, most own time first, and the stage with the most own time as
        the bottleneck (asynchronous prefetch stages, whose time is waiting,
        are never named).

    Raises:
        TypeError: if `dataset` is not a Grain dataset.
        RuntimeError: if Grain gave no timing within `max_wait_s`.

    Example:

    ```python
    evidence = time_stages(grain_ds)
    print(evidence.summary())
    ```
    """
    if not is_grain_dataset(dataset):
        raise TypeError(
            f"time_stages() takes a grain.MapDataset or grain.IterDataset, got "
            f"{type(dataset).__name__}."
        )
    began = time.perf_counter()
    iterator, read = _timed_pass(dataset, batches, began + max_pass_s)
    pass_s = time.perf_counter() - began
    summary = _wait_for_summary(iterator, read, began + pass_s + max_wait_s)
    rows = _rows(summary)
    evidence = ProfileEvidence(source=GRAIN, first_step=0, stop_step=read)
    evidence.trigger = (
        f"Grain's stage timing, in a separate pass over {read} batches of the "
        f"training dataset once training ended ({pass_s:.2f} s)"
    )
    evidence.iterators = rows
    evidence.cost.steps = read
    evidence.cost.window_s = time.perf_counter() - began
    slowest = next((row for row in rows if not row.waiting), None)
    if slowest is not None:
        evidence.bottleneck = slowest.stage
        evidence.bottleneck_iterator = slowest.iterator
        evidence.bottleneck_node = slowest.stage_node
    evidence.notes.append(
        "Stage times are Grain's own (ExecutionTrackingMode.STAGE_TIMING), measured in a "
        "separate pass over the training dataset once training ended, not during the training "
        "steps; a stage read on several threads adds up the time of all of them."
    )
    return evidence


def _timed_pass(dataset, batches: int, deadline: float):
    """Reads up to `batches` elements with Grain's stage timing on, until `deadline`.

    Returns:
        The (closed) iterator, which holds Grain's timing, and the elements read.
    """
    import grain

    if isinstance(dataset, grain.MapDataset):
        dataset = dataset.to_iter_dataset()
    options = grain.experimental.DatasetOptions(
        execution_tracking_mode=grain.experimental.ExecutionTrackingMode.STAGE_TIMING
    )
    iterator = iter(grain.experimental.WithOptionsIterDataset(dataset, options))
    read = 0
    try:
        for _ in range(batches):
            next(iterator)
            read += 1
            if time.perf_counter() > deadline:
                break
    except StopIteration:
        pass
    finally:
        # Stops read-ahead threads; what they recorded is still folded in.
        iterator.close()
    return iterator, read


def _wait_for_summary(iterator, read: int, deadline: float):
    get_summary = _summary_reader()
    while True:
        summary = get_summary(iterator)
        output = summary.nodes.get(0)
        produced = output.num_produced_elements if output is not None else 0
        if read == 0 or produced >= read:
            return summary
        if time.perf_counter() > deadline:
            if produced:
                return summary
            raise RuntimeError(
                f"Grain folded no stage timing into its summary within "
                f"{deadline:.0f} s of the pass"
            )
        time.sleep(_POLL_S)


def _summary_reader():
    import grain

    # Grain documents `grain.experimental.get_execution_summary`; 0.2.18
    # defines it without exporting it there.
    reader = getattr(grain.experimental, "get_execution_summary", None)
    if reader is None:
        from grain._src.python.dataset import dataset as grain_dataset

        reader = grain_dataset.get_execution_summary
    return reader


def _rows(summary) -> List[IteratorTime]:
    nodes: Dict[int, object] = dict(summary.nodes)
    totals: Dict[int, float] = {}

    def total_ns(node_id: int) -> float:
        if node_id not in totals:
            node = nodes[node_id]
            totals[node_id] = node.total_processing_time_ns + sum(
                total_ns(child) for child in node.inputs if child in nodes
            )
        return totals[node_id]

    working_ns = sum(
        node.total_processing_time_ns for node in nodes.values() if not node.is_prefetch
    )
    rows: List[Tuple[float, IteratorTime]] = []
    for node_id, node in nodes.items():
        self_ns = float(node.total_processing_time_ns)
        rows.append(
            (
                self_ns,
                IteratorTime(
                    iterator=node.name,
                    stage=stage_label(node.name),
                    stage_node=f"grain:{node_id}",
                    dataset_op=node.name.split("(", 1)[0],
                    calls=int(node.num_produced_elements),
                    self_ms=self_ns / 1e6,
                    total_ms=total_ns(node_id) / 1e6,
                    self_share=(self_ns / working_ns)
                    if working_ns and not node.is_prefetch
                    else 0.0,
                    waiting=bool(node.is_prefetch),
                ),
            )
        )
    rows.sort(key=lambda pair: -pair[0])
    return [row for _, row in rows]
