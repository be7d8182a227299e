"""Grain's own per-stage timing: which transformation of a Grain pipeline is slow.

Keras 3 trains on Grain datasets (`grain.MapDataset`, `grain.IterDataset`)
directly. TensorFlow's profiler cannot see inside them, but Grain times its own
stages: with `ExecutionTrackingMode.STAGE_TIMING` each transformation records
the time it takes to produce an element, its inputs excluded, and Grain's
`get_execution_summary` returns them as an `ExecutionSummary`.

- `track_stages` turns that timing on for one iterator, just made: the
  iterator `fit` reads (see `instrumentation.grain_stage_timing`), or the one
  of a separate pass (`time_stages`, after training, only when the user asks
  for their Python to run again).
- `stage_summary` reads Grain's summary of such an iterator at any time:
  Grain folds the recorded times into it from a background thread every few
  seconds, and the times recorded since are added (read, never moved).
- `stage_evidence` turns a summary into the profiler window's `IteratorTime`
  rows, in a `ProfileEvidence` whose `source` is `GRAIN`, so that the advice
  and every output show them as they show a profiled tf.data pipeline.
"""

import contextlib
import dataclasses
import re
import sys
import time
import weakref
from typing import Callable
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
# Reads of a summary at most, when Grain folds times in during one.
_READ_ATTEMPTS = 3

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
) -> ProfileEvidence:
    """Times each stage of a Grain pipeline with Grain's own stage timing, in a pass of its own.

    Reads up to `batches` elements of `dataset` (for a `fit` input, batches)
    with `STAGE_TIMING` on, then reads Grain's execution summary. The dataset
    itself is not changed; its functions run again for the elements read:
    the tuner does this only when the user asks for it (training's own
    iterator is timed during training otherwise, see `track_stages`).

    Args:
        dataset: a `grain.MapDataset` or `grain.IterDataset` (a `MapDataset`
            is read through `to_iter_dataset()`, as `iter()` and Keras read it).
        batches: elements the pass reads at most.
        max_pass_s: seconds the pass reads for at most.

    Returns:
        A `ProfileEvidence` with `source` `GRAIN` (see `stage_evidence`).

    Raises:
        TypeError: if `dataset` is not a Grain dataset.

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
    recorder, read = _timed_pass(dataset, batches, began + max_pass_s)
    pass_s = time.perf_counter() - began
    evidence = stage_evidence(
        stage_summary(recorder),
        trigger=(
            f"Grain's stage timing, in a separate pass over {read} batches of the "
            f"training dataset once training ended ({pass_s:.2f} s)"
        ),
        note=(
            "Stage times are Grain's own (ExecutionTrackingMode.STAGE_TIMING), measured in a "
            "separate pass over the training dataset once training ended, not during the "
            "training steps; a stage read on several threads adds up the time of all of them."
        ),
        batches=read,
    )
    evidence.cost.window_s = time.perf_counter() - began
    return evidence


def track_stages(iterator, keep_on: Optional[Callable[[], bool]] = None):
    """Turns Grain's stage timing on for `iterator`, made and not read yet.

    Sets `STAGE_TIMING` in the options of the iterator's pipeline, as
    `grain.experimental.WithOptionsIterDataset` does when it makes an iterator
    (its other options stay as they are). Elements, their order and the
    threads that make them stay the same; each stage times each element it
    makes (microseconds, see `instrumentation.grain_stage_timing`). The
    options belong to this iterator; its stages that read a `MapDataset`
    record their times in that dataset's nodes, whose recorders are made anew
    by the next iterator over them.

    Args:
        iterator: a Grain `DatasetIterator`.
        keep_on: asked after each element the iterator gives, on the thread
            that reads it; once it returns `False` the timing is turned off
            again (the iterator's options as before, recorders that record
            nothing), and the times recorded so far stay readable.

    Returns:
        Grain's recorder of the iterator's output stage, which `stage_summary`
        reads (it outlives the iterator).

    Example:

    >>> import grain
    >>> iterator = iter(grain.MapDataset.range(8).batch(2))
    >>> recorder = track_stages(iterator, keep_on=lambda: False)
    >>> [batch.tolist() for batch in iterator]
    [[0, 1], [2, 3], [4, 5], [6, 7]]
    >>> stage_summary(recorder).nodes[0].num_produced_elements  # then off
    1
    """
    import grain

    mode = grain.experimental.ExecutionTrackingMode.STAGE_TIMING
    options = grain.experimental.DatasetOptions(execution_tracking_mode=mode)
    # pylint: disable=protected-access
    context = iterator._ctx
    before = context.dataset_options
    context.dataset_options = options.merge(before)
    if "_stats" in vars(iterator):
        # Made already (with the options it was made with): made again.
        iterator._initialize_stats(mode)
    recorder = iterator._stats
    # pylint: enable=protected-access
    if keep_on is not None:
        _stop_when_asked(iterator, recorder, before, keep_on)
    return recorder


def stage_summary(recorder):
    """Grain's execution summary of a tracked iterator, with the times not folded in yet.

    Grain folds each stage's recorded times into its summary from a
    background thread every 5 s (`stats._REPORTING_PERIOD_SEC`); the times
    recorded since are read from each stage's recorder and added here, so the
    summary covers every element made so far. Nothing of Grain's is moved:
    its thread goes on as before. A fold by that thread while this reads
    would drop the times it moved from this summary; what Grain holds is
    compared before and after, and the summary read again when they differ.

    Args:
        recorder: what `track_stages` returned.

    Returns:
        An `ExecutionSummary` (Grain's protocol buffer): one node per stage,
        the output stage's id 0.

    Raises:
        ValueError: if the iterator's stages are not timed.
    """
    for _ in range(_READ_ATTEMPTS):
        held = _held(recorder)
        summary = _summary_with_unfolded(recorder)
        if _held(recorder) == held:
            break
    return summary


def _summary_with_unfolded(recorder):
    summary = _grain_summary(recorder)
    for stats, node in _stages(recorder, summary):
        _add_unfolded(node, list(getattr(stats, "_self_times_buffer", ())))
    return summary


def _stages(recorder, summary):
    """Each stage's recorder with its node in `summary`, as Grain numbers them.

    (See Grain's `_build_execution_summary`.)
    """
    pending = [(recorder, 0)]
    while pending:
        stats, node_id = pending.pop()
        if node_id not in summary.nodes:
            continue
        node = summary.nodes[node_id]
        config = getattr(stats, "_config", None)
        if node.name != getattr(config, "name", None):
            continue
        yield stats, node
        if _numbers_inputs_in_order(stats):
            pending.extend(zip(getattr(stats, "_parents", ()), node.inputs))


def _held(recorder) -> List[Tuple[int, int]]:
    """What Grain holds of each stage: elements folded in, and times waiting to be."""
    held, pending = [], [recorder]
    while pending:
        stats = pending.pop()
        folded = getattr(stats, "_summary", None)
        held.append(
            (
                getattr(folded, "num_produced_elements", 0),
                len(getattr(stats, "_self_times_buffer", ())),
            )
        )
        pending.extend(getattr(stats, "_parents", ()))
    return held


def merged_summary(summaries):
    """One summary of several passes over the same pipeline (e.g. one iterator an epoch).

    Args:
        summaries: `ExecutionSummary` protocol buffers, the first one's stages
            kept; a stage of the others is added in where the first has it
            under the same id and name.

    Returns:
        A new `ExecutionSummary`, or `None` when `summaries` is empty.
    """
    merged = None
    for summary in summaries:
        if merged is None:
            merged = type(summary)()
            merged.CopyFrom(summary)
            continue
        for node_id, node in summary.nodes.items():
            if node_id in merged.nodes and merged.nodes[node_id].name == node.name:
                into = merged.nodes[node_id]
                into.num_produced_elements += node.num_produced_elements
                into.total_processing_time_ns += node.total_processing_time_ns
                if node.num_produced_elements:
                    into.min_processing_time_ns = min(
                        into.min_processing_time_ns, node.min_processing_time_ns
                    )
                    into.max_processing_time_ns = max(
                        into.max_processing_time_ns, node.max_processing_time_ns
                    )
    return merged


def stage_evidence(summary, trigger: str, note: str, batches: int) -> ProfileEvidence:
    """Grain's summary of a pipeline's stages as evidence for the advice.

    Args:
        summary: an `ExecutionSummary` (`stage_summary`, `merged_summary`).
        trigger: how and when the stages were timed (one sentence, no stop).
        note: the caveat the report shows with them.
        batches: elements the pipeline's output gave (for `fit`, batches).

    Returns:
        A `ProfileEvidence` with `source` `GRAIN`: one `IteratorTime` per
        stage, most own time first, and the stage with the most own time as
        the bottleneck (asynchronous prefetch stages, whose time is waiting,
        are never named).
    """
    rows = _rows(summary)
    evidence = ProfileEvidence(source=GRAIN, first_step=0, stop_step=batches)
    evidence.trigger = trigger
    evidence.iterators = rows
    evidence.cost.steps = batches
    slowest = next((row for row in rows if not row.waiting), None)
    if slowest is not None:
        evidence.bottleneck = slowest.stage
        evidence.bottleneck_iterator = slowest.iterator
        evidence.bottleneck_node = slowest.stage_node
    evidence.notes.append(note)
    return evidence


def _timed_pass(dataset, batches: int, deadline: float):
    """Reads up to `batches` elements with Grain's stage timing on, until `deadline`.

    Returns:
        The recorder of the (closed) iterator, which holds Grain's timing, and
        the elements read.
    """
    import grain

    if isinstance(dataset, grain.MapDataset):
        dataset = dataset.to_iter_dataset()
    iterator = iter(dataset)
    recorder = track_stages(iterator)
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
        # Stops read-ahead threads; what they recorded is still read.
        iterator.close()
    return recorder, read


def _stop_when_asked(iterator, recorder, before, keep_on: Callable[[], bool]) -> None:
    """Asks `keep_on` as the output stage records each element; turns the timing off on `False`.

    The output stage records an element on the thread reading the iterator,
    once it is made: there the iterator's recorders are made anew with the
    options it had, as when it was made (its read-ahead threads finish the
    elements they began on the recorders they began them on).
    """
    record = recorder.record_self_time
    iterator_ref = weakref.ref(iterator)

    @contextlib.contextmanager
    def record_self_time(*args, **kwargs):
        with record(*args, **kwargs):
            yield
        if recorder.record_self_time is record_self_time and not keep_on():
            # Once: this recorder records as Grain's own from here on.
            del recorder.record_self_time
            tracked = iterator_ref()
            if tracked is not None:
                # pylint: disable=protected-access
                tracked._ctx.dataset_options = before
                tracked._initialize_stats(before.execution_tracking_mode)

    recorder.record_self_time = record_self_time


def _grain_summary(recorder):
    # `grain.experimental.get_execution_summary(iterator)` reads the iterator's
    # recorder; the recorder is read here, since it outlives the iterator.
    try:
        return recorder._get_execution_summary()  # pylint: disable=protected-access
    except AttributeError:
        raise ValueError(
            "Grain's stage timing is not on for this iterator (no execution summary)"
        ) from None


def _numbers_inputs_in_order(stats) -> bool:
    """Whether Grain numbers this stage's inputs as its own recorders' parents.

    Stages that merge their workers' summaries (mp_prefetch, interleave) number
    theirs otherwise: their inputs keep Grain's figures as they are.
    """
    from grain._src.python.dataset import stats as grain_stats

    plain = grain_stats._ExecutionStats._build_execution_summary  # pylint: disable=protected-access
    return getattr(type(stats), "_build_execution_summary", None) is plain


def _add_unfolded(node, recorded) -> None:
    for duration_ns, elements in recorded:
        if elements <= 0:
            continue
        node.num_produced_elements += elements
        node.total_processing_time_ns += duration_ns
        per_element_ns = duration_ns // elements
        node.min_processing_time_ns = min(node.min_processing_time_ns, per_element_ns)
        node.max_processing_time_ns = max(node.max_processing_time_ns, per_element_ns)


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
