"""The short summary printed at the end of fit and by `keras-pipeline-tuner report`."""

import dataclasses
import enum
import logging
import re
from typing import IO
from typing import Any
from typing import Optional

from rich.console import Console
from rich.padding import Padding
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from keras_pipeline_tuner.advice.recommendation import Recommendation
from keras_pipeline_tuner.advice.recommendation import describe_gain
from keras_pipeline_tuner.outputs.log_dir_runs import describe_runs
from keras_pipeline_tuner.outputs.report import PROFILE_PENDING
from keras_pipeline_tuner.outputs.report import Report
from keras_pipeline_tuner.outputs.report import figures_of
from keras_pipeline_tuner.profiling.evidence import GRAIN
from keras_pipeline_tuner.timing.step_stats import Verdict
from keras_pipeline_tuner.timing.step_stats import format_ms
from keras_pipeline_tuner.workers.exchange import WORKER_COLUMNS
from keras_pipeline_tuner.workers.exchange import worker_rows

logger = logging.getLogger("keras_pipeline_tuner")

_VERDICT_STYLE = {
    Verdict.HIGHLY_INPUT_BOUND: "bold red",
    Verdict.MODERATELY_INPUT_BOUND: "bold yellow",
    Verdict.NOT_INPUT_BOUND: "bold green",
    Verdict.UNKNOWN: "bold",
}
# The share of the median step the user's Python must take a batch to be named.
PYTHON_SHARE = 0.2
_SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": ""}
# Control characters other than tab and newline: escape sequences in a report
# read from disk would restyle, retitle or clear the user's terminal.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def verdict_line(report: Report) -> str:
    """The one-line verdict, e.g. "highly input-bound: 97.6 % of step time waits for input".

    The report's figures' line (`Figures.line`): the verdict, what decided it,
    and the profiler window's figure as evidence.

    Args:
        report: the `Report`.

    Returns:
        The line, without markup.
    """
    return figures_of(report).line


def announce(line: str, verbose: int) -> None:
    """Says one line before the tuner's own work that may take over a second.

    Logged at INFO, and printed (`print_line`) when the tuner is verbose.

    Args:
        line: what the work is, e.g. "converting the profile (xprof) ...".
        verbose: the tuner's `verbose`.
    """
    logger.info("keras-pipeline-tuner: %s", line)
    if verbose:
        print_line(f"keras-pipeline-tuner: {line}")


def print_line(line: str, file: Optional[IO[str]] = None) -> None:
    """Prints one line of the tuner's between Keras' progress-bar updates.

    On a terminal the progress bar redraws its line in place; the line is put on
    a line of its own so that the bar carries on below it.

    Args:
        line: the text (shown literally, no markup).
        file: where to write; standard output by default.
    """
    console = Console(file=file, highlight=False, soft_wrap=True)
    if console.is_terminal:
        console.file.write("\n")
    console.print(Text(_CONTROL.sub("", line)))


def print_summary(
    report: Report, file: Optional[IO[str]] = None, details: bool = False
) -> None:
    """Prints the verdict and the step timings as a few lines and a small table.

    Args:
        report: the `Report` to show.
        file: where to write; standard output by default. Colour is used only
            when it is a terminal.
        details: show every recommendation with its reason, code and
            evidence, instead of the top three in one line each.

    Example:

    ```python
    print_summary(tuner.report)
    ```
    """
    console = Console(file=file, highlight=False, soft_wrap=True)
    report = visible(report)
    figures = figures_of(report)
    console.print(
        Text.assemble(
            ("Input pipeline: ", "bold"),
            (figures.line, _VERDICT_STYLE[figures.verdict]),
        )
    )
    table = Table(box=None, pad_edge=False, show_edge=False)
    table.add_column("steps (medians)", justify="left")
    for column in ("count", "input wait ms", "compute ms", "step ms"):
        table.add_column(column, justify="right")
    if figures.steps:
        table.add_row(
            "train",
            str(figures.steps),
            format_ms(figures.wait_ms),
            format_ms(figures.compute_ms),
            format_ms(figures.step_ms),
        )
    validation = report.validation
    if validation is not None and validation.steps:
        table.add_row(
            "validation",
            str(validation.steps),
            format_ms(validation.input_wait.median_ms),
            format_ms(validation.compute.median_ms),
            format_ms(validation.step.median_ms),
        )
    console.print(table)
    _print_step_notes(report, figures, console)
    if report.tuner_cost is not None:
        console.print(Text(report.tuner_cost.summary()))
    limits = report.cpu.limits() if report.cpu is not None else None
    if limits is not None:
        console.print(Text(limits))
    if report.workers is not None:
        _print_workers(report.workers, console)
    if report.profile is not None:
        # Text, not markup: stage names may hold brackets.
        console.print(Text(_profile_line(report, figures)))
    elif report.profile_pending:
        console.print(Text(PROFILE_PENDING))
    stages = stage_table_line(report)
    if stages is not None:
        console.print(Text(stages))
        if figures.capacity is not None:
            console.print(Text(figures.capacity.line()))
    python = user_calls_line(report)
    if python is not None:
        console.print(Text(python))
    if figures.fixes_line:
        console.print(Text(figures.fixes_line))
    if details:
        _print_recommendations(report, console)
    else:
        for rank, recommendation in enumerate(report.recommendations[:3], 1):
            console.print(recommendation_line(rank, recommendation))
    for note in report.notes:
        console.print(Text(f"Note: {note}", style="dim"))
    runs = describe_runs(report.runs, report.run)
    if details and runs is not None:
        console.print(Text(runs))


def _profile_line(report: Report, figures) -> str:
    """The window's stage line, under the range the figures give (its share is in the verdict)."""
    profile = report.profile
    if figures.window is not None:
        return f"Profiler window, {figures.window.span}: {profile.summary()}"
    if profile.source == GRAIN:
        return f"Grain stage timing, {profile.span()}: {profile.summary()}"
    return f"Profiler window: {profile.summary()}"


def stage_table_line(report: Report) -> Optional[str]:
    """The costliest tf.data stages from tf.data's live model, in one line, or `None`.

    Args:
        report: the `Report`.

    Returns:
        e.g. "tf.data stages (live model, measured over 128 batches):
        map(decode) 0.19 ms/element, 99 %, parallelism 2 of 2; final prefetch
        100 % full mid-pass."
    """
    table = report.stage_table
    if table is None or not table.rows:
        return None
    line = f"tf.data stages (live model, measured over {table.batches} batches): {table.line()}"
    if table.prefetch_fullness is not None:
        line += f"; final prefetch {table.prefetch_fullness * 100:.0f} % full mid-pass"
    return line + "."


def user_calls_line(report: Report) -> Optional[str]:
    """One line on the user's Python that took a large share of the step, or `None`.

    The function timed during training with the most wall time per training
    batch, when that is at least `PYTHON_SHARE` of the median training step.

    Args:
        report: the `Report`.

    Returns:
        The line, without markup, or `None`.
    """
    step = figures_of(report).step_ms
    timed = [t for t in report.user_calls if t.per_batch_ms is not None]
    if not step or not timed:
        return None
    top = max(timed, key=lambda timing: timing.per_batch_ms)
    if top.per_batch_ms < PYTHON_SHARE * step:
        return None
    return (
        f"Your Python, timed during training: {top.function} in {top.stage} took "
        f"{top.per_batch_ms:.1f} ms a batch ({top.per_batch_calls:.1f} calls of "
        f"{top.wall_ms:.1f} ms), against a median step of {step:.1f} ms."
    )


def visible(value: Any) -> Any:
    """A copy of `value` whose strings show control characters as escapes.

    Args:
        value: a `Report`, or any part of one.

    Returns:
        The same structure, with e.g. ESC shown as the four characters `\\x1b`.
    """
    if isinstance(value, enum.Enum):  # before str: Verdict is a str enum
        return value
    if isinstance(value, str):
        return _CONTROL.sub(lambda match: match.group().encode("unicode_escape").decode(), value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {
            field.name: visible(getattr(value, field.name))
            for field in dataclasses.fields(value)
            if field.init
        }
        return dataclasses.replace(value, **changes)
    if isinstance(value, list):
        return [visible(item) for item in value]
    if isinstance(value, dict):
        return {visible(key): visible(item) for key, item in value.items()}
    return value


def _print_step_notes(report: Report, figures, console: Console) -> None:
    """The lines under the table: the steps, what is left out, Keras' figure, input free."""
    console.print(
        Text(
            f"The step is the {figures.scope.split(':')[0]}'s median ({figures.scope}); the "
            "input share is the verdict's, of the same steps."
            if figures.scope != "all steps"
            else "The step is the median of all training steps (the first apart)."
        )
    )
    for cost in figures.one_off:
        console.print(Text(cost))
    if figures.setup_ms is not None:
        console.print(
            Text(
                f"Set-up before each epoch's first step (a new iterator): "
                f"{figures.setup_ms:.1f} ms on average, in no step."
            )
        )
    if report.train.host_gap.median_ms:
        console.print(
            f"Between steps (the loop's own work): {report.train.host_gap.median_ms:.2f} ms."
        )
    first = report.first_steps.get("train")
    if first is not None:
        tracing = (
            "tracing not measured apart"
            if first.tracing_ms is None
            else f"tracing {first.tracing_ms:.0f} ms"
        )
        console.print(f"First step {first.wall_ms:.0f} ms ({tracing}), reported apart.")
    if figures.keras_line:
        console.print(Text(figures.keras_line))
    free = figures.input_free
    if free is not None and free.step_ms_after is not None:
        console.print(
            Text(
                f"With input free: a step of about {free.step_ms_after:.2f} ms, "
                f"{describe_gain(free)}: the ceiling of any change to the input pipeline."
            )
        )


def recommendation_line(rank: int, recommendation: Recommendation) -> Text:
    """One recommendation in one line: rank, title and expected gain.

    Args:
        rank: its place in the report, from 1.
        recommendation: the `Recommendation`.

    Returns:
        The line as rich `Text`.
    """
    return Text.assemble(
        f"{rank}. ",
        (recommendation.title, _SEVERITY_STYLE.get(recommendation.severity, "")),
        (f"  [{describe_gain(recommendation.expected_gain)}]", "dim"),
    )


def _print_recommendations(report: Report, console: Console) -> None:
    console.print()
    console.print(Text("Recommendations", style="bold"))
    if not report.recommendations:
        console.print("None: no evidence points at a change.")
    for rank, recommendation in enumerate(report.recommendations, 1):
        console.print(recommendation_line(rank, recommendation))
        body = Table.grid(padding=(0, 1))
        body.add_column(style="dim", no_wrap=True)
        body.add_column()
        if recommendation.reason:
            body.add_row("why", Text(recommendation.reason))
        if recommendation.fix:
            body.add_row(
                "fix", Syntax(recommendation.fix, "python", theme="ansi_dark", word_wrap=True)
            )
        gain = recommendation.expected_gain
        if gain is not None and gain.statement:
            body.add_row("gain", Text(gain.statement))
        for item in recommendation.evidence:
            # Text, not markup: stage names and reasons may hold brackets.
            body.add_row("evidence", Text(f"{item.source}: {item.detail}"))
        console.print(Padding(body, (0, 0, 1, 3)))


def _print_workers(view, console: Console) -> None:
    if view.task != view.chief:
        console.print(f"This is {view.task}; the chief ({view.chief}) compares the workers.")
        return
    table = Table(box=None, pad_edge=False, show_edge=False)
    for index, column in enumerate(WORKER_COLUMNS):
        numeric = 2 <= index < len(WORKER_COLUMNS) - 1
        table.add_column(column, justify="right" if numeric else "left")
    for row in worker_rows(view):
        table.add_row(*row)
    console.print(table)
    # Text, not markup: the reason quotes task names.
    console.print(Text("Means per step. " + view.straggler_reason))
