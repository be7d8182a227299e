"""How long a timed pass of `tune` is: whole epochs when they fit the budget, else a few batches.

A pipeline whose epoch takes seconds cannot be timed in whole epochs: three
rounds of two passes of two epochs each, for every candidate, would spend the
budget on the original. Most rewrites (parallel calls, prefetch, fusion,
vectorisation, thread pools) change the rate at which batches come, which a
few batches after a warm-up show as well as an epoch does; a cache, which
needs a second pass over the same elements, is filled once by a whole untimed
epoch and then read by passes of the same few batches (see
`TuningSession.factory`). So when whole-epoch passes do not fit, every pass
reads `num_batches` batches after `WARMUP_BATCHES` untimed ones, sized so
that the passes of every comparison fit `PASSES_SHARE` of the budget left.
A shuffle buffer fills before its first element comes out: the warm-up
covers it (`warmup_batches`), and a pipeline whose buffer is a large part of
an epoch keeps whole epochs, since a few batches after it would time the
buffer, not the stages.
"""

from typing import Optional
from typing import Tuple

from keras_pipeline_tuner.pipeline.tune.budget import MIN_ROUNDS
from keras_pipeline_tuner.pipeline.tune.budget import REFERENCE_SHARE
from keras_pipeline_tuner.pipeline.tune.paired_timing import PassPlan

# Batches read before a pass's clock starts: its threads and buffers start up.
WARMUP_BATCHES = 2
# The fewest timed batches per pass: fewer would time the iterator's start.
MIN_BATCHES = 4
# The fewest batches an epoch is cut to: fewer would leave a warm-up and a
# timed pass little of it.
LEAST_CUT_BATCHES = 2 * (WARMUP_BATCHES + MIN_BATCHES)
# Share of the budget left that the timed passes may take: each candidate's
# check reads an epoch, and building datasets takes the rest.
PASSES_SHARE = 0.5


def sized_plan(
    plan: PassPlan,
    epoch_s: float,
    batches: int,
    left_s: float,
    comparisons: int,
    warmup_batches: Optional[int] = WARMUP_BATCHES,
    whole_epoch: bool = True,
) -> Tuple[PassPlan, Optional[str]]:
    """The plan of `tune`'s passes, and a note when they are cut to a few batches.

    Args:
        plan: the plan as asked (`epochs`, `num_batches`, `consumer_step_s`).
        epoch_s: seconds of one epoch of the original, consumer included.
        batches: batches in one epoch of the original.
        left_s: seconds of the budget left.
        comparisons: side-by-side comparisons still to run (candidates and
            the final one).
        warmup_batches: batches that fill the pipeline's shuffle buffers (the
            warm-up is `WARMUP_BATCHES` at least), or `None` when they are not
            known: whole epochs then, or, for an epoch read in part, passes
            timed from their start.
        whole_epoch: `False` when `batches` and `epoch_s` are only the first
            part of an epoch (its first read was cut at its time limit): the
            passes are then always cut, to that part at most.

    Returns:
        `(plan, note)`: the plan unchanged (note `None`) when the caller gave
        `num_batches`, whole-epoch passes fit, or too few batches were read
        to cut them; otherwise a plan of one epoch
        of `num_batches` batches after `WARMUP_BATCHES`, and a note that says so.

    Example:

    >>> plan, note = sized_plan(PassPlan(epochs=2), epoch_s=5.0, batches=30,
    ...                         left_s=50.0, comparisons=3)
    >>> plan.epochs, plan.num_batches, plan.warmup_batches
    (1, 6, 2)
    >>> sized_plan(PassPlan(epochs=2), 0.1, 30, 50.0, 3)[1] is None
    True
    >>> sized_plan(PassPlan(epochs=2), 0.1, 30, 50.0, 3, whole_epoch=False)[0].num_batches
    28
    >>> plan, note = sized_plan(PassPlan(epochs=2), 6.0, 35, 50.0, 3, 64, whole_epoch=False)
    >>> plan.warmup_batches, plan.num_batches, note.split(", so ")[1][:36]
    (0, 8, 'each timed pass read its first 8 bat')
    """
    passes = 2 * MIN_ROUNDS * max(comparisons, 1)
    if plan.num_batches is not None:
        return plan, None
    fits = plan.epochs * epoch_s * passes <= PASSES_SHARE * left_s
    if whole_epoch and (fits or warmup_batches is None):
        return plan, None
    warmup = max(WARMUP_BATCHES, warmup_batches or 0)
    # A whole epoch is kept when cutting it would leave few batches to time.
    if whole_epoch and (batches < LEAST_CUT_BATCHES or batches < warmup + MIN_BATCHES):
        return plan, None
    # An epoch read in part whose shuffle buffers hold more batches than were
    # read (or an unknown number): no warm-up can fill them and leave batches
    # to time, so each pass is timed from its iterator's start, fill included.
    fill_timed = warmup_batches is None or batches < warmup + MIN_BATCHES
    if fill_timed:
        warmup = 0
    batch_s = epoch_s / batches
    fitting = int(PASSES_SHARE * left_s / passes / batch_s) - warmup
    num_batches = max(MIN_BATCHES, min(fitting, batches - warmup))
    sized = PassPlan(
        epochs=1,
        num_batches=num_batches,
        consumer_step_s=plan.consumer_step_s,
        warmup_batches=warmup,
    )
    if whole_epoch:
        why = (
            f"One epoch takes {epoch_s:.2f} s: {passes} passes of {plan.epochs} whole epochs "
            "would not fit the budget"
        )
    else:
        why = (
            f"The first {batches} batches of an epoch took {epoch_s:.2f} s, the most its "
            f"first read may take ({REFERENCE_SHARE:.0%} of the budget)"
        )
    if fill_timed:
        buffer = "" if warmup_batches is None else f" (some {warmup_batches} batches)"
        note = (
            f"{why}, so each timed pass read its first {num_batches} batches, timed from "
            f"its start: its shuffle buffer{buffer} fills in the first, which no untimed "
            "warm-up within the budget could fill."
        )
    else:
        note = (
            f"{why}, so each timed pass read {num_batches} batches after {warmup} untimed "
            "ones."
        )
    return sized, note
