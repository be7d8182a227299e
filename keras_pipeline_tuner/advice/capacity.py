"""The capacity model: the rate each tf.data stage can sustain, and the step it allows.

Plumber's operational analysis (Kuchnik et al., MLSys 2022) on the statistics
tf.data's live model measured (`profiling.live_model.StageTable`) and the CPU
budget the run read (`timing.cpu_budget`):

- a stage costs `c` ms of CPU per batch of the pipeline's output (its own
  processing time per output element); at its parallelism `p` it sustains
  `1000 p / c` batches a second (a sequential stage `p = 1`), and at most
  `1000 B / c` with the budget's `B` cores when it can run in parallel;
- the pipeline sustains the rate of its slowest stage, and never more than
  the budget's cores over the CPU all stages take a batch (`1000 B / sum c`);
- a pipeline that runs ahead of the step (tf.data prefetches) gives a step of
  the larger of the model's compute and the input's time per batch, and, where
  the model computes on the same cores (a CPU-only job), of the budget's cores
  sharing the compute and the input's CPU a batch (a stage's time taken as
  CPU: one that sleeps or waits on storage makes this term too large, and
  the predicted gain of speeding it up too small);
- a prefetch's own time is waiting for room in its buffer or for its input,
  not work: it costs nothing here.

From it: the predicted step of a change to one stage (parallel calls, a
cache read back), the cores that make the input free, and how much faster the
model may get before the input caps the step. Every figure here is a
prediction, labelled so where shown, and checked against `kpt.tune`'s
measurements in `bench/advice_accuracy.py`.

The cores that make the input free rest on CPU time, not on tf.data's stage
times: tf.data times a stage on its threads' clocks, which other work on the
cores stretches (a busy machine: up to twice the CPU) and which ops running on
several threads shrink. The job's CPU time a training step, as the CPU meter
measured it over the steady state (`timing.cpu_usage`: all its threads and
worker processes, the step's own work too), has to fit in a step with the
input free (the compute and the host's time between steps, less the time the
training thread waited for a core: other work on the cores stretches the
compute too): their ratio is the cores the job needs for the input to keep
ahead of the step (`bench/capacity_cores.py` checks it under cgroup CPU
quotas). tf.data's stage times remain the fallback where the meter measured
nothing.
"""

import dataclasses
import math
from typing import Optional
from typing import Tuple

# Changes the model predicts (`predicted_step_ms`).
PARALLEL = "parallel"
CACHE = "cache"
# The stage's work moved onto parallel calls, whatever its kind (a
# generator's work into a parallel map, a loader's work onto workers).
SPREAD = "spread"
# Stages whose work a parallel version runs on several threads.
_PARALLEL_KINDS = ("map(", "interleave(", "batch(", "filter(")
# The step with input free is never taken as less than this share of the
# measured one (the training thread's wait for a core also falls in input waits).
_LEAST_FREE_SHARE = 0.25


@dataclasses.dataclass(frozen=True)
class StepCpu:
    """The job's CPU a training step over the steady state (measured by the CPU meter).

    Attributes:
        cpu_ms: the CPU time of all its threads and worker processes a step
            (the input's and the step's own).
        delayed_ms: how long the training thread waited for a core a step
            (the kernel's run-queue delay: other work on the cores, a quota's
            throttling), or `None` where not read.
    """

    cpu_ms: float
    delayed_ms: Optional[float] = None


@dataclasses.dataclass(frozen=True)
class StageCapacity:
    """One stage's sustainable rate (predicted from its measured cost).

    Attributes:
        stage: the stage as the user wrote it.
        node: its graph node, if known.
        cpu_ms_per_batch: its CPU time per batch of the output (measured).
        threads: the parallelism it ran at (1 for a sequential stage).
        batches_per_s: the rate it sustains at `threads`.
        batches_per_s_at_budget: the rate at the budget's cores, where it can
            run in parallel (its rate at `threads` otherwise).
    """

    stage: str
    node: Optional[str]
    cpu_ms_per_batch: float
    threads: int
    batches_per_s: float
    batches_per_s_at_budget: float


@dataclasses.dataclass(frozen=True)
class Capacity:
    """The pipeline's capacity against the model's compute (predicted).

    Attributes:
        stages: each stage's `StageCapacity`, sources first.
        cpu_budget: the cores the model assumes (the run's budget, else
            tf.data's own).
        slowest: the stage that sustains the fewest batches a second.
        batches_per_s: the pipeline's sustainable rate.
        input_ms: the input's time per batch at that rate.
        compute_ms: the model's compute a step (measured by the step clock).
        step_ms: the step it allows: the largest of `compute_ms`, `input_ms`
            and the two sharing the budget's cores.
        cores_for_input_free: the cores of CPU time the job needs for the
            input to keep ahead of the step (a quota may give a fraction): its
            CPU time a step (the input's and the step's own) over the step
            with input free (`cpu_ms_per_step`, `free_step_ms`); `None` when
            no core count would (a sequential stage slower than the step) or
            without a compute time.
        faster_model_cap: a model up to this many times faster gains in full
            before the input caps its step (1 or less: it already does).
        cpu_ms_per_step: the job's CPU time a training step over the steady
            state (measured by the CPU meter), or `None` where not measured:
            then the cores rest on tf.data's stage times.
        free_step_ms: the step with input free the cores are for: the
            compute and the host's time between steps, less the training
            thread's wait for a core (all measured).
    """

    stages: Tuple[StageCapacity, ...] = ()
    cpu_budget: int = 1
    slowest: str = ""
    batches_per_s: float = 0.0
    input_ms: float = 0.0
    compute_ms: Optional[float] = None
    step_ms: Optional[float] = None
    cores_for_input_free: Optional[float] = None
    faster_model_cap: Optional[float] = None
    cpu_ms_per_step: Optional[float] = None
    free_step_ms: Optional[float] = None

    def input_caps(self) -> bool:
        """Whether the input's rate, not the compute, sets the step the model predicts."""
        return self.compute_ms is not None and self.input_ms >= self.compute_ms

    def stage(self, stage: str, node: Optional[str] = None) -> Optional[StageCapacity]:
        """A stage's capacity, by graph node or label."""
        for item in self.stages:
            if node is not None and item.node == node:
                return item
        return next((item for item in self.stages if item.stage == stage), None)

    def predicted_step_ms(
        self, stage: str, change: str, node: Optional[str] = None
    ) -> Optional[float]:
        """The step after `change` to `stage` (predicted), or `None` when the model cannot say.

        Args:
            stage: the stage changed, as the user wrote it.
            change: `PARALLEL` (parallel calls at the budget's cores, for a
                stage that can run them), `SPREAD` (its work moved onto
                parallel calls at the budget's cores, e.g. a generator's work
                into a parallel map) or `CACHE` (a cache after it, read back:
                it and its inputs cost nothing on the passes that read it).
            node: its graph node, if known.

        Returns:
            The predicted step in milliseconds.

        Example:

        >>> table = _example()
        >>> capacity = capacity_of(table, compute_ms=5.0, cpu_budget=4)
        >>> capacity.step_ms, capacity.predicted_step_ms("map(decode)", PARALLEL)
        (20.0, 6.25)
        """
        target = self.stage(stage, node)
        if target is None or self.compute_ms is None:
            return None
        if change in (PARALLEL, SPREAD):
            spread = 1000.0 * max(self.cpu_budget, target.threads) / target.cpu_ms_per_batch
            at_budget = spread if change == SPREAD else target.batches_per_s_at_budget
            rates = [
                at_budget if item is target else item.batches_per_s for item in self.stages
            ]
            cpu = sum(item.cpu_ms_per_batch for item in self.stages)
        elif change == CACHE:
            index = self.stages.index(target)
            kept = self.stages[index + 1 :]
            rates = [item.batches_per_s for item in kept]
            cpu = sum(item.cpu_ms_per_batch for item in kept)
        else:
            return None
        rate = _pipeline_rate(rates, cpu, self.cpu_budget)
        return _step_ms(self.compute_ms, 1000.0 / rate if rate else 0.0, cpu, self.cpu_budget)

    def evidence(self, stage: str, node: Optional[str] = None) -> Optional[str]:
        """What the model says of one stage, with its line, or `None` for a stage it lacks."""
        held = self.stage(stage, node)
        if held is None:
            return None
        return (
            f"{stage} takes {held.cpu_ms_per_batch:.2f} ms of CPU a batch at "
            f"{held.threads} thread(s): it sustains {held.batches_per_s:.1f} batches/s "
            f"(its time measured by tf.data; the rate predicted). {self.line()}"
        )

    def line(self) -> str:
        """The model's answer in one line, for people (every figure a prediction).

        Example:

        >>> print(capacity_of(_example(), compute_ms=5.0, cpu_budget=4).line())
        ... # doctest: +ELLIPSIS
        Capacity model (predicted): the input sustains 50.0 batches/s (20.00 ms a batch, ...
        """
        text = (
            f"Capacity model (predicted): the input sustains {self.batches_per_s:.1f} batches/s "
            f"({self.input_ms:.2f} ms a batch, {self.slowest} the slowest stage)"
        )
        if self.compute_ms is None:
            return text + "."
        text += f" against a compute of {self.compute_ms:.2f} ms a step"
        if self.cores_for_input_free is None:
            text += "; no core count makes the input free (a sequential stage is slower)"
        elif self.cpu_ms_per_step is not None:
            text += (
                f"; {self.cores_for_input_free:.2f} cores make the input free (the job's "
                f"{self.cpu_ms_per_step:.2f} ms of CPU a step, measured, within a step of "
                f"{self.free_step_ms:.2f} ms: compute and the time between steps, less "
                "waits for a core)"
            )
        else:
            text += (
                f"; {self.cores_for_input_free:.2f} cores make the input free (from tf.data's "
                "stage times, which load stretches)"
            )
        if self.faster_model_cap is not None and self.faster_model_cap > 1.0:
            text += (
                f"; a model up to {self.faster_model_cap:.1f}x faster gains in full before "
                "the input caps its step"
            )
        else:
            text += "; a faster model gains nothing: the input already caps the step"
        return text + "."


def capacity_of(
    table,
    compute_ms: Optional[float] = None,
    cpu_budget: Optional[int] = None,
    step_cpu: Optional[StepCpu] = None,
    gap_ms: Optional[float] = None,
) -> Optional[Capacity]:
    """The capacity model of a stage table.

    Args:
        table: a `StageTable` (tf.data's live model).
        compute_ms: the model's compute a step (measured), if known.
        cpu_budget: the cores the job may use; tf.data's own budget when `None`.
        step_cpu: the job's `StepCpu` over the steady state (the CPU
            meter's), for the cores that make the input free.
        gap_ms: the host's time between steps (measured), part of the step
            with input free.

    Returns:
        The `Capacity`, or `None` without a timed stage.

    Example:

    >>> capacity = capacity_of(_example(), compute_ms=30.0, cpu_budget=2,
    ...                        step_cpu=StepCpu(12.0, delayed_ms=8.0), gap_ms=2.0)
    >>> capacity.free_step_ms, capacity.cores_for_input_free
    (24.0, 0.5)
    """
    if table is None:
        return None
    budget = max(int(cpu_budget or table.cpu_budget or 1), 1)
    stages = []
    for row in table.rows:
        if row.ms_per_batch <= 0 or row.waits:
            continue
        threads = max(int(row.parallelism or 1), 1)
        rate = 1000.0 * threads / row.ms_per_batch
        parallel = row.parallelism is not None or row.stage.startswith(_PARALLEL_KINDS)
        at_budget = 1000.0 * max(budget, threads) / row.ms_per_batch if parallel else rate
        stages.append(
            StageCapacity(row.stage, row.node, row.ms_per_batch, threads, rate, at_budget)
        )
    if not stages:
        return None
    cpu = sum(item.cpu_ms_per_batch for item in stages)
    rate = _pipeline_rate([item.batches_per_s for item in stages], cpu, budget)
    slowest = min(stages, key=lambda item: item.batches_per_s)
    input_ms = 1000.0 / rate
    step_ms = _step_ms(compute_ms, input_ms, cpu, budget) if compute_ms else None
    free_ms = _free_step_ms(compute_ms, gap_ms, step_cpu)
    measured = step_cpu.cpu_ms if step_cpu is not None and step_cpu.cpu_ms > 0 else None
    return Capacity(
        stages=tuple(stages),
        cpu_budget=budget,
        slowest=slowest.stage,
        batches_per_s=rate,
        input_ms=input_ms,
        compute_ms=compute_ms,
        step_ms=step_ms,
        cores_for_input_free=_cores_for(stages, compute_ms, measured, free_ms),
        faster_model_cap=compute_ms / max(input_ms, cpu / budget) if compute_ms else None,
        cpu_ms_per_step=measured if compute_ms else None,
        free_step_ms=free_ms,
    )


def _free_step_ms(compute_ms, gap_ms, step_cpu: Optional[StepCpu]) -> Optional[float]:
    """The step with input free: compute and gap, less the training thread's wait for a core."""
    if not compute_ms:
        return None
    measured = compute_ms + max(gap_ms or 0.0, 0.0)
    delayed = step_cpu.delayed_ms if step_cpu is not None else None
    if not delayed or delayed <= 0:
        return measured
    return max(measured - delayed, _LEAST_FREE_SHARE * measured)


def _step_ms(compute_ms: float, input_ms: float, cpu_ms: float, budget: int) -> float:
    """The step: compute, the input's time a batch, or both on the budget's shared cores."""
    return max(compute_ms, input_ms, (compute_ms + cpu_ms) / budget)


def _pipeline_rate(rates, cpu_ms: float, budget: int) -> float:
    """The slowest stage's rate, within the budget's cores over the CPU a batch takes."""
    bound = 1000.0 * budget / cpu_ms if cpu_ms > 0 else math.inf
    return min([*rates, bound])


def _cores_for(
    stages, compute_ms: Optional[float], cpu_ms: Optional[float], free_ms: Optional[float]
) -> Optional[float]:
    """Cores whose work keeps the input ahead of a step of `free_ms`: the input is then free.

    The job's measured CPU a step (`cpu_ms`) where there is one; else tf.data's
    stage times over the compute (the step's own cores left out).
    """
    if not compute_ms:
        return None
    for item in stages:
        sequential = item.batches_per_s_at_budget == item.batches_per_s and item.threads == 1
        if sequential and item.cpu_ms_per_batch > compute_ms:
            return None
    if cpu_ms is not None and free_ms:
        return cpu_ms / free_ms
    cpu = sum(item.cpu_ms_per_batch for item in stages)
    return cpu / compute_ms


def _example():
    """A stage table for the examples: a sequential map of 20 ms a batch."""
    from keras_pipeline_tuner.profiling.live_model import StageRow
    from keras_pipeline_tuner.profiling.live_model import StageTable

    return StageTable(
        rows=(
            StageRow("range(0, 100, 1)", ms_per_batch=0.0),
            StageRow("map(decode)", ms_per_batch=20.0, share=1.0),
        ),
        batches=10,
        cpu_budget=4,
    )
