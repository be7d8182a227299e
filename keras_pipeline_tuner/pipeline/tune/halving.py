"""Successive halving: many settings timed on a few batches, the better half on more.

A loader's settings (worker counts, queue sizes) are too many to time each
for long within a budget. Every setting is timed on a short pass; the faster
half is timed again on passes twice as long, and so on, until one is left, the
passes cover the batches allowed, or the next rung would not fit before the
deadline. The passes of a rung alternate between the settings (each rung in
its own rotated order) as `paired_timing.side_by_side` times them, with the
collector off, and each pass's CPU use (threads and worker processes) is
measured beside its wall time.
"""

import dataclasses
import math
import time
from typing import Callable
from typing import Dict
from typing import List
from typing import Optional
from typing import Tuple

from keras_pipeline_tuner.pipeline.tune import paired_timing
from keras_pipeline_tuner.pipeline.tune.paired_timing import PassPlan

# A pass this many times longer than the fastest of its rung so far (plus
# `_SLOW_FLOOR_S`) is stopped: that setting cannot win, and would spend the budget.
SLOW_MULTIPLE = 3.0
_SLOW_FLOOR_S = 0.5


@dataclasses.dataclass
class SettingTiming:
    """One setting of a loader, as successive halving measured it.

    Attributes:
        setting: the setting as code, e.g. "num_workers=4, prefetch_factor=2".
        batches: batches per epoch of its longest timed pass.
        epochs: epochs per pass.
        pass_s: seconds of that pass (measured, the median where it ran more).
        cpu_cores: CPU time its pass used over the pass's wall time, in cores
            (this process's threads and its worker processes), measured.
        rungs: how many rungs of the halving it was timed in (the best went
            furthest).
        stopped: its pass was stopped at `SLOW_MULTIPLE` times the fastest of
            its rung: `pass_s` is then where it was stopped, a lower bound.
    """

    setting: str
    batches: int
    epochs: int
    pass_s: float
    cpu_cores: Optional[float] = None
    rungs: int = 1
    stopped: bool = False

    @property
    def batch_ms(self) -> float:
        """Milliseconds a batch in its longest pass, consumer step included."""
        return self.pass_s / max(self.batches * self.epochs, 1) * 1e3


def successive_halving(
    factories: Dict[str, Callable[[int], object]],
    plan: PassPlan,
    first_batches: int,
    most_batches: int,
    deadline: float,
    stop_at: Optional[float] = None,
    cpu_cores: Optional[Callable[[str], Optional[float]]] = None,
    on_pass: Optional[Callable[[], None]] = None,
) -> Tuple[List[str], Dict[str, SettingTiming]]:
    """Times the settings in rungs of doubling passes, keeping the faster half each time.

    Args:
        factories: setting (as code) -> callable giving, for a number of
            batches, a fresh loader with that setting whose epochs (an
            iterable, iterated once an epoch) stop at that many batches.
        plan: the `PassPlan` of every pass (epochs, consumer step).
        first_batches: batches an epoch in the first rung.
        most_batches: the most batches an epoch (the loader's length).
        deadline: a `time.perf_counter()` value no rung may end after (the
            first always runs).
        stop_at: a `time.perf_counter()` value at which a pass under way stops.
        cpu_cores: setting -> CPU cores its last pass used, if measured.
        on_pass: called after every timed pass.

    Returns:
        `(ranking, table)`: the settings best first (those of the last rung,
        then those dropped before it, each group fastest first), and what was
        measured of each.

    Raises:
        OutOfTime: if `stop_at` came before the first setting's pass ended.
    """
    alive = list(factories)
    dropped: List[str] = []
    table: Dict[str, SettingTiming] = {}
    batches = max(1, min(first_batches, most_batches))
    rung = 0
    while True:
        began = time.perf_counter()
        _time_rung(
            factories, alive, batches, plan, rung, table, (deadline, stop_at), cpu_cores, on_pass
        )
        rung_s = time.perf_counter() - began
        alive.sort(key=lambda name: (table[name].stopped, table[name].pass_s))
        if len(alive) == 1 or batches >= most_batches:
            break
        keep = math.ceil(len(alive) / 2)
        following = min(2 * batches, most_batches)
        # The next rung: half the settings, passes `following / batches` as long.
        next_s = rung_s * keep / len(alive) * following / batches
        if time.perf_counter() + next_s > deadline:
            break
        dropped = alive[keep:] + dropped
        alive = alive[:keep]
        batches = following
        rung += 1
    return alive + dropped, table


def _time_rung(factories, alive, batches, plan, rung, table, ends, cpu_cores, on_pass):
    """Times each setting of a rung once, in an order rotated from the last rung's.

    A pass that runs `SLOW_MULTIPLE` times longer than the fastest of the
    rung so far is stopped there (a setting whose workers take seconds to
    start, say): the setting is then last, `stopped`. Past the deadline
    (`ends`: deadline and stop_at), the settings left are not timed: last
    too, `stopped`, at an infinite time.
    """
    deadline, stop_at = ends
    shift = rung % len(alive)
    fastest = None
    for name in alive[shift:] + alive[:shift]:
        previous = table.get(name)
        if fastest is not None and time.perf_counter() > deadline:
            table[name] = SettingTiming(
                name, batches, plan.epochs, math.inf, None,
                previous.rungs if previous else 0, stopped=True,
            )
            continue
        try:
            # Made before its limit starts: a factory may read an untimed epoch
            # first (workers that persist, warmed as training's later epochs).
            made = factories[name](batches)
            limit = stop_at
            if fastest is not None:
                own = time.perf_counter() + SLOW_MULTIPLE * fastest + _SLOW_FLOOR_S
                limit = own if limit is None else min(limit, own)
            began = time.perf_counter()
            times = paired_timing.side_by_side(
                {name: lambda: made},
                plan,
                rounds=1,
                stop_at=limit,
                on_pass=on_pass,
            )
        except paired_timing.OutOfTime:
            if fastest is None or (stop_at is not None and time.perf_counter() > stop_at):
                raise
            pass_s, stopped = time.perf_counter() - began, True
        else:
            pass_s, stopped = times[name][0], False
            fastest = pass_s if fastest is None else min(fastest, pass_s)
        table[name] = SettingTiming(
            setting=name,
            batches=batches,
            epochs=plan.epochs,
            pass_s=pass_s,
            cpu_cores=None if stopped or cpu_cores is None else cpu_cores(name),
            rungs=previous.rungs + 1 if previous else 1,
            stopped=stopped,
        )

