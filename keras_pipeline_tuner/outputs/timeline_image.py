"""The timeline image: when each step waited for input and when it computed.

Drawn like the timeline plots of the tf.data performance guide: time runs left
to right, each row is one activity, and a bar marks when it ran. The first panel
holds the step clock's latest training steps (input wait and compute, one bar
each per step, so gaps between bars are time spent outside the step). With a
profiler window a second panel shows its first steps from the capture, one row
per tf.data stage, so the stage that keeps the step waiting is seen working
while the step waits.

Figures are drawn with matplotlib's Agg canvas on `Figure` objects, never through
pyplot, so no global figure state is touched and no display is needed.
"""

import dataclasses
import io
import logging
import threading
from typing import Dict
from typing import List
from typing import Optional
from typing import Sequence
from typing import Tuple

import numpy as np

WAIT_COLOUR = "#d62728"
COMPUTE_COLOUR = "#1f77b4"
STAGE_COLOUR = "#2ca02c"
MARKER_COLOUR = "#7f7f7f"
# Enough steps to see a pattern, few enough that each bar stays visible.
DEFAULT_MAX_STEPS = 48
MAX_PROFILED_STEPS = 8
MAX_STAGE_ROWS = 6
_MIN_BAR_FRACTION = 0.002
_FETCH_EVENTS = ("IteratorGetNextOp::DoCompute", "IteratorGetNextAsOptionalOp::DoCompute")
# The figure's width, and the room its text takes (inches).
_WIDTH_IN = 10.0
_LABEL_IN_PER_CHAR = 0.075
_TITLE_IN = 0.35
_AXIS_IN = 0.55
_preloading = threading.Lock()
_preloaded = False


def preload() -> None:
    """Imports matplotlib in a background thread, once per process.

    Its import (the font list, the Agg canvas) takes most of the first image's
    time, about 0.8 s here against 0.1 s for each later image: loaded while the
    first epoch trains, it is not paid on the training thread at that epoch's
    end. The thread holds Python's GIL while it imports, as any Python work
    would; the compiled steps run meanwhile. Safe to call often.

    Example:

    >>> preload()
    """
    global _preloaded
    with _preloading:
        if _preloaded:
            return
        _preloaded = True
    threading.Thread(target=_import_matplotlib, name="kpt-matplotlib", daemon=True).start()


def _import_matplotlib() -> None:
    try:
        from matplotlib import figure  # noqa: F401
        from matplotlib.backends import backend_agg  # noqa: F401
    except Exception:  # noqa: BLE001 - the image's own draw reports a missing matplotlib.
        logging.getLogger("keras_pipeline_tuner").debug("matplotlib did not preload", exc_info=True)


@dataclasses.dataclass
class TimelineRow:
    """One row of the timeline: a label and when that activity ran.

    Attributes:
        label: what ran, e.g. "input wait" or "map(load_image)".
        spans_ms: (start, duration) pairs in milliseconds, on the panel's time axis.
        colour: the bars' colour.
    """

    label: str
    spans_ms: List[Tuple[float, float]]
    colour: str = STAGE_COLOUR


def step_rows(
    steps: Dict[str, np.ndarray], max_steps: int = DEFAULT_MAX_STEPS
) -> List[TimelineRow]:
    """Rows for the latest steps of the step clock: input wait, then compute.

    Args:
        steps: per-step arrays as `StepClock.steps()` returns them ("start",
            "wait", "compute" in seconds).
        max_steps: how many of the latest steps to show.

    Returns:
        Two `TimelineRow`s in milliseconds from the first shown step's start; no
        row when there are no steps.

    Example:

    >>> rows = step_rows({"start": np.array([0.0, 0.1]), "wait": np.array([0.08, 0.08]),
    ...                   "compute": np.array([0.02, 0.02])})
    >>> [row.label for row in rows], rows[1].spans_ms[0]
    (['input wait', 'compute'], (80.0, 20.0))
    """
    start = np.asarray(steps.get("start", ()), dtype=np.float64)[-max_steps:]
    if start.size == 0:
        return []
    wait = np.nan_to_num(np.asarray(steps["wait"], dtype=np.float64)[-max_steps:])
    compute = np.asarray(steps["compute"], dtype=np.float64)[-max_steps:]
    origin = start[0]
    begin_ms = (start - origin) * 1e3
    wait_ms, compute_ms = wait * 1e3, compute * 1e3
    return [
        TimelineRow("input wait", _spans(begin_ms, wait_ms), WAIT_COLOUR),
        TimelineRow("compute", _spans(begin_ms + wait_ms, compute_ms), COMPUTE_COLOUR),
    ]


def profile_rows(
    events: Sequence[dict],
    stages: Dict[str, str],
    max_steps: int = MAX_PROFILED_STEPS,
    max_stages: int = MAX_STAGE_ROWS,
    within: Optional[Tuple[int, int]] = None,
) -> List[TimelineRow]:
    """Rows for the first steps of a profiler window, from its Chrome trace.

    Args:
        events: the capture's trace events (xprof's "trace_viewer" tool; times
            in microseconds).
        stages: profiler iterator name to stage label (e.g.
            "Iterator::Root::MapAndBatch" to "map(load_image)"), most important
            first; iterators not in it are not drawn.
        max_steps: how many step markers to cover.
        max_stages: at most this many stage rows.
        within: the first and last step the window's figures are of
            (`WindowFigures`): markers of other steps (a partial first step
            the analyzer left out) are not drawn.

    Returns:
        `TimelineRow`s in milliseconds from the first step marker: the steps,
        the batch fetches, then one row per stage. No row without step markers.
    """
    markers, fetches = [], []
    by_stage: Dict[str, List[Tuple[float, float]]] = {}
    wanted = dict(list(stages.items())[:max_stages])
    for event in events:
        if event.get("ph") != "X":
            continue
        args = event.get("args") or {}
        span = (float(event.get("ts", 0.0)), float(event.get("dur", 0.0)))
        name = event.get("name", "")
        if "step_num" in args:
            if within is None or within[0] <= _step_number(args["step_num"]) <= within[1]:
                markers.append(span)
        elif name in _FETCH_EVENTS:
            fetches.append(span)
        elif name.startswith("Iterator::"):
            # The root iterator's event carries no long name.
            label = wanted.get(args.get("long_name", name))
            if label is not None:
                by_stage.setdefault(label, []).append(span)
    if not markers:
        return []
    markers.sort()
    shown = markers[:max_steps]
    origin, end = shown[0][0], shown[-1][0] + shown[-1][1]

    def clipped(spans):
        return [
            ((begin - origin) / 1e3, duration / 1e3)
            for begin, duration in sorted(spans)
            if begin < end and begin + duration > origin
        ]

    rows = [
        TimelineRow("train step", clipped(shown), MARKER_COLOUR),
        TimelineRow("get_next", clipped(fetches), WAIT_COLOUR),
    ]
    rows += [
        TimelineRow(label, clipped(by_stage[label]), STAGE_COLOUR)
        for label in dict.fromkeys(wanted.values())
        if label in by_stage
    ]
    return rows


def timeline_png(
    steps: Sequence[TimelineRow],
    title: str = "",
    profiled: Sequence[TimelineRow] = (),
    profile_title: str = "",
) -> bytes:
    """Draws the timeline as a PNG image.

    Args:
        steps: rows of the step clock panel (`step_rows`).
        title: the panel's title.
        profiled: rows of the profiler panel (`profile_rows`); none omits it.
        profile_title: that panel's title.

    Returns:
        The PNG file's bytes.

    Example:

    ```python
    png = timeline_png(step_rows(tuner.clock.steps("train")), "last steps")
    open("timeline.png", "wb").write(png)
    ```
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    panels = [
        (rows, heading)
        for rows, heading in ((steps, title), (profiled, profile_title))
        if rows
    ]
    heights = [max(len(rows), 1) * 0.45 + 0.9 for rows, _ in panels] or [1.5]
    figure = Figure(figsize=(_WIDTH_IN, sum(heights)), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.subplots(len(panels) or 1, 1, squeeze=False, height_ratios=heights)[:, 0]
    # Fixed margins, from the labels' lengths: a layout engine would draw the
    # figure twice (half of the image's time).
    labels = [row.label for rows, _ in panels for row in rows]
    total_in = sum(heights)
    figure.subplots_adjust(
        left=min(0.4, (0.35 + _LABEL_IN_PER_CHAR * max(map(len, labels), default=0)) / _WIDTH_IN),
        right=0.98,
        top=1 - _TITLE_IN / total_in,
        bottom=_AXIS_IN / total_in,
        hspace=(_TITLE_IN + _AXIS_IN) / (total_in / max(len(panels), 1) - _TITLE_IN - _AXIS_IN),
    )
    if not panels:
        axes[0].text(0.5, 0.5, "No steps measured yet.", ha="center", va="center")
        axes[0].set_axis_off()
    for ax, (rows, heading) in zip(axes, panels):
        _draw(ax, rows, heading)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


def _draw(ax, rows: Sequence[TimelineRow], heading: str) -> None:
    count = len(rows)
    extent = max((b + d for row in rows for b, d in row.spans_ms), default=1.0)
    # A sub-millisecond compute next to long waits would fall between pixels.
    visible = extent * _MIN_BAR_FRACTION
    for index, row in enumerate(rows):
        # First row on top, as in the tf.data guide.
        y = count - 1 - index
        if row.spans_ms:
            spans = [(begin, max(duration, visible)) for begin, duration in row.spans_ms]
            ax.broken_barh(spans, (y - 0.35, 0.7), facecolors=row.colour, linewidth=0)
    ax.set_yticks(range(count), [row.label for row in reversed(rows)])
    ax.set_ylim(-0.6, count - 0.4)
    ax.set_xlabel("wall time (ms)")
    ax.set_title(heading, loc="left", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    ax.set_xlim(left=0)


def _step_number(value) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return -1


def _spans(begin_ms: np.ndarray, duration_ms: np.ndarray) -> List[Tuple[float, float]]:
    return [(float(b), float(d)) for b, d in zip(begin_ms, duration_ms) if d > 0]
