"""The `Report` of a run, built from what its evidence holds so far.

Built on demand (every epoch, at checkpoints, at the end) from the run's step
clock, profiler window, findings, replay and CPU figures; nothing here measures
or writes. The verdict is decided once, in `advice.verdict.judge`; the figures
every output shows are built from it once (`advice.figures`), and the advice
reads them.
"""

import sys
from typing import TYPE_CHECKING
from typing import List
from typing import Optional
from typing import Tuple

from keras_pipeline_tuner._util import features
from keras_pipeline_tuner.advice.advisor import RunEvidence
from keras_pipeline_tuner.advice.advisor import advise
from keras_pipeline_tuner.advice.capacity import StepCpu
from keras_pipeline_tuner.advice.cpu_contention import CpuContention
from keras_pipeline_tuner.advice.cpu_contention import contention_ceiling
from keras_pipeline_tuner.advice.cpu_contention import cpu_contention
from keras_pipeline_tuner.advice.data_reuse import DataReuse
from keras_pipeline_tuner.advice.data_reuse import reuse_of
from keras_pipeline_tuner.advice.figures import Figures
from keras_pipeline_tuner.advice.figures import build_figures
from keras_pipeline_tuner.advice.scale_out import job_stats
from keras_pipeline_tuner.advice.verdict import Judgement
from keras_pipeline_tuner.advice.verdict import judge
from keras_pipeline_tuner.advice.verdict import later_epochs
from keras_pipeline_tuner.instrumentation.user_calls import calls_since
from keras_pipeline_tuner.instrumentation.user_calls import with_batches
from keras_pipeline_tuner.outputs.report import Report
from keras_pipeline_tuner.pipeline.graph import kinds
from keras_pipeline_tuner.timing.cpu_usage import throttled
from keras_pipeline_tuner.timing.step_clock import TRAIN
from keras_pipeline_tuner.timing.step_clock import VALIDATION
from keras_pipeline_tuner.timing.step_stats import StepStats
from keras_pipeline_tuner.timing.step_stats import Verdict
from keras_pipeline_tuner.workers import exchange as worker_reports

if TYPE_CHECKING:
    from keras_pipeline_tuner.timing.cpu_usage import CpuUsage

NO_STEP = "No training step was measured"
# Notes of the probes that say why the advised fixes were not timed.
_UNTIMED_NOTES = ("The advised fixes were not timed", "measure_fixes timed no")
# The fix timing line quotes a reason up to this many characters.
_REASON_CHARS = 120


def judgement_of(run, cpu: Optional["CpuUsage"]) -> Judgement:
    """The run's verdict from the evidence so far (see `advice.verdict.judge`).

    Args:
        run: the `run.lifecycle.Run`.
        cpu: the run's `CpuUsage` (`run.cpu_usage()`), read once by the caller
            so that a report's verdict and figures share it; `None` where
            the CPU meter is off.

    Returns:
        The `Judgement`.
    """
    return _judgement(run, cpu, run.profile_evidence())


def _judgement(run, cpu, profile) -> Judgement:
    clock = run.clock
    train = clock.stats(TRAIN)
    contention, ceiling = _input_cpu(run, cpu, train)
    return judge(
        train,
        profile,
        clock.epochs,
        clock.steady_share(TRAIN),
        clock.epoch_start_share(TRAIN),
        run.what_if,
        throttled=throttled(cpu),
        fetch_floor=run.fetch_floor,
        cpu_contention=contention,
        contention_ceiling=ceiling,
    )


def _steady_span(run, cpu, train: StepStats):
    """`(CpuUsage, user calls, training steps, steady share)` over the verdict's steady state.

    From the second training epoch once two ended (a first epoch that filled a
    cache called the user's map; later ones did not), else over the whole run
    (the CPU meter starts after the first step, which traces).
    """
    clock = run.clock
    share, steps, calls = clock.steady_share(TRAIN), train.steps, _timings(run)
    later = later_epochs(clock.epochs)
    since = run.usage_since_epoch(later[0]) if later is not None else None
    if since is not None:
        from_epoch, share = later
        cpu, calls = since[0], calls_since(calls, since[1])
        steps -= sum(
            e.stats.steps for e in clock.epochs if e.kind == TRAIN and e.epoch < from_epoch
        )
    return cpu, calls, steps, share


def _step_cpu(run, cpu, train: StepStats) -> Optional[StepCpu]:
    """The job's CPU a training step over the steady state (the CPU meter's), or `None`."""
    cpu, _, steps, _ = _steady_span(run, cpu, train)
    if cpu is None or steps <= 0 or cpu.wall_s <= 0:
        return None
    delay = cpu.thread_delay_s
    return StepCpu(
        cpu.process_cores * cpu.wall_s * 1e3 / steps,
        delay * 1e3 / steps if delay is not None else None,
    )


def _input_cpu(run, cpu, train: StepStats) -> Tuple[Optional[CpuContention], Optional[float]]:
    """What the input's CPU use predicts it cost the compute, and the most it could cost.

    `(advice.cpu_contention.cpu_contention, advice.cpu_contention.contention_ceiling)`,
    both over the verdict's steady state (`_steady_span`).
    """
    cpu, calls, steps, share = _steady_span(run, cpu, train)
    if share is not None and share.steps:
        step_ms = share.step_ms / share.steps
        compute_ms = (share.step_ms - share.wait_ms) / share.steps
    else:
        step_ms, compute_ms = train.step.mean_ms, train.compute.mean_ms
    pipeline = getattr(run.findings, "pipeline", None)
    workers = pipeline.worker_processes if pipeline is not None else None
    return (
        cpu_contention(
            cpu, calls, step_ms, compute_ms, run.stage_table, steps, worker_processes=workers
        ),
        contention_ceiling(cpu, calls, run.stage_table, steps, worker_processes=workers),
    )


def build_report(run) -> Report:
    """The `Report` of what `run` measured so far.

    Args:
        run: the `run.lifecycle.Run`.

    Returns:
        The `Report`, with the advice when that feature is on.
    """

    measurement, notes = run.measurement, list(run.notes)
    clock = run.clock
    validation, train = clock.stats(VALIDATION), clock.stats(TRAIN)
    notes += run.failure_notes() + _worker_notes(run)
    if not train.steps and TRAIN not in clock.first_steps and not any(
        note.startswith(NO_STEP) for note in notes
    ):
        notes.append(f"{NO_STEP}: the dataset gave no batch, or fit has not run a step yet.")
    # Read once: the verdict and the report show the same figures. A profile
    # may join on another thread meanwhile (`run.late_profile`): whether it is
    # pending is read first, so that the report never has neither.
    cpu = run.cpu_usage()
    profile_pending = run.profile_pending
    evidence = run.profile_evidence()
    judgement = _judgement(run, cpu, evidence)
    user_calls = _user_calls(run, train)
    figures = figures_of(
        run, judgement, train, cpu, _fixes_line(run, judgement), evidence
    )
    report = Report(
        verdict=figures.verdict,
        input_fraction=figures.input_fraction,
        train=train,
        validation=validation if validation.steps else None,
        epochs=list(clock.epochs),
        first_steps=dict(clock.first_steps),
        measurement=measurement,
        steps_per_execution=run.steps_per_execution,
        notes=notes + run.profile_notes(),
        # Grain's own stage timing names Grain's stages; a profiler window
        # sees them only as Keras' generator around the dataset.
        profile=run.stage_timing or evidence,
        profile_pending=profile_pending,
        findings=list(run.findings),
        what_if=run.what_if,
        workers=run.worker_view,
        cpu=cpu,
        environment=environment(),
        judgement=judgement,
        figures=figures,
        run=run.files.entry.run if run.files.entry is not None else None,
        tuner_cost=run.cost.cost(),
        user_calls=user_calls,
        stage_table=run.stage_table,
        execution=run.execution,
    )
    guard = run.guard
    if guard.enabled(features.ADVICE):
        with guard(features.ADVICE):
            report.reuse = _reuse(run, report.train)
            stats, job_figures = _job(run, report, figures)
            report.recommendations = advise(
                RunEvidence(
                    stats,
                    report.profile,
                    # With the pipeline they were found in, when inspected here.
                    run.findings,
                    what_if=report.what_if,
                    cpu=report.cpu,
                    workers=report.workers,
                    fix_timings=run.fix_timings,
                    reuse=report.reuse,
                    user_calls=report.user_calls,
                    execution=run.execution,
                ),
                job_figures,
            )
    return report


def figures_of(
    run,
    judgement: Judgement,
    train: StepStats,
    cpu,
    fixes_line: str = "",
    profile=None,
) -> Figures:
    """The run's `Figures`, built once from its judgement and its evidence.

    Args:
        run: the `run.lifecycle.Run`.
        judgement: the run's `Judgement`.
        train: the clock's training `StepStats`.
        cpu: the run's `CpuUsage`, or `None`.
        fixes_line: what the fix timing measured, in one line.
        profile: the run's profile evidence (`run.profile_evidence()`), or
            `None` to read it now.

    Returns:
        The `Figures`.
    """
    clock = run.clock
    steady = clock.steady_steps(TRAIN, judgement.from_epoch)
    epoch_steady = {}
    for epoch in clock.epochs:
        rows = clock.steady_steps(epoch.kind, epoch=epoch.epoch)
        epoch_steady[(epoch.kind, epoch.epoch)] = StepStats.from_arrays(
            rows["wait"], rows["compute"], rows["gap"]
        )
    return build_figures(
        judgement,
        train,
        steady=StepStats.from_arrays(steady["wait"], steady["compute"], steady["gap"]),
        epochs=clock.epochs,
        epoch_steady=epoch_steady,
        profile=profile if profile is not None else run.profile_evidence(),
        what_if=run.what_if,
        throttled=throttled(cpu),
        first_steps=clock.first_steps,
        cpu_budget=cpu.budget.cpus if cpu is not None and cpu.budget is not None else None,
        fixes_line=fixes_line,
        keras_verbose=clock.keras_verbose,
        stage_table=run.stage_table,
        step_cpu=_step_cpu(run, cpu, train),
    )


def _job(run, report: Report, figures: Figures):
    """The statistics and figures the advice judges: a multi-worker job's straggler's.

    In synchronous training every worker waits for the slowest: when another
    worker waits longer for input, the job is judged by its steps, by the same
    decider as the run (`advice.verdict.judge`).
    """
    stats = job_stats(report.train, report.workers)
    if stats is report.train:
        return stats, figures
    judgement = judge(stats, report.profile)
    return stats, build_figures(
        judgement,
        stats,
        profile=report.profile,
        what_if=report.what_if,
        throttled=throttled(report.cpu),
        cpu_budget=figures.cpu_budget,
    )


def _fixes_line(run, judgement: Judgement) -> str:
    """What the fix timing measured, or that it measured nothing and why, in one line.

    Said once training has ended (the timing runs after it).
    """
    if not run.finished or judgement.verdict == Verdict.UNKNOWN:
        return ""
    timings = list(run.fix_timings or ())
    measured = [timing for timing in timings if timing.measured]
    others = [timing for timing in timings if not timing.measured]
    if measured:
        parts = [
            f"{timing.change} {timing.batch_ms_before:.1f} -> {timing.batch_ms_after:.1f} ms "
            "a batch"
            for timing in measured
        ]
        line = "Fix timing, on the pipeline alone after training: " + "; ".join(parts)
        if others:
            line += f"; {len(others)} other{'s' if len(others) != 1 else ''} not timed " + (
                f"({others[0].status}: {_first_sentence(others[0].reason).rstrip('.')})"
            )
        return line + "."
    if not judgement.verdict.input_bound:
        return "Fix timing: none ran, the input pipeline is not the bottleneck."
    if others:
        what = others[0].stage or others[0].change or others[0].recommendation
        return f"Fix timing measured nothing: {what}: {_why_untimed(others[0])}"
    for note in run.notes:
        if note.startswith(_UNTIMED_NOTES):
            return f"Fix timing measured nothing: {_first_sentence(note.split(': ', 1)[-1])}"
    return (
        "Fix timing measured nothing: it did not run (measure_fixes=False, or no tf.data "
        "dataset it can rebuild)."
    )


def _why_untimed(timing) -> str:
    """Why a fix was not timed, short: the probes' reasons run to several sentences."""
    if "calls Python" in timing.reason or timing.reran_python:
        return (
            "it runs your Python, which the tuner does not run again after training unless "
            "asked (measure_fixes=True, allow_unverified=True)."
        )
    return f"{timing.status}, {_first_sentence(timing.reason)}"


def _first_sentence(text: str) -> str:
    """The first sentence of `text`, ending with its full stop (or "…" where cut)."""
    sentence = text.split(". ")[0].rstrip(".")
    if len(sentence) > _REASON_CHARS:
        return sentence[: _REASON_CHARS - 1].rstrip(" ,;:") + "…"
    return sentence + "."


def _batches_read(run, train) -> int:
    """The training batches the run measured, its first step included."""
    return train.steps + (1 if TRAIN in run.clock.first_steps else 0)


def _user_calls(run, train) -> list:
    """The user's Python calls timed during training, per training batch where known."""
    return with_batches(_timings(run), _batches_read(run, train))


def _timings(run) -> list:
    """The user's Python calls timed during training: final, else the figures so far."""
    timings = run.user_calls
    so_far = run.user_calls_so_far
    if not timings and so_far is not None and run.guard.enabled(features.USER_CALLS):
        # Training still runs: the figures so far.
        with run.guard(features.USER_CALLS):
            timings = so_far()
    return timings


def _reuse(run, train) -> Optional[DataReuse]:
    """How much of its dataset the fit read (see `advice.data_reuse`)."""
    pipeline = getattr(run.findings, "pipeline", None)
    if pipeline is None:
        return None
    read = _batches_read(run, train)
    repeated = any(stage.kind == kinds.REPEAT for stage in pipeline.stages)
    return reuse_of(pipeline.cardinality, read, repeated)


def environment() -> dict:
    """The versions of the libraries the run used, and its Keras backend and Python.

    Example:

    >>> import keras
    >>> found = environment()
    >>> found["backend"] in ("tensorflow", "jax", "torch")
    True
    >>> sorted(set(found) & {"keras", "python"})
    ['keras', 'python']
    """
    found = {}
    # Named only when the run used them: the torch and JAX backends may run
    # without TensorFlow, a custom loop without Keras, and no framework is
    # imported just to name it (importing Keras takes seconds).
    for name in ("tensorflow", "jax", "torch", "keras"):
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "__version__"):
            found[name] = str(module.__version__)
    keras = sys.modules.get("keras")
    if keras is not None and hasattr(keras, "backend"):
        found["backend"] = keras.backend.backend()
    found["python"] = sys.version.split()[0]
    return found


def _worker_notes(run) -> List[str]:
    view = run.worker_view
    if view is None or view.waited_s is None:
        return []
    missing = worker_reports.missing_note(view, run.settings.log_dir)
    return [missing] if missing is not None else []
