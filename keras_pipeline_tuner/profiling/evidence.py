"""What a TF Profiler window showed: xprof's input-pipeline analysis, read headlessly.

A capture (`<host>.xplane.pb`) is converted with xprof, the library behind
TensorBoard's Profile tab (during a fit in a process of its own, see
`conversion`), into two of its tools:

- "input_pipeline_analyzer": per-step input and compute times, the input share
  and its conclusion sentence (the same numbers the Profile tab shows), and the
  tf.data iterators with their self time;
- "trace_viewer": the timeline, for which dataset op each iterator came from
  (so it can be named as the user wrote it) and, when the analyzer finds no steps
  (`steps_per_execution > 1`), for computing the per-step figures from the step
  markers and the batch fetches themselves.

The slowest stage is picked from the iterator self times, leaving out
asynchronous iterators whose self time is only waiting for their input.
"""

import collections
import contextlib
import dataclasses
import json
import os
import re
import time
import typing
from typing import Dict
from typing import List
from typing import Optional
from typing import Sequence
from typing import Tuple

from keras_pipeline_tuner._util import files
from keras_pipeline_tuner.profiling import stage_names
from keras_pipeline_tuner.timing.step_stats import MODERATELY_INPUT_BOUND_FRACTION

if typing.TYPE_CHECKING:
    from keras_pipeline_tuner.pipeline.graph.model import Stage

ANALYZER = "input_pipeline_analyzer"
TRACE = "trace"
# Stage times from Grain's own stage timing (see `grain_stages`), not the TF Profiler.
GRAIN = "grain"
# The name of the step markers the profiler window puts around each step.
STEP_MARKER = "train"
# Above this size a capture is kept for the Profile tab but not converted here:
# conversion time and memory grow with it, and the end of fit may wait for it.
MAX_CONVERTED_BYTES = 256 * 2**20
# An asynchronous iterator that waits on its input shows about as much self time
# as its inputs spend working (they overlap), plus its own bookkeeping; on a
# function slower than its input it shows the function's time instead.
_WAITING_SLACK = 1.25
_FETCH_EVENTS = ("IteratorGetNextOp::DoCompute", "IteratorGetNextAsOptionalOp::DoCompute")
_STEP_NUMBER = re.compile(r"(\d+)\s*$")
# Steps of a window whose trace the outputs draw: as many as the timeline image's
# profiler panel shows (`timeline_image.MAX_PROFILED_STEPS`).
TIMELINE_STEPS = 8
# The first steps' trace of captures converted in a process of their own, by
# capture, the latest few: the outputs draw them from here, since converting the
# capture again on the training thread would stall it as long as that took.
_KEPT_TRACES: "collections.OrderedDict[str, List[dict]]" = collections.OrderedDict()
_KEEP_TRACES = 4


# Steps a window needs before its stage table may name a bottleneck: fewer are
# a sample of noise (a window opened at a run's last step closed with none).
MIN_STEPS = 5

@dataclasses.dataclass
class ProfiledStep:
    """One profiled step, as the analyzer (or the trace) timed it.

    With `steps_per_execution > 1` one entry covers one call of the compiled
    function, that many steps.

    Attributes:
        step: the training step number given to the step marker.
        step_ms: the step's duration.
        input_ms: time the step waited for its batch.
        compute_ms: the rest of the step.
    """

    step: int
    step_ms: float
    input_ms: float
    compute_ms: float


@dataclasses.dataclass
class IteratorTime:
    """Time one tf.data iterator took during the window.

    Attributes:
        iterator: the profiler's name, e.g. "Iterator::Root::Prefetch::BatchV2".
        stage: the transformation as the user wrote it, e.g. "map(load_image)".
        stage_node: the graph node of that stage (`Stage.node`),
            when the pipeline was read.
        dataset_op: the dataset op it runs, as the trace names it (e.g.
            "MapDataset:1"), if the trace showed it.
        calls: how many elements it produced.
        self_ms: time spent in the iterator itself, its inputs excluded.
        total_ms: time including its inputs.
        self_share: `self_ms` over the self time of the iterators that worked
            (not `waiting`): the stage's share of the pipeline's work. Time
            spent waiting would otherwise be counted twice, once by the waiting
            iterator and once by the one it waited for.
        waiting: an asynchronous iterator whose self time is spent waiting for
            its input rather than working: never the slowest stage.
    """

    iterator: str
    stage: str
    stage_node: Optional[str]
    dataset_op: Optional[str]
    calls: int
    self_ms: float
    total_ms: float
    self_share: float
    waiting: bool


@dataclasses.dataclass
class CaptureCost:
    """What the window cost, to keep it bounded and stated.

    Attributes:
        steps: training steps inside the window.
        window_s: wall time from starting the profiler to having the file.
        start_s: time to start the profiler.
        stop_s: time to stop it and write the capture.
        file_bytes: size of the `.xplane.pb` capture.
        conversion_s: time to convert it with xprof, in a process of its own
            while training went on: from starting that process to its result.
        conversion_began_at: when that process was started (`time.time()`).
        conversion_ended_at: when it had the result (`time.time()`).
        conversion_wait_s: time the training thread waited for the result:
            0 at the end of fit, which does not wait (the result joins the
            report when it arrives); a custom loop's `close()` waits for it.
            The tuner's only cost of the conversion on that thread.
    """

    steps: int = 0
    window_s: float = 0.0
    start_s: float = 0.0
    stop_s: float = 0.0
    file_bytes: int = 0
    conversion_s: Optional[float] = None
    conversion_began_at: Optional[float] = None
    conversion_ended_at: Optional[float] = None
    conversion_wait_s: Optional[float] = None


@dataclasses.dataclass
class ProfileEvidence:
    """What one TF Profiler window showed about the input pipeline.

    Attributes:
        run_dir: the capture's run folder, which TensorBoard's Profile tab lists
            (`<dir>/plugins/profile/<run>`).
        xplane_path: the capture file in it.
        temporary: the capture went to a temporary directory because the tuner
            had no `log_dir`.
        trigger: why the window was taken.
        first_step: first training step in the window.
        stop_step: the step after the window.
        source: "input_pipeline_analyzer" when the per-step figures are xprof's,
            "trace" when they were computed from the trace (the analyzer found no
            steps), "grain" for the stage times of a Grain pipeline timed by
            Grain itself (then `stop_step` is the number of batches read and
            there are no per-step figures), "" when there are none.
        steps: per-step input and compute times.
        input_fraction: input time over step time in the window, or `None`:
            evidence, which the run's verdict weighs with the step clock's
            (`advice.verdict.judge`); the window decides nothing itself.
        conclusion: the analyzer's conclusion sentence (xprof's own words),
            or what replaced it; kept as read, not shown as a verdict.
        iterators: tf.data iterators, most self time first.
        bottleneck: the stage holding the most input time (e.g.
            "map(load_image)"); it limits training when the verdict is
            input-bound.
        bottleneck_iterator: the profiler's name of that stage's iterator.
        bottleneck_node: the graph node of that stage, when the pipeline was read.
        cost: the `CaptureCost`.
        notes: caveats, e.g. why figures are missing.
        timed_in_training: for Grain's stage timing, whether the stages were
            timed on the iterator training read, as it read it (`False`: in a
            separate pass after training).

    Example:

    ```python
    evidence = tuner.report.profile
    print(evidence.input_fraction, evidence.bottleneck, evidence.cost.file_bytes)
    ```
    """

    run_dir: str = ""
    xplane_path: str = ""
    temporary: bool = False
    trigger: str = ""
    first_step: int = 0
    stop_step: int = 0
    source: str = ""
    steps: List[ProfiledStep] = dataclasses.field(default_factory=list)
    input_fraction: Optional[float] = None
    conclusion: str = ""
    iterators: List[IteratorTime] = dataclasses.field(default_factory=list)
    bottleneck: Optional[str] = None
    bottleneck_iterator: Optional[str] = None
    bottleneck_node: Optional[str] = None
    cost: CaptureCost = dataclasses.field(default_factory=CaptureCost)
    notes: List[str] = dataclasses.field(default_factory=list)
    timed_in_training: bool = False

    def summary(self) -> str:
        """One line for people: the window's slowest stage and where the capture is.

        The window's steps and input share are the report's figures
        (`advice.figures.WindowFigures`), said with the verdict; this line
        names the stage.

        Returns:
            e.g. "slowest stage map(load_image) (99 % of the input pipeline's
            time); capture in ...".
        """
        slowest = next(
            (it for it in self.iterators if it.iterator == self.bottleneck_iterator), None
        )
        if self.source == GRAIN:
            if slowest is None:
                return "no stage named (see notes)"
            per_element = slowest.self_ms / slowest.calls if slowest.calls else 0.0
            return (
                f"slowest stage {slowest.stage} ({per_element:.1f} ms per element, "
                f"{slowest.self_share * 100:.0f} % of the pipeline's time)"
            )
        if not self.steps:
            line = "no step figures (see notes)"
        elif slowest is None:
            line = "no stage named the bottleneck"
        else:
            line = (
                f"slowest stage {slowest.stage} "
                f"({slowest.self_share * 100:.0f} % of the input pipeline's time)"
            )
        return f"{line}; capture in {self.run_dir}"

    def window_range(self) -> Tuple[int, int, int]:
        """The steps the window's figures are of: `(first, last, count)`.

        The steps the analyzer (or the trace) timed, when it timed some: its
        input share is theirs (xprof leaves out a capture's partial first and
        last steps). Otherwise the steps the capture covered. The one range
        every output shows.

        Example:

        >>> ProfileEvidence(first_step=10, stop_step=24).window_range()
        (10, 23, 14)
        >>> steps = [ProfiledStep(step, 1.0, 0.5, 0.5) for step in range(11, 23)]
        >>> ProfileEvidence(first_step=10, stop_step=24, steps=steps).window_range()
        (11, 22, 12)
        """
        if self.steps:
            numbers = [step.step for step in self.steps]
            return min(numbers), max(numbers), len(self.steps)
        last = max(self.stop_step - 1, self.first_step)
        return self.first_step, last, max(self.stop_step - self.first_step, 0)

    def span(self) -> str:
        """What the stage times cover, e.g. "steps 11-22 (12 steps)" (see `window_range`).

        Returns:
            The profiled steps, or for Grain's stage timing the batches
            training read, or the separate pass.

        Example:

        >>> ProfileEvidence(first_step=10, stop_step=25).span()
        'steps 10-24 (15 steps)'
        >>> ProfileEvidence(source=GRAIN, stop_step=24, timed_in_training=True).span()
        'the 24 batches training read'
        >>> ProfileEvidence(source=GRAIN, stop_step=8).span()
        'a separate pass over 8 batches after training'
        """
        if self.source == GRAIN:
            batches = self.stop_step - self.first_step
            if self.timed_in_training:
                return f"the {batches} batches training read"
            return f"a separate pass over {batches} batches after training"
        first, last, count = self.window_range()
        return f"steps {first}-{last} ({count} step{'s' if count != 1 else ''})"


def analyze_capture(
    xplane_path: str,
    stages: Optional[Dict[str, "Stage"]] = None,
    window_steps: Optional[int] = None,
) -> ProfileEvidence:
    """Converts a capture with xprof and reads the input-pipeline evidence.

    Args:
        xplane_path: a `<host>.xplane.pb` written by the TF Profiler, with step
            markers named `STEP_MARKER`.
        stages: `stage_names.pipeline_stages` of the profiled pipeline, to name
            stages as the user wrote them; `None` names them by kind.
        window_steps: training steps the window covered (a marker holds several
            with `steps_per_execution > 1`); the markers found by default.

    Returns:
        A `ProfileEvidence` with the figures, the ranked iterators, the
        bottleneck and the conversion time; the capture fields (`run_dir`,
        `trigger`, steps, `cost` apart from `file_bytes` and `conversion_s`)
        are left for the caller.

    Example:

    ```python
    evidence = analyze_capture("logs/plugins/profile/run/host.xplane.pb")
    print(evidence.input_fraction, evidence.bottleneck)
    ```
    """
    return analyze_capture_and_trace(xplane_path, stages, window_steps)[0]


def analyze_capture_and_trace(
    xplane_path: str,
    stages: Optional[Dict[str, "Stage"]] = None,
    window_steps: Optional[int] = None,
) -> Tuple[ProfileEvidence, List[dict]]:
    """As `analyze_capture`, with the trace of the window's first steps from the same conversion.

    Args:
        xplane_path: the capture, as for `analyze_capture`.
        stages: the pipeline's stages, as for `analyze_capture`.
        window_steps: the window's training steps, as for `analyze_capture`.

    Returns:
        The evidence, and `first_steps` of the capture's trace (none when it
        was not converted), which the outputs draw without converting it again.

    Example:

    ```python
    evidence, first = analyze_capture_and_trace("logs/plugins/profile/run/host.xplane.pb")
    keep_first_steps(evidence.xplane_path, first)
    ```
    """
    evidence = ProfileEvidence(xplane_path=xplane_path)
    evidence.cost.file_bytes = files.size(xplane_path)
    if evidence.cost.file_bytes > MAX_CONVERTED_BYTES:
        evidence.notes.append(
            f"The capture is {evidence.cost.file_bytes / 2**20:.0f} MB, above the "
            f"{MAX_CONVERTED_BYTES / 2**20:.0f} MB the tuner converts: open it in "
            "TensorBoard's Profile tab, or profile fewer steps (profile_steps)."
        )
        return evidence, []
    began = time.perf_counter()
    analysis = _tool_json(xplane_path, "input_pipeline_analyzer")
    events = trace_events(xplane_path)
    evidence.cost.conversion_s = time.perf_counter() - began

    steps_table, iterators_table = _analyzer_tables(analysis)
    steps = _read_steps(evidence, steps_table, events)
    evidence.steps = steps
    evidence.input_fraction = _input_fraction(steps)
    if evidence.source == TRACE and evidence.input_fraction is not None:
        evidence.conclusion = (
            f"{evidence.input_fraction * 100:.1f} % of the step time sampled is waiting "
            "for input (computed from the trace)."
        )
    evidence.iterators = rank_iterators(
        iterators_table, _iterator_ops(events), stages or {}
    )
    bottleneck = _named_bottleneck(evidence, window_steps)
    if bottleneck is not None:
        evidence.bottleneck = bottleneck.stage
        evidence.bottleneck_iterator = bottleneck.iterator
        evidence.bottleneck_node = bottleneck.stage_node
    if not evidence.iterators:
        evidence.notes.append("The capture holds no tf.data iterator activity.")
    return evidence, first_steps(events)


def _read_steps(evidence: ProfileEvidence, steps_table: dict, events) -> list:
    """The window's steps: the analyzer's, else the trace's; sets `evidence.source`."""
    steps = _analyzer_steps(steps_table)
    if steps:
        evidence.source = ANALYZER
        evidence.conclusion = steps_table.get("p", {}).get("input_conclusion", "")
        return steps
    steps = trace_steps(events)
    if steps:
        evidence.source = TRACE
        evidence.notes.append(
            "xprof's input-pipeline analyzer found no steps in this window (it "
            "does not, with steps_per_execution > 1); the per-step input and "
            "compute times were computed from the trace instead: the time each "
            "step marker spent in a batch fetch while no step op ran."
        )
    else:
        evidence.notes.append(
            "The window could not be analysed: neither the analyzer nor the "
            f"trace shows a step marker named {STEP_MARKER!r} (was training "
            "running while the profiler was on?)."
        )
    return steps


def _named_bottleneck(
    evidence: ProfileEvidence, window_steps: Optional[int]
) -> Optional[IteratorTime]:
    """The stage named the bottleneck: the busiest not waiting, when the window can say."""
    bottleneck = next((it for it in evidence.iterators if not it.waiting), None)
    steps = evidence.steps
    covered = len(steps) if window_steps is None else max(window_steps, len(steps))
    if not steps:
        covered = 0
    if bottleneck is not None and covered < MIN_STEPS:
        # A stage table from a handful of steps (or none) says nothing about
        # where training waits.
        evidence.notes.append(
            f"The window holds {covered} step(s), fewer than the {MIN_STEPS} it needs to "
            "name a bottleneck: its stage table is shown, no stage is named."
        )
        return None
    fraction = evidence.input_fraction
    if bottleneck is not None and (fraction is None or fraction < MODERATELY_INPUT_BOUND_FRACTION):
        shown = "no" if fraction is None else f"{fraction * 100:.1f} %"
        evidence.notes.append(
            f"The window measured {shown} input, under the "
            f"{MODERATELY_INPUT_BOUND_FRACTION:.0%} at which input costs the step anything: "
            "no stage limits training, so none is named the bottleneck."
        )
        return None
    return bottleneck


def rank_iterators(
    iterators_table: dict,
    iterator_ops: Dict[str, str],
    stages: Dict[str, "Stage"],
) -> List[IteratorTime]:
    """Ranks the analyzer's tf.data iterators by self time and flags waiting ones.

    Args:
        iterators_table: the analyzer's iterator table (a gviz DataTable with
            "opName", "count", "timeInMs" and "selfTimeInMs" columns).
        iterator_ops: iterator name to dataset op name, from the trace.
        stages: dataset op name to the user's `Stage`.

    Returns:
        `IteratorTime`s, most self time first.
    """
    rows = _table_rows(iterators_table)
    self_ms = {row["opName"]: float(row.get("selfTimeInMs") or 0.0) for row in rows}
    waiting = {
        name: _is_waiting(name, stage_names.iterator_kind(name), self_ms) for name in self_ms
    }
    working_ms = sum(ms for name, ms in self_ms.items() if not waiting[name]) or 1.0
    ranked = []
    for row in rows:
        name = row["opName"]
        kind = stage_names.iterator_kind(name)
        dataset_op = _stage_op(name, kind, iterator_ops)
        # The root iterator carries the last op's name but is no stage of its own.
        stage = stage_names.stage_of(dataset_op, stages) if kind != "Root" else None
        if stage is None and kind != "Root":
            stage = stage_names.stage_of_kind(kind, stages) or _enclosing_stage(
                name, iterator_ops, stages
            )
        ranked.append(
            IteratorTime(
                iterator=name,
                stage=stage_names.stage_label(name, dataset_op, stage),
                stage_node=stage.node if stage is not None else None,
                dataset_op=iterator_ops.get(name),
                calls=int(row.get("count") or 0),
                self_ms=self_ms[name],
                total_ms=float(row.get("timeInMs") or 0.0),
                # A waiting iterator's self time (its wait) can exceed the
                # work of those it waits for: as a share, at most all of it.
                self_share=min(self_ms[name] / working_ms, 1.0),
                waiting=waiting[name],
            )
        )
    ranked.sort(key=lambda item: item.self_ms, reverse=True)
    return ranked


def trace_events(xplane_path: str) -> List[dict]:
    """The capture's timeline, converted by xprof's "trace_viewer" tool.

    Args:
        xplane_path: a `<host>.xplane.pb` capture.

    Returns:
        Chrome-trace events (times in microseconds), metadata events included.
    """
    trace = _tool_json(xplane_path, "trace_viewer")
    return trace.get("traceEvents", []) if isinstance(trace, dict) else []


def trace_steps(events: Sequence[dict]) -> List[ProfiledStep]:
    """Per-step input and compute times computed from the trace's step markers.

    A step's input time is the part of it during which a batch fetch
    (`IteratorGetNext`, or `IteratorGetNextAsOptional` in Keras' multi-step
    loop) ran while no op of the step did: the step was waiting for input. This
    holds whatever the number of steps per marker, which is why it is used when
    the analyzer finds none.

    Args:
        events: Chrome-trace events (times in microseconds) from xprof's
            "trace_viewer" tool.

    Returns:
        One `ProfiledStep` per step marker, in time order.
    """
    threads = {
        event.get("tid"): event.get("args", {}).get("name", "")
        for event in events
        if event.get("ph") == "M" and event.get("name") == "thread_name"
    }
    markers, fetches, ops = [], [], []
    for event in events:
        if event.get("ph") != "X":
            continue
        args = event.get("args", {})
        interval = (float(event["ts"]), float(event["ts"]) + float(event.get("dur", 0.0)))
        # "train 12" once xprof has grouped the step's events, "train" when it could not.
        name = event.get("name", "")
        if "step_num" in args and (name == STEP_MARKER or name.startswith(STEP_MARKER + " ")):
            markers.append((interval, int(args["step_num"])))
        elif event.get("name") in _FETCH_EVENTS:
            fetches.append(interval)
        elif (
            "long_name" in args
            and not str(threads.get(event.get("tid"), "")).startswith("tf_data")
            and not name.startswith(("Iterator::", "IteratorGetNext"))
        ):
            ops.append(interval)
    fetches, ops = _union(fetches), _union(ops)
    steps = []
    for (begin, end), number in sorted(markers):
        waiting = _length(_subtract(_clip(fetches, begin, end), _clip(ops, begin, end)))
        duration = end - begin
        steps.append(
            ProfiledStep(
                step=number,
                step_ms=duration / 1e3,
                input_ms=waiting / 1e3,
                compute_ms=(duration - waiting) / 1e3,
            )
        )
    return steps


def first_steps(events: Sequence[dict], steps: int = TIMELINE_STEPS) -> List[dict]:
    """The events of a trace's first `steps` step markers that the timeline draws.

    Args:
        events: the capture's trace events (`trace_events`).
        steps: how many step markers, from the first.

    Returns:
        Those markers, then the batch fetches and tf.data iterator events that
        overlap them; none without step markers.

    Example:

    >>> def event(name, ts, **args):
    ...     return {"ph": "X", "name": name, "ts": ts, "dur": 10, "args": args}
    >>> trace = [event("train", 0, step_num=0), event("train", 20, step_num=1),
    ...          event("Iterator::Root", 5), event("Iterator::Root", 25), event("MatMul", 6)]
    >>> [(e["name"], e["ts"]) for e in first_steps(trace, steps=1)]
    [('train', 0), ('Iterator::Root', 5)]
    """

    def interval(event):
        begin = float(event.get("ts", 0.0))
        return begin, begin + float(event.get("dur", 0.0))

    timed = [event for event in events if event.get("ph") == "X"]
    markers = sorted(
        (event for event in timed if "step_num" in (event.get("args") or {})), key=interval
    )[:steps]
    if not markers:
        return []
    origin, end = interval(markers[0])[0], interval(markers[-1])[1]
    drawn = []
    for event in timed:
        name = event.get("name", "")
        if "step_num" in (event.get("args") or {}) or not (
            name in _FETCH_EVENTS or name.startswith("Iterator::")
        ):
            continue
        begin, finish = interval(event)
        if begin < end and finish > origin:
            drawn.append(event)
    return markers + drawn


def keep_first_steps(xplane_path: str, events: List[dict]) -> None:
    """Keeps the `first_steps` of a capture converted elsewhere, for `first_steps_trace`.

    Args:
        xplane_path: the capture.
        events: its `first_steps`.
    """
    _KEPT_TRACES[xplane_path] = events
    _KEPT_TRACES.move_to_end(xplane_path)
    while len(_KEPT_TRACES) > _KEEP_TRACES:
        _KEPT_TRACES.popitem(last=False)


def first_steps_trace(xplane_path: str) -> List[dict]:
    """The trace of a capture's first steps, for drawing them.

    Args:
        xplane_path: the capture.

    Returns:
        Its `first_steps`: kept from its conversion in a process of its own
        (`keep_first_steps`), else converted here, which takes seconds.
    """
    kept = _KEPT_TRACES.get(xplane_path)
    return list(kept) if kept is not None else first_steps(trace_events(xplane_path))


# Conversion.


@contextlib.contextmanager
def native_stderr_silenced():
    """Hides what native code writes to standard error (file descriptor 2) meanwhile.

    The TF Profiler logs "Profiler session initializing", "Collecting XSpace
    to repository ..." and the like from C++ on starting and stopping, lines
    that break into Keras' progress bar; `TF_CPP_MIN_LOG_LEVEL` set after
    TensorFlow's import does not reach them. Used only between steps, around
    calls that write nothing the user needs.
    """
    # xprof's C++ logs "No UnifiedProfileProcessor registered for tool:
    # trace_viewer" on every legacy conversion, an error line that is not one;
    # TF_CPP_MIN_LOG_LEVEL does not reach it. During a fit the conversion runs in
    # a process of its own, whose file descriptor 2 is no one else's; the
    # profiler's start and stop run between steps: hiding it hides nothing of
    # training.
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    try:
        with open(os.devnull, "wb") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _tool_json(xplane_path: str, tool: str):
    from xprof.convert import raw_to_tool_data

    # The legacy "trace_viewer" returns the whole trace as JSON and, unlike
    # "trace_viewer@", writes no cache files into the user's run folder.
    # xprof reads local files only: a capture in a remote log dir is read from a copy.
    with files.local_copy(xplane_path) as local_path, native_stderr_silenced():
        data, _ = raw_to_tool_data.xspace_to_tool_data(
            [local_path], tool, {"use_saved_result": False}
        )
    if data is None:
        raise RuntimeError(f"xprof could not convert {xplane_path} with {tool!r}")
    return json.loads(data)


def _analyzer_tables(analysis) -> Tuple[dict, dict]:
    # The analyzer answers a list of gviz DataTables: [1] the steps, [2] the
    # tf.data iterators.
    if not isinstance(analysis, list) or len(analysis) < 3:
        return {}, {}
    return analysis[1] or {}, analysis[2] or {}


def _table_rows(table: dict) -> List[dict]:
    columns = [column.get("id") for column in table.get("cols", [])]
    return [
        {column: cell.get("v") if cell else None for column, cell in zip(columns, row["c"])}
        for row in table.get("rows", [])
    ]


def _analyzer_steps(steps_table: dict) -> List[ProfiledStep]:
    steps = []
    for index, row in enumerate(_table_rows(steps_table)):
        step_ms = float(row.get("stepTimeMs") or 0.0)
        input_ms = float(row.get("infeedTimeMs") or 0.0)
        number = _STEP_NUMBER.search(str(row.get("stepnum", "")))
        steps.append(
            ProfiledStep(
                step=int(number.group(1)) if number else index,
                step_ms=step_ms,
                input_ms=input_ms,
                compute_ms=max(step_ms - input_ms, 0.0),
            )
        )
    return steps


def _input_fraction(steps: Sequence[ProfiledStep]) -> Optional[float]:
    total = sum(step.step_ms for step in steps)
    if not steps or total <= 0:
        return None
    return sum(step.input_ms for step in steps) / total


def _iterator_ops(events: Sequence[dict]) -> Dict[str, str]:
    ops = {}
    for event in events:
        name = event.get("name", "")
        if event.get("ph") != "X" or not name.startswith("Iterator::"):
            continue
        args = event.get("args", {})
        long_name = args.get("long_name", name)
        if "name" in args and long_name not in ops:
            ops[long_name] = args["name"]
    return ops


def _stage_op(name: str, kind: str, iterator_ops: Dict[str, str]) -> Optional[str]:
    # from_generator runs its generator inside a flat_map of its own making: the
    # generator's op lives in that function, the user's stage is the flat_map.
    if kind == "Generator":
        parent = name.rsplit("::", 1)[0]
        parent = parent[: parent.rindex("[")] if parent.endswith("]") else parent
        if stage_names.iterator_kind(parent) == "FlatMap" and parent in iterator_ops:
            return iterator_ops[parent]
    return iterator_ops.get(name)


def _enclosing_stage(name: str, iterator_ops: Dict[str, str], stages):
    # A dataset built inside a user function (the `TFRecordDataset(f).map(...)`
    # an interleave opens per file) is no stage of the pipeline's graph: its
    # work is the enclosing stage's, as the user wrote it.
    parts = name.split("::")
    for end in range(len(parts) - 1, 1, -1):
        parent = "::".join(parts[:end])
        kind = stage_names.iterator_kind(parent)
        if kind == "Root":
            return None
        unindexed = parent[: parent.rindex("[")] if parent.endswith("]") else parent
        for candidate in dict.fromkeys((parent, unindexed)):
            stage = stage_names.stage_of(_stage_op(candidate, kind, iterator_ops), stages)
            if stage is not None and stage.function is not None:
                return stage
    return None


def _is_waiting(name: str, kind: str, self_ms: Dict[str, float]) -> bool:
    if not stage_names.is_asynchronous(kind):
        return False
    if not stage_names.runs_user_function(kind):
        return True
    # A parallel map or interleave waits on its function (its own work) and on
    # its input (the descendants' work); the descendants tell which it was.
    # Inputs of an interleave are indexed: "...::ParallelInterleaveV4[0]::Generator".
    descendants = sum(
        ms for other, ms in self_ms.items() if other.startswith((name + "::", name + "["))
    )
    return self_ms[name] <= _WAITING_SLACK * descendants


# Interval arithmetic on sorted, disjoint (begin, end) lists.


def _union(intervals):
    merged = []
    for begin, end in sorted(intervals):
        if merged and begin <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([begin, end])
    return [tuple(interval) for interval in merged]


def _clip(intervals, begin, end):
    return [(max(a, begin), min(b, end)) for a, b in intervals if b > begin and a < end]


def _subtract(intervals, holes):
    remaining = []
    for begin, end in intervals:
        cursor = begin
        for hole_begin, hole_end in holes:
            if hole_end <= cursor or hole_begin >= end:
                continue
            if hole_begin > cursor:
                remaining.append((cursor, hole_begin))
            cursor = max(cursor, hole_end)
        if cursor < end:
            remaining.append((cursor, end))
    return remaining


def _length(intervals) -> float:
    return sum(end - begin for begin, end in intervals)
