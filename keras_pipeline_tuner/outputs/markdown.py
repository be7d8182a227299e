"""The report as markdown, for TensorBoard's Text tab.

TensorBoard renders text summaries as markdown with tables and fenced code
blocks, and lets some HTML through (e.g. images that load a URL); user-provided
text (stage names, notes, anything read back from a report file) is escaped so
that it shows as typed: an underscore in a function name does not turn the rest
of a line into italics, and `<img src=...>` is text, not an image.
"""

import html
import re
from typing import List
from typing import Optional

from keras_pipeline_tuner.advice.recommendation import Recommendation
from keras_pipeline_tuner.advice.recommendation import describe_gain
from keras_pipeline_tuner.outputs.report import PROFILE_PENDING
from keras_pipeline_tuner.outputs.report import Report
from keras_pipeline_tuner.outputs.report import figures_of
from keras_pipeline_tuner.profiling.evidence import GRAIN
from keras_pipeline_tuner.timing.step_stats import format_ms
from keras_pipeline_tuner.workers.exchange import WORKER_COLUMNS
from keras_pipeline_tuner.workers.exchange import worker_rows

_MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]{}|#])")
# Iterators shown in the profile table; the rest hold little time.
_PROFILE_ROWS = 6


def render_markdown(report: Report, heading: Optional[str] = None) -> str:
    """Renders the verdict, the numbers and the recommendations as markdown.

    Args:
        report: the `Report`.
        heading: what the report covers, e.g. "after epoch 3"; shown under the
            verdict.

    Returns:
        The markdown text.

    Example:

    ```python
    tf.summary.text("input_pipeline/report", render_markdown(tuner.report), step=0)
    ```
    """
    figures = figures_of(report)
    lines = [f"## Input pipeline: {figures.verdict.value}", ""]
    if figures.input_fraction is not None:
        lines.append(
            f"**{figures.input_fraction * 100:.1f} %** of steady-state step time is input "
            f"({escape(figures.source or 'step clock')}), over {figures.steps} steps "
            f"({escape(figures.scope)})."
        )
    else:
        lines.append("The input wait could not be separated from compute (see the notes).")
    if heading:
        lines[-1] += f" Report {escape(heading)}."
    if figures.line:
        lines += ["", escape(figures.line)]
        lines += [f"- {escape(cost)}" for cost in figures.one_off]
    lines += [""] + _timings_table(report, figures)
    limits = report.cpu.limits() if report.cpu is not None else None
    if limits is not None:
        lines += ["", escape(limits)]
    if report.workers is not None:
        lines += _workers(report.workers)
    bound = figures.input_free
    if bound is not None and bound.statement:
        lines += ["", f"With input free: {escape(describe_gain(bound))}. {escape(bound.statement)}"]
    if figures.fixes_line:
        lines += ["", escape(figures.fixes_line)]
    lines += ["", "### Recommendations", ""]
    if not report.recommendations:
        lines.append("None: no evidence points at a change.")
    for rank, recommendation in enumerate(report.recommendations, 1):
        lines += _recommendation(rank, recommendation)
    if report.profile is not None:
        lines += _profile(report, figures)
    elif report.profile_pending:
        lines += ["", "### Profiler window", "", escape(PROFILE_PENDING)]
    if report.user_calls:
        lines += _user_calls(report)
    if report.notes:
        lines += ["", "### Notes", ""]
        lines += [f"- {escape(note)}" for note in report.notes]
    return "\n".join(lines) + "\n"


def escape(text: str) -> str:
    """Escapes markdown's special characters and HTML in plain text.

    Args:
        text: text that should show as typed.

    Returns:
        The escaped text.

    Example:

    >>> escape("map(load_image)")
    'map(load\\\\_image)'
    """
    return _MARKDOWN_SPECIAL.sub(r"\\\1", html.escape(text, quote=False))


def _code_span(text: str) -> str:
    # Delimited by more backticks than the text holds, so it cannot close early.
    text = " ".join(text.splitlines())  # a table row is one line
    ticks = "`" * (_longest_backtick_run(text) + 1)
    return f"{ticks} {text} {ticks}" if len(ticks) > 1 else f"`{text}`"


def _fence(code: str) -> str:
    return "`" * max(3, _longest_backtick_run(code) + 1)


def _longest_backtick_run(text: str) -> int:
    return max((len(run) for run in re.findall(r"`+", text)), default=0)


def _timings_table(report: Report, figures) -> List[str]:
    lines = [
        "| steps (medians) | count | input wait ms | compute ms | step ms |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    rows = [("train", figures.steps, figures.wait, figures.compute, figures.step)]
    validation = report.validation
    if validation is not None and validation.steps:
        rows.append(
            ("validation", validation.steps, validation.input_wait, validation.compute,
             validation.step)
        )
    for name, steps, wait, compute, step in rows:
        if not steps:
            continue
        lines.append(
            f"| {name} | {steps} | {format_ms(wait.median_ms)} | "
            f"{format_ms(compute.median_ms)} | {format_ms(step.median_ms)} |"
        )
    note = f"The step is the median of the training steps of the {escape(figures.scope)}."
    if figures.setup_ms is not None:
        note += (
            f" Set-up before each epoch's first step (a new iterator): "
            f"{figures.setup_ms:.1f} ms on average, in no step."
        )
    first = report.first_steps.get("train")
    if first is not None:
        note += (
            f" The first step ({first.wall_ms:.0f} ms, of which tracing "
            f"{first.tracing_ms or 0:.0f} ms) is reported apart."
        )
    lines += ["", note]
    if figures.keras_line:
        lines += ["", escape(figures.keras_line)]
    return lines


def _recommendation(rank: int, recommendation: Recommendation) -> List[str]:
    lines = [
        f"#### {rank}. {escape(recommendation.title)}",
        "",
        f"*{escape(recommendation.severity)}*, "
        f"{escape(describe_gain(recommendation.expected_gain))}",
        "",
    ]
    if recommendation.reason:
        lines += [escape(recommendation.reason), ""]
    if recommendation.fix:
        fence = _fence(recommendation.fix)
        lines += [f"{fence}python", recommendation.fix, fence, ""]
    gain = recommendation.expected_gain
    if gain is not None and gain.statement:
        lines += [f"Expected gain: {escape(gain.statement)}", ""]
    lines.append("Evidence:")
    lines += [
        f"- **{escape(item.source)}**: {escape(item.detail)}" for item in recommendation.evidence
    ]
    return lines + [""]


def _profile(report: Report, figures) -> List[str]:
    profile = report.profile
    grain = profile.source == GRAIN
    title = "Grain stage timing" if grain else "Profiler window"
    span = figures.window.span if figures.window is not None else profile.span()
    lines = ["", f"### {title}: {escape(span)}", ""]
    if grain and profile.conclusion:
        lines += [escape(profile.conclusion), ""]
    elif figures.window is not None and figures.window.input_fraction is not None:
        # Evidence beside the verdict (its line says why the verdict stands).
        lines += [
            f"The window measured {figures.window.input_fraction * 100:.1f} % input over "
            f"{escape(figures.window.span)}.",
            "",
        ]
    if profile.bottleneck:
        lines += [f"Bottleneck stage: {_code_span(profile.bottleneck)}", ""]
    if profile.iterators:
        lines += [
            "| stage | own time ms | share | elements |",
            "| --- | ---: | ---: | ---: |",
        ]
        for iterator in profile.iterators[:_PROFILE_ROWS]:
            waiting = " (waits)" if iterator.waiting else ""
            lines.append(
                f"| {_code_span(iterator.stage)}{waiting} | {iterator.self_ms:.1f} | "
                f"{iterator.self_share * 100:.0f} % | {iterator.calls} |"
            )
        lines.append("")
    if grain:
        lines.append(escape(profile.trigger) + ".")
    else:
        lines.append("The full capture is in TensorBoard's Profile tab.")
    return lines


def _user_calls(report: Report) -> List[str]:
    lines = [
        "",
        "### Your Python, timed during training",
        "",
        "| stage | function | timed | calls | ms per call (mean / median) | CPU ms per call "
        "| threads | calls per batch |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for timing in report.user_calls:
        per_batch = "-" if timing.per_batch_calls is None else f"{timing.per_batch_calls:.2f}"
        if not timing.per_element:
            per_batch = "once per pass"
        lines.append(
            f"| {_code_span(timing.stage)} | {_code_span(timing.function)} | "
            f"{escape(timing.source)} | {timing.calls} | {timing.wall_ms:.2f} / "
            f"{timing.wall_ms_median:.2f} | {timing.cpu_ms:.2f} | {timing.threads} | "
            f"{per_batch} |"
        )
    lines += [
        "",
        "Each call was timed during training, as the fit made it, on the thread that ran "
        "it; nothing was called again to time it.",
    ]
    return lines


def _workers(view) -> List[str]:
    if view.task != view.chief:
        return ["", escape(f"This is {view.task}; the chief ({view.chief}) compares the workers.")]
    lines = [
        "",
        "### Workers",
        "",
        "| " + " | ".join(WORKER_COLUMNS) + " |",
        "| --- | --- |" + " ---: |" * (len(WORKER_COLUMNS) - 3) + " --- |",
    ]
    for row in worker_rows(view):
        lines.append("| " + " | ".join(escape(cell) for cell in row) + " |")
    lines += ["", "Means per step. " + escape(view.straggler_reason)]
    return lines
