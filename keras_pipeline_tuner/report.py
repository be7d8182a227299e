"""The report: everything the tuner found, as plain data that round-trips JSON."""

import dataclasses
import enum
import json
import math
import typing
from typing import Any, Dict, List, Optional

from keras_pipeline_tuner.advisor import Recommendation
from keras_pipeline_tuner.cpu_usage import CpuUsage
from keras_pipeline_tuner.findings import Finding
from keras_pipeline_tuner.profile_evidence import ProfileEvidence
from keras_pipeline_tuner.step_clock import EpochBreakdown
from keras_pipeline_tuner.step_clock import FirstStep
from keras_pipeline_tuner.step_stats import StepStats
from keras_pipeline_tuner.step_stats import Verdict
from keras_pipeline_tuner.what_if_replay import WhatIfResult
from keras_pipeline_tuner.worker_reports import MultiWorkerSummary

REPORT_FILENAME = "report.json"
SCHEMA_VERSION = 1


@dataclasses.dataclass
class Report:
    """What the tuner measured and concluded for one run.

    Attributes:
        verdict: `Verdict` of the training steps ("highly input-bound",
            "moderately input-bound", "not input-bound", or "unknown" when the
            input wait could not be measured).
        input_fraction: share of training step time spent waiting for input.
        train: `StepStats` of the training steps (the first step excluded).
        validation: `StepStats` of the validation steps, if any ran.
        epochs: per-epoch `EpochBreakdown`s, training and validation.
        first_steps: the first step of each kind, reported apart (it traces).
        measurement: "in-step" (wait and compute split inside the step) or
            "whole-step" (only the total per step, see `notes`); for custom
            loops "decorator", "iterator" or "decorator+iterator" (what timed
            the steps), or "not timed" (a loop compiled into one graph).
        steps_per_execution: the model's `steps_per_execution`.
        recommendations: ranked `Recommendation`s of the advisor, most
            important first.
        notes: plain-language caveats about what was or was not measured.
        environment: versions of the libraries the run used.
        profile: `ProfileEvidence` of the TF Profiler window, if one was
            captured and converted.
        findings: `Finding`s of the pipeline inspection (`kpt.inspect`) of the
            data fit iterated.
        what_if: `WhatIfResult` of the what-if replay (`PipelineTuner(
            what_if=True)`): the step time with input free, measured.
        workers: `MultiWorkerSummary` of a multi-worker run: in the chief's
            report, every worker's figures and the straggler. The fields above
            are this worker's own measurements; the recommendations judge the
            job, that is the straggler.
        cpu: `CpuUsage` of the host over the training steps so far.

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
    measurement: str = "in-step"
    steps_per_execution: int = 1
    recommendations: List[Recommendation] = dataclasses.field(default_factory=list)
    notes: List[str] = dataclasses.field(default_factory=list)
    environment: Dict[str, str] = dataclasses.field(default_factory=dict)
    profile: Optional[ProfileEvidence] = None
    findings: List[Finding] = dataclasses.field(default_factory=list)
    what_if: Optional[WhatIfResult] = None
    workers: Optional[MultiWorkerSummary] = None
    cpu: Optional[CpuUsage] = None

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
            ValueError: if the text is not a report (names the field at fault).
        """
        try:
            # `to_json` never writes NaN or Infinity.
            data = json.loads(text, parse_constant=_reject_constant)
        except json.JSONDecodeError as error:
            raise ValueError(f"Not a report: invalid JSON ({error}).") from error
        except RecursionError as error:
            raise ValueError("Not a report: the JSON is nested too deeply.") from error
        if not isinstance(data, dict):
            raise ValueError("Not a report: the JSON is not an object.")
        data.pop("schema_version", None)
        return from_dict(cls, data, "report")


def _reject_constant(name: str):
    raise ValueError(f"Not a report: {name} is not a number a report holds.")


def encode_json_value(value):
    """The JSON form of what `json` cannot encode itself in report dataclasses (enums)."""
    if isinstance(value, enum.Enum):
        return value.value
    raise TypeError(f"Cannot serialise {type(value).__name__}")


def from_dict(cls, data: Any, where: str):
    """Builds dataclass `cls` from plain JSON data, checking types on the way.

    Args:
        cls: a dataclass type, or a typing annotation made of dataclasses,
            enums, lists, dicts, optionals and JSON scalars.
        data: the decoded JSON value.
        where: the path of `data` in the document, for error messages.

    Returns:
        The rebuilt value.

    Raises:
        ValueError: naming the field whose value has the wrong type.
    """
    origin = typing.get_origin(cls)
    args = typing.get_args(cls)
    if cls is Any:
        return data
    if origin is typing.Union:
        if data is None and type(None) in args:
            return None
        inner = [arg for arg in args if arg is not type(None)]
        return from_dict(inner[0], data, where)
    if origin in (list, List):
        if not isinstance(data, list):
            raise ValueError(f"Bad report: {where} should be a list.")
        return [from_dict(args[0], item, f"{where}[{i}]") for i, item in enumerate(data)]
    if origin in (dict, Dict):
        if not isinstance(data, dict):
            raise ValueError(f"Bad report: {where} should be an object.")
        return {str(k): from_dict(args[1], v, f"{where}.{k}") for k, v in data.items()}
    if isinstance(cls, type) and issubclass(cls, enum.Enum):
        try:
            return cls(data)
        except ValueError as error:
            raise ValueError(f"Bad report: {where} has unknown value {data!r}.") from error
    if dataclasses.is_dataclass(cls):
        if not isinstance(data, dict):
            raise ValueError(f"Bad report: {where} should be an object.")
        hints = typing.get_type_hints(cls)
        kwargs = {}
        for field in dataclasses.fields(cls):
            required = (
                field.init
                and field.default is dataclasses.MISSING
                and field.default_factory is dataclasses.MISSING
            )
            if required and field.name not in data:
                raise ValueError(f"Bad report: {where}.{field.name} is missing.")
            if field.init and field.name in data:
                kwargs[field.name] = from_dict(
                    hints[field.name], data[field.name], f"{where}.{field.name}"
                )
        return cls(**kwargs)
    if cls is float:
        if isinstance(data, bool) or not isinstance(data, (int, float)):
            raise ValueError(f"Bad report: {where} should be a number.")
        try:
            number = float(data)
        except OverflowError:
            number = math.inf
        if not math.isfinite(number):
            raise ValueError(f"Bad report: {where} should be a finite number.")
        return number
    if cls in (int, str, bool):
        if not isinstance(data, cls) or (cls is int and isinstance(data, bool)):
            raise ValueError(f"Bad report: {where} should be of type {cls.__name__}.")
        return data
    return data
