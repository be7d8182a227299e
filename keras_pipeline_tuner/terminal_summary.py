"""The short summary printed at the end of fit and by `keras-pipeline-tuner report`."""

from typing import IO, Optional

from rich.console import Console
from rich.table import Table
from rich.text import Text

from keras_pipeline_tuner.report import Report
from keras_pipeline_tuner.step_stats import Distribution
from keras_pipeline_tuner.step_stats import Verdict

_VERDICT_STYLE = {
    Verdict.HIGHLY_INPUT_BOUND: "bold red",
    Verdict.MODERATELY_INPUT_BOUND: "bold yellow",
    Verdict.NOT_INPUT_BOUND: "bold green",
    Verdict.UNKNOWN: "bold",
}


def verdict_line(report: Report) -> str:
    """The one-line verdict, e.g. "highly input-bound: 97.6 % of step time waits for input".

    Args:
        report: the `Report`.

    Returns:
        The line, without markup.
    """
    if report.input_fraction is None:
        return f"{report.verdict.value}: input wait could not be measured"
    return (
        f"{report.verdict.value}: {report.input_fraction * 100:.1f} % of step time "
        "waits for input"
    )


def print_summary(report: Report, file: Optional[IO[str]] = None) -> None:
    """Prints the verdict and the step timings as a few lines and a small table.

    Args:
        report: the `Report` to show.
        file: where to write; standard output by default. Colour is used only
            when it is a terminal.

    Example:

    ```python
    print_summary(tuner.report)
    ```
    """
    console = Console(file=file, highlight=False, soft_wrap=True)
    console.print(
        Text.assemble(
            ("Input pipeline: ", "bold"),
            (verdict_line(report), _VERDICT_STYLE[report.verdict]),
        )
    )
    table = Table(box=None, pad_edge=False, show_edge=False)
    table.add_column("steps", justify="left")
    for column in ("count", "input wait ms", "compute ms", "step ms", "input %"):
        table.add_column(column, justify="right")
    for name, stats in (("train", report.train), ("validation", report.validation)):
        if stats is None or not stats.steps:
            continue
        table.add_row(
            name,
            str(stats.steps),
            _median(stats.input_wait),
            _median(stats.compute),
            _median(stats.step),
            "-" if stats.input_fraction is None else f"{stats.input_fraction * 100:.1f}",
        )
    console.print(table)
    first = report.first_steps.get("train")
    if first is not None:
        console.print(
            f"First step {first.wall_ms:.0f} ms (tracing {first.tracing_ms or 0:.0f} ms), "
            "reported apart. Medians shown; per-epoch figures in the report."
        )
    for recommendation in report.recommendations[:3]:
        console.print(f"- {getattr(recommendation, 'title', recommendation)}")
    for note in report.notes:
        console.print(f"Note: {note}", style="dim")


def _median(distribution: Distribution) -> str:
    if distribution.median_ms is None:
        return "-"
    return f"{distribution.median_ms:.2f}"
