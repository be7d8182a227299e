"""A timed fix's gain for the step: the pipeline alone's figures turned into a step time.

The fix timing (`after_training.fix_timing`) times a change on the pipeline
alone; a step also computes. With the step clock's compute time (`c`) and the
time per batch before (`b0`) and after (`b1`) the change:

- when the last stage TensorFlow runs prepares batches ahead (a prefetch,
  written or injected at run time, or a parallel stage such as the fused
  map_and_batch), the next batch is prepared while a step computes, and a step
  takes about `max(c, b)`;
- otherwise the batch is prepared only after the step ends, and a step takes
  about `c + b`.

The likely speed-up is `step(b0) / step(b1)` (a final prefetch added by the
change counts as overlap after it), never more than the run's measured bound
(step time over compute time).
"""

from typing import Optional
from typing import Tuple

from keras_pipeline_tuner.advice.data_reuse import DataReuse
from keras_pipeline_tuner.advice.recommendation import LEAST_MEASURED_GAIN
from keras_pipeline_tuner.advice.recommendation import MEASURED
from keras_pipeline_tuner.advice.recommendation import ExpectedGain
from keras_pipeline_tuner.after_training.fix_timing import FixTiming


def measured_gain(
    timing: FixTiming, bound: Optional[ExpectedGain], reuse: Optional[DataReuse] = None
) -> Optional[ExpectedGain]:
    """The step gain a timed fix predicts, by the rule in this module's docstring.

    Args:
        timing: the `FixTiming`; `None` is returned unless it was measured.
        bound: the run's bound (`free_input_gain`, or the what-if replay's):
            its `step_ms` is the step time now, its `step_ms_after` the
            compute time a step cannot go below.
        reuse: the fit's `DataReuse`: a cache timed on its read-back passes
            only (`read_back_only`) gains over the fit what those passes gain
            after its first pass, which fills it at today's speed.

    Returns:
        An `ExpectedGain` with basis "measured" whose `likely_speedup` (and
        `speedup`) is the predicted step gain, the bound said in its
        statement; or `None`.

    Example:

    >>> bound = ExpectedGain(speedup=10.0, step_ms=41.0, step_ms_after=1.0)
    >>> timing = FixTiming("sequential-map", "map(f)", "MapDataset/_3", "map(f, ...)",
    ...                    "measured", batch_ms_before=40.0, batch_ms_after=10.0,
    ...                    overlapped_before=True, overlapped_after=True)
    >>> measured_gain(timing, bound).likely_speedup
    4.0
    """
    if not timing.measured or bound is None or bound.step_ms is None:
        return None
    compute, before, after, freed = _step_model(timing, bound)
    if before <= 0 or after <= 0:
        return None
    likely = before / after
    capped = bound.speedup is not None and likely > bound.speedup
    if capped:
        likely = bound.speedup
    statement = f"{pass_statement(timing)} {_rule(timing, compute, before, after)}"
    if freed:
        statement += (
            " (now: the fit's measured step, as a cache read back also frees the CPU its "
            "stages took beside the steps, all but the share its batches still take)"
        )
    if likely < 1.0:
        statement += f": {1.0 / likely:.2f}x slower."
    else:
        statement += f": {likely:.2f}x faster."
    if capped:
        statement += (
            f" Capped at the measured bound of {bound.speedup:.2f}x (steps no faster "
            "than their compute)."
        )
    elif bound.speedup is not None:
        statement += f" (The bound, steps as fast as their compute: {bound.speedup:.2f}x.)"
    if timing.read_back_only:
        likely, filling = _with_fill(likely, reuse)
        statement += filling
    if timing.replay:
        statement += " " + timing.replay
    return ExpectedGain(
        speedup=likely,
        step_ms=bound.step_ms,
        step_ms_after=bound.step_ms / likely,
        basis=MEASURED,
        statement=statement,
        likely_speedup=likely,
        timed="a replay of the change" if timing.replay else ExpectedGain.timed,
        # Batches well under the compute (by the timing's noise, a fifth):
        # the figure is the fit's step over its compute, not the passes'.
        reaches_compute=freed and timing.batch_ms_after * LEAST_MEASURED_GAIN <= compute,
    )


def pass_statement(timing: FixTiming) -> str:
    """What a measured fix's timed passes read, in a sentence.

    Example:

    >>> pass_statement(FixTiming("sequential-map", "map(f)", None, "map(f, ...)", "measured",
    ...                          batch_ms_before=4.0, batch_ms_after=1.0, rounds=3, batches=20))
    'Timed after training on the pipeline alone (3 side-by-side rounds of 20 batches): a \
batch every 4.00 ms as written, every 1.00 ms with map(f, ...).'
    """
    where = ", running your Python again in this process, as allow_unverified=True asked"
    return (
        f"Timed after training on the pipeline alone{where if timing.reran_python else ''} "
        f"({timing.rounds} side-by-side rounds of {timing.batches} batches): a batch every "
        f"{timing.batch_ms_before:.2f} ms as written, every {timing.batch_ms_after:.2f} ms "
        f"with {timing.change}."
    )


def _with_fill(steady: float, reuse: Optional[DataReuse]) -> Tuple[float, str]:
    """A cache's read-back gain over the fit, its first pass at today's speed, and the words."""
    said = " That is the gain of the passes that read the cache back"
    if reuse is None or reuse.repeats is None or reuse.passes is None:
        return steady, said + "; how many passes this fit makes is not known."
    likely = reuse.fit_speedup(steady)
    return likely, (
        f"{said}; over the fit's {reuse.passes:.1f} passes, the first at today's speed "
        f"to fill it: {likely:.2f}x faster."
    )


def untimed_statement(timing: FixTiming) -> str:
    """A sentence saying why a fix was not timed, for its gain's statement.

    Example:

    >>> untimed_statement(FixTiming("cache-missing", "map(f)", None, "", "not measured",
    ...                             "the budget was spent"))
    'The change was not timed (not measured: the budget was spent), so the figure stays a bound.'
    """
    return (
        f"The change was not timed ({timing.status}: {timing.reason.rstrip('.')}), so the "
        "figure stays a bound."
    )


def _step_model(timing: FixTiming, bound: ExpectedGain) -> Tuple[float, float, float, bool]:
    """`(compute, step now, step after, whether "now" is the fit's measured step)`, in ms."""
    compute = bound.step_ms_after or 0.0
    before = _step_ms(compute, timing.batch_ms_before, timing.overlapped_before)
    after = _step_ms(compute, timing.batch_ms_after, timing.overlapped_after)
    # A cache read back also frees the CPU its stages took beside the steps,
    # which the pipeline timed alone does not show: the step now is the one
    # the fit measured (a cache of an expensive map at 6-8 % input timed 1.00x
    # by the rule alone, where following it delivered 1.11-1.25x). What its
    # batches still take (the stages after it) keeps its share of that CPU.
    freed = timing.read_back_only and bound.step_ms > before
    if freed:
        kept = timing.batch_ms_after / max(timing.batch_ms_before, timing.batch_ms_after)
        before, after = bound.step_ms, after + (bound.step_ms - before) * kept
    return compute, before, after, freed


def _step_ms(compute: float, batch: float, overlapped: bool) -> float:
    return max(compute, batch) if overlapped else compute + batch


def _rule(timing: FixTiming, compute: float, before: float, after: float) -> str:
    if timing.overlapped_before:
        how = (
            "The pipeline's last stage runs ahead of the consumer (a prefetch or a parallel "
            "stage), so the next batch is prepared while a step computes: a step takes "
            "about max(compute, batch)"
        )
    elif timing.overlapped_after:
        how = (
            "Without a prefetch a step takes about compute + batch, and with it about "
            "max(compute, batch)"
        )
    else:
        how = (
            "Without a prefetch at the end the next batch is prepared only after a step "
            "ends: a step takes about compute + batch"
        )
    return f"{how}; with {compute:.2f} ms of compute, {before:.2f} ms now and {after:.2f} ms after"
