"""Advice from the CPUs the job really has: a container's quota, and the kernel's throttling.

Three rules, each resting on the run's `CpuUsage` (its `CpuBudget` and its
`Throttling`, see `timing.cpu_budget`) rather than on the step clock:

- tf.data's AUTOTUNE sizes the pipeline's parallelism from the CPUs the
  process may be scheduled on (its affinity mask), not from a container's
  quota. Under a quota below that count the pipeline runs more threads than
  it has CPU time for, and the kernel stops the whole group once the quota is
  used up. The advice sets `options.autotune.cpu_budget` to the budget (and a
  private thread pool set above it, down to it). A private pool of the
  budget's size joins the advice only where it was timed faster on the user's
  pipeline, under the same quota (`measure_fixes`); otherwise the fix says to
  keep tf.data's own, with the timing, or to time it first. Under a 1-CPU
  quota on two cores (`bench/cpu_quota.py`) a pool of one thread made a fit's
  steps 1.20x slower quiet and 1.09x beside two busy loops (medians of three
  rounds, wall time a step), where AUTOTUNE's budget alone left them within
  the rounds' spread; on a host with many more CPUs than its quota, where
  tf.data's own pool has a thread per CPU, it may not.
- A Keras `PyDataset` or a torch `DataLoader` with more worker processes than
  the budget has CPUs for runs them in turn, not in parallel: the advice sets
  `workers` / `num_workers` to the budget.
- A job throttled in a meaningful share of its periods (`CpuUsage.throttled`) is
  slowed by the kernel, the model as much as the pipeline: its verdict says how
  the two share the CPU time the quota gives, not how fast either could run.
  The advice states the figures and the two ways out (a larger limit, fewer
  threads).

None of them has a step-time figure of its own: a quota is a ceiling on CPU
time, and what fewer threads bring to the steps depends on what they were
contending for (the pipeline timed alone has the quota to itself). `kpt.tune`
times both thread changes with the budget's value too.
"""

from typing import TYPE_CHECKING
from typing import Iterable
from typing import List
from typing import Optional

from keras_pipeline_tuner.advice.recommendation import BOUND
from keras_pipeline_tuner.advice.recommendation import FIX_TIMING
from keras_pipeline_tuner.advice.recommendation import QUOTA_THREADS
from keras_pipeline_tuner.advice.recommendation import QUOTA_WORKERS
from keras_pipeline_tuner.advice.recommendation import THROTTLED
from keras_pipeline_tuner.advice.recommendation import Evidence
from keras_pipeline_tuner.advice.recommendation import ExpectedGain
from keras_pipeline_tuner.advice.recommendation import Recommendation
from keras_pipeline_tuner.advice.timed_gains import pass_statement
from keras_pipeline_tuner.after_training.fix_timing import FixTiming
from keras_pipeline_tuner.pipeline.graph import kinds
from keras_pipeline_tuner.pipeline.tune.planning import autotune_budget_short
from keras_pipeline_tuner.pipeline.tune.results import DEFAULT_MIN_GAIN
from keras_pipeline_tuner.pipeline.tune.results import fast_enough_to_keep

if TYPE_CHECKING:
    from keras_pipeline_tuner.pipeline.graph.model import Pipeline
    from keras_pipeline_tuner.timing.cpu_usage import CpuUsage

CPU_BUDGET = "CPU budget"

# Input stages that are not tf.data: their threads are not tf.data's pool.
_NOT_TF_DATA = (kinds.PY_DATASET, kinds.DATA_LOADER, kinds.GENERATOR, kinds.ARRAYS)
_POOL_OPTION = "threading_options.private_threadpool_size"


def cpu_limit_recommendations(
    pipeline: Optional["Pipeline"],
    cpu: Optional["CpuUsage"],
    gain: Optional[ExpectedGain],
    fix_timings: Iterable[FixTiming] = (),
) -> List[Recommendation]:
    """The recommendations the run's CPU budget and throttling call for.

    Args:
        pipeline: the `Pipeline` the run's findings were read from, if any.
        cpu: the run's `CpuUsage` (with its `budget` and `throttling`).
        gain: the run's input-free ceiling (`ExpectedGain`), when the run is
            input-bound: the most a change to the input can bring.
        fix_timings: the advised fixes timed after training
            (`after_training.fix_timing`): a private thread pool of the budget's size
            joins the advice when its timing says it is faster; the timing is
            shown either way.

    Returns:
        The "cpu-quota-threads", "cpu-quota-workers" and "cpu-throttled"
        `Recommendation`s that apply, in that order.

    Example:

    >>> from keras_pipeline_tuner.timing.cpu_budget import CpuBudget, Throttling
    >>> from keras_pipeline_tuner.timing.cpu_usage import CpuUsage
    >>> budget = CpuBudget(host_count=8, affinity_count=8, quota_cpus=2.0,
    ...                    cgroup=None, cgroup_version=2)
    >>> cpu = CpuUsage(wall_s=10.0, cpu_count=8, process_cores=2.0, budget=budget,
    ...                throttling=Throttling(100, 40, 3.0))
    >>> [r.id for r in cpu_limit_recommendations(None, cpu, None)]
    ['cpu-throttled']
    """
    if cpu is None or cpu.budget is None:
        return []
    pool_timing = next(
        (timing for timing in fix_timings if timing.recommendation == QUOTA_THREADS), None
    )
    found = [
        _threads_over_quota(pipeline, cpu, gain, pool_timing),
        _workers_over_budget(pipeline, cpu, gain),
        _throttled(cpu),
    ]
    return [item for item in found if item is not None]


def _threads_over_quota(pipeline, cpu, gain, pool_timing) -> Optional[Recommendation]:
    """AUTOTUNE (and a pool set by hand) sized to the quota, when tf.data cannot see it."""
    budget = cpu.budget
    if not budget.hidden_from_tf_data or pipeline is None or not _is_tf_data(pipeline):
        return None
    cpus = budget.cpus
    lines = []
    if autotune_budget_short(pipeline, budget):
        lines.append(f"options.autotune.cpu_budget = {cpus}")
    pool = pipeline.options.get(_POOL_OPTION)
    set_pool = (isinstance(pool, int) and pool > cpus) or _timed_faster(pool_timing)
    if set_pool:
        lines.append(f"options.threading.private_threadpool_size = {cpus}")
    if not lines:
        return None
    if pool is None and not set_pool:
        lines.append(_pool_kept_line(pool_timing, cpus))
    evidence = [Evidence(CPU_BUDGET, cpu.describe() + ".")]
    if pool is None:
        evidence.append(Evidence(FIX_TIMING, _pool_sentence(pool_timing, cpus)))
    return Recommendation(
        id=QUOTA_THREADS,
        title=f"Give tf.data's AUTOTUNE the {cpus}-CPU quota as its budget",
        severity=_severity(cpu),
        evidence=evidence,
        fix="\n".join(["options = tf.data.Options()"] + lines + ["ds = ds.with_options(options)"]),
        expected_gain=_no_figure(gain, "A budget the size of the quota"),
        stage=None,
        reason=(
            f"tf.data's AUTOTUNE sizes the pipeline's parallelism from the "
            f"{budget.affinity_count} CPUs this process may be scheduled on, but the "
            f"container's quota gives it {budget.quota_cpus:.2f} CPU of time: the threads it "
            "starts beyond that queue for the same time, and the kernel stops every thread "
            f"of the job once it is used up. Check with kpt.tune, which times this change "
            f"with {cpus}."
        ),
    )


def _timed_faster(timing: Optional[FixTiming]) -> bool:
    """Whether a timed change is faster by `kpt.tune`'s rule for keeping a rewrite."""
    return (
        timing is not None
        and timing.measured
        and fast_enough_to_keep(timing.batch_ms_after / timing.batch_ms_before)
    )


def _timed_sentence(timing: FixTiming) -> str:
    """The timing's passes and its ratio, in words.

    Example:

    >>> _timed_sentence(FixTiming("cpu-quota-threads", None, None, "pool = 1", "measured",
    ...                           batch_ms_before=2.0, batch_ms_after=2.5, rounds=3, batches=40))
    'Timed after training on the pipeline alone (3 side-by-side rounds of 40 batches): a \
batch every 2.00 ms as written, every 2.50 ms with pool = 1. That is 1.25x slower.'
    """
    return f"{pass_statement(timing)} That is {_ratio_words(timing)}."


def _pool_kept_line(timing: Optional[FixTiming], cpus: int) -> str:
    """The fix's line on the pool size, where a pool of the budget's size is not set.

    The advice says what to do with the pool either way: keep tf.data's own
    where a pool of the budget's size timed no faster, and time it first where
    it was not timed.

    Example:

    >>> _pool_kept_line(FixTiming("cpu-quota-threads", None, None, "pool = 1", "measured",
    ...                           batch_ms_before=2.0, batch_ms_after=2.4, rounds=3,
    ...                           batches=40), 1)
    "# thread pool: keep tf.data's own; a private pool of 1 timed 1.20x slower here"
    >>> _pool_kept_line(None, 1)
    '# thread pool: a private pool of 1 was not timed here; time it with kpt.tune first'
    """
    if timing is None or not timing.measured:
        return (
            f"# thread pool: a private pool of {cpus} was not timed here; time it with "
            "kpt.tune first"
        )
    return (
        f"# thread pool: keep tf.data's own; a private pool of {cpus} timed "
        f"{_ratio_words(timing)} here"
    )


def _ratio_words(timing: FixTiming) -> str:
    """A measured timing's ratio, as "1.25x slower" or "1.10x faster"."""
    ratio = timing.batch_ms_before / timing.batch_ms_after
    return f"{ratio:.2f}x faster" if ratio >= 1.0 else f"{1.0 / ratio:.2f}x slower"


def _pool_sentence(timing: Optional[FixTiming], cpus: int) -> str:
    """Why a private pool of the budget's size is, or is not, in the advice."""
    pool = f"A private thread pool of {cpus} (options.threading.private_threadpool_size)"
    rule = (
        f"it joins the advice only when timed at least {DEFAULT_MIN_GAIN * 100:g} % faster, as "
        "kpt.tune keeps a rewrite: on a few CPUs a pool that small can slow the steps"
    )
    if timing is None:
        return (
            f"{pool} was not timed after training (measure_fixes times the advised fixes of "
            f"a fit that waits for its input; kpt.tune times it on any pipeline): {rule}."
        )
    if not timing.measured:
        return f"{pool} was not timed ({timing.status}: {timing.reason.rstrip('.')}): {rule}."
    said = _timed_sentence(timing)
    if _timed_faster(timing):
        return f"{said} So the advice sets it too."
    return f"{said} Left out: {rule}."


def _workers_over_budget(pipeline, cpu, gain) -> Optional[Recommendation]:
    """Fewer loader worker processes, when they are more than the budget's CPUs."""
    budget = cpu.budget
    if pipeline is None:
        return None
    for stage in pipeline.stages:
        if stage.kind == kinds.PY_DATASET and stage.params.get("use_multiprocessing"):
            name, workers = "workers", stage.params.get("workers")
            fix = f"super().__init__(workers={budget.cpus}, use_multiprocessing=True, **kwargs)"
        elif stage.kind == kinds.DATA_LOADER:
            name, workers = "num_workers", stage.params.get("num_workers")
            fix = f"DataLoader(dataset, ..., num_workers={budget.cpus})"
        else:
            continue
        if not isinstance(workers, int) or workers <= budget.cpus:
            continue
        return Recommendation(
            id=QUOTA_WORKERS,
            title=f"Run {budget.cpus} loader workers, not {workers}",
            severity=_severity(cpu),
            evidence=[Evidence(CPU_BUDGET, cpu.describe() + ".")],
            fix=fix,
            expected_gain=_no_figure(gain, f"{budget.cpus} workers instead of {workers}"),
            stage=stage.label,
            reason=(
                f"{stage.label} runs {workers} worker processes ({name}={workers}) on a "
                f"budget of {budget.cpus} CPU ({budget.binding} binds): the workers take "
                "turns on the CPUs and each holds a batch in memory while it waits. "
                f"{name}={budget.cpus} loads as fast with less memory and no contention "
                "with the training step."
            ),
        )
    return None


def _throttled(cpu) -> Optional[Recommendation]:
    """The kernel throttled the job in a meaningful share of its periods."""
    throttling = cpu.throttling
    if not cpu.throttled:
        return None
    budget = cpu.budget
    return Recommendation(
        id=THROTTLED,
        title=f"The CPU quota stopped this job in {throttling.share * 100:.0f} % of periods",
        severity="warning",
        evidence=[Evidence(CPU_BUDGET, cpu.describe() + ".")],
        fix=(
            "# Either a larger limit (Kubernetes resources.limits.cpu, docker --cpus),\n"
            "# or fewer threads: tf.data.Options().autotune.cpu_budget, the loaders'\n"
            "# workers, and\n"
            f"# tf.config.threading.set_intra_op_parallelism_threads({budget.cpus})"
        ),
        expected_gain=ExpectedGain(
            basis=BOUND,
            statement=(
                f"The kernel stopped the job's threads for {throttling.throttled_s:.2f} s in "
                "total, wherever they were: in the input wait, in the compute and between "
                "steps alike. So the verdict says how the two share the quota, not how fast "
                "either runs."
            ),
        ),
        stage=None,
        reason=(
            f"The job used up its {budget.limit_cpus:.2f}-CPU quota in "
            f"{throttling.throttled_periods} of {throttling.periods} scheduling periods and "
            "was stopped until the next one each time: the model and the pipeline are both "
            "slowed by the kernel, not only by each other."
        ),
    )


def _is_tf_data(pipeline) -> bool:
    return bool(pipeline.stages) and not any(
        stage.kind in _NOT_TF_DATA for stage in pipeline.stages
    )


def _severity(cpu) -> str:
    """A warning where the job was throttled in a meaningful share of periods, else info."""
    return "warning" if cpu.throttled else "info"


def _no_figure(gain: Optional[ExpectedGain], change: str) -> ExpectedGain:
    """The gain of a change that has no figure of its own: the run's ceiling, if any.

    Example:

    >>> _no_figure(None, "Two workers instead of eight").statement
    'Two workers instead of eight has no figure of its own from this run: what it brings \
depends on what the threads were contending for.'
    """
    statement = (
        f"{change} has no figure of its own from this run: what it brings depends on what "
        "the threads were contending for."
    )
    if gain is None or gain.speedup is None:
        return ExpectedGain(basis=BOUND, statement=statement)
    return ExpectedGain(
        speedup=gain.speedup,
        step_ms=gain.step_ms,
        step_ms_after=gain.step_ms_after,
        basis=BOUND,
        # The figure shown beside it is that ceiling, and says so.
        statement=(
            f"{statement} No change to the input can beat the run's ceiling: {gain.statement}"
        ),
    )
