"""The runs in one log dir: each in a folder of its own, claimed by one process.

A log dir gathers runs over time (a fit, an `evaluate()` with the same tuner, a
second fit, a later script) and sometimes at once (two processes given one log
dir). Each run has its own TensorBoard run folder under `<log_dir>/pipeline_tuner`:
the first run is that folder itself, later ones `fit-2`, `evaluate-3`, ... below
it. A run claims its folder when it begins by creating `run.json` there (what the
run is and which process runs it); creating it fails if another run claimed the
name first, and the run takes the next one. A run that begins while a run of
another process in the same log dir is still going gets its host and process id
in its name (`fit-3-host-1234`), so that the two never share a folder. Each run
writes its own `report.json` into its folder.

`report.json` at the log dir's root is that of the latest training run (a fit or
a custom loop), listing every run of the log dir (`Report.runs`): the `report`
and `check` commands read training, never an `evaluate()` that followed it.
"""

import dataclasses
import json
import os
import re
import socket
import time
from typing import List
from typing import Optional

from keras_pipeline_tuner._util import files
from keras_pipeline_tuner.profiling.capture import PROFILE_RUN

# The name of a run's report file, in its folder.
REPORT_FILENAME = "report.json"

RUN = PROFILE_RUN
CLAIM_FILENAME = "run.json"
# Kinds of run whose report is the log dir's own (the training).
TRAINING_KINDS = ("fit", "loop")
# A run of another host counts as live while its report was written this recently
# (a run writes it every few seconds).
LIVE_S = 120.0
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclasses.dataclass
class RunEntry:
    """One run of a log dir, as its `run.json` says.

    Attributes:
        run: its TensorBoard run under the log dir, e.g. "pipeline_tuner/fit-2".
        kind: "fit", "loop" (a custom training loop) or "evaluate".
        host: the host that ran it.
        pid: its process id there.
        started: when it began (`time.time()`).
        finished: whether it ended (its report is final).
        live: when listed, whether it is still running (see `LIVE_S`).

    Example:

    >>> RunEntry("pipeline_tuner/fit-2", "fit", "node-1", 42).process
    'node-1:42'
    """

    run: str = RUN
    kind: str = "fit"
    host: str = ""
    pid: int = 0
    started: float = 0.0
    finished: bool = False
    live: Optional[bool] = None

    @property
    def process(self) -> str:
        """`host:pid` of the process that ran it."""
        return f"{self.host}:{self.pid}"


def run_path(run_name: Optional[str] = None) -> str:
    """The TensorBoard run, under a log dir, of the tuner's run `run_name`.

    Example:

    >>> run_path(), run_path("fit-2")
    ('pipeline_tuner', 'pipeline_tuner/fit-2')
    """
    return RUN if not run_name else f"{RUN}/{run_name}"


def run_folder(log_dir: str, run: str) -> str:
    """The folder of TensorBoard run `run` (as `run_path` gives it) in `log_dir`."""
    return os.path.join(log_dir, *run.split("/"))


def claim_run(log_dir: str, kind: str) -> RunEntry:
    """Claims a new run folder in `log_dir` for a run of `kind`, in this process.

    Args:
        log_dir: the log dir (local, or on a TensorFlow file system).
        kind: "fit", "loop" or "evaluate".

    Returns:
        The `RunEntry` claimed: its `run` names the folder.
    """
    host, pid = _this_host(), os.getpid()
    root = os.path.join(log_dir, RUN)
    while True:
        # Looked at again after a lost claim: the winner may be another process.
        others = [
            entry
            for entry in list_runs(log_dir)
            if entry.live and (entry.host, entry.pid) != (host, pid)
        ]
        suffix = f"-{host}-{pid}" if others else ""
        name = None if _free_root(root) else f"{kind}-{_last_number(root) + 1}{suffix}"
        entry = RunEntry(run_path(name), kind, host, pid, time.time())
        claim = os.path.join(run_folder(log_dir, entry.run), CLAIM_FILENAME)
        if files.create_exclusively(claim, _encode(entry)):
            return entry


def finish_run(log_dir: str, entry: RunEntry) -> None:
    """Marks `entry` finished in its `run.json`."""
    entry.finished = True
    files.write_atomically(run_folder(log_dir, entry.run), CLAIM_FILENAME, _encode(entry))


def list_runs(log_dir: str) -> List[RunEntry]:
    """Every run claimed in `log_dir`, in the order they began, with whether each is live.

    Folders of runs written before runs were claimed (no `run.json`) are left
    out; a `run.json` that cannot be read is skipped.

    Args:
        log_dir: the log dir.

    Returns:
        The `RunEntry`s.
    """
    root = os.path.join(log_dir, RUN)
    if not files.exists(root):
        return []
    folders = [root] + [os.path.join(root, name) for name in files.list_dir(root)]
    found = []
    for folder in folders:
        claim = os.path.join(folder, CLAIM_FILENAME)
        try:
            entry = _decode(files.read_text(claim))
        except (OSError, ValueError, TypeError):
            continue
        entry.live = _is_live(entry, folder)
        found.append(entry)
    return sorted(found, key=lambda entry: entry.started)


def _state(entry: RunEntry) -> str:
    if entry.finished:
        return "finished"
    return "running" if entry.live else "ended early"


def describe_runs(runs: List[RunEntry], this_run: Optional[str]) -> Optional[str]:
    """A sentence listing the runs of a log dir, or `None` when it holds one run at most.

    Args:
        runs: `Report.runs` of the log dir's root report.
        this_run: `Report.run` of that report.

    Example:

    >>> describe_runs([RunEntry("pipeline_tuner", "fit", "h", 1, 0.0, True),
    ...                RunEntry("pipeline_tuner/evaluate-2", "evaluate", "h", 1, 1.0, True)],
    ...               "pipeline_tuner")  # doctest: +NORMALIZE_WHITESPACE
    'This log dir holds 2 runs: pipeline_tuner (fit, finished),
    pipeline_tuner/evaluate-2 (evaluate, finished); this report is that of
    pipeline_tuner, its latest training run.'
    """
    if len(runs) < 2:
        return None
    listed = ", ".join(
        f"{entry.run} ({entry.kind}, {_state(entry)})" for entry in runs
    )
    line = f"This log dir holds {len(runs)} runs: {listed}"
    if this_run is not None:
        line += f"; this report is that of {this_run}, its latest training run"
    processes = sorted({entry.process for entry in runs})
    if len(processes) > 1:
        line += (
            f". They come from {len(processes)} processes ({', '.join(processes)}), each "
            "writing into folders of its own"
        )
    return line + "."


def _is_live(entry: RunEntry, folder: str) -> bool:
    if entry.finished:
        return False
    if entry.host == _this_host():
        return _process_alive(entry.pid)
    try:
        written = files.modified_time(os.path.join(folder, REPORT_FILENAME))
    except OSError:
        written = entry.started
    return time.time() - written < LIVE_S


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True


def _free_root(root: str) -> bool:
    """Whether the log dir's first run folder is free: no claim, no event file."""
    if not files.exists(root):
        return True
    names = files.list_dir(root)
    return CLAIM_FILENAME not in names and not any("tfevents" in name for name in names)


def _last_number(root: str) -> int:
    """The highest run number under `root` (1: the first run, the root itself)."""
    numbers = [1]
    if files.exists(root):
        for name in files.list_dir(root):
            match = re.match(r"^[a-z]+-(\d+)(?:-|$)", name)
            if match:
                numbers.append(int(match.group(1)))
    return max(numbers)


def _this_host() -> str:
    return _UNSAFE.sub("_", socket.gethostname()) or "host"


def _encode(entry: RunEntry) -> str:
    data = dataclasses.asdict(entry)
    data.pop("live")
    return json.dumps(data, indent=2)


def _decode(text: str) -> RunEntry:
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("run.json is not an object")
    names = {field.name for field in dataclasses.fields(RunEntry)} - {"live"}
    entry = RunEntry(**{key: value for key, value in data.items() if key in names})
    if not isinstance(entry.run, str) or not isinstance(entry.pid, int):
        raise ValueError("run.json has fields of the wrong type")
    return entry
