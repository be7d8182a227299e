"""A PyDataset's advised `workers`, timed after training (`measure_fixes`).

Keras reads a `keras.utils.PyDataset` through its own adapter: one batch at a
time by `__getitem__` when `workers` is 1, through a queue that `workers`
threads fill otherwise. The advice (`py-dataset-workers`) is to read it with
`ADVISED_WORKERS`; this times that change, as the fix timing does a tf.data
rewrite: passes of a few batches after a warm-up, read through Keras' own
adapter with the PyDataset as written and with the advised workers, in
alternating rounds, medians.

`__getitem__` is the user's Python, which may keep state (an index of its
own, a NumPy generator, `on_epoch_end`'s shuffle): the passes run it again, in
this process, so they run only when the user asks (`measure_fixes=True` with
`allow_unverified=True`, see `after_training.probes`). Otherwise the advice
predicts the change's gain from `__getitem__`'s calls timed during training.
A pass reads its batches from index 0, as an epoch does; the PyDataset's
`workers` is put back as it was after the passes.

Keras' TensorFlow backend prefetches a PyDataset read by one worker (a
`prefetch` after `from_generator`), so a batch is loaded while a step
computes before the change as after it; the other backends read it on demand.
"""

import math
import statistics
import time
from typing import Dict
from typing import Iterable
from typing import List
from typing import Optional

from keras_pipeline_tuner.advice.recommendation import Recommendation
from keras_pipeline_tuner.after_training.fix_timing import FixTiming
from keras_pipeline_tuner.after_training.fix_timing import delivered_batch_s
from keras_pipeline_tuner.pipeline.lint.catalogue import PY_DATASET_WORKERS
from keras_pipeline_tuner.pipeline.lint.keras_inputs import ADVISED_WORKERS
from keras_pipeline_tuner.pipeline.tune import results as tune_results
from keras_pipeline_tuner.pipeline.tune.budget import MIN_ROUNDS
from keras_pipeline_tuner.pipeline.tune.pass_size import MIN_BATCHES
from keras_pipeline_tuner.pipeline.tune.pass_size import WARMUP_BATCHES
from keras_pipeline_tuner.pipeline.tune.py_dataset_loader import PyDatasetKind
from keras_pipeline_tuner.timing.step_stats import StepStats

# Share of the budget the passes are sized to fill: starting the adapters
# and their worker threads takes the rest.
_BUDGET_SHARE = 0.6
_MAX_BATCHES = 200
_MAX_ROUNDS = 15

AS_WRITTEN = "as written"
ADVISED = "advised"


def time_workers(
    py_dataset,
    recommendations: Iterable[Recommendation],
    stats: StepStats,
    budget_s: float,
    backend: str = "tensorflow",
    min_pass_s: float = 0.0,
) -> List[FixTiming]:
    """Times the advised `workers` of a PyDataset against it as written.

    Runs the PyDataset's `__getitem__` again, in this process, for about
    `budget_s` seconds; the model is not involved. Only for a user who asked
    (`allow_unverified=True`): its Python may keep state.

    Args:
        py_dataset: the `keras.utils.PyDataset` fit was given.
        recommendations: the advice formed for the run.
        stats: the run's training `StepStats`, to size the passes.
        budget_s: about how long the timing may take, in seconds.
        backend: the Keras backend (TensorFlow's prefetches a PyDataset read
            by one worker: see the module's docstring).
        min_pass_s: the least a timed pass should last, in seconds, as
            estimated from the steps (`timing.cpu_budget.quota_span_s` under a
            binding CPU quota: several of its periods), within the batches
            the PyDataset has.

    Returns:
        One `FixTiming` for the `py-dataset-workers` recommendation, or none
        when it was not advised.

    Example:

    ```python
    (timing,) = time_workers(train_batches, report.recommendations, report.train, 5.0)
    print(timing.change, timing.batch_ms_before, timing.batch_ms_after)
    ```
    """
    advised = [r for r in recommendations if PY_DATASET_WORKERS in (r.id, *r.also)]
    if not advised:
        return []
    recommendation = advised[0]
    timing = FixTiming(
        PY_DATASET_WORKERS,
        recommendation.stage,
        recommendation.stage_node,
        f"workers={ADVISED_WORKERS}",
        "",
        overlapped_before=backend == "tensorflow",
        overlapped_after=True,
        reran_python=True,
    )
    num_batches = _pass_batches(py_dataset, stats, budget_s, min_pass_s)
    if num_batches is None:
        timing.status = tune_results.NOT_APPLICABLE
        timing.reason = (
            f"it has fewer than {WARMUP_BATCHES + MIN_BATCHES} batches, too few for a timed pass"
        )
        return [timing]
    _measure(timing, py_dataset, num_batches, budget_s)
    return [timing]


def _measure(timing: FixTiming, py_dataset, num_batches: int, budget_s: float) -> None:
    """Runs the side-by-side passes; records them in `timing`."""
    try:
        passes = _side_by_side(py_dataset, num_batches, time.perf_counter() + budget_s)
    except Exception as error:  # noqa: BLE001 - the user's __getitem__ raised.
        timing.status, timing.reason = tune_results.FAILED, f"{type(error).__name__}: {error}"
        return
    rounds = min(len(passes[AS_WRITTEN]), len(passes[ADVISED]))
    if rounds < MIN_ROUNDS:
        timing.status = tune_results.NOT_MEASURED
        timing.reason = (
            f"{rounds} of {MIN_ROUNDS} side-by-side rounds fitted the {budget_s:g} s of "
            "measure_fixes"
        )
        return
    timing.status, timing.rounds, timing.batches = tune_results.MEASURED, rounds, num_batches
    timing.batch_ms_before = statistics.median(passes[AS_WRITTEN]) / num_batches * 1e3
    timing.batch_ms_after = statistics.median(passes[ADVISED]) / num_batches * 1e3


def _pass_batches(
    py_dataset, stats: StepStats, budget_s: float, min_pass_s: float = 0.0
) -> Optional[int]:
    """Batches per timed pass (after the warm-up), or `None` when too few exist."""
    # One worker reads a batch at most as fast as the steps that waited for it.
    batch_s = delivered_batch_s(stats)
    passes = 2 * MIN_ROUNDS
    fitting = int(_BUDGET_SHARE * budget_s / (passes * batch_s)) - WARMUP_BATCHES
    num_batches = max(
        MIN_BATCHES, min(_MAX_BATCHES, fitting), math.ceil(min_pass_s / batch_s)
    )
    available = py_dataset.num_batches
    if available is not None:
        if available < WARMUP_BATCHES + MIN_BATCHES:
            return None
        num_batches = min(num_batches, available - WARMUP_BATCHES)
    return num_batches


def _side_by_side(py_dataset, num_batches: int, deadline: float) -> Dict[str, List[float]]:
    """Passes as written and with the advised workers, alternated, to the deadline."""
    written = py_dataset.workers
    sides = {AS_WRITTEN: written, ADVISED: ADVISED_WORKERS}
    times: Dict[str, List[float]] = {AS_WRITTEN: [], ADVISED: []}
    try:
        for round_index in range(_MAX_ROUNDS):
            order = list(sides) if round_index % 2 == 0 else list(reversed(sides))
            for side in order:
                if time.perf_counter() > deadline:
                    return times
                py_dataset.workers = sides[side]
                times[side].append(_timed_pass(py_dataset, num_batches))
    finally:
        py_dataset.workers = written
    return times


def _timed_pass(py_dataset, num_batches: int) -> float:
    """Seconds to read `num_batches` batches through Keras' adapter, after the warm-up."""
    # Keras' own reading path, which fit takes: it reads `workers` when made.
    batches = PyDatasetKind().epoch(py_dataset)
    try:
        for _ in range(WARMUP_BATCHES):
            next(batches)
        began = time.perf_counter()
        for _ in range(num_batches):
            next(batches)
        return time.perf_counter() - began
    finally:
        batches.close()
