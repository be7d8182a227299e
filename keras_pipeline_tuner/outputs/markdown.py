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
    lines = [f"## Input pipeline: {report.verdict.value}", ""]
    if report.input_fraction is not None:
        lines.append(
            f"**{report.input_fraction * 100:.1f} %** of training step time waits for "
            f"input, over {report.train.steps} steps."
        )
    else:
        lines.append("The input wait could not be separated from compute (see the notes).")
    if heading:
        lines[-1] += f" Report {escape(heading)}."
    if report.judgement is not None and report.judgement.line:
        lines += ["", escape(report.judgement.line)]
        lines += [f"- {escape(cost)}" for cost in report.judgement.one_off]
    lines += [""] + _timings_table(report)
    limits = report.cpu.limits() if report.cpu is not None else None
    if limits is not None:
        lines += ["", escape(limits)]
    if report.workers is not None:
        lines += _workers(report.workers)
    bound = report.input_free
    if bound is not None and bound.statement:
        lines += ["", escape(bound.statement)]
    lines += ["", "### Recommendations", ""]
    if not report.recommendations:
        lines.append("None: no evidence points at a change.")
    for rank, recommendation in enumerate(report.recommendations, 1):
        lines += _recommendation(rank, recommendation)
    if report.profile is not None:
        lines += _profile(report)
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


def _timings_table(report: Report) -> List[str]:
    lines = [
        "| steps | count | input wait ms | compute ms | step ms | input % of total |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, stats in (("train", report.train), ("validation", report.validation)):
        if stats is None or not stats.steps:
            continue
        fraction = "-" if stats.input_fraction is None else f"{stats.input_fraction * 100:.1f}"
        lines.append(
            f"| {name} | {stats.steps} | {format_ms(stats.input_wait.median_ms)} | "
            f"{format_ms(stats.compute.median_ms)} | {format_ms(stats.step.median_ms)} | "
            f"{fraction} |"
        )
    note = (
        "The ms columns are medians; input % is the total wait over the total step time "
        "of all steps (the verdict describes the steady state)."
    )
    first = report.first_steps.get("train")
    if first is not None:
        note += (
            f" The first step ({first.wall_ms:.0f} ms, of which tracing "
            f"{first.tracing_ms or 0:.0f} ms) is reported apart."
        )
    return lines + ["", note]


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


def _profile(report: Report) -> List[str]:
    profile = report.profile
    grain = profile.source == GRAIN
    title = "Grain stage timing" if grain else "Profiler window"
    lines = ["", f"### {title}: {escape(profile.span())}", ""]
    if profile.conclusion:
        lines += [escape(profile.conclusion), ""]
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
