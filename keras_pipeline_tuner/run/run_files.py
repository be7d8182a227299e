"""Where a run's files go in its log dir: its own folder, and the log dir's report.

A run claims a folder of its own when it begins (see `outputs.log_dir_runs`) and
writes its `report.json` there; a training run's report is also the log dir's
own `report.json`, listing every run of the log dir, so that the `report` and
`check` commands read training, never an `evaluate()` that followed it. Any
failure here turns the report file off (through the tuner's guard), never the
training.
"""

import dataclasses
import os
import threading
from typing import List
from typing import Optional

from keras_pipeline_tuner._util import features
from keras_pipeline_tuner._util import files
from keras_pipeline_tuner._util.feature_guard import FeatureGuard
from keras_pipeline_tuner.outputs import log_dir_runs
from keras_pipeline_tuner.outputs.report import REPORT_FILENAME
from keras_pipeline_tuner.outputs.report import Report
from keras_pipeline_tuner.outputs.report import write_report

# The log dir's own report is written by each training run of the log dir, and
# by a run whose profile joins after it ended (on a thread of the tuner's): one
# write at a time in a process, so that a later run's write is the last.
_WRITES = threading.Lock()


class RunFiles:
    """A run's folder in its log dir, and the report files it writes.

    Args:
        output_dir: the log dir the run writes into (a worker's own folder
            under it in a multi-worker job), or `None` for no files.
        kind: "fit", "loop" or "evaluate".
        guard: the tuner's `FeatureGuard`.

    Example:

    ```python
    run_files = RunFiles("logs/run1", "fit", guard)
    run_files.claim()
    run_files.write(report)            # every epoch and checkpoint
    run_files.finish()
    run_files.write(report, final=True)
    ```
    """

    def __init__(self, output_dir: Optional[str], kind: str, guard: FeatureGuard):
        self.output_dir = output_dir
        self.kind = kind
        self._guard = guard
        # The run's own folder, once claimed.
        self.entry: Optional[log_dir_runs.RunEntry] = None
        self._runs: List[log_dir_runs.RunEntry] = []

    @property
    def run_name(self) -> Optional[str]:
        """The run's TensorBoard run below `pipeline_tuner`, or `None` for that run itself."""
        if self.entry is None or "/" not in self.entry.run:
            return None
        return self.entry.run.split("/", 1)[1]

    @property
    def writes(self) -> bool:
        """Whether the run writes report files (a log dir, the feature on)."""
        return self._enabled()

    @property
    def training(self) -> bool:
        """Whether the run trains (its report is the log dir's own)."""
        return self.kind in log_dir_runs.TRAINING_KINDS

    def claim(self) -> None:
        """Claims the run's folder, and reads which runs the log dir holds."""
        if not self._enabled():
            return
        with self._guard(features.REPORT_FILE):
            # A folder of its own: a second fit's scalars never restart inside
            # the first's, nor does another process write into it.
            self.entry = log_dir_runs.claim_run(self.output_dir, self.kind)
            self._runs = log_dir_runs.list_runs(self.output_dir)

    def folder(self) -> Optional[str]:
        """Where this run's own files go: the log dir for training, else its folder."""
        if self.entry is None or self.training:
            return self.output_dir
        return log_dir_runs.run_folder(self.output_dir, self.entry.run)

    def write(self, report: Report, final: bool = False, late: bool = False) -> None:
        """Writes the report into the run's folder and, for training, the log dir.

        An `evaluate()` leaves the log dir's report, training's, as it is; at
        its end (`final`) that report's list of runs is brought up to date.

        Args:
            report: the run's report.
            final: the run has ended.
            late: written after the run ended (a profile joined): the log
                dir's report only while this run is still its latest training
                run, so that it never replaces a later run's.
        """
        if not self._enabled():
            return
        with self._guard(features.REPORT_FILE), _WRITES:
            entry = self.entry
            if entry is not None:
                write_report(report, log_dir_runs.run_folder(self.output_dir, entry.run))
            if entry is None or self.training:
                if late and not self._still_latest_training():
                    return
                listed = dataclasses.replace(report, runs=list(self._runs))
                write_report(listed, self.output_dir)
            elif final:
                self._list_in_the_root_report()

    def finish(self) -> None:
        """Marks the run's folder finished, and lists the log dir's runs as they stand."""
        if self.entry is None or not self._enabled():
            return
        with self._guard(features.REPORT_FILE):
            log_dir_runs.finish_run(self.output_dir, self.entry)
            self._runs = log_dir_runs.list_runs(self.output_dir)

    def _still_latest_training(self) -> bool:
        """Whether no training run began in the log dir after this one (any process).

        Reads the log dir's runs again: those that began since this run ended
        (an `evaluate()`, say) are listed in what is written.
        """
        if self.entry is None:
            return True
        self._runs = log_dir_runs.list_runs(self.output_dir)
        training = [entry for entry in self._runs if entry.kind in log_dir_runs.TRAINING_KINDS]
        return not training or training[-1].run == self.entry.run

    def _list_in_the_root_report(self) -> None:
        root = os.path.join(self.output_dir, REPORT_FILENAME)
        try:
            trained = Report.from_json(files.read_text(root))
        except (OSError, ValueError):
            # No training report (an evaluate() on its own), or one this
            # version cannot read: this run's report stands in its folder.
            return
        trained.runs = list(self._runs)
        write_report(trained, self.output_dir)

    def _enabled(self) -> bool:
        return self.output_dir is not None and self._guard.enabled(features.REPORT_FILE)
