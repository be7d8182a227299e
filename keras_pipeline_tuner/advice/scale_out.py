"""Advice for when one host is not enough: a straggling worker, saturated CPUs.

Two rules of the advisor live here, each resting on evidence the single-host
rules do not use:

- A multi-worker run whose straggler waits for input: in synchronous training
  every worker's step lasts as long as the slowest one's, so the job is judged
  by the straggler's input wait, and the first thing to do is to look at that
  worker (see `worker_reports` for the rule that names it).
- A run that waits for input although every stage that does work already runs
  in parallel, on a host whose CPUs are saturated: more threads have no CPU to
  run on. The tf.data service moves the pipeline to worker processes on other
  hosts (`dataset.apply(tf.data.experimental.service.distribute(...))`). It needs
  a pipeline made of TensorFlow ops: Python functions (`tf.py_function`,
  `from_generator`) cannot run on the service's workers, so such a pipeline
  gets no such advice.
"""

import dataclasses
from typing import TYPE_CHECKING
from typing import List
from typing import Optional
from typing import Sequence

from keras_pipeline_tuner.advice.recommendation import BOUND
from keras_pipeline_tuner.advice.recommendation import LINT
from keras_pipeline_tuner.advice.recommendation import Evidence
from keras_pipeline_tuner.advice.recommendation import ExpectedGain
from keras_pipeline_tuner.advice.recommendation import Recommendation
from keras_pipeline_tuner.advice.recommendation import free_input_gain
from keras_pipeline_tuner.pipeline.graph import kinds
from keras_pipeline_tuner.pipeline.lint.catalogue import PARALLELISING
from keras_pipeline_tuner.pipeline.lint.catalogue import PYTHON_GENERATOR
from keras_pipeline_tuner.pipeline.lint.data_service import GUIDE_URL
from keras_pipeline_tuner.pipeline.lint.data_service import service_stages
from keras_pipeline_tuner.timing.step_stats import StepStats
from keras_pipeline_tuner.timing.step_stats import verdict_for
from keras_pipeline_tuner.workers.exchange import task_folder

if TYPE_CHECKING:
    from keras_pipeline_tuner.pipeline.graph.model import Pipeline
    from keras_pipeline_tuner.timing.cpu_usage import CpuUsage
    from keras_pipeline_tuner.workers.exchange import MultiWorkerSummary

WORKERS = "workers"
CPU = "CPU usage"

STRAGGLER = "input-straggler"
OFFLOAD = "data-service-offload"

# Stage kinds that run a function: the work parallelism spreads.
_WORK_KINDS = (kinds.MAP, kinds.MAP_AND_BATCH, kinds.INTERLEAVE, kinds.FILTER)
# Findings that say a stage could still run on more threads: those whose fix
# parallelises, and a Python generator.
_STILL_SEQUENTIAL = PARALLELISING | {PYTHON_GENERATOR}
OFFLOAD_FIX = (
    "# On each host with idle CPUs, a service worker (and one dispatcher somewhere):\n"
    "#   tf.data.experimental.service.WorkerServer(\n"
    "#       tf.data.experimental.service.WorkerConfig(dispatcher_address=\"dispatcher:5050\"))\n"
    "ds = ds.apply(tf.data.experimental.service.distribute(\n"
    "    processing_mode=\"distributed_epoch\", service=\"grpc://dispatcher:5050\"))\n"
    "ds = ds.prefetch(tf.data.AUTOTUNE)"
)


def job_stats(stats: StepStats, workers: Optional["MultiWorkerSummary"]) -> StepStats:
    """The step statistics that limit the job.

    In synchronous multi-worker training every step waits for the slowest
    worker: when the straggler is another worker and waits longer for input
    than this one, the job is judged by its statistics.

    Args:
        stats: this worker's `StepStats`.
        workers: the chief's `MultiWorkerSummary`, if any.

    Returns:
        The straggler's `StepStats`, or `stats`.
    """
    straggler = _straggler(workers)
    if straggler is None or straggler.task == workers.task:
        return stats
    theirs, ours = straggler.train.input_fraction, stats.input_fraction
    if theirs is None or (ours is not None and ours >= theirs):
        return stats
    return straggler.train


def straggler_recommendation(
    workers: Optional["MultiWorkerSummary"],
) -> Optional[Recommendation]:
    """Names the worker every other one waits for, when it waits for input.

    Args:
        workers: the chief's `MultiWorkerSummary`, if any.

    Returns:
        The "input-straggler" `Recommendation`, or `None`.
    """
    straggler = _straggler(workers)
    if straggler is None or not verdict_for(straggler.train.input_fraction).input_bound:
        return None
    others = [w for w in workers.workers if w.task != straggler.task and w.train.steps]
    detail = (
        f"{straggler.task} waits {straggler.mean_input_wait_ms:.2f} ms per step for input "
        f"({straggler.train.input_fraction * 100:.1f} % of its step time)"
    )
    computes = [w.train.compute.mean_ms for w in others if w.train.compute.mean_ms is not None]
    waits = [w.mean_input_wait_ms for w in others if w.mean_input_wait_ms is not None]
    if waits:
        detail += f", the other workers at most {max(waits):.2f} ms"
    own_compute = straggler.train.compute.mean_ms
    if computes and own_compute is not None and max(computes) > own_compute:
        spread = f"{min(computes):.2f}-{max(computes):.2f}"
        if f"{min(computes):.2f}" == f"{max(computes):.2f}":
            spread = f"{max(computes):.2f}"
        detail += (
            f"; their compute ({spread} ms) exceeds {straggler.task}'s "
            f"({own_compute:.2f} ms) by the time they wait for it in the all-reduce"
        )
    host = f" on {straggler.host}" if straggler.host else ""
    return Recommendation(
        id=STRAGGLER,
        title=f"Speed up the input of {straggler.task}: every worker waits for it",
        severity="warning",
        evidence=[Evidence(WORKERS, detail + ".")],
        fix=(
            f"# What differs on {straggler.task}{host} from the other workers?\n"
            "# Its shard of the data, its storage, other jobs on its CPUs.\n"
            "# Its own report, with its profiler window if one was captured:\n"
            f"#   keras-pipeline-tuner report LOG_DIR/workers/{task_folder(straggler.task)}\n"
            "# The pipeline's recommendations below apply to every worker."
        ),
        expected_gain=free_input_gain(straggler.train),
        stage=None,
        reason=workers.straggler_reason,
    )


def offload_recommendation(
    run,
    findings: Sequence,
    pipeline: Optional["Pipeline"],
    cpu: Optional["CpuUsage"],
) -> Optional[Recommendation]:
    """Recommends the tf.data service when this host's CPUs are the limit.

    Needs all of: an input-bound run; a pipeline read from its graph whose
    stages that do work all run in parallel (AUTOTUNE, or at least as many
    threads as CPU cores) with no finding saying otherwise; no Python
    functions in it (the service's workers cannot run them); not reading from
    the service already; and CPUs busy `cpu_usage.BUSY_FRACTION` of the time.

    Args:
        run: the advisor's evidence of the run (its verdict, bound, clock
            evidence and CPU count).
        findings: the pipeline inspection's findings.
        pipeline: the `Pipeline` they were found in.
        cpu: the run's `CpuUsage`.

    Returns:
        The "data-service-offload" `Recommendation`, or `None`.
    """
    if not run.verdict.input_bound or cpu is None or not cpu.saturated:
        return None
    if pipeline is None or service_stages(pipeline):
        return None
    if any(
        finding.id in _STILL_SEQUENTIAL and str(finding.severity) == "warning"
        for finding in findings
    ):
        return None
    parallel = _parallel_work(pipeline, run.cpu_count)
    if not parallel:
        return None
    stages = ", ".join(stage.label for stage in parallel)
    gain = run.bound
    if gain is not None:
        gain = dataclasses.replace(
            gain,
            basis=BOUND,
            statement=gain.statement
            + " Service workers get there when together they produce batches faster than "
            "the model takes them: add workers until the wait is gone.",
        )
    else:
        gain = ExpectedGain(basis=BOUND, statement="The input wait was not measured.")
    return Recommendation(
        id=OFFLOAD,
        title="Move the preprocessing to tf.data service workers on other hosts",
        severity="warning",
        evidence=run.clock_evidence
        + [
            Evidence(LINT, f"every stage that does work already runs in parallel: {stages}."),
            Evidence(CPU, cpu.describe() + "."),
        ],
        fix=OFFLOAD_FIX,
        expected_gain=gain,
        stage=None,
        reason=(
            "Training waits for its input although every stage that does work already "
            f"runs in parallel, and {cpu.describe_busy()}: more threads have no CPU to run "
            "on. The tf.data service runs the pipeline on "
            "worker processes on other hosts and streams the batches to training; "
            "processing_mode=\"distributed_epoch\" gives each element to one worker "
            f"(each epoch sees every element once). Guide: {GUIDE_URL}"
        ),
    )


def _straggler(workers):
    if workers is None or workers.straggler is None:
        return None
    return workers.worker(workers.straggler)


def _parallel_work(pipeline: "Pipeline", cpu_count: int) -> List:
    """The stages that do work, if every one of them runs in parallel; else []."""
    work = []
    for stage in pipeline.stages:
        function = stage.function
        if stage.kind == kinds.FROM_GENERATOR or (
            function is not None and function.py_function_ops
        ):
            return []
        reads_files = stage.kind in kinds.READER_KINDS and (stage.files or 0) > 1
        if not reads_files and (
            stage.kind not in _WORK_KINDS or function is None or function.trivial
        ):
            continue
        if not (stage.parallel or stage.parallel_at_runtime):
            return []
        threads = stage.params.get("num_parallel_calls", stage.params.get("num_parallel_reads"))
        if isinstance(threads, int) and not isinstance(threads, bool) and threads < cpu_count:
            return []
        work.append(stage)
    return work
