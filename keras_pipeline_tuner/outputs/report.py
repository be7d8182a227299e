"""The report: everything the tuner found, as plain data that round-trips JSON."""

import dataclasses
import json
from typing import Dict
from typing import List
from typing import Optional

from keras_pipeline_tuner._util.files import write_atomically
from keras_pipeline_tuner._util.json_codec import encode_json_value
from keras_pipeline_tuner._util.json_codec import from_dict
from keras_pipeline_tuner._util.json_codec import reject_constant
from keras_pipeline_tuner.advice.data_reuse import DataReuse
from keras_pipeline_tuner.advice.figures import Figures
from keras_pipeline_tuner.advice.figures import legacy_figures
from keras_pipeline_tuner.advice.recommendation import Recommendation
from keras_pipeline_tuner.advice.verdict import Judgement
from keras_pipeline_tuner.after_training.execution_replay import ExecutionReplay
from keras_pipeline_tuner.after_training.what_if_replay import WhatIfResult
from keras_pipeline_tuner.instrumentation.user_calls import UserCallTiming
from keras_pipeline_tuner.outputs.log_dir_runs import REPORT_FILENAME  # noqa: F401 - re-exported
from keras_pipeline_tuner.outputs.log_dir_runs import RunEntry
from keras_pipeline_tuner.pipeline.lint.findings import Finding
from keras_pipeline_tuner.profiling.evidence import ProfileEvidence
from keras_pipeline_tuner.profiling.live_model import StageTable
from keras_pipeline_tuner.timing import measurement as measured_by
from keras_pipeline_tuner.timing.cpu_usage import CpuUsage
from keras_pipeline_tuner.timing.step_clock import EpochBreakdown
from keras_pipeline_tuner.timing.step_clock import FirstStep
from keras_pipeline_tuner.timing.step_stats import StepStats
from keras_pipeline_tuner.timing.step_stats import Verdict
from keras_pipeline_tuner.timing.tuner_cost import TunerCost
from keras_pipeline_tuner.workers.exchange import MultiWorkerSummary

SCHEMA_VERSION = 1
# What the outputs say of a profile still converting (`Report.profile_pending`).
PROFILE_PENDING = "Profile: converting (xprof), joins the report when ready."


@dataclasses.dataclass
class Report:
    """What the tuner measured and concluded for one run.

    Attributes:
        verdict: `Verdict` of the training steps ("highly input-bound",
            "moderately input-bound", "not input-bound", or "unknown" when the
            input wait could not be measured).
        input_fraction: share of training step time the input costs in the
            steady state: the verdict's (`figures.input_fraction`).
        train: `StepStats` of the training steps (the first step excluded):
            evidence, of all steps; what outputs show is in `figures`.
        validation: `StepStats` of the validation steps, if any ran.
        epochs: per-epoch `EpochBreakdown`s, training and validation.
        first_steps: the first step of each kind, reported apart (it traces).
        measurement: how the steps were timed (`timing.measurement`):
            "in-step" (wait and compute split inside the step) or "whole-step"
            (only the total per step, see `notes`); for custom loops
            "decorator", "iterator" or "decorator+iterator" (what timed the
            steps), or "not timed" (a loop compiled into one graph).
        steps_per_execution: the model's `steps_per_execution`.
        recommendations: ranked `Recommendation`s of the advisor, most
            important first.
        notes: plain-language caveats about what was or was not measured.
        environment: versions of the libraries the run used.
        profile: `ProfileEvidence` of the TF Profiler window, if one was
            captured and converted.
        profile_pending: a window was captured and its conversion still runs:
            its evidence joins the report (and `report.json`, TensorBoard)
            when ready; `PipelineTuner.wait_for_profile()` waits for it.
        findings: `Finding`s of the pipeline inspection (`kpt.inspect`) of the
            data fit iterated.
        what_if: `WhatIfResult` of the what-if replay (`PipelineTuner(
            what_if=True)`): the step time with input free, measured.
        workers: `MultiWorkerSummary` of a multi-worker run: in the chief's
            report, every worker's figures and the straggler. The fields above
            are this worker's own measurements; the recommendations judge the
            job, that is the straggler.
        cpu: `CpuUsage` of the host over the training steps so far.
        run: the TensorBoard run, under the log dir, that holds this run's
            summaries and its own `report.json` (e.g. "pipeline_tuner",
            "pipeline_tuner/fit-2"); a log dir's root `report.json` is that of
            its latest training run (see `outputs.log_dir_runs`).
        runs: in a log dir's root `report.json`, every run of the log dir
            (`RunEntry`: its run, kind, process, whether it finished or is
            still going), when it has been read.
        judgement: how the verdict was decided (`advice.verdict.Judgement`):
            the steady state, what decided, one-off costs left out.
        figures: every figure the outputs show, built once from the
            judgement and the evidence (`advice.figures.Figures`): the step
            (the steady state's median), the input share, the input-free
            ceiling, the profiler window's steps, the CPU budget, Keras' own
            ms/step, each epoch judged by the run's rule. `None` in reports
            written before they were kept (see `figures_of`).
        tuner_cost: what the tuner's own work after training took, part by
            part, against its budget, and its whole work once per fit
            (before the first step, outputs during training, after it;
            `timing.tuner_cost.TunerCost`); `None` while training runs.
        reuse: how much of its dataset the fit read, and whether that reads an
            element twice (`advice.data_reuse.DataReuse`): whether a cache
            would be read back; `None` when the dataset's length was not read.
        user_calls: the user's Python functions that fed training (a
            `from_generator` generator, a `tf.py_function` / `numpy_function`
            in a map, a `PyDataset.__getitem__`, a Python generator given to
            fit), each timed during training, call by call, where the fit made
            the call (`instrumentation.user_calls.UserCallTiming`); nothing was
            called again to time it.
        stage_table: every stage of a tf.data pipeline the fit read, from
            tf.data's live model of the fit's own iterator, read at epoch ends
            and once in the steady state (`profiling.live_model.StageTable`):
            per stage its time per element, its share, the parallelism and
            buffer AUTOTUNE chose, and the final prefetch's fullness. On every
            backend, with or without a profiler window.
        execution: Keras' fit on cached batches at `steps_per_execution` 1 and
            at a larger setting, timed after training where the host's work
            between steps bounded the step (`after_training.execution_replay`).

    Example:

    >>> report = Report.from_json(Report(input_fraction=0.5).to_json())
    >>> report.input_fraction
    0.5
    """

    verdict: Verdict = Verdict.UNKNOWN
    input_fraction: Optional[float] = None
    train: StepStats = dataclasses.field(default_factory=StepStats)
    validation: Optional[StepStats] = None
    epochs: List[EpochBreakdown] = dataclasses.field(default_factory=list)
    first_steps: Dict[str, FirstStep] = dataclasses.field(default_factory=dict)
    measurement: str = measured_by.IN_STEP
    steps_per_execution: int = 1
    recommendations: List[Recommendation] = dataclasses.field(default_factory=list)
    notes: List[str] = dataclasses.field(default_factory=list)
    environment: Dict[str, str] = dataclasses.field(default_factory=dict)
    profile: Optional[ProfileEvidence] = None
    findings: List[Finding] = dataclasses.field(default_factory=list)
    what_if: Optional[WhatIfResult] = None
    workers: Optional[MultiWorkerSummary] = None
    cpu: Optional[CpuUsage] = None
    judgement: Optional[Judgement] = None
    figures: Optional[Figures] = None
    run: Optional[str] = None
    runs: List[RunEntry] = dataclasses.field(default_factory=list)
    tuner_cost: Optional[TunerCost] = None
    reuse: Optional[DataReuse] = None
    user_calls: List[UserCallTiming] = dataclasses.field(default_factory=list)
    profile_pending: bool = False
    stage_table: Optional[StageTable] = None
    execution: Optional[ExecutionReplay] = None

    def to_json(self, indent: Optional[int] = 2) -> str:
        """Serialises the report.

        Args:
            indent: JSON indentation; `None` for one line.

        Returns:
            The report as a JSON string, with a schema version.
        """
        data = {"schema_version": SCHEMA_VERSION, **dataclasses.asdict(self)}
        return json.dumps(data, indent=indent, default=encode_json_value, allow_nan=False)

    @classmethod
    def from_json(cls, text: str) -> "Report":
        """Rebuilds a report written by `to_json`.

        Args:
            text: the JSON text.

        Returns:
            The `Report`.

        Raises:
            ValueError: if the text is not a report (names the field at fault),
                or has a `schema_version` other than this version's.
        """
        try:
            # `to_json` never writes NaN or Infinity.
            data = json.loads(text, parse_constant=reject_constant)
        except json.JSONDecodeError as error:
            raise ValueError(f"Not a report: invalid JSON ({error}).") from error
        except RecursionError as error:
            raise ValueError("Not a report: the JSON is nested too deeply.") from error
        if not isinstance(data, dict):
            raise ValueError("Not a report: the JSON is not an object.")
        version = data.pop("schema_version", SCHEMA_VERSION)
        if version != SCHEMA_VERSION:
            raise ValueError(
                f"Not a report this version can read: report.schema_version is "
                f"{version!r}, and this keras-pipeline-tuner reads version "
                f"{SCHEMA_VERSION}. Read it with the keras-pipeline-tuner that wrote it, "
                "or upgrade (pip install -U keras-pipeline-tuner)."
            )
        return from_dict(cls, data, "report")


def figures_of(report: Report) -> Figures:
    """The figures every output shows of `report`.

    Its own `figures`; for a report written before they were kept, the ones
    its stored verdict, line and statistics give (`advice.figures.legacy_figures`).

    Args:
        report: the `Report`.

    Returns:
        The `Figures`.

    Example:

    >>> figures_of(Report(input_fraction=0.5)).input_fraction
    0.5
    """
    return report.figures if report.figures is not None else legacy_figures(report)


def write_report(report: Report, log_dir: str) -> str:
    """Writes `report.json` into `log_dir` atomically.

    Args:
        report: the `Report`.
        log_dir: the directory; created if missing.

    Returns:
        The path written.
    """
    return write_atomically(log_dir, REPORT_FILENAME, report.to_json())
