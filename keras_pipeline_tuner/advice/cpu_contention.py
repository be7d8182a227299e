"""Contention from CPU use: the compute slowdown the input's CPU work predicts.

On the CPU, an input pipeline's threads and worker processes share the cores
with the model's step: much of the pipeline's cost shows up as slower compute,
not as a wait at the fetch. Training already shows how much CPU the input took,
without running anything after it:

- the user's Python calls made off the training thread (tf.data
  `py_function` / `numpy_function` / `from_generator`, a PyDataset's worker
  threads): their CPU time, timed where the fit made them
  (`instrumentation.user_calls`), over the span the CPU meter read;
- the process's children (a DataLoader's or a PyDataset's worker processes):
  their CPU time over the run (`timing.cpu_usage`), unless the input is known
  to start none (`Pipeline.worker_processes`);
- a tf.data pipeline's stages of TensorFlow ops: their processing time per
  batch in tf.data's own live model (`profiling.live_model`), times the
  batches training read. tf.data times a stage by its threads' clocks, which a
  busy machine stretches, so the input's cores are never more than the
  process used.

Their average cores are the input's CPU seconds a second of training, and
their share of all the CPU work done on the job's CPUs is the input's share.
Where the CPUs are saturated, the cores freed by a free input go to everything
that runs on them, in proportion to what each got: the step's gain is its
part of them, and the step shrinks by the input's cores over all the busy
cores, the process's and other processes' alike (`CpuUsage.others_cores`; on
a quiet machine the process's own). Scaled by how busy the CPUs were (idle
cores absorb the input's work; from `BUSY_FRACTION` busy, all of it counts),
it predicts the share of the step the input cost inside the compute:

    contention = min(input cores / (process cores + others' cores), input cores,
                     compute / step) x min(busy / 0.8, 1)

Its CPU seconds can displace no more of the step than themselves: the share is
never above the input's cores (a step that sleeps, or waits on a device, uses
little CPU, and the input is then most of the job's CPU while it takes little
from the step).

Measured on 2 cores, each case's own process alone on them (real-time
priority), the steady step on the real input against an in-memory copy of its
batches (`bench/contention_truth.py`): a `py_function` map computing 3 ms a
batch in Python, 27.5 % true against 28-29 % predicted; the tf.data guide's
map in a custom loop, 7.2 % against 11-12 %; a DataLoader's two worker
processes, 66.7 % against 58-62 %.

It is a prediction, and says so. Where the replay after training ran, its
measured figure decides and this one is shown beside it. Calls the fetch makes
on the training thread (a Python generator on JAX and torch) are the wait
itself, not contention, and are left out.
"""

import dataclasses
from typing import List
from typing import Optional
from typing import Sequence
from typing import Tuple

from keras_pipeline_tuner.timing.cpu_usage import BUSY_FRACTION

# Calls made on the training thread, inside the fetch: already in the wait.
ON_TRAINING_THREAD = frozenset({"generator next"})
# Below this share of the step the estimate is not worth a word.
NEGLIGIBLE = 0.01
# The kernel counts a process's children's CPU time in clock ticks (10 ms),
# four counters rounded apiece: below ten ticks over the span it tells nothing.
CHILDREN_RESOLUTION_S = 0.1


@dataclasses.dataclass(frozen=True)
class CpuContention:
    """The share of step time the input's CPU use predicts it cost the compute.

    Attributes:
        fraction: the predicted share of step time (of the compute part).
        input_cores: the cores the input's threads and workers kept busy on
            average while training ran.
        budget_cpus: the CPUs the job may use.
        busy: the share of those CPUs that was busy (`CpuUsage.busy`).
        parts: what the input's cores consist of, each in words.
        process_cores: the cores the whole process kept busy (its children
            included), of which the input's are a share; `None` in reports
            written before it was kept.
        others_cores: the cores other processes kept busy on the job's CPUs,
            which share what a free input would free.

    Example:

    >>> found = CpuContention(0.21, 0.4, 2.0, 0.95, ["Python calls of map(load) 0.40 cores"],
    ...                       process_cores=1.9)
    >>> found.describe().split(": ")[1]
    'predicted 21.0 % of step time (CPU use)'
    """

    fraction: float
    input_cores: float
    budget_cpus: float
    busy: float
    parts: List[str] = dataclasses.field(default_factory=list)
    process_cores: Optional[float] = None
    others_cores: float = 0.0

    def describe(self) -> str:
        """The estimate in one phrase, with what it rests on."""
        of_job = ""
        if self.process_cores:
            share = self.input_cores / max(self.process_cores, self.input_cores)
            of_job = f", {share * 100:.0f} % of the {self.process_cores:.2f} the job used"
            if self.others_cores >= NEGLIGIBLE:
                of_job += f" (other processes used {self.others_cores:.2f} beside it)"
        return (
            f"the input's threads and workers used {self.input_cores:.2f} cores{of_job}, "
            f"of {self.budget_cpus:g} CPUs ({'; '.join(self.parts)}; "
            f"the CPUs {self.busy * 100:.0f} % busy): predicted {self.fraction * 100:.1f} % "
            "of step time (CPU use)"
        )


def cpu_contention(
    cpu,
    user_calls: Sequence,
    step_ms: Optional[float],
    compute_ms: Optional[float],
    stage_table=None,
    steps: int = 0,
    worker_processes: Optional[bool] = None,
) -> Optional[CpuContention]:
    """Predicts the compute the input's CPU use cost, from what training measured.

    Args:
        cpu: the run's `CpuUsage`, or `None`.
        user_calls: the run's `UserCallTiming`s, per training batch where known.
        step_ms: the steady state's mean step.
        compute_ms: the steady state's mean compute per step.
        stage_table: the run's `profiling.live_model.StageTable`, or `None`.
        steps: the training steps the run read (batches, for the stage table).
        worker_processes: whether the input starts worker processes
            (`Pipeline.worker_processes`); with `False` the process's children
            are not the input's (another job's processes, started from it).

    Returns:
        The `CpuContention`, or `None` where nothing measured the input's CPU
        or it is negligible.

    Example:

    >>> from keras_pipeline_tuner.timing.cpu_usage import CpuUsage
    >>> from keras_pipeline_tuner.timing.cpu_budget import CpuBudget
    >>> cpu = CpuUsage(wall_s=10.0, cpu_count=2, process_cores=2.0, host_busy=1.0,
    ...                budget=CpuBudget(2, 2), children_cores=0.5)
    >>> round(cpu_contention(cpu, [], step_ms=10.0, compute_ms=10.0).fraction, 2)
    0.25
    """
    if cpu is None or not step_ms or step_ms <= 0 or compute_ms is None:
        return None
    cores, parts = input_cores(cpu, user_calls, stage_table, steps, worker_processes)
    budget = _budget_cpus(cpu)
    if cores <= 0 or budget <= 0:
        return None
    busy = cpu.busy
    # Never more than the input's own CPU seconds a second, one for one: a step
    # that sleeps or waits on a device uses little CPU, and the input's share
    # of the job's CPU is then near all of it while it slows the step little.
    # Of all the busy cores: on saturated CPUs the freed cores are shared by
    # everything that runs there, other processes too.
    others = cpu.others_cores
    share = min(cores / max(cpu.process_cores + others, cores), cores)
    fraction = min(share, compute_ms / step_ms, 1.0) * min(busy / BUSY_FRACTION, 1.0)
    if fraction < NEGLIGIBLE:
        return None
    return CpuContention(fraction, cores, budget, busy, parts, cpu.process_cores, others)


def input_cores(
    cpu,
    user_calls: Sequence,
    stage_table=None,
    steps: int = 0,
    worker_processes: Optional[bool] = None,
    least: float = NEGLIGIBLE,
) -> Tuple[float, List[str]]:
    """The cores the input's threads and workers kept busy, and what they consist of, in words.

    Args:
        cpu: the run's `CpuUsage`.
        user_calls: the run's `UserCallTiming`s.
        stage_table: the run's `profiling.live_model.StageTable`, or `None`.
        steps: the training steps the run read (batches, for the stage table).
        worker_processes: whether the input starts worker processes
            (`Pipeline.worker_processes`).
        least: the cores from which a tf.data stage counts.

    Returns:
        `(cores, parts)`, the cores never more than the process used.

    Example:

    >>> from keras_pipeline_tuner.timing.cpu_usage import CpuUsage
    >>> from keras_pipeline_tuner.timing.cpu_budget import CpuBudget
    >>> cpu = CpuUsage(wall_s=10.0, cpu_count=2, process_cores=2.0, host_busy=1.0,
    ...                budget=CpuBudget(2, 2), children_cores=0.5)
    >>> input_cores(cpu, [])
    (0.5, ['worker processes 0.50 cores'])
    """
    parts: List[str] = []
    cores = 0.0
    for timing in user_calls:
        if timing.source in ON_TRAINING_THREAD or cpu.wall_s <= 0:
            continue
        # Over the span the CPU meter read, as the workers' cores are: calls
        # run ahead of the steps that read their results.
        used = timing.cpu_ms * timing.calls / 1e3 / cpu.wall_s
        if used > 0:
            cores += used
            parts.append(f"Python calls of {timing.stage} {used:.2f} cores")
    called = {timing.stage for timing in user_calls}
    for row in getattr(stage_table, "rows", ()):
        # A stage of Python is counted by its calls' CPU time, not its wall; a
        # prefetch's own time is waiting, not work.
        if row.stage in called or row.added_by_tf or row.waits or cpu.wall_s <= 0 or not steps:
            continue
        used = row.ms_per_batch * steps / 1e3 / cpu.wall_s
        if used >= least and used > 0:
            cores += used
            parts.append(f"tf.data's {row.stage} {used:.2f} cores")
    if (
        worker_processes is not False
        and cpu.children_cores
        and cpu.children_cores * cpu.wall_s >= CHILDREN_RESOLUTION_S
    ):
        cores += cpu.children_cores
        parts.append(f"worker processes {cpu.children_cores:.2f} cores")
    cores = min(cores, cpu.process_cores)
    return cores, parts


def contention_ceiling(
    cpu,
    user_calls: Sequence,
    stage_table=None,
    steps: int = 0,
    worker_processes: Optional[bool] = None,
) -> Optional[float]:
    """The most of step time the input's CPU could take from the compute, where all of it is known.

    Every CPU second the input used is known where the input is a tf.data
    pipeline of TensorFlow ops alone (it calls no Python and starts no
    processes: `Pipeline.worker_processes` is `False`) and tf.data's live
    model timed its stages: it can displace no more of the step than those
    seconds, one for one (see `cpu_contention`). Elsewhere the input may have
    used CPU nothing measured, and there is no ceiling.

    Args:
        cpu: the run's `CpuUsage`, or `None`.
        user_calls: the run's `UserCallTiming`s.
        stage_table: the run's `profiling.live_model.StageTable`, or `None`.
        steps: the training steps the run read (batches, for the stage table).
        worker_processes: whether the input starts worker processes.

    Returns:
        The ceiling as a share of step time, or `None`.

    Example:

    >>> from keras_pipeline_tuner.timing.cpu_usage import CpuUsage
    >>> from keras_pipeline_tuner.timing.cpu_budget import CpuBudget
    >>> cpu = CpuUsage(wall_s=10.0, cpu_count=2, process_cores=1.0, host_busy=0.5,
    ...                budget=CpuBudget(2, 2))
    >>> contention_ceiling(cpu, [], stage_table=None, steps=100, worker_processes=False) is None
    True
    """
    if cpu is None or stage_table is None or worker_processes is not False or steps <= 0:
        return None
    cores, _ = input_cores(cpu, user_calls, stage_table, steps, worker_processes, least=0.0)
    return min(cores, 1.0)


def _budget_cpus(cpu) -> float:
    """The CPUs the job may use: its quota where one binds, else the CPUs it may run on."""
    budget = cpu.budget
    if budget is not None:
        return float(budget.limit_cpus)
    return float(cpu.cpu_count)
