"""Timing datasets side by side, so that their ratio survives a noisy machine.

On a shared machine one pass of a pipeline can take twice as long as the next
for reasons that have nothing to do with the pipeline. Two pipelines are only
compared fairly when they are timed alternately in the same run (each round in
a different order, so neither always runs first), with Python's garbage
collector off while a pass runs (a full collection with TensorFlow loaded takes
hundreds of milliseconds at random moments) and only the young generations
collected between rounds, and judged by the median of the per-round ratios.
"""

import dataclasses
import gc
import statistics
import time
from typing import Callable
from typing import Dict
from typing import List
from typing import Optional
from typing import Sequence

# A comparison stops early once its first rounds put the two pipelines clearly
# apart: after at least this many rounds, every round's ratio beyond
# `CLEAR_RATIO` on the same side (a sign test whose rounds each differ by more
# than the noise of this machine: a tenth, rarely a fifth, between passes).
CLEAR_ROUNDS = 3
CLEAR_RATIO = 1.25
# Collected between rounds: generations 0 and 1, never the oldest (see `side_by_side`).
YOUNG_GENERATIONS = 1


class OutOfTime(RuntimeError):
    """A timed pass, or a candidate's check of its elements, ran past its `stop_at`."""


@dataclasses.dataclass
class PassPlan:
    """What one timed pass over a dataset consists of.

    Attributes:
        epochs: epochs per pass.
        num_batches: batches per epoch; `None` for whole epochs. As in
            `model.fit`, whole epochs each get a new iterator, while epochs
            of `num_batches` (`steps_per_epoch`) continue one iterator, and
            start another only when it runs out.
        consumer_step_s: seconds the simulated training step sleeps after
            each batch; `None` or 0 for the dataset alone.
        warmup_batches: with `num_batches`, batches read from the pass's
            iterator before its clock starts (its threads and buffers start
            up, as in training's first steps, which a pass of a few batches
            would otherwise mostly time).
    """

    epochs: int = 2
    num_batches: Optional[int] = None
    consumer_step_s: Optional[float] = None
    warmup_batches: int = 0


def time_pass(dataset, plan: PassPlan, stop_at: Optional[float] = None) -> float:
    """Times one pass over a dataset as a training loop would consume it.

    Args:
        dataset: the `tf.data.Dataset`.
        plan: the `PassPlan`.
        stop_at: a `time.perf_counter()` value past which the pass stops,
            checked before every batch; `None` for none.

    Returns:
        The wall time of the pass in seconds, from the first iterator's
        creation (or the end of its warm-up) to the end of the last epoch:
        with its iterator destroyed for whole epochs (as `fit` destroys it
        before the next epoch); at its last batch for epochs of
        `num_batches`, whose iterator training would go on reading.

    Raises:
        OutOfTime: if the pass was still running at `stop_at`.
    """
    step = plan.consumer_step_s or 0.0
    iterator = _warmed_up(dataset, plan, stop_at)
    began = time.perf_counter()
    for _ in range(plan.epochs):
        fresh = iterator is None or plan.num_batches is None
        if fresh:
            iterator = iter(dataset)
        taken = 0
        while plan.num_batches is None or taken < plan.num_batches:
            _check_pass(stop_at, taken)
            try:
                next(iterator)
            except StopIteration:
                if plan.num_batches is None or fresh:
                    break
                iterator, fresh = iter(dataset), True
                continue
            fresh = False
            taken += 1
            if step:
                time.sleep(step)
        if plan.num_batches is None:
            # Destroying an iterator can take a while (autotuning threads
            # stop); it is part of what an epoch costs, so it is timed.
            iterator = None
    ended = time.perf_counter()
    # Destroying the last iterator of `num_batches` epochs is left out: it
    # took 8, 300 or 640 ms at random (a generator's, against 0.3-0.6 s of
    # batches), which made one pipeline's passes read at two rates 2x apart.
    del iterator
    return ended - began


def check_time(stop_at: Optional[float], running: str) -> None:
    """Raises `OutOfTime` when `time.perf_counter()` is past `stop_at` (`None`: never).

    Args:
        stop_at: the `time.perf_counter()` value to stop at, or `None`.
        running: what was still running, for the message ("a timed pass").
    """
    if stop_at is not None and time.perf_counter() > stop_at:
        raise OutOfTime(f"{running} was still running when the time budget ran out")


def _check_pass(stop_at: Optional[float], taken: int) -> None:
    check_time(stop_at, f"a timed pass, after {taken} batches,")


def _warmed_up(dataset, plan: PassPlan, stop_at: Optional[float]):
    """An iterator past its warm-up batches (`plan.warmup_batches`), or `None`."""
    if not plan.warmup_batches or plan.num_batches is None:
        return None
    iterator = iter(dataset)
    for _ in range(plan.warmup_batches):
        _check_pass(stop_at, 0)
        try:
            next(iterator)
        except StopIteration:
            return None
    return iterator


def side_by_side(
    factories: Dict[str, Callable[[], object]],
    plan: PassPlan,
    rounds: int,
    deadline: Optional[float] = None,
    on_pass: Optional[Callable[[], None]] = None,
    settled: Optional[Callable[[Dict[str, List[float]]], bool]] = None,
    stop_at: Optional[float] = None,
) -> Dict[str, List[float]]:
    """Times several datasets in alternating passes.

    Each round times every dataset once, in an order rotated from the previous
    round's; each pass uses a fresh dataset from its factory (built before the
    clock starts), so caches start empty as they would in a new training run.

    Args:
        factories: name -> callable returning a fresh `tf.data.Dataset`.
        plan: the `PassPlan` of every pass.
        rounds: how many rounds at most.
        deadline: a `time.perf_counter()` value after which no new round
            starts (at least one round always runs).
        on_pass: called after each timed pass (e.g. to show progress).
        settled: called with the times after each round; `True` stops the
            rounds there (see `clearly_apart`).
        stop_at: a `time.perf_counter()` value at which a pass under way
            stops (a machine that slowed down after the rounds were sized):
            its round is dropped, and the rounds before it are returned.

    Returns:
        name -> list of pass times in seconds, one per round run in full.

    Raises:
        OutOfTime: if `stop_at` came before the first round ended.
    """
    names = list(factories)
    times: Dict[str, List[float]] = {name: [] for name in names}
    enabled = gc.isenabled()
    try:
        for index in range(rounds):
            if index and deadline is not None and time.perf_counter() > deadline:
                break
            # What the passes made (their iterators, their threads) is young:
            # with the collector off during a round nothing of it is promoted,
            # so collecting the two young generations frees it. A full
            # collection would also scan the rest of the process's heap and run
            # the finalisers of whatever garbage it holds: in a process that had
            # run many fits, one took 60 s, a whole budget, on a busy machine.
            gc.collect(YOUNG_GENERATIONS)
            gc.disable()
            shift = index % len(names)
            try:
                for name in names[shift:] + names[:shift]:
                    dataset = factories[name]()
                    times[name].append(time_pass(dataset, plan, stop_at))
                    del dataset
                    if on_pass is not None:
                        on_pass()
            except OutOfTime:
                # Only whole rounds pair their passes: the one cut short is dropped.
                if not index:
                    raise
                return {name: found[:index] for name, found in times.items()}
            if enabled:
                gc.enable()
            if settled is not None and settled(times):
                break
    finally:
        if enabled:
            gc.enable()
    return times


def clearly_apart(first: Sequence[float], second: Sequence[float]) -> bool:
    """Whether paired rounds already put two pipelines clearly apart (see `CLEAR_RATIO`).

    Args:
        first: pass times of one dataset, one per round.
        second: pass times of the other, from the same rounds.

    Returns:
        `True` after `CLEAR_ROUNDS` rounds or more whose every ratio is
        beyond `CLEAR_RATIO` on the same side.

    Example:

    >>> clearly_apart([2.0, 2.1, 1.9], [1.0, 1.0, 1.0]), clearly_apart([2.0, 1.1], [1.0, 1.0])
    (True, False)
    >>> clearly_apart([2.0, 1.1, 2.0], [1.0, 1.0, 1.0])
    False
    """
    ratios = [a / b for a, b in zip(first, second) if b > 0]
    if len(ratios) < CLEAR_ROUNDS:
        return False
    return all(r >= CLEAR_RATIO for r in ratios) or all(r <= 1 / CLEAR_RATIO for r in ratios)


def median_ratio(numerators: Sequence[float], denominators: Sequence[float]) -> float:
    """The median of per-round ratios `numerators[i] / denominators[i]`.

    Args:
        numerators: pass times of one dataset, one per round.
        denominators: pass times of the other, from the same rounds.

    Returns:
        The median ratio.

    Example:

    >>> median_ratio([1.0, 2.0, 1.1], [2.0, 2.0, 2.0])
    0.55
    """
    ratios = [a / b for a, b in zip(numerators, denominators) if b > 0]
    if not ratios:
        raise ValueError("No round has a positive time to divide by.")
    return statistics.median(ratios)
