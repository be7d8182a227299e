"""Findings of the pipeline inspection: plain data, and a table to read them."""

import dataclasses
import enum
import io
from typing import Iterable
from typing import List
from typing import Optional

# Errors first: they mean the model trains on the wrong data.
_SEVERITY_ORDER = ("error", "warning", "info")
_SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "dim"}


class Severity(str, enum.Enum):
    """How much a finding matters.

    "error": the model trains on wrong data (e.g. frozen augmentations);
    "warning": the pipeline is slower than it could be; "info": something
    TensorFlow already handles, said so the user knows.
    """

    ERROR = "error"
    WARNING = "warning"
    INFO = "info"

    def __str__(self) -> str:
        return self.value


@dataclasses.dataclass
class Finding:
    """One place where a pipeline departs from the tf.data performance guide.

    Attributes:
        id: stable identifier, e.g. "cache-after-random".
        severity: `Severity` ("error", "warning" or "info").
        stage: the stage as code, e.g. "map(augment)".
        node: the stage's node in the dataset graph (unique in the pipeline).
        op: the dataset op, e.g. "MapDataset".
        function: the user function the stage applies, if any.
        reason: why it matters, in one paragraph.
        fix: the code to write instead.

    Example:

    >>> finding = Finding("missing-prefetch", Severity.INFO, "map(f)", "MapDataset/_3",
    ...                   "MapDataset", "f", "...", "ds = ds.prefetch(tf.data.AUTOTUNE)")
    >>> finding.severity == "info"
    True
    """

    id: str
    severity: Severity
    stage: str
    node: str
    op: str
    function: Optional[str]
    reason: str
    fix: str

    def __post_init__(self):
        try:
            self.severity = Severity(self.severity)
        except ValueError:
            raise ValueError(
                f"Finding {self.id!r}: severity must be one of "
                f"{', '.join(_SEVERITY_ORDER)}, got {self.severity!r}."
            ) from None


def stage_finding(
    finding_id: str, severity: Severity, stage, reason: str, fix: str
) -> Finding:
    """A finding about one stage of a pipeline.

    Args:
        finding_id: the finding's id, from the catalogue.
        severity: its `Severity`.
        stage: the pipeline `Stage` it is about (its label, node, op and
            function name go into the finding).
        reason: why it matters, in one paragraph.
        fix: the code to write instead.

    Returns:
        The `Finding`.

    Example:

    >>> from keras_pipeline_tuner.pipeline.graph.model import Stage
    >>> from keras_pipeline_tuner.pipeline.lint.catalogue import MISSING_PREFETCH
    >>> stage = Stage(node="PrefetchDataset/_2", op="PrefetchDataset", kind="prefetch",
    ...               params={"buffer_size": 2})
    >>> stage_finding(MISSING_PREFETCH, Severity.INFO, stage, "...", "...").stage
    'prefetch(2)'
    """
    return Finding(
        id=finding_id,
        severity=severity,
        stage=stage.label,
        node=stage.node,
        op=stage.op,
        function=stage.function_name,
        reason=reason,
        fix=fix,
    )


class Findings(List[Finding]):
    """A list of `Finding`s that prints as a table.

    Args:
        findings: the findings.
        pipeline: the `Pipeline` they are about, when one was read.

    Example:

    ```python
    findings = kpt.inspect(train_ds)
    print(findings)             # a table: severity, id, stage, why and fix
    if "cache-after-random" in findings.ids: ...
    ```
    """

    def __init__(self, findings: Iterable[Finding] = (), pipeline=None):
        super().__init__(findings)
        self.pipeline = pipeline
        # The memory its caches and buffers will hold (`memory_forecast`), when read.
        self.memory = None

    @property
    def ids(self) -> List[str]:
        """The finding ids, in order."""
        return [finding.id for finding in self]

    def of_severity(self, severity: str) -> "Findings":
        """The findings of one severity ("error", "warning" or "info")."""
        if severity not in _SEVERITY_ORDER:
            raise ValueError(
                f"Unknown severity {severity!r}: use one of {', '.join(_SEVERITY_ORDER)}."
            )
        return Findings((f for f in self if f.severity == severity), self.pipeline)

    def sorted(self) -> "Findings":
        """The findings ordered by severity, errors first (stable otherwise)."""
        return Findings(
            sorted(self, key=lambda finding: _SEVERITY_ORDER.index(str(finding.severity))),
            self.pipeline,
        )

    def __rich__(self):
        from rich.table import Table
        from rich.text import Text

        counts = [
            f"{count} {severity}{'s' if count != 1 else ''}"
            for severity in _SEVERITY_ORDER
            if (count := sum(1 for finding in self if finding.severity == severity))
        ]
        title = f"Pipeline inspection: {', '.join(counts) or 'no findings'}"
        table = Table(title=title, title_justify="left", show_lines=True, expand=True)
        table.add_column("severity", no_wrap=True)
        table.add_column("id", no_wrap=True)
        table.add_column("stage", ratio=1, overflow="fold")
        table.add_column("why, and what to write instead", ratio=3)
        for finding in self:
            severity = str(finding.severity)
            table.add_row(
                Text(severity, style=_SEVERITY_STYLE.get(severity, "")),
                finding.id,
                finding.stage,
                Text.assemble(finding.reason, "\n", ("Fix:", "bold"), "\n", (finding.fix, "cyan")),
            )
        return table

    def __str__(self) -> str:
        from rich.console import Console

        buffer = io.StringIO()
        Console(file=buffer, width=120, color_system=None, highlight=False).print(self)
        return buffer.getvalue().rstrip("\n")

    def __repr__(self) -> str:
        return f"Findings({self.ids!r})"
