"""The run's figures: every quantity a user sees, computed once, in one frozen record.

The verdict is decided in one place (`advice.verdict.judge`); the figures are
built from it and from the evidence once, each time a report is built (at the
end of training, for the early verdict, at epoch ends), into `Figures`. The
advice, the terminal, `report.json`, the Text tab, the dashboard, the timeline
image and the command line read them and work out no figure of their own, so
that each quantity reads the same wherever it is shown:

- **the step**: the steady state's median step (and its wait and compute), over
  the steps the verdict's input share is of: each epoch's first
  `EPOCH_START_STEPS` left out, and the first epoch once later epochs decide;
- **the input share** and what measured it (the step clock, the replay, the
  profiler window), the verdict's own;
- **input free**: the step with input free and how much faster that is, the
  largest of what the share (`1 / (1 - share)`), the step over its compute and
  a replay measured; a run that is not input-bound never shows more than
  `1 / (1 - 5 %)`;
- **the profiler window**: its first and last step and step count (the steps
  its figures are of), and its input share, shown as evidence beside the
  verdict, never as a second verdict;
- **set-up, the first step, Keras' own ms/step** with what makes them differ
  from the step;
- **each epoch**, judged by the run's rule (`advice.verdict.judge_epoch`);
- **the CPU budget**, and what the fix timing measured, in one line.
"""

import dataclasses
from typing import Dict
from typing import List
from typing import Optional
from typing import Sequence
from typing import Tuple

from keras_pipeline_tuner.advice.capacity import Capacity
from keras_pipeline_tuner.advice.capacity import StepCpu
from keras_pipeline_tuner.advice.capacity import capacity_of
from keras_pipeline_tuner.advice.gains import free_input_ceiling
from keras_pipeline_tuner.advice.gains import replayed_gain
from keras_pipeline_tuner.advice.recommendation import BOUND
from keras_pipeline_tuner.advice.recommendation import CPU_USE
from keras_pipeline_tuner.advice.recommendation import MEASURED
from keras_pipeline_tuner.advice.recommendation import PROFILER
from keras_pipeline_tuner.advice.recommendation import REPLAY
from keras_pipeline_tuner.advice.recommendation import ExpectedGain
from keras_pipeline_tuner.advice.verdict import Judgement
from keras_pipeline_tuner.advice.verdict import judge_epoch
from keras_pipeline_tuner.timing.step_clock import EPOCH_START_STEPS
from keras_pipeline_tuner.timing.step_clock import TRAIN
from keras_pipeline_tuner.timing.step_stats import MODERATELY_INPUT_BOUND_FRACTION
from keras_pipeline_tuner.timing.step_stats import Distribution
from keras_pipeline_tuner.timing.step_stats import StepStats
from keras_pipeline_tuner.timing.step_stats import Verdict
from keras_pipeline_tuner.timing.step_stats import verdict_for

# Keras' ms/step is explained beside the step when it is this much larger...
KERAS_EXPLAINED_RATIO = 1.2
# ...and by at least this many ms.
KERAS_EXPLAINED_MS = 1.0
# A part of that difference is named when it is at least this many ms a step.
_KERAS_PART_MS = 0.5
# The largest input-free figure said (a share of 1 is no finite bound), as
# `gains.free_input_ceiling` caps it.
_MOST = free_input_ceiling(1.0)
# Profiler windows that time steps (a Grain pass has no steps).
_STEP_WINDOWS = ("input_pipeline_analyzer", "trace", "")


@dataclasses.dataclass(frozen=True)
class WindowFigures:
    """The profiler window's figures: which steps, and what they measured.

    Attributes:
        first_step: the first step its figures are of (run-wide numbering,
            the run's first step being 0).
        last_step: the last.
        steps: how many steps that is.
        input_fraction: the window's input share of step time, or `None`
            (not converted, or no step figures).
        agrees: its share reads the verdict's class; when not, the verdict's
            line says why the verdict stands.
    """

    first_step: int
    last_step: int
    steps: int
    input_fraction: Optional[float] = None
    agrees: bool = True

    @property
    def span(self) -> str:
        """e.g. "steps 11-22 (12 steps)".

        Example:

        >>> WindowFigures(11, 22, 12).span
        'steps 11-22 (12 steps)'
        """
        return f"steps {self.first_step}-{self.last_step} ({_count(self.steps, 'step')})"


@dataclasses.dataclass(frozen=True)
class EpochFigures:
    """One epoch's figures, judged by the run's rule.

    Attributes:
        epoch: the epoch (as Keras counts them, from 0).
        kind: "train" or "validation".
        steps: its steady steps (the first `EPOCH_START_STEPS` left out).
        step: their step times (median first).
        wait: their input wait.
        compute: their compute.
        setup_ms: from the epoch's start to its first step (a new iterator).
        input_fraction: its input share, by the rule of the run's verdict.
        verdict: the class of that share.
        left_out: why the run's verdict leaves the epoch out ("" when it does not).
        keras_step_ms: Keras' own ms/step of the epoch, where known.
    """

    epoch: int
    kind: str
    steps: int = 0
    step: Distribution = dataclasses.field(default_factory=Distribution)
    wait: Distribution = dataclasses.field(default_factory=Distribution)
    compute: Distribution = dataclasses.field(default_factory=Distribution)
    setup_ms: Optional[float] = None
    input_fraction: Optional[float] = None
    verdict: Verdict = Verdict.UNKNOWN
    left_out: str = ""
    keras_step_ms: Optional[float] = None


@dataclasses.dataclass(frozen=True)
class Figures:
    """Every figure of one run, computed once; every output shows these.

    Attributes:
        verdict: the run's `Verdict` (`advice.verdict.judge` decided it).
        input_fraction: the verdict's input share of step time.
        source: what measured it: "step clock", "what-if replay" or "profiler".
        wait_fraction: the steady share of step time waiting at the fetch
            (beyond a fetch of a ready batch where the replay measured it);
            equal to `input_fraction` unless the replay's contention or the
            input's CPU use decided (the verdict's line then names it as a part).
        scope: which steps `step`, `wait`, `compute` and the share are of.
        line: the verdict in one sentence, with the profiler window's figure
            as evidence where a window ran.
        one_off: one-off input costs left out of the verdict, each with its size.
        steps: how many steps the medians are of.
        step: the steady state's step times: `step.median_ms` is "the step".
        wait: their input wait.
        compute: their compute.
        setup_ms: the mean time from a training epoch's start to its first
            step (a new iterator, the old one's destruction), in no step.
        first_step_ms: the run's first step (it traces), in no step.
        input_free: how much faster the step would be with input free
            (`input_free`); the ceiling of every input change's gain.
        window: the profiler window's `WindowFigures`, if one was captured.
        cpu_budget: the CPU cores the job may use (affinity and quota), if read.
        keras_step_low_ms: the lowest of Keras' own ms/step over the epochs.
        keras_step_high_ms: the highest.
        keras_line: why Keras' ms/step differs from the step, when it is
            clearly larger; "" otherwise.
        epochs: `EpochFigures` of each epoch.
        fixes_line: what the fix timing measured, or that it measured nothing
            and why, in one line ("" where no line is due).
        capacity: the capacity model of the tf.data stages tf.data's live
            model timed, against the step's compute (`advice.capacity`):
            predicted rates, cores for input free, a faster model's headroom.

    Example:

    >>> figures = Figures(input_fraction=0.5, step=Distribution(median_ms=40.0))
    >>> figures.step_ms
    40.0
    """

    verdict: Verdict = Verdict.UNKNOWN
    input_fraction: Optional[float] = None
    source: Optional[str] = None
    wait_fraction: Optional[float] = None
    scope: str = "all steps"
    line: str = ""
    one_off: List[str] = dataclasses.field(default_factory=list)
    steps: int = 0
    step: Distribution = dataclasses.field(default_factory=Distribution)
    wait: Distribution = dataclasses.field(default_factory=Distribution)
    compute: Distribution = dataclasses.field(default_factory=Distribution)
    setup_ms: Optional[float] = None
    first_step_ms: Optional[float] = None
    input_free: Optional[ExpectedGain] = None
    window: Optional[WindowFigures] = None
    cpu_budget: Optional[int] = None
    keras_step_low_ms: Optional[float] = None
    keras_step_high_ms: Optional[float] = None
    keras_line: str = ""
    epochs: List[EpochFigures] = dataclasses.field(default_factory=list)
    fixes_line: str = ""
    capacity: Optional[Capacity] = None

    @property
    def step_ms(self) -> Optional[float]:
        """The step: the steady state's median step time."""
        return self.step.median_ms

    @property
    def wait_ms(self) -> Optional[float]:
        """The steady state's median input wait."""
        return self.wait.median_ms

    @property
    def compute_ms(self) -> Optional[float]:
        """The steady state's median compute."""
        return self.compute.median_ms


def build_figures(
    judgement: Judgement,
    stats: StepStats,
    steady: Optional[StepStats] = None,
    epochs: Sequence = (),
    epoch_steady: Optional[Dict[Tuple[str, int], StepStats]] = None,
    profile=None,
    what_if=None,
    throttled: bool = False,
    first_steps: Optional[dict] = None,
    cpu_budget: Optional[int] = None,
    fixes_line: str = "",
    keras_verbose: Optional[int] = None,
    stage_table=None,
    step_cpu: Optional[StepCpu] = None,
) -> Figures:
    """Builds the run's `Figures` once, from its judgement and evidence.

    Args:
        judgement: the run's `Judgement` (`advice.verdict.judge`).
        stats: `StepStats` of all training steps (the first step excluded).
        steady: `StepStats` of the steps the verdict's share is of
            (`StepClock.steady_steps(TRAIN, judgement.from_epoch)`); all
            steps (`stats`) when not given or empty.
        epochs: the run's `EpochBreakdown`s.
        epoch_steady: each epoch's steady steps, by `(kind, epoch)`; an epoch
            without is shown from all its steps.
        profile: the run's `ProfileEvidence`, if a window ran.
        what_if: the run's `WhatIfResult`, if a replay ran.
        throttled: a CPU quota stopped the job often (see `replayed_gain`).
        first_steps: the clock's `first_steps`.
        cpu_budget: the CPU cores the job may use, if read.
        fixes_line: what the fix timing measured, in one line.
        keras_verbose: the fit's `verbose` (`StepClock.keras_verbose`): how
            Keras counted the ms/step it showed.
        stage_table: tf.data's live model of the fit's pipeline
            (`Report.stage_table`), for the capacity model.
        step_cpu: the job's CPU a training step over the steady state (the
            CPU meter's `StepCpu`), for the capacity model's cores.

    Returns:
        The `Figures`.

    Example:

    >>> import numpy as np
    >>> from keras_pipeline_tuner.advice.verdict import judge
    >>> stats = StepStats.from_arrays(np.full(8, 0.03), np.full(8, 0.01))
    >>> figures = build_figures(judge(stats), stats)
    >>> round(figures.step_ms, 1), round(figures.input_free.speedup, 2)
    (40.0, 4.0)
    """
    whole = steady is None or not steady.steps
    shown = stats if whole else steady
    train_epochs = [e for e in epochs if e.kind == TRAIN]
    step_ms = shown.step.median_ms
    window = _window(profile, judgement)
    keras = [e.keras_ms_per_step for e in train_epochs if e.keras_ms_per_step is not None]
    setups = [e.setup_ms for e in train_epochs if e.setup_ms is not None]
    first = (first_steps or {}).get(TRAIN)
    return Figures(
        verdict=judgement.verdict,
        input_fraction=judgement.input_fraction,
        source=judgement.source,
        wait_fraction=judgement.wait_fraction,
        scope=_scope(judgement, train_epochs, whole),
        line=judgement.line + _window_line(window, judgement, train_epochs),
        one_off=list(judgement.one_off),
        steps=shown.steps,
        step=shown.step,
        wait=shown.input_wait,
        compute=shown.compute,
        setup_ms=sum(setups) / len(setups) if setups else None,
        first_step_ms=first.wall_ms if first is not None else None,
        input_free=input_free(
            judgement,
            step_ms,
            shown.compute.median_ms,
            what_if,
            throttled,
        ),
        window=window,
        cpu_budget=cpu_budget,
        keras_step_low_ms=min(keras) if keras else None,
        keras_step_high_ms=max(keras) if keras else None,
        keras_line=_keras_line(train_epochs, step_ms, first_steps, keras_verbose),
        epochs=_epochs(epochs, stats, judgement, epoch_steady or {}),
        fixes_line=fixes_line,
        capacity=capacity_of(stage_table, shown.compute.median_ms, cpu_budget,
                             step_cpu, shown.host_gap.median_ms),
    )


def input_free(
    judgement: Judgement,
    step_ms: Optional[float],
    compute_ms: Optional[float] = None,
    what_if=None,
    throttled: bool = False,
) -> Optional[ExpectedGain]:
    """The run's one "input free" figure: the step with input free, and how much faster.

    Three measurements bound it from below, each of the same steady state:
    the verdict's input share (a step that spends `share` of its time on input
    is `1 / (1 - share)` times faster without it; the share holds the CPU the
    input's threads took from the compute, `advice.cpu_contention`), the step
    over its compute (the steady state's medians: with input free a step
    takes its compute), and the replay's step with input free against the
    real one, timed side by side (the pipeline's threads also slow the
    compute). The largest is the ceiling: no change to the input pipeline goes
    beyond what any of them measured free input to bring. On a run that is
    not input-bound it is at most `1 / (1 - max(share, 5 %))`: the verdict
    says input costs no more. A replay that ran no faster with input free
    measured no gain, which the wait does not overrule.

    Args:
        judgement: the run's `Judgement`.
        step_ms: the step (the steady state's median).
        compute_ms: the steady state's median compute, if measured.
        what_if: the run's `WhatIfResult`, if a replay ran.
        throttled: a CPU quota stopped the job often.

    Returns:
        The `ExpectedGain` (a ceiling; measured when the replay set it), or
        `None` when no share or step was measured.

    Example:

    >>> later = Judgement(Verdict.NOT_INPUT_BOUND, 0.029, "step clock")
    >>> gain = input_free(later, 26.06, compute_ms=25.0)
    >>> round(gain.speedup, 3), round(gain.step_ms_after, 2)
    (1.042, 25.0)
    >>> round(input_free(later, 26.06, compute_ms=20.0).speedup, 3)
    1.053
    """
    fraction = judgement.input_fraction
    if fraction is None or not step_ms:
        return None
    replayed = replayed_gain(what_if, throttled)
    if judgement.source == CPU_USE:
        # The replay's steps differed within its noise: it bounds nothing the
        # CPU use's prediction does not (see `advice.verdict`).
        replayed = None
    if replayed is not None and replayed.speedup is not None and replayed.speedup <= 1.0:
        return dataclasses.replace(replayed, step_ms=step_ms, step_ms_after=step_ms)
    share = free_input_ceiling(fraction)
    over_compute = step_ms / compute_ms if compute_ms and 0 < compute_ms < step_ms else 1.0
    measured = replayed.speedup if replayed is not None and replayed.speedup else 1.0
    ceiling = min(max(share, over_compute, measured), _MOST)
    capped = ""
    if not judgement.verdict.input_bound:
        most = free_input_ceiling(max(fraction, MODERATELY_INPUT_BOUND_FRACTION))
        if ceiling > most:
            ceiling, capped = most, (
                f" (at most what a {MODERATELY_INPUT_BOUND_FRACTION:.0%} input share brings: "
                "the verdict finds input costs less)"
            )
    after = step_ms / ceiling
    if ceiling == measured and measured > share:
        basis, how = MEASURED, (
            f"the replay with input free ran {measured:.2f}x faster than the real pipeline, "
            "side by side"
        )
    elif ceiling == over_compute and over_compute > share:
        basis, how = BOUND, (
            f"with input free a step takes its compute, the steady state's median "
            f"{compute_ms:.2f} ms"
        )
    else:
        basis = MEASURED if judgement.source == REPLAY else BOUND
        how = f"the input costs {fraction * 100:.1f} % of the step ({judgement.source})"
    return ExpectedGain(
        ceiling,
        step_ms,
        after,
        basis,
        f"The step, the steady state's median {step_ms:.2f} ms, would take about "
        f"{after:.2f} ms with input free, at most {ceiling:.2f}x faster{capped}: {how}.",
    )


def legacy_figures(report) -> Figures:
    """The figures of a report written before they were kept, from what it holds.

    Reports of earlier versions hold the verdict, its share and line, and the
    statistics of all training steps and of each epoch: those are shown as they
    were written, the step of the last training epoch when two or more ran (as
    those versions compared runs).

    Args:
        report: a `Report` without `figures`.

    Returns:
        The `Figures`.
    """
    judgement = report.judgement or Judgement(
        report.verdict, report.input_fraction, None, _legacy_line(report)
    )
    judgement = dataclasses.replace(
        judgement, verdict=report.verdict, input_fraction=report.input_fraction
    )
    if not judgement.line:
        judgement = dataclasses.replace(judgement, line=_legacy_line(report))
    # Their runs were compared by the last training epoch when two or more ran.
    train = [epoch for epoch in report.epochs if epoch.kind == TRAIN and epoch.stats.steps]
    steady = train[-1].stats if len(train) >= 2 else None
    figures = build_figures(
        judgement,
        report.train,
        steady=steady,
        epochs=report.epochs,
        profile=report.profile,
        what_if=report.what_if,
        first_steps=report.first_steps,
        cpu_budget=report.cpu.budget.cpus if report.cpu and report.cpu.budget else None,
    )
    # Its line said the window's figure already, as written then.
    scope = f"epoch {train[-1].epoch + 1} of {len(train)}" if steady is not None else "all steps"
    return dataclasses.replace(figures, line=judgement.line, scope=scope)


def _legacy_line(report) -> str:
    if report.input_fraction is None:
        return f"{report.verdict.value}: input wait could not be measured"
    return (
        f"{report.verdict.value}: {report.input_fraction * 100:.1f} % of step time "
        "waits for input"
    )


def _scope(judgement: Judgement, train_epochs: Sequence, whole: bool) -> str:
    """What the step and the share are of, in words."""
    if whole:
        return "all steps"
    start = f"the first {EPOCH_START_STEPS} steps of each epoch left out"
    if judgement.from_epoch is None:
        return f"steady state: {start}"
    numbers = [e.epoch + 1 for e in train_epochs if e.epoch >= judgement.from_epoch]
    if not numbers:
        return f"steady state: {start}"
    epochs = (
        f"epoch {numbers[0]}" if len(numbers) == 1 else f"epochs {numbers[0]}-{numbers[-1]}"
    )
    return f"steady state: {epochs}, {start}"


def _window(profile, judgement: Judgement) -> Optional[WindowFigures]:
    if profile is None or profile.source not in _STEP_WINDOWS or not profile.stop_step:
        return None
    first, last, count = profile.window_range()
    fraction = profile.input_fraction
    agrees = fraction is None or verdict_for(fraction) == judgement.verdict
    return WindowFigures(first, last, count, fraction, agrees)


def _window_line(window: Optional[WindowFigures], judgement: Judgement, train_epochs) -> str:
    """The window's figure, as evidence beside the verdict, and why the verdict stands."""
    if window is None or window.input_fraction is None or judgement.source == PROFILER:
        return ""
    line = (
        f" The profiler window, {window.span}, measured "
        f"{window.input_fraction * 100:.1f} % input"
    )
    if window.agrees:
        return line + "."
    if judgement.from_epoch is not None and window.last_step < _first_step_of(
        judgement.from_epoch, train_epochs
    ):
        why = " (one-off work, below)" if judgement.warm_up_epoch is not None else ""
        return line + (
            f", all in the first epoch, which the verdict leaves out{why}: the later epochs "
            "decide."
        )
    return line + (
        ": those steps only, where the step clock timed every step, so the step clock decides."
    )


def _first_step_of(epoch: int, train_epochs: Sequence) -> int:
    """The run-wide number of training epoch `epoch`'s first step.

    Steps are numbered as the clock counts them (`StepClock.step_numbers`):
    the run's first step, kept apart, is 0, and the steps recorded after it
    are 1, 2, ...; an epoch's statistics leave that first step out.
    """
    return sum(e.stats.steps for e in train_epochs if e.epoch < epoch) + 1


def _epochs(epochs: Sequence, stats: StepStats, judgement: Judgement, steady) -> List[EpochFigures]:
    shown = []
    for epoch in epochs:
        fraction, verdict, left_out = judge_epoch(epoch, stats, judgement)
        own = steady.get((epoch.kind, epoch.epoch))
        if own is None or not own.steps:
            own = epoch.stats
        shown.append(
            EpochFigures(
                epoch=epoch.epoch,
                kind=epoch.kind,
                steps=own.steps,
                step=own.step,
                wait=own.input_wait,
                compute=own.compute,
                setup_ms=epoch.setup_ms,
                input_fraction=fraction,
                verdict=verdict,
                left_out=left_out,
                keras_step_ms=epoch.keras_ms_per_step,
            )
        )
    return shown


def _keras_line(
    train_epochs: Sequence, step_ms: Optional[float], first_steps, keras_verbose
) -> str:
    """Why Keras' ms/step is larger than the step, in one line, when it clearly is.

    Keras divides an epoch's wall time by its steps: with `verbose=2` from the
    epoch's start (its set-up and first step in it), with `verbose=1` from the
    end of its first step. What that time holds beyond the step (the steady
    state's median) a step is named, part by part.
    """
    counted = [e for e in train_epochs if e.keras_ms_per_step is not None and e.keras_steps]
    if not counted or not step_ms:
        return ""
    low = min(e.keras_ms_per_step for e in counted)
    high = max(e.keras_ms_per_step for e in counted)
    if high < KERAS_EXPLAINED_RATIO * step_ms or high - step_ms < KERAS_EXPLAINED_MS:
        return ""
    whole = keras_verbose == 2
    first = (first_steps or {}).get(TRAIN)
    steps = sum(e.keras_steps for e in counted)
    excess = sum((e.keras_ms_per_step - step_ms) * e.keras_steps for e in counted)
    setup = tracing = slower = gaps = 0.0
    for index, epoch in enumerate(counted):
        timed = epoch.stats.steps if whole else epoch.keras_steps
        if whole and epoch.setup_ms is not None:
            setup += epoch.setup_ms
        if whole and index == 0 and first is not None and epoch is train_epochs[0]:
            # The run's first step is in no epoch's statistics.
            tracing += first.wall_ms - step_ms
        mean = epoch.stats.step.mean_ms
        if mean is not None:
            slower += (mean - step_ms) * timed
        gap = epoch.stats.host_gap.mean_ms
        if gap is not None:
            gaps += gap * timed
    rest = excess - setup - tracing - slower - gaps
    parts = [
        (setup, "set-up before each epoch's first step (a new iterator)"),
        (tracing, "the first step (tracing)"),
        (slower, "steps slower than the median (each epoch's first steps, the first epoch, "
                 "stalls)"),
        (gaps, "between steps (Keras' loop, the callbacks' batch hooks)"),
        (rest, "at the epochs' ends (validation, the callbacks' epoch-end work)"),
    ]
    named = [f"{ms / steps:.1f} ms {what}" for ms, what in parts if ms / steps >= _KERAS_PART_MS]
    shown = f"{low:.0f} ms/step" if round(low) == round(high) else f"{low:.0f}-{high:.0f} ms/step"
    counts = (
        "each epoch's wall time over its steps" if whole
        else "each epoch's time after its first step over its later steps"
    )
    return (
        f"Keras' progress bar showed {shown} ({counts}); the step here, {step_ms:.2f} ms, "
        "is the steady state's median"
        + (f". The difference, a step: {'; '.join(named)}." if named else ".")
    )


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'s' if number != 1 else ''}"
