"""Per-worker summaries under `MultiWorkerMirroredStrategy`, and the chief's view.

Each worker runs its own copy of the training script, so each has its own
tuner and step clock. The workers do not talk to each other through the tuner:
any exchange over the strategy's collectives would have to happen on every
worker in the same order, and one worker's tuner failing would then stall the
others. Instead every worker writes a small JSON summary of its own
measurements into the shared `log_dir` (with `tf.io.gfile`, so a remote log
dir such as `gs://...` works) at the end of each epoch and of fit:

    <log_dir>/workers/<task>/worker_summary.json     e.g. workers/worker_1/...

The chief reads them. At the end of fit it waits a bounded time for the final
summary of every other worker, then compares what is there and names the
workers that are missing; at the end of an epoch it reads what is there
without waiting. A worker other than the chief writes its own `report.json`
(and, when asked to, its TensorBoard run) under its `workers/<task>` folder, so
nothing it writes overwrites the chief's.

The straggler rule: in synchronous training every step ends only when every
worker's gradients are summed, so a worker whose input is slow makes the others
wait inside the step's all-reduce, which their step clocks count as compute.
The straggler is therefore the worker whose steps wait longest for input (mean
input wait per step), provided it waits clearly longer than the next one.
"""

import dataclasses
import json
import logging
import math
import os
import socket
import time
from typing import Dict
from typing import List
from typing import Optional
from typing import Sequence
from typing import Tuple

from keras_pipeline_tuner._util import files
from keras_pipeline_tuner._util.json_codec import encode_json_value
from keras_pipeline_tuner._util.json_codec import from_dict
from keras_pipeline_tuner._util.tf_import import tensorflow
from keras_pipeline_tuner.timing.cpu_usage import CpuUsage
from keras_pipeline_tuner.timing.step_stats import StepStats
from keras_pipeline_tuner.timing.step_stats import format_ms

logger = logging.getLogger("keras_pipeline_tuner")

WORKERS_DIR = "workers"
SUMMARY_FILENAME = "worker_summary.json"
# The chief waits at most this long at the end of fit for the other workers.
DEFAULT_TIMEOUT_S = 30.0
_POLL_S = 0.25
TENSORBOARD_WORKERS = ("chief", "all")
# Jobs whose tasks train in MultiWorkerMirroredStrategy.
_TRAINING_JOBS = ("chief", "worker")
# A straggler waits for input longer than every other worker by at least this
# much per step, and by this share of its step: below that it is noise.
_STRAGGLER_MIN_GAP_MS = 1.0
_STRAGGLER_MIN_GAP_SHARE = 0.1
STRAGGLER_RULE = (
    "The straggler is the worker whose steps wait longest for input (mean per "
    "step). In synchronous training the other workers wait for it inside the "
    "step's all-reduce, which their step clocks count as compute."
)


@dataclasses.dataclass
class WorkerSummary:
    """What one worker's tuner measured, as that worker wrote it.

    Attributes:
        task: the worker's task, e.g. "worker:1".
        host: the host name it ran on.
        chief: whether it is the chief.
        final: True when written at the end of fit, False at the end of an epoch.
        epochs: training epochs completed when it was written.
        train: `StepStats` of its training steps.
        cpu: `CpuUsage` of its host over its training, if measured.
        notes: its tuner's caveats (e.g. a feature turned off after a failure).
    """

    task: str
    host: str = ""
    chief: bool = False
    final: bool = False
    epochs: int = 0
    train: StepStats = dataclasses.field(default_factory=StepStats)
    cpu: Optional[CpuUsage] = None
    notes: List[str] = dataclasses.field(default_factory=list)

    @property
    def mean_input_wait_ms(self) -> Optional[float]:
        """Mean input wait per training step, the straggler rule's measure."""
        return self.train.input_wait.mean_ms


@dataclasses.dataclass
class MultiWorkerSummary:
    """All workers of a multi-worker run, as one worker's report sees them.

    The chief's report compares every worker and names the straggler; another
    worker's report holds only its own summary (the chief aggregates).

    Attributes:
        task: the task of the worker whose report this is, e.g. "worker:0".
        chief: the chief's task.
        tasks: every task that trains, in order.
        workers: the `WorkerSummary` of each worker found, in task order.
        missing: tasks whose summary was not found (or not final at the end
            of fit, when the chief waited for it).
        straggler: the task of the straggler, or `None` when no worker waits
            for input clearly longer than the others (or fewer than two were
            measured).
        straggler_reason: the rule applied, with the numbers.
        waited_s: how long the chief waited for the other workers at the end
            of fit; `None` at the end of an epoch or on another worker.
    """

    task: str
    chief: str
    tasks: List[str] = dataclasses.field(default_factory=list)
    workers: List[WorkerSummary] = dataclasses.field(default_factory=list)
    missing: List[str] = dataclasses.field(default_factory=list)
    straggler: Optional[str] = None
    straggler_reason: str = ""
    waited_s: Optional[float] = None

    def worker(self, task: str) -> Optional[WorkerSummary]:
        """The summary of `task`, or `None` if it is missing."""
        return next((worker for worker in self.workers if worker.task == task), None)


@dataclasses.dataclass(frozen=True)
class WorkerIdentity:
    """Where this process sits in a multi-worker cluster.

    Attributes:
        task: this worker's task, e.g. "worker:1".
        chief: the chief's task ("chief:0" if the cluster has a chief job,
            else "worker:0", as in TensorFlow).
        tasks: every training task of the cluster, in order.
    """

    task: str
    chief: str
    tasks: Tuple[str, ...]

    @property
    def is_chief(self) -> bool:
        """Whether this worker is the chief."""
        return self.task == self.chief

    @property
    def folder(self) -> str:
        """This worker's folder name under `workers/`, e.g. "worker_1"."""
        return task_folder(self.task)


def identity_of(strategy) -> Optional[WorkerIdentity]:
    """This worker's place in the cluster of a `MultiWorkerMirroredStrategy`.

    Args:
        strategy: a `tf.distribute.Strategy` (e.g. `model.distribute_strategy`).

    Returns:
        The `WorkerIdentity`, or `None` for any other strategy and for a
        cluster of one worker.
    """
    tf = tensorflow()
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return None
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or resolver.task_type is None:
        return None
    return identity_from_cluster(
        resolver.cluster_spec().as_dict(), resolver.task_type, resolver.task_id
    )


def identity_from_environment() -> Optional[WorkerIdentity]:
    """This worker's place in the cluster, for a custom training loop.

    Uses the strategy in scope if it is a `MultiWorkerMirroredStrategy`, else the
    `TF_CONFIG` environment variable that strategy reads (unless it names a
    parameter-server cluster, whose workers do not run the loop).

    Returns:
        The `WorkerIdentity`, or `None` outside a multi-worker cluster.
    """
    tf = tensorflow()
    identity = identity_of(tf.distribute.get_strategy())
    if identity is not None:
        return identity
    try:
        config = json.loads(os.environ.get("TF_CONFIG") or "{}")
        task = config.get("task") or {}
        cluster = config.get("cluster") or {}
        if "ps" in cluster:
            # Parameter-server training: the workers do not run the loop.
            return None
        return identity_from_cluster(cluster, task.get("type"), int(task.get("index", 0)))
    except (ValueError, TypeError, AttributeError):
        return None


def identity_from_cluster(cluster: Dict, task_type: Optional[str], task_id: int):
    """The `WorkerIdentity` of task `task_type:task_id` in `cluster`.

    Args:
        cluster: the cluster as in `TF_CONFIG`, e.g. `{"worker": ["host:port",
            ...]}` (a job's tasks may also be a dict of index to address).
        task_type: "chief" or "worker" (other jobs do not train).
        task_id: the task's index in its job.

    Returns:
        The `WorkerIdentity`, or `None` when the task does not train or the
        cluster trains on fewer than two workers.

    Example:

    >>> identity = identity_from_cluster({"worker": ["a:1", "b:1"]}, "worker", 1)
    >>> identity.task, identity.chief, identity.is_chief
    ('worker:1', 'worker:0', False)
    """
    tasks = tuple(
        f"{job}:{index}"
        for job in _TRAINING_JOBS
        for index in sorted(int(i) for i in _task_indices(cluster.get(job)))
    )
    task = f"{task_type}:{task_id}"
    if len(tasks) < 2 or task not in tasks:
        return None
    chief = "chief:0" if "chief:0" in tasks else "worker:0"
    return WorkerIdentity(task=task, chief=chief, tasks=tasks)


def task_folder(task: str) -> str:
    """A task's folder name under `workers/`: "worker:1" -> "worker_1"."""
    return task.replace(":", "_")


def summary_path(log_dir: str, task: str) -> str:
    """Where the summary of `task` is written under `log_dir`."""
    return os.path.join(log_dir, WORKERS_DIR, task_folder(task), SUMMARY_FILENAME)


def write_summary(summary: WorkerSummary, log_dir: str) -> str:
    """Writes a worker's summary into the shared `log_dir`, atomically.

    Args:
        summary: the `WorkerSummary`.
        log_dir: the log dir every worker was given (local or remote).

    Returns:
        The path written.
    """
    path = summary_path(log_dir, summary.task)
    text = json.dumps(dataclasses.asdict(summary), default=encode_json_value, allow_nan=False)
    return files.write_atomically(os.path.dirname(path), os.path.basename(path), text)


def read_summary(log_dir: str, task: str) -> Optional[WorkerSummary]:
    """Reads the summary of `task`, or `None` if it is not there (or unreadable).

    Args:
        log_dir: the shared log dir.
        task: e.g. "worker:1".

    Returns:
        The `WorkerSummary`, or `None`.
    """
    path = summary_path(log_dir, task)
    try:
        return from_dict(WorkerSummary, json.loads(files.read_text(path)), path)
    except FileNotFoundError:
        return None
    except (ValueError, OSError) as error:
        # Written by a newer tuner, or being replaced: as good as missing.
        logger.info("keras-pipeline-tuner: cannot read %s: %s", path, error)
        return None


def remove_summaries(log_dir: str, tasks: Sequence[str]) -> None:
    """Removes summaries a previous run left for `tasks` in `log_dir`.

    Args:
        log_dir: the shared log dir.
        tasks: the tasks whose summaries to remove.
    """
    for task in tasks:
        files.remove(summary_path(log_dir, task))


def compare(
    identity: WorkerIdentity,
    summaries: Sequence[WorkerSummary],
    final: bool = False,
    waited_s: Optional[float] = None,
) -> MultiWorkerSummary:
    """Compares the workers' summaries and names the straggler.

    Args:
        identity: the `WorkerIdentity` of the worker doing the comparison.
        summaries: the summaries found, this worker's included.
        final: whether only summaries written at the end of fit count (the
            others are listed as missing).
        waited_s: how long the chief waited for them.

    Returns:
        The `MultiWorkerSummary`.
    """
    by_task = {summary.task: summary for summary in summaries}
    workers = [
        by_task[task]
        for task in identity.tasks
        if task in by_task and (by_task[task].final or not final)
    ]
    found = {worker.task for worker in workers}
    straggler, reason = find_straggler(workers)
    return MultiWorkerSummary(
        task=identity.task,
        chief=identity.chief,
        tasks=list(identity.tasks),
        workers=workers,
        missing=[task for task in identity.tasks if task not in found],
        straggler=straggler,
        straggler_reason=reason,
        waited_s=waited_s,
    )


def find_straggler(workers: Sequence[WorkerSummary]) -> Tuple[Optional[str], str]:
    """Names the worker whose steps wait longest for input, if one clearly does.

    Args:
        workers: the workers' summaries.

    Returns:
        The straggler's task (or `None`) and the rule applied, with its numbers.

    Example:

    ```python
    task, reason = find_straggler(report.workers.workers)
    ```
    """
    measured = sorted(
        (worker for worker in workers if worker.mean_input_wait_ms is not None),
        key=lambda worker: worker.mean_input_wait_ms,
        reverse=True,
    )
    if len(measured) < 2:
        return None, (
            f"{STRAGGLER_RULE} Fewer than two workers measured their input wait, so "
            "none is named."
        )
    first, second = measured[0], measured[1]
    gap = first.mean_input_wait_ms - second.mean_input_wait_ms
    step = first.train.step.mean_ms or 0.0
    numbers = (
        f"{first.task} waits {first.mean_input_wait_ms:.2f} ms per step for input, "
        f"{second.task} {second.mean_input_wait_ms:.2f} ms"
    )
    if gap < max(_STRAGGLER_MIN_GAP_MS, _STRAGGLER_MIN_GAP_SHARE * step):
        return None, (
            f"{STRAGGLER_RULE} {numbers}: no worker waits clearly longer (by "
            f"{_STRAGGLER_MIN_GAP_MS:.0f} ms and {_STRAGGLER_MIN_GAP_SHARE * 100:.0f} % "
            "of a step), so none is named."
        )
    return first.task, f"{STRAGGLER_RULE} {numbers}."


class WorkerExchange:
    """One worker's side of the exchange of summaries through the log dir.

    Args:
        identity: this worker's `WorkerIdentity`.
        log_dir: the log dir every worker was given; `None` exchanges
            nothing (each worker reports alone).
        timeout_s: how long the chief waits at the end of fit for the other
            workers' final summaries.

    Example:

    ```python
    identity = identity_of(model.distribute_strategy)
    exchange = WorkerExchange(identity, "logs/run1", timeout_s=30)
    exchange.begin_fit()
    exchange.publish(summary)                       # every worker, each epoch
    view = exchange.collect(summary, final=True)    # at the end of fit
    ```
    """

    def __init__(self, identity: WorkerIdentity, log_dir: Optional[str], timeout_s: float):
        self.identity = identity
        self.log_dir = log_dir
        self.timeout_s = timeout_s

    def output_dir(self) -> Optional[str]:
        """Where this worker writes its report and TensorBoard run.

        The chief writes into the log dir itself; another worker into its own
        folder under `workers/`, so that it overwrites nothing of the chief's.
        """
        if self.log_dir is None or self.identity.is_chief:
            return self.log_dir
        return os.path.join(self.log_dir, WORKERS_DIR, self.identity.folder)

    def begin_fit(self) -> None:
        """At the start of fit, the chief removes summaries of an earlier run.

        No other worker can have written this run's summary yet: it writes one
        only after a training step, and no step ends before the chief's has run.
        """
        if self.log_dir is not None and self.identity.is_chief:
            remove_summaries(self.log_dir, self.identity.tasks)

    def publish(self, summary: WorkerSummary) -> None:
        """Writes this worker's summary where the chief reads it."""
        if self.log_dir is not None:
            write_summary(summary, self.log_dir)

    def collect(self, own: WorkerSummary, final: bool) -> MultiWorkerSummary:
        """Gathers the workers' summaries (the chief) or only its own (the others).

        Args:
            own: this worker's latest summary.
            final: at the end of fit: the chief waits up to `timeout_s` for the
                other workers' final summaries; otherwise it reads what is there.

        Returns:
            The `MultiWorkerSummary`.
        """
        identity = self.identity
        if not identity.is_chief:
            view = compare(identity, [own])
            view.missing = []
            view.straggler_reason = f"The chief ({identity.chief}) compares the workers."
            return view
        others = [task for task in identity.tasks if task != identity.task]
        began = time.monotonic()
        found: Dict[str, WorkerSummary] = {}
        while True:
            for task in others:
                if task in found and (found[task].final or not final):
                    continue
                summary = read_summary(self.log_dir, task) if self.log_dir else None
                if summary is not None:
                    found[task] = summary
            complete = all(
                task in found and (found[task].final or not final) for task in others
            )
            waited = time.monotonic() - began
            if complete or not final or self.log_dir is None or waited >= self.timeout_s:
                break
            time.sleep(_POLL_S)
        view = compare(
            identity,
            [own, *found.values()],
            final=final,
            waited_s=waited if final else None,
        )
        return view


def missing_note(view: MultiWorkerSummary, log_dir: Optional[str]) -> Optional[str]:
    """A note on the workers whose summary the chief did not find, if any.

    Args:
        view: the chief's `MultiWorkerSummary` at the end of fit.
        log_dir: the log dir the chief read.

    Returns:
        The note, or `None` when no worker is missing.
    """
    if not view.missing:
        return None
    names = ", ".join(view.missing)
    if log_dir is None:
        return (
            f"Workers {names} are not compared: without a log_dir the workers have no "
            "place to share their summaries. Give every worker the same log_dir."
        )
    waited = f" within {view.waited_s:.0f} s" if view.waited_s is not None else ""
    return (
        f"No final summary from {names} in {os.path.join(log_dir, WORKERS_DIR)}{waited}: "
        "the comparison covers the other workers only. Every worker must be given the "
        "same log_dir, on storage all of them reach (e.g. a network file system or "
        "gs://...); a worker whose tuner could not write there says so in its own log."
    )


def worker_rows(view: MultiWorkerSummary) -> List[Tuple[str, ...]]:
    """The comparison as table rows, for the terminal and TensorBoard.

    Columns: task, host, steps, mean input wait ms, mean compute ms, mean step
    ms, input %, CPU busy %, and what the worker is (chief, straggler, missing).

    Args:
        view: the `MultiWorkerSummary`.

    Returns:
        One tuple of strings per task, in task order.
    """
    rows = []
    for task in view.tasks:
        worker = view.worker(task)
        roles = []
        if task == view.chief:
            roles.append("chief")
        if task == view.straggler:
            roles.append("straggler")
        if worker is None:
            if task in view.missing:
                roles.append("missing")
            rows.append((task, "-", "-", "-", "-", "-", "-", "-", ", ".join(roles)))
            continue
        stats = worker.train
        fraction = stats.input_fraction
        rows.append(
            (
                task,
                worker.host or "-",
                str(stats.steps),
                format_ms(stats.input_wait.mean_ms),
                format_ms(stats.compute.mean_ms),
                format_ms(stats.step.mean_ms),
                "-" if fraction is None else f"{fraction * 100:.1f}",
                "-" if worker.cpu is None else f"{worker.cpu.busy * 100:.0f}",
                ", ".join(roles),
            )
        )
    return rows


WORKER_COLUMNS = (
    "worker",
    "host",
    "steps",
    "input wait ms",
    "compute ms",
    "step ms",
    "input %",
    "CPU busy %",
    "",
)


def checked_tensorboard_workers(value) -> str:
    """Validates `PipelineTuner(tensorboard_workers=...)`.

    Raises:
        ValueError: naming the accepted values.
    """
    if value not in TENSORBOARD_WORKERS or not isinstance(value, str):
        raise ValueError(
            f"`tensorboard_workers` must be 'chief' (only the chief writes TensorBoard "
            f"summaries) or 'all' (every worker, each into <log_dir>/workers/<task>/), "
            f"got {value!r}."
        )
    return value


def checked_timeout(value) -> float:
    """Validates `PipelineTuner(worker_timeout_s=...)`.

    Raises:
        ValueError: naming what to pass.
    """
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        raise ValueError(
            f"`worker_timeout_s` must be a number of seconds >= 0 (how long the chief "
            f"waits for the other workers at the end of fit), got {value!r}. Pass e.g. "
            "worker_timeout_s=30."
        )
    return float(value)


def this_host() -> str:
    """The host name, as a worker's summary records it."""
    return socket.gethostname()


def _task_indices(job) -> List:
    if job is None:
        return []
    if isinstance(job, dict):
        return list(job.keys())
    return list(range(len(job)))
