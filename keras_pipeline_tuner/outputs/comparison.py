"""Two runs' reports side by side: step time, input wait, compute, and whether they differ.

Each run is compared by its figures (`Report.figures`): the steps of its steady
state, those its verdict's input share is of (each epoch's first steps left
out, and the first epoch once later ones decide: it may fill a cache or warm
up), with its own input share and verdict. A difference between two runs
means something only when it is larger than how much steps vary within each
run. The spread of a timing here is its interquartile range (p75 minus p25,
over the steps compared): a difference of medians beyond the larger of the two
runs' spreads is called out as real. Quartiles, not the p90: on a busy machine
a few steps stall for tens of milliseconds, which moves a p90 of a few dozen
steps but not the middle half of them. A report written before the quartiles
were kept is spread by its p90 minus its median.
"""

import dataclasses
from typing import List
from typing import Optional

from keras_pipeline_tuner.outputs.report import Report
from keras_pipeline_tuner.outputs.report import figures_of
from keras_pipeline_tuner.timing.step_stats import Distribution
from keras_pipeline_tuner.timing.step_stats import format_ms


@dataclasses.dataclass
class TimingComparison:
    """One timing of two runs, compared.

    Attributes:
        name: "step", "input wait" or "compute".
        mean_a_ms: mean of run A.
        mean_b_ms: mean of run B.
        ratio: `median_b_ms / median_a_ms` (below 1: B is faster), the ratio of
            the figures every output shows (medians); `None` when either is
            missing or A's is zero.
        median_difference_ms: median of B minus median of A.
        spread_ms: the larger of the two runs' interquartile ranges.
        beyond_spread: whether the medians differ by more than `spread_ms`;
            `None` when a figure is missing.
    """

    name: str
    mean_a_ms: Optional[float]
    mean_b_ms: Optional[float]
    ratio: Optional[float]
    median_difference_ms: Optional[float]
    spread_ms: Optional[float]
    beyond_spread: Optional[bool]
    median_a_ms: Optional[float] = None
    median_b_ms: Optional[float] = None


@dataclasses.dataclass
class RunComparison:
    """Two runs compared.

    Attributes:
        timings: `TimingComparison` of step, input wait and compute.
        input_fraction_a: run A's share of step time waiting for input.
        input_fraction_b: run B's.
        verdict_a: run A's verdict.
        verdict_b: run B's verdict.
        scope_a: which of run A's steps were compared, e.g. "steady state:
            epochs 2-3, the first 2 steps of each epoch left out".
        scope_b: which of run B's.
    """

    timings: List[TimingComparison]
    input_fraction_a: Optional[float]
    input_fraction_b: Optional[float]
    verdict_a: str
    verdict_b: str
    scope_a: str = "all steps"
    scope_b: str = "all steps"


def compare_reports(a: Report, b: Report) -> RunComparison:
    """Compares the training steps of two reports.

    Args:
        a: the first run's `Report` (the baseline).
        b: the second run's `Report`.

    Returns:
        A `RunComparison`.

    Example:

    >>> from keras_pipeline_tuner.timing.step_stats import StepStats
    >>> slow = Report(train=StepStats.from_arrays(np.full(10, 0.03), np.full(10, 0.01)))
    >>> fast = Report(train=StepStats.from_arrays(np.full(10, 0.001), np.full(10, 0.01)))
    >>> step = compare_reports(slow, fast).timings[0]
    >>> round(step.ratio, 3), step.beyond_spread
    (0.275, True)
    """
    figures_a, figures_b = figures_of(a), figures_of(b)
    timings = [
        _compare(name, getattr(figures_a, field), getattr(figures_b, field))
        for name, field in (("step", "step"), ("input wait", "wait"), ("compute", "compute"))
    ]
    return RunComparison(
        timings=timings,
        input_fraction_a=figures_a.input_fraction,
        input_fraction_b=figures_b.input_fraction,
        verdict_a=figures_a.verdict.value,
        verdict_b=figures_b.verdict.value,
        scope_a=figures_a.scope,
        scope_b=figures_b.scope,
    )


def format_comparison(comparison: RunComparison, name_a: str, name_b: str) -> str:
    """The comparison as a plain-text table, one timing a line.

    Args:
        comparison: the `RunComparison`.
        name_a: how to call run A.
        name_b: how to call run B.

    Returns:
        The table, ending with a newline.

    Example:

    >>> from keras_pipeline_tuner.timing.step_stats import StepStats
    >>> slow = Report(train=StepStats.from_arrays(np.full(10, 0.03), np.full(10, 0.01)))
    >>> text = format_comparison(compare_reports(slow, slow), "monday", "tuesday")
    >>> print(text.splitlines()[4])
    step            40.00 ms    40.00 ms    1.00x  +0.00 ms           0.00 ms  no
    """
    header = ("", "A (median)", "B (median)", "B/A", "medians differ by", "spread", "beyond spread")
    lines = [header]
    for timing in comparison.timings:
        beyond = {None: "-", True: "yes", False: "no"}[timing.beyond_spread]
        lines.append(
            (
                timing.name,
                _ms(timing.median_a_ms),
                _ms(timing.median_b_ms),
                "-" if timing.ratio is None else f"{timing.ratio:.2f}x",
                _ms(timing.median_difference_ms, signed=True),
                _ms(timing.spread_ms),
                beyond,
            )
        )
    lines.append(
        (
            "input share",
            _percent(comparison.input_fraction_a),
            _percent(comparison.input_fraction_b),
            "",
            "",
            "",
            "",
        )
    )
    lines.append(("verdict", comparison.verdict_a, comparison.verdict_b, "", "", "", ""))
    lines.append(("steps compared", comparison.scope_a, comparison.scope_b, "", "", "", ""))
    widths = [max(len(line[column]) for line in lines) for column in range(len(header))]
    text = [f"A: {name_a}", f"B: {name_b}", ""]
    for line in lines:
        text.append("  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip())
    text += [
        "",
        "Steps compared: each run's steady state, the steps its verdict's input share is "
        "of (each epoch's first steps left out, and the first epoch once later ones "
        "decide: it may fill a cache). The input share and verdict are the runs' own. "
        "Spread: the interquartile range (p75 minus p25) of each run's steps, "
        "the larger of the two; a difference of medians beyond it is more than "
        "step-to-step noise.",
    ]
    return "\n".join(text) + "\n"


def _compare(name: str, a: Distribution, b: Distribution) -> TimingComparison:
    ratio = None
    if a.median_ms and b.median_ms is not None:
        ratio = b.median_ms / a.median_ms
    difference = spread = beyond = None
    spreads = (_spread(a), _spread(b))
    if None not in (a.median_ms, b.median_ms, *spreads):
        difference = b.median_ms - a.median_ms
        spread = max(spreads)
        beyond = abs(difference) > spread
    return TimingComparison(
        name, a.mean_ms, b.mean_ms, ratio, difference, spread, beyond, a.median_ms, b.median_ms
    )


def _spread(timing: Distribution) -> Optional[float]:
    """Interquartile range; p90 minus median for a report without quartiles."""
    if timing.p25_ms is not None and timing.p75_ms is not None:
        return timing.p75_ms - timing.p25_ms
    if timing.median_ms is None or timing.p90_ms is None:
        return None
    return timing.p90_ms - timing.median_ms


def _ms(value: Optional[float], signed: bool = False) -> str:
    if value is None:
        return "-"
    return (f"{value:+.2f}" if signed else format_ms(value)) + " ms"


def _percent(value: Optional[float]) -> str:
    return "-" if value is None else f"{value * 100:.1f} %"
