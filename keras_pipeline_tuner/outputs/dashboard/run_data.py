"""A run's dashboard data, read back through TensorBoard's data provider.

Runs the tuner wrote with the dashboard's summaries are read from them (see
`summaries`). Runs written before the dashboard existed still have
`report.json` beside the `pipeline_tuner` run and the per-step scalars; those
are the fallback: the report from the file, the steps from the scalars (their
time axis is then the steps' own cumulative time, since the scalars carry when
they were written, not when each step ran).
"""

import dataclasses
import json
import os
import threading
from typing import Any
from typing import Dict
from typing import List
from typing import Optional
from typing import Tuple

import numpy as np
from tensorboard.data import provider

from keras_pipeline_tuner.advice.recommendation import ExpectedGain
from keras_pipeline_tuner.advice.recommendation import describe_gain
from keras_pipeline_tuner.outputs.dashboard import summaries
from keras_pipeline_tuner.outputs.report import REPORT_FILENAME
from keras_pipeline_tuner.outputs.report import Report
from keras_pipeline_tuner.outputs.report import figures_of

SUMMARIES = "summaries"
# Tags of the per-step scalars, which runs written before the dashboard hold.
_SCALAR_PLUGIN = "scalars"
_WAIT_TAG = "input_pipeline/input_wait_ms"
_COMPUTE_TAG = "input_pipeline/compute_ms"
_WHOLE_STEP_TAG = "input_pipeline/step_ms"
# How deep under the log dir to look for report.json files of older runs.
_MAX_DEPTH = 4
EMPTY_ROWS = np.zeros((0, len(summaries.STEP_COLUMNS)))


class UnreadableRun(ValueError):
    """A run's report (file or summary) that is not a report: the reason, in words."""


class RunData:
    """Reads the dashboard's data of the runs in one TensorBoard log dir.

    Args:
        data_provider: TensorBoard's `DataProvider` (the plugin context's).
        logdir: the log dir TensorBoard serves, for `report.json` of older
            runs; empty when TensorBoard reads from elsewhere.

    Example:

    ```python
    data = RunData(context.data_provider, context.logdir)
    data.runs(ctx, experiment_id)            # [{"run": ..., "verdict": ...}]
    data.steps(ctx, experiment_id, "naive/pipeline_tuner")
    ```
    """

    def __init__(self, data_provider, logdir: str = ""):
        self._provider = data_provider
        self._logdir = logdir or ""
        self._lock = threading.Lock()
        # run -> (what the rows were read from, the rows): re-read when it changes.
        self._steps_cache: Dict[str, Tuple[Any, np.ndarray]] = {}

    # Listing.

    def tagged_runs(self, ctx, experiment_id: str) -> Dict[str, Dict[str, Any]]:
        """The runs holding the dashboard's summaries: run to tag to time series."""
        if self._provider is None:
            return {}
        return self._provider.list_tensors(
            ctx, experiment_id=experiment_id, plugin_name=summaries.PLUGIN_NAME
        )

    def report_file_runs(self) -> Dict[str, str]:
        """Runs that have a `report.json` beside them: run name to the file's path."""
        found = {}
        if not self._logdir or not os.path.isdir(self._logdir):
            return found
        root_depth = self._logdir.rstrip(os.sep).count(os.sep)
        of_log_dirs = {}
        for directory, subdirectories, files in os.walk(self._logdir):
            if directory.count(os.sep) - root_depth >= _MAX_DEPTH:
                subdirectories[:] = []
            # Profiler captures hold no report.json.
            subdirectories[:] = [name for name in subdirectories if name != "plugins"]
            if REPORT_FILENAME not in files:
                continue
            relative = os.path.relpath(directory, self._logdir).replace(os.sep, "/")
            path = os.path.join(directory, REPORT_FILENAME)
            if summaries.RUN in relative.split("/"):
                # A run's own report, in its folder.
                found[relative] = path
            else:
                # A log dir's: that of its latest training run, which older
                # versions wrote there alone, for the run `pipeline_tuner`.
                run = summaries.RUN if relative == "." else f"{relative}/{summaries.RUN}"
                of_log_dirs[run] = path
        for run, path in of_log_dirs.items():
            found.setdefault(run, path)
        return found

    def runs(self, ctx, experiment_id: str) -> List[Dict[str, Any]]:
        """Every run the dashboard can show, with its verdict, sorted by name.

        Returns:
            One dict per run: "run", "source" ("summaries" or "report.json"),
            "unreadable" (why its report cannot be read, or `None`), "verdict",
            "input_fraction" and "step_ms" (its figures': the verdict's share,
            the steady state's median step), "has_steps", "last_step" (the
            latest step written, 0 when none) and "has_tune".
        """
        tagged = self.tagged_runs(ctx, experiment_id)
        files = self.report_file_runs()
        listed = []
        for run in sorted(set(tagged) | set(files)):
            unreadable = None
            try:
                report, source = self.report(ctx, experiment_id, run, files)
            except UnreadableRun as reason:
                # Listed with the reason; the other runs are shown as ever.
                report, source, unreadable = None, "", str(reason)
            tags = tagged.get(run, {})
            figures = (report or {}).get("figures") or {}
            listed.append(
                {
                    "run": run,
                    "source": source,
                    "unreadable": unreadable,
                    "verdict": figures.get("verdict"),
                    "input_fraction": figures.get("input_fraction"),
                    "step_ms": (figures.get("step") or {}).get("median_ms"),
                    "has_steps": any(
                        tag.startswith(summaries.STEPS_TAG_PREFIX) for tag in tags
                    ),
                    "last_step": max(
                        (
                            int(series.max_step)
                            for tag, series in tags.items()
                            if tag.startswith(summaries.STEPS_TAG_PREFIX)
                        ),
                        default=0,
                    ),
                    "has_tune": summaries.TUNE_TAG in tags,
                }
            )
        return listed

    # One run.

    def report(
        self, ctx, experiment_id: str, run: str, files: Optional[Dict[str, str]] = None
    ) -> Tuple[Optional[dict], str]:
        """The run's report as JSON data, and where it came from.

        Args:
            ctx: TensorBoard's request context.
            experiment_id: the experiment.
            run: the run's name.
            files: `report_file_runs()`, if already listed.

        Returns:
            `(report data or None, "summaries" | "report.json" | "")`.

        Raises:
            UnreadableRun: when what the run holds is not a report, with the
                field at fault (as `Report.from_json` names it).
        """
        text = self._latest_text(ctx, experiment_id, run, summaries.REPORT_TAG)
        source = SUMMARIES
        if text is None:
            path = (self.report_file_runs() if files is None else files).get(run)
            if path is None:
                return None, ""
            try:
                with open(path, encoding="utf-8") as file:
                    text = file.read()
            except (OSError, UnicodeDecodeError):
                # Being written right now, or gone: nothing to show yet.
                return None, ""
            source = REPORT_FILENAME
        try:
            # The parser the `report` command uses: it names the field at fault.
            parsed = Report.from_json(text)
        except ValueError as reason:
            raise UnreadableRun(f"{source} of {run}: {reason}") from None
        return _with_gain_phrases(_with_figures(json.loads(text), parsed)), source

    def tune(self, ctx, experiment_id: str, run: str) -> Optional[dict]:
        """The `kpt.tune` result written for the run, if any.

        Raises:
            UnreadableRun: when the summary holds no JSON object.
        """
        return self._latest_object(ctx, experiment_id, run, summaries.TUNE_TAG)

    def profile_stages(self, ctx, experiment_id: str, run: str) -> Optional[dict]:
        """The profiler window's timeline rows ({"title", "rows"}), if any.

        Raises:
            UnreadableRun: when the summary holds no JSON object.
        """
        return self._latest_object(ctx, experiment_id, run, summaries.PROFILE_STAGES_TAG)

    def steps(self, ctx, experiment_id: str, run: str) -> Tuple[np.ndarray, str]:
        """Every step row the run holds, sorted by step, and where they came from.

        Returns:
            `(float64 rows of summaries.STEP_COLUMNS, "summaries" | "scalars" | "")`.
        """
        tags = self.tagged_runs(ctx, experiment_id).get(run, {})
        blocks = {
            tag: series.max_step
            for tag, series in tags.items()
            if tag.startswith(summaries.STEPS_TAG_PREFIX)
        }
        if blocks:
            key = tuple(sorted((tag, s.max_step, s.max_wall_time) for tag, s in tags.items()))
            with self._lock:
                cached = self._steps_cache.get(run)
            if cached is not None and cached[0] == key:
                return cached[1], SUMMARIES
            versions = {tag: getattr(tags[tag], "plugin_content", b"") for tag in blocks}
            rows = self._read_blocks(ctx, experiment_id, run, versions)
            with self._lock:
                self._steps_cache[run] = (key, rows)
            return rows, SUMMARIES
        rows = self._scalar_rows(ctx, experiment_id, run)
        return rows, ("scalars" if rows.shape[0] else "")

    # Internals.

    def _latest_text(self, ctx, experiment_id: str, run: str, tag: str) -> Optional[str]:
        if self._provider is None:
            return None
        read = self._provider.read_tensors(
            ctx,
            experiment_id=experiment_id,
            plugin_name=summaries.PLUGIN_NAME,
            downsample=1,
            run_tag_filter=_filter(run, tag),
        )
        data = read.get(run, {}).get(tag)
        if not data:
            return None
        value = data[-1].numpy
        text = value.item() if hasattr(value, "item") else value
        if isinstance(text, bytes):
            try:
                text = text.decode("utf-8")
            except UnicodeDecodeError:
                raise UnreadableRun(f"{tag} of {run} is not UTF-8 text") from None
        if not isinstance(text, str):
            raise UnreadableRun(f"{tag} of {run} holds no text")
        return text

    def _latest_object(self, ctx, experiment_id: str, run: str, tag: str) -> Optional[dict]:
        text = self._latest_text(ctx, experiment_id, run, tag)
        if text is None:
            return None
        try:
            data = json.loads(text)
        except ValueError as error:
            raise UnreadableRun(f"{tag} of {run} is not JSON ({error})") from None
        if not isinstance(data, dict):
            raise UnreadableRun(f"{tag} of {run} is not a JSON object")
        return data

    def _read_blocks(
        self, ctx, experiment_id: str, run: str, versions: Dict[str, bytes]
    ) -> np.ndarray:
        read = self._provider.read_tensors(
            ctx,
            experiment_id=experiment_id,
            plugin_name=summaries.PLUGIN_NAME,
            downsample=1,  # the latest write of each block holds all its rows
            run_tag_filter=_filter(run, *sorted(versions)),
        )
        blocks = []
        for tag, data in read.get(run, {}).items():
            if not data:
                continue
            try:
                block = np.asarray(data[-1].numpy, dtype=np.float64)
                if versions.get(tag) == b"1":
                    blocks.append(summaries.widened(block))
                else:
                    blocks.append(block.reshape(-1, len(summaries.STEP_COLUMNS)))
            except (TypeError, ValueError):
                raise UnreadableRun(f"{tag} of {run} holds no step rows") from None
        if not blocks:
            return EMPTY_ROWS
        rows = np.concatenate(blocks)
        return rows[np.argsort(rows[:, 0], kind="stable")]

    def _scalar_rows(self, ctx, experiment_id: str, run: str) -> np.ndarray:
        if self._provider is None:
            return EMPTY_ROWS
        read = self._provider.read_scalars(
            ctx,
            experiment_id=experiment_id,
            plugin_name=_SCALAR_PLUGIN,
            downsample=1_000_000,
            run_tag_filter=_filter(run, _WAIT_TAG, _COMPUTE_TAG, _WHOLE_STEP_TAG),
        )
        tags = read.get(run, {})
        compute = {datum.step: datum.value for datum in tags.get(_COMPUTE_TAG, [])}
        wait = {datum.step: datum.value for datum in tags.get(_WAIT_TAG, [])}
        if not compute:
            compute = {datum.step: datum.value for datum in tags.get(_WHOLE_STEP_TAG, [])}
        if not compute:
            return EMPTY_ROWS
        steps = np.array(sorted(compute), dtype=np.float64)
        compute_s = np.array([compute[step] for step in steps]) / 1e3
        wait_s = np.array([wait.get(step, np.nan) for step in steps]) / 1e3
        # No per-step start in the scalars: the steps laid end to end.
        start = np.concatenate([[0.0], np.cumsum(np.nan_to_num(wait_s) + compute_s)[:-1]])
        return summaries.widened(
            np.stack([steps, np.zeros_like(steps), start, wait_s, compute_s], axis=1)
        )


def _with_figures(data: dict, report: Report) -> dict:
    """The report's figures, which every part of the page shows (`Report.figures`).

    A report written before they were kept gets those its stored verdict and
    statistics give (`report.figures_of`), as the terminal shows it.
    """
    if not isinstance(data.get("figures"), dict):
        data["figures"] = json.loads(summaries.json_text(figures_of(report)))
    return data


def _with_gain_phrases(report: Any) -> Any:
    """Adds to each expected gain the phrase the terminal shows (`describe_gain`).

    The page shows the same words as the terminal and Markdown, worked out in
    one place, instead of deciding again how a gain reads.
    """
    if not isinstance(report, dict):
        return report
    names = {field.name for field in dataclasses.fields(ExpectedGain)}
    gains = [(report.get("figures") or {}).get("input_free")]
    for recommendation in report.get("recommendations") or []:
        if isinstance(recommendation, dict):
            gains.append(recommendation.get("expected_gain"))
    for gain in gains:
        if not isinstance(gain, dict):
            continue
        try:
            gain["described"] = describe_gain(
                ExpectedGain(**{key: value for key, value in gain.items() if key in names})
            )
        except (TypeError, ValueError):
            # A hostile or older report: the page shows its statement alone.
            continue
    return report


def _filter(run: str, *tags: str) -> provider.RunTagFilter:
    return provider.RunTagFilter(runs=[run], tags=list(tags))
