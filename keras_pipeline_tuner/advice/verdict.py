"""The run's verdict, decided in one place for the report, the terminal and the advice.

The verdict describes the steady state of training, with one-off costs reported
apart with their size:

- **Epoch starts.** The first `EPOCH_START_STEPS` steps of every epoch wait for
  a new iterator, a refilling shuffle buffer, parallel calls warming up. Their
  wait is totalled apart (`StepClock.epoch_start_share`) and left out.
- **The first epoch.** Once two epochs have ended, the epochs after the first
  are the steady state: the first may do one-off work (filling a cache, a
  first pass over files), which also competes with the model for the CPU
  while the wait stays small. When its steps waited, per step, more than
  twice as long as the later epochs' (and by at least `WARMUP_MIN_MS`), and
  the later epochs alone earn a milder verdict, that is said with its size.
- **Contention.** Where the input pipeline and the model share CPU cores, the
  pipeline's work slows the step itself and is booked as compute. A replay of
  cached batches through the compiled step after training (the what-if replay)
  times the step with input free, around steps on the real pipeline
  (under the same load); when the real step is slower than the replayed one by
  at least `replay_comparison.CONTENTION_MIN_SPEEDUP`, its share of the step,
  `1 - replayed / real`, is the input's cost, and decides when it is larger
  than the wait's. Where a CPU quota throttled the job, the two are compared
  by wall time a step: the kernel's stops fall between steps too.
- **Contention from CPU use.** Training itself shows how much CPU the input's
  threads and workers took while the step computed; against the job's CPU
  budget it predicts the compute the input cost (`advice.cpu_contention`),
  with no run after training. Where no replay ran, the wait plus that
  prediction decides when larger than the wait; where a replay ran, its
  measurement decides and the prediction is shown beside it.
- **The fetch itself.** Fetching a batch that is already in memory still takes
  a little time inside the step (the fetch op, and the step's first ops
  starting beside it). The replay measures it on cached batches; where it did
  not run, it is measured after training through the fit's own kind of fetch
  (`timing.fetch_floor`). Only the wait beyond it counts as waiting for the
  pipeline, and the line says so with both figures; where neither measured
  it, a wait up to `FETCH_FLOOR_BOUND_MS` a step is left out only where that
  changes the class, and the line says so.

The thresholds are the TF Profiler's (see `timing.step_stats`). When the step
clock timed whole steps only, the profiler window's split decides.
"""

import dataclasses
from typing import List
from typing import Optional
from typing import Sequence
from typing import Tuple

from keras_pipeline_tuner.advice.cpu_contention import CpuContention
from keras_pipeline_tuner.advice.recommendation import CPU_USE
from keras_pipeline_tuner.advice.recommendation import PROFILER
from keras_pipeline_tuner.advice.recommendation import REPLAY
from keras_pipeline_tuner.advice.recommendation import STEP_CLOCK
from keras_pipeline_tuner.advice.replay_comparison import CONTENTION_MIN_MS
from keras_pipeline_tuner.advice.replay_comparison import alongside
from keras_pipeline_tuner.advice.replay_comparison import compared_steps
from keras_pipeline_tuner.advice.replay_comparison import contention_of
from keras_pipeline_tuner.advice.replay_comparison import mean_step_ms
from keras_pipeline_tuner.advice.replay_comparison import resolution
from keras_pipeline_tuner.timing.step_clock import EPOCH_START_STEPS
from keras_pipeline_tuner.timing.step_clock import TRAIN
from keras_pipeline_tuner.timing.step_clock import Share
from keras_pipeline_tuner.timing.step_stats import FETCH_FLOOR_BOUND_MS
from keras_pipeline_tuner.timing.step_stats import HIGHLY_INPUT_BOUND_FRACTION
from keras_pipeline_tuner.timing.step_stats import MODERATELY_INPUT_BOUND_FRACTION
from keras_pipeline_tuner.timing.step_stats import StepStats
from keras_pipeline_tuner.timing.step_stats import Verdict
from keras_pipeline_tuner.timing.step_stats import beyond_fetch_bound
from keras_pipeline_tuner.timing.step_stats import verdict_for

# A first epoch is a warm-up when its steps waited more than this many times
# the later epochs' wait per step, and at least this many ms more.
WARMUP_RATIO = 2.0
WARMUP_MIN_MS = 1.0
# The replay's fetch floor varies from fit to fit on a busy machine (0.12-0.14
# ms quiet, 0.65-1.06 ms loaded, for one pipeline of 0.2 ms steps here): a
# wait within this share above the floor is the fetch itself, not the pipeline...
FLOOR_MARGIN = 0.5
# ...as is a wait within this many ms a step above it: training's fetch hands
# a batch over from tf.data's prefetch thread, the replay's does not, and on a
# quiet machine here that took 0.06-0.13 ms a step more (8-29 % of a 0.21 ms
# step, "moderately" and "highly" in two fits of five of a healthy pipeline).
FLOOR_MARGIN_MS = CONTENTION_MIN_MS

# The wait alone decides "highly input-bound" when, less that bound, it is still
# this far above the boundary: the contention check could only raise the share.
WAIT_DECIDES_MARGIN = 0.05
# A share this close to a class boundary (relative to it) is borderline: fits of
# the same pipeline on a busy machine may read either side, and the line says so.
BORDERLINE_MARGIN = 0.2

_SEVERITY = {
    Verdict.NOT_INPUT_BOUND: 0,
    Verdict.MODERATELY_INPUT_BOUND: 1,
    Verdict.HIGHLY_INPUT_BOUND: 2,
    Verdict.UNKNOWN: -1,
}


@dataclasses.dataclass
class Judgement:
    """The verdict of a run and the input share it rests on.

    Attributes:
        verdict: the `Verdict`.
        input_fraction: the share of steady-state step time the input costs,
            or `None` when nothing measured it.
        source: what decided: "step clock" (the wait at the batch fetch),
            "what-if replay" (the step with input free was faster by more than
            the wait explains: contention), or "profiler" (the step clock
            timed whole steps only; the window split them).
        line: the verdict in one sentence, with what decided and where the
            step clock and the profiler window differ.
        one_off: one-off input costs left out of the verdict, each with its size.
        wait_fraction: the steady-state share of step time waiting at the fetch.
        contention_fraction: `1 - replayed / real` step time, when a replay ran.
        fetch_floor_ms: the wait per step for a batch already in memory, as
            the replay or the fetch floor's own measurement found it; left out
            of `wait_fraction`.
        fetch_floor_how: how `fetch_floor_ms` was measured (e.g. "the
            replay"), or `None`.
        cpu_contention: the share of step time the input's CPU use predicts
            it cost the compute (`advice.cpu_contention.CpuContention`), or
            `None` where nothing measured it or it is negligible.
        borderline: the class boundary the input share is near (within
            `BORDERLINE_MARGIN` of it), e.g. 0.2, or `None`: repeated fits of
            the same pipeline may read either class, and the line says so.
        from_epoch: the first training epoch of the steady state, when the
            epochs after the first decide (two or more ended); `None` when
            every epoch counts. Each epoch's first `EPOCH_START_STEPS` are
            left out either way.
        warm_up_epoch: the first epoch, when it waited far longer than the
            later ones (one-off work such as filling a cache), else `None`.
        contention_ceiling: the most of step time the input's CPU could take
            from the compute, where all of the input's CPU was measured
            (`advice.cpu_contention.contention_ceiling`), else `None`.
        unbounded_wait_fraction: the wait before the fetch bound left up to
            `FETCH_FLOOR_BOUND_MS` a step out of it (`wait_fraction` then
            holds what is left), else `None`.
    """

    verdict: Verdict = Verdict.UNKNOWN
    input_fraction: Optional[float] = None
    source: Optional[str] = None
    line: str = ""
    one_off: List[str] = dataclasses.field(default_factory=list)
    wait_fraction: Optional[float] = None
    contention_fraction: Optional[float] = None
    fetch_floor_ms: Optional[float] = None
    borderline: Optional[float] = None
    from_epoch: Optional[int] = None
    warm_up_epoch: Optional[int] = None
    fetch_floor_how: Optional[str] = None
    cpu_contention: Optional[CpuContention] = None
    contention_ceiling: Optional[float] = None
    unbounded_wait_fraction: Optional[float] = None


def judge(
    stats: StepStats,
    profile=None,
    epochs: Sequence = (),
    steady: Optional[Share] = None,
    epoch_starts: Optional[Share] = None,
    what_if=None,
    throttled: bool = False,
    fetch_floor=None,
    cpu_contention=None,
    contention_ceiling: Optional[float] = None,
) -> Judgement:
    """Decides the steady-state verdict of a run from all the evidence it has.

    Args:
        stats: `StepStats` of the training steps.
        profile: the run's `ProfileEvidence`, if a window was converted.
        epochs: the run's `EpochBreakdown`s.
        steady: the clock's `steady_share()` of training steps (epoch starts out).
        epoch_starts: the clock's `epoch_start_share()` of training steps.
        what_if: the run's `WhatIfResult`, if a replay ran.
        throttled: whether a CPU quota stopped the job in a meaningful share
            of its periods (`CpuUsage.throttled`): the contention check's
            rounds are then compared by wall time a step.
        fetch_floor: the `timing.fetch_floor.FetchFloor` measured after
            training, used where no replay measured the floor.
        cpu_contention: the `advice.cpu_contention.CpuContention` of the
            run, or `None`.
        contention_ceiling: the most of step time the input's CPU could take
            from the compute (`advice.cpu_contention.contention_ceiling`), or
            `None`.

    Returns:
        The `Judgement`.

    Example:

    >>> stats = StepStats.from_arrays(np.array([0.03, 0.03]), np.array([0.01, 0.01]))
    >>> judge(stats).verdict.value
    'highly input-bound'
    """
    if stats.input_fraction is None:
        return _from_profile(profile)
    one_off: List[str] = []
    from_epoch = warm_up_epoch = None
    floor_ms, floor_how = _fetch_floor(what_if, fetch_floor)
    share = steady if steady is not None and steady.steps else None
    scope = "over all steps"
    if share is not None:
        scope = "in steady state"
        if epoch_starts is not None and epoch_starts.steps and epoch_starts.wait_ms > 0:
            one_off.append(_epoch_starts_line(share, epoch_starts))
        later = later_epochs(epochs)
        if later is not None:
            from_epoch, share = later
        warm = _warm_up(epochs, stats, floor_ms)
        if warm is not None:
            first, later, extra_ms = warm
            warm_up_epoch = first.epoch
            one_off.append(
                f"Epoch {first.epoch + 1} waited {extra_ms / 1e3:.2f} s more than later epochs "
                f"({first.steady.mean_wait_ms:.2f} ms a step against "
                f"{later.mean_wait_ms:.2f} ms): one-off work such as filling a cache; later "
                f"epochs {_beyond_floor(later, stats, floor_ms) * 100:.1f} % input. Left out "
                "of the verdict."
            )
            share = later
    wait_fraction = _beyond_floor(share, stats, floor_ms)
    raw_wait, step_ms = wait_fraction, mean_step_ms(share, stats)
    bounded = _within_fetch_bound(wait_fraction, step_ms) if floor_ms is None else None
    if bounded is not None:
        wait_fraction = bounded
    fraction, source = wait_fraction, STEP_CLOCK
    compared = compared_steps(what_if, share, stats, throttled)
    skipped_ms = _skipped_fetch_ms(what_if, fetch_floor)
    if compared is not None and skipped_ms:
        # A step on an in-memory copy of the batches still fetches them
        # through Keras' iterator, which the replay's step left out.
        compared = (compared[0], compared[1] + skipped_ms, compared[2])
    contention = contention_of(compared)
    # A replay whose steps differ within its noise bounds the contention, not
    # measures it: below that bound, the CPU use's prediction stands.
    unresolved = contention == 0.0 and compared is not None
    if contention is not None and contention > fraction:
        fraction, source = contention, REPLAY
    elif cpu_contention is not None and (contention is None or unresolved):
        if unresolved and cpu_contention.fraction > resolution(compared[0]):
            cpu_contention = dataclasses.replace(
                cpu_contention, fraction=resolution(compared[0])
            )
        fraction, source = min(wait_fraction + cpu_contention.fraction, 1.0), CPU_USE
    verdict = verdict_for(fraction)
    line = _line(
        verdict, fraction, source, scope, wait_fraction, contention, what_if, compared,
        _beyond(floor_ms, floor_how), cpu_contention,
    )
    line += _cpu_line(cpu_contention, source)
    near = borderline(fraction)
    line += _bound_line(raw_wait, step_ms) if bounded is not None else ""
    line += _borderline_line(near)
    return Judgement(
        verdict,
        fraction,
        source,
        line,
        one_off,
        wait_fraction,
        contention,
        floor_ms,
        near,
        from_epoch,
        warm_up_epoch,
        floor_how if floor_ms else None,
        cpu_contention,
        contention_ceiling,
        raw_wait if bounded is not None else None,
    )


def _cpu_line(cpu_contention, source: str) -> str:
    if cpu_contention is None or source == CPU_USE:
        return ""
    return f" Beside it, from CPU use: {cpu_contention.describe()}."


def judge_epoch(epoch, stats: StepStats, judgement: Judgement):
    """One epoch's input share and class, by the rule the run's verdict follows.

    Its steady steps (the first `EPOCH_START_STEPS` left out), the wait beyond
    the fetch floor the replay measured (or beyond `FETCH_FLOOR_BOUND_MS` a step
    where that changes the class and no replay ran), raised to the contention the
    replay measured when that decided the run. An epoch the run's verdict leaves
    out (the first, once later epochs decide) keeps its own figures, with the
    reason it is left out.

    Args:
        epoch: an `EpochBreakdown`.
        stats: the run's training `StepStats` (for epochs without a steady share).
        judgement: the run's `Judgement`.

    Returns:
        `(fraction, verdict, left_out)`: `left_out` is "" for an epoch of the
        steady state, else why the verdict leaves it out.

    Example:

    >>> from keras_pipeline_tuner.timing.step_clock import EpochBreakdown, Share
    >>> first = EpochBreakdown(0, TRAIN, None, StepStats(steps=22), Share(20, 1200.0, 1700.0))
    >>> later = Judgement(Verdict.NOT_INPUT_BOUND, 0.03, from_epoch=1, warm_up_epoch=0)
    >>> fraction, verdict, left_out = judge_epoch(first, StepStats(), later)
    >>> round(fraction, 2), verdict.value, left_out.split(":")[0]
    (0.71, 'highly input-bound', 'one-off work such as filling a cache')
    """
    share = epoch.steady if epoch.steady is not None and epoch.steady.steps else None
    if share is None and not epoch.stats.steps:
        return None, Verdict.UNKNOWN, ""
    source = epoch.stats if share is None else stats
    fraction = _beyond_floor(share, source, judgement.fetch_floor_ms)
    if fraction is None:
        return None, Verdict.UNKNOWN, ""
    if judgement.fetch_floor_ms is None:
        bounded = _within_fetch_bound(fraction, mean_step_ms(share, epoch.stats))
        fraction = bounded if bounded is not None else fraction
    left_out = ""
    steady_from = judgement.from_epoch
    if epoch.kind == TRAIN and steady_from is not None and epoch.epoch < steady_from:
        left_out = (
            "one-off work such as filling a cache: left out of the verdict"
            if epoch.epoch == judgement.warm_up_epoch
            else "the first epoch: the verdict is the later epochs'"
        )
    elif judgement.source == REPLAY and judgement.contention_fraction is not None:
        # The replay measured the pipeline's cost inside the step for the run.
        fraction = max(fraction, judgement.contention_fraction)
    return fraction, verdict_for(fraction), left_out


def wait_decides(judgement: "Judgement", step_ms: Optional[float]) -> bool:
    """Whether the wait alone makes a run highly input-bound, whatever a replay would add.

    The contention check after training can only raise the input's share (it
    counts the pipeline's cost inside the step), or lower it by a fetch floor
    under `FETCH_FLOOR_BOUND_MS` a step: when the wait less that bound is still
    above the "highly" boundary by `WAIT_DECIDES_MARGIN`, the check cannot
    change the verdict and is not worth its time.

    Args:
        judgement: the run's `Judgement` before any replay (the steady state,
            one-off costs left out).
        step_ms: the training steps' mean time.

    Returns:
        True when the wait decides.

    Example:

    >>> wait_decides(Judgement(wait_fraction=0.98), step_ms=81.0)
    True
    >>> wait_decides(Judgement(wait_fraction=0.6), step_ms=0.5)
    False
    """
    if judgement.wait_fraction is None or not step_ms or step_ms <= 0:
        return False
    beyond = beyond_fetch_bound(judgement.wait_fraction, step_ms)
    return beyond >= HIGHLY_INPUT_BOUND_FRACTION + WAIT_DECIDES_MARGIN


def check_can_change_class(judgement: "Judgement", step_ms: Optional[float]) -> bool:
    """Whether the contention check after training could change the verdict's class.

    The check measures the fetch of a batch already in memory, which can lower
    the wait by up to `FETCH_FLOOR_BOUND_MS` a step (nothing, where the fetch
    floor was measured first and is out of the wait), and the pipeline's cost
    inside the step, which can raise the input's share by no more than the
    input's CPU could take from the compute (`Judgement.contention_ceiling`).
    Where both ends of that span fall in one class, away from its boundaries
    (`borderline`), the check cannot change the class. Without a ceiling (the
    input may have used CPU nothing measured) it always could.

    Args:
        judgement: the run's `Judgement` before any replay.
        step_ms: the training steps' mean time.

    Returns:
        False where the class stands whatever the check finds.

    Example:

    >>> healthy = Judgement(wait_fraction=0.0, contention_ceiling=0.01)
    >>> check_can_change_class(healthy, step_ms=12.0)
    False
    >>> busy_input = Judgement(wait_fraction=0.0, contention_ceiling=0.3)
    >>> check_can_change_class(busy_input, step_ms=12.0)
    True
    >>> check_can_change_class(Judgement(wait_fraction=0.0), step_ms=12.0)
    True

    A sub-millisecond step waits 8 % at the fetch: the fetch of a ready batch
    could be all of it, or none. With the floor measured first, 1 % is left.

    >>> fetch_or_not = Judgement(wait_fraction=0.08, contention_ceiling=0.005)
    >>> check_can_change_class(fetch_or_not, step_ms=0.8)
    True
    >>> floor_out = Judgement(wait_fraction=0.01, contention_ceiling=0.005, fetch_floor_ms=0.06)
    >>> check_can_change_class(floor_out, step_ms=0.8)
    False
    """
    ceiling = judgement.contention_ceiling
    wait = judgement.wait_fraction
    if ceiling is None or wait is None or not step_ms or step_ms <= 0:
        return True
    # A measured floor is out of the wait already; else the fetch of a ready
    # batch may be up to the bound.
    lowest = wait if judgement.fetch_floor_ms is not None else beyond_fetch_bound(wait, step_ms)
    unbounded = judgement.unbounded_wait_fraction
    highest = min((wait if unbounded is None else unbounded) + ceiling, 1.0)
    return (
        verdict_for(lowest) != verdict_for(highest)
        or borderline(lowest) is not None
        or borderline(highest) is not None
    )


def floor_can_change_class(judgement: "Judgement") -> bool:
    """Whether measuring the fetch floor after training could change the verdict's class.

    The floor only lowers the wait (the fetch of a ready batch is no
    pipeline's fault), and with it the input's share. Where nothing measured
    it yet, no bound stood in for it (`unbounded_wait_fraction`) and the share
    with the whole wait in it is already "not input-bound", away from the
    boundary, the floor cannot change the class.

    Args:
        judgement: the run's `Judgement` before the floor is measured.

    Returns:
        False where the class stands whatever the floor measures.

    Example:

    >>> healthy = Judgement(Verdict.NOT_INPUT_BOUND, 0.004, wait_fraction=0.004)
    >>> floor_can_change_class(healthy)
    False
    >>> floor_can_change_class(Judgement(Verdict.MODERATELY_INPUT_BOUND, 0.08))
    True
    """
    return not (
        judgement.verdict is Verdict.NOT_INPUT_BOUND
        and judgement.borderline is None
        and judgement.unbounded_wait_fraction is None
        and judgement.fetch_floor_ms is None
    )


def borderline(fraction: Optional[float]) -> Optional[float]:
    """The class boundary `fraction` is near (within `BORDERLINE_MARGIN` of it), or `None`.

    Example:

    >>> borderline(0.19), borderline(0.052), borderline(0.5), borderline(0.10)
    (0.2, 0.05, None, None)
    """
    if fraction is None:
        return None
    for boundary in (MODERATELY_INPUT_BOUND_FRACTION, HIGHLY_INPUT_BOUND_FRACTION):
        if abs(fraction - boundary) <= BORDERLINE_MARGIN * boundary:
            return boundary
    return None


def _borderline_line(near: Optional[float]) -> str:
    if near is None:
        return ""
    return (
        f" Borderline: within {BORDERLINE_MARGIN:.0%} of the {near:.0%} boundary between "
        "classes, so fits of the same pipeline may read either side of it."
    )


# How the replay measured the fetch floor, as the verdict line says.
REPLAY_FLOOR = "the replay"


def _fetch_floor(what_if, measured):
    """`(ms, how)` of the fetch of a cached batch: what any pipeline's fetch costs.

    The larger of the replay's mean wait (the fit's own step, fetched from
    cached batches) and the fetch floor measured after training through the
    fit's own kind of fetch: on JAX and torch the replay of NumPy arrays
    hands the step its batches from a list, without Keras' iterator, so its
    wait misses what that iterator costs. `(None, None)` where neither
    measured it.
    """
    replay_ms = what_if.replay_input_wait.mean_ms if what_if is not None else None
    if measured is not None and measured.ms > 0 and measured.ms > (replay_ms or 0.0):
        return measured.ms, measured.describe()
    if replay_ms:
        return replay_ms, REPLAY_FLOOR
    return None, None


def _with_margin(floor_ms: float) -> float:
    """A fetch floor with its spread from fit to fit (`FLOOR_MARGIN`, `FLOOR_MARGIN_MS`)."""
    return max((1.0 + FLOOR_MARGIN) * floor_ms, floor_ms + FLOOR_MARGIN_MS)


def _skipped_fetch_ms(what_if, measured) -> float:
    """What the replay's fetch left out of the fit's, a step, with the floor's spread.

    The measured floor beyond the replay's own wait: a step on an in-memory
    copy of the batches pays it, as the wait does.
    """
    if what_if is None or measured is None:
        return 0.0
    skipped = measured.ms - (what_if.replay_input_wait.mean_ms or 0.0)
    return _with_margin(skipped) if skipped > 0 else 0.0


def _beyond(floor_ms: Optional[float], how: Optional[str]) -> str:
    if not floor_ms:
        return ""
    if how == REPLAY_FLOOR:
        took = f"the {floor_ms:.2f} ms a fetch of a batch already in memory took in the replay"
    else:
        took = f"the fetch of a batch already in memory, measured at {how}"
    return (
        f" beyond {took} (and {FLOOR_MARGIN:.0%} or {FLOOR_MARGIN_MS:.1f} ms more, its "
        "spread from fit to fit)"
    )


def _beyond_floor(share: Optional[Share], stats: StepStats, floor_ms: Optional[float]):
    """The steady share of step time waiting, beyond the fetch of a ready batch."""
    if share is None or not share.steps:
        wait_ms, step_ms = stats.input_wait.mean_ms, stats.step.mean_ms
        if wait_ms is None or not step_ms:
            return stats.input_fraction
        steps = 1
    else:
        wait_ms, step_ms, steps = share.wait_ms, share.step_ms, share.steps
    if floor_ms:
        wait_ms = max(wait_ms - _with_margin(floor_ms) * steps, 0.0)
    return wait_ms / step_ms if step_ms > 0 else 0.0


def _within_fetch_bound(wait_fraction, step_ms: Optional[float]) -> Optional[float]:
    """The wait beyond `FETCH_FLOOR_BOUND_MS` a step, where that changes the class; else None.

    Without a replay nothing measured what the fetch of a ready batch costs:
    on a busy machine a sub-millisecond step waits most of its time there,
    whatever its pipeline, and the class would follow the machine's load.
    Only the wait that no fetch explains then decides.
    """
    if wait_fraction is None:
        return None
    certain = beyond_fetch_bound(wait_fraction, step_ms)
    if certain is None or verdict_for(certain) == verdict_for(wait_fraction):
        return None
    return certain


def _bound_line(raw_wait: float, step_ms: float) -> str:
    return (
        f" Nothing measured the fetch of a batch already in memory here (no replay ran, and "
        f"no fetch floor is measured for this kind of input), and up to "
        f"{FETCH_FLOOR_BOUND_MS:.0f} ms a step of the wait may be "
        f"that fetch on a busy machine: left out, as it changes the class; with it the wait "
        f"at the fetch is {raw_wait * step_ms:.2f} ms a step."
    )


def _epoch_starts_line(share: Share, epoch_starts: Share) -> str:
    total = share.plus(epoch_starts)
    return (
        f"Epoch starts: the first {EPOCH_START_STEPS} steps of each epoch waited "
        f"{epoch_starts.wait_ms:.1f} ms in all ({_percent(epoch_starts.wait_ms, total.step_ms)}"
        " of training step time): new iterators, refilling shuffle buffers; left out of the "
        "verdict."
    )


def _from_profile(profile) -> Judgement:
    fraction = profile.input_fraction if profile is not None else None
    if fraction is not None:
        verdict = verdict_for(fraction)
        return Judgement(
            verdict,
            fraction,
            PROFILER,
            f"{verdict.value}: {fraction * 100:.1f} % of step time is input in the profiler "
            f"window ({profile.span()}); the step clock timed whole steps only.",
        )
    return Judgement(line="unknown: input wait was not separated from compute.")


def _train_epochs(epochs: Sequence) -> list:
    """The training epochs that have steady steps."""
    return [e for e in epochs if e.kind == TRAIN and e.steady is not None and e.steady.steps]


def later_epochs(epochs: Sequence) -> Optional[Tuple[int, Share]]:
    """Where the verdict's steady state starts once two training epochs have ended.

    The first epoch is left out: it fills caches and warms the pipeline up.

    Args:
        epochs: the clock's `EpochBreakdown`s.

    Returns:
        The first later epoch and the steady share of it and those after it,
        or `None` before two training epochs ended.

    Example:

    >>> later_epochs([]) is None
    True
    """
    train = _train_epochs(epochs)
    if len(train) < 2:
        return None
    later = Share()
    for epoch in train[1:]:
        later = later.plus(epoch.steady)
    return train[1].epoch, later


def _warm_up(epochs: Sequence, stats: StepStats, floor_ms: Optional[float]):
    """(first epoch, later epochs' share, extra wait in ms) when epoch 1 was a warm-up."""
    found = later_epochs(epochs)
    if found is None:
        return None
    first, later = _train_epochs(epochs)[0], found[1]
    first_wait, later_wait = first.steady.mean_wait_ms, later.mean_wait_ms
    if first_wait is None or later_wait is None:
        return None
    if first_wait < WARMUP_RATIO * later_wait or first_wait - later_wait < WARMUP_MIN_MS:
        return None
    first_verdict = verdict_for(first.steady.input_fraction)
    if _SEVERITY[verdict_for(_beyond_floor(later, stats, floor_ms))] >= _SEVERITY[first_verdict]:
        return None
    return first, later, (first_wait - later_wait) * first.steady.steps


def _line(
    verdict, fraction, source, scope, wait_fraction, contention, what_if, compared, beyond,
    cpu_contention=None,
) -> str:
    if source == CPU_USE:
        line = (
            f"{verdict.value}: the input costs {fraction * 100:.1f} % of step time {scope}: "
            f"the wait at the fetch, {wait_fraction * 100:.1f} %{beyond} (step clock), and "
            f"{cpu_contention.describe()}."
        )
        if compared is not None:
            line += (
                f" A replay with input free ran {compared[1]:.2f} ms a step ({compared[2]}) "
                f"against {compared[0]:.2f} ms with the pipeline: a difference within its "
                f"noise, which cannot tell contention under {resolution(compared[0]) * 100:.0f} %."
            )
        return line
    if source == REPLAY:
        line = (
            f"{verdict.value}: the input costs {fraction * 100:.1f} % of step time {scope}: "
            f"steps took {compared[1]:.2f} ms ({compared[2]}) on replayed cached batches "
            f"against {compared[0]:.2f} ms with the pipeline{alongside(what_if)}, "
            f"which shares the CPU; the wait at the fetch alone was "
            f"{wait_fraction * 100:.1f} %{beyond} (step clock)."
        )
    else:
        line = (
            f"{verdict.value}: {fraction * 100:.1f} % of step time waits for input {scope}"
            f"{beyond} (step clock)."
        )
        if contention is not None:
            line += (
                f" A replay with input free ran {compared[1]:.2f} ms a step ({compared[2]}) "
                f"against {compared[0]:.2f} ms with the pipeline: no contention beyond that."
            )
    return line


def _percent(part: float, whole: float) -> str:
    return f"{part / whole * 100:.1f} %" if whole > 0 else "0 %"
