"""`tune`: rewrite a tf.data pipeline, measure each rewrite, keep what is faster.

The candidates come from `pipeline_rewrite.plan_rewrites` (parallel map and
interleave, AUTOTUNE for fixed parallelism, a cache at a safe point, a final
prefetch). Each one is tried on top of the rewrites kept so far: the rewritten
graph is rebuilt in this process, its elements are checked against the
original's, and it is timed side by side with the pipeline without it
(`paired_timing`); it is kept only when it is measurably faster. The pipeline
with every kept rewrite is finally timed against the original, and that ratio
is the one reported.
"""

import dataclasses
import hashlib
import itertools
import logging
import math
import os
import shutil
import statistics
import tempfile
import time
import uuid
from typing import Callable, List, Optional, Tuple, Union

import numpy as np

from keras_pipeline_tuner.pipeline import code as pipeline_code
from keras_pipeline_tuner.pipeline import paired_timing
from keras_pipeline_tuner.pipeline import graph as pipeline_graph
from keras_pipeline_tuner.pipeline import rewrite as pipeline_rewrite
from keras_pipeline_tuner._util.argument_checks import checked_dataset
from keras_pipeline_tuner._util.argument_checks import positive_int
from keras_pipeline_tuner._util.argument_checks import seconds
from keras_pipeline_tuner._util.argument_checks import verbosity
from keras_pipeline_tuner._util.tf_import import tensorflow

logger = logging.getLogger("keras_pipeline_tuner")

DEFAULT_BUDGET_S = 60.0
_MIN_ROUNDS = 3
_MAX_ROUNDS = 9
# A pass of tens of milliseconds is at the mercy of one scheduling slice: fast
# pipelines get more rounds, up to about this many seconds per side...
_FAST_SIDE_S = 1.0
# ... and at most this many rounds.
_MAX_FAST_ROUNDS = 45
# Share of the available memory a cache may take: training needs the rest.
_CACHE_MEMORY_SHARE = 0.25
# Share of the budget one epoch of the original may take before tuning gives up.
_EPOCH_BUDGET_SHARE = 0.3
# Elements compared between two passes at a cache point in a random pipeline.
_REPEAT_CHECK_ELEMENTS = 256

class _FillTooLong(Exception):
    """Filling a cache would take longer than the budget leaves."""


KEPT = "kept"
SLOWER = "not faster"
CHANGED_ELEMENTS = "changed the elements"
FAILED = "failed"
NOT_MEASURED = "not measured"
NOT_APPLICABLE = "not applicable"
UNVERIFIED = "not proven"
# Timed only, by `time_rewrites`: neither kept nor refused.
MEASURED = "measured"

# Epochs tuning may run of a pipeline that calls Python (its side effects run
# on every one), unless the caller allows more.
DEFAULT_PYTHON_EPOCHS = 60
# Relative tolerance for floating-point elements of a vectorised map: the same
# element-wise ops on a batch may take other (vectorised) code paths.
VECTORIZE_RTOL = 1e-6


@dataclasses.dataclass
class RewriteOutcome:
    """A rewrite `tune` considered, and what became of it.

    Attributes:
        kind: "vectorize", "parallel-map", "parallel-interleave", "autotune",
            "parallel-batch", "map-fusion", "cache", "prefetch",
            "nondeterministic" (deterministic=False), "private-threadpool" or
            "autotune-off".
        stage: the stage as the user wrote it, e.g. "map(load)".
        change: the stage after the rewrite, as code.
        applied: whether the tuned dataset has it.
        status: "kept", "not faster", "changed the elements", "failed",
            "not measured" (the budget was spent, the rewrite is too slow to
            measure in the budget, or the limit of passes over Python code was
            reached; `reason` gives the figures), "not proven" (its elements
            cannot be proven equal and `allow_unverified` was not given) or
            "not applicable".
        ratio: median over rounds of the pass time with the rewrite over the
            pass time without it (the rewrites kept before it in both), timed
            side by side; below 1 is faster. `None` when not measured.
        rounds: how many side-by-side rounds `ratio` comes from.
        reason: why it was kept or not, in words.
        changes_order: whether it can change the order of the elements (for
            a rewrite that cannot be proven, such as parallel calls of a Python
            function: which element the function's state goes with).
        changes_determinism: whether it can change the elements' values from
            run to run (random numbers drawn in another order).
        caveat: what it assumes about the user's code, if anything.
        verified: False when the elements could not be proven equal (e.g. a
            Python function called from several threads) and it was kept
            because `allow_unverified=True`.
        elements_check: how its elements were compared with the pipeline's
            without it: "equal" (same values in the same order), "equal within
            rtol=..." (floating-point values, after vectorisation), "same
            elements, any order" (it may reorder) or "structure" (the pipeline
            is random: number, types and shapes only); empty when not run.
    """

    kind: str
    stage: str
    change: str = ""
    applied: bool = False
    status: str = NOT_APPLICABLE
    ratio: Optional[float] = None
    rounds: int = 0
    reason: str = ""
    changes_order: bool = False
    changes_determinism: bool = False
    caveat: Optional[str] = None
    verified: bool = True
    elements_check: str = ""

    @property
    def speedup(self) -> Optional[float]:
        """How many times faster the rewrite made the pipeline (1 / ratio)."""
        return None if not self.ratio else 1.0 / self.ratio


@dataclasses.dataclass
class TuneResult:
    """What `tune` measured and changed.

    All times are medians of passes timed side by side in the same run; a pass
    is `epochs` epochs of at most `batches_per_epoch` batches, each followed by
    a simulated training step of `consumer_step_s` seconds. Passes of
    `batches_per_epoch` batches time the steady state: a cache in them is
    filled first by one whole untimed epoch (said in `notes`).

    Attributes:
        original_s: seconds per pass of the original pipeline.
        tuned_s: seconds per pass of the tuned pipeline.
        ratio: median over rounds of tuned / original pass time; 1.0 when
            nothing was changed. Below 1 is faster.
        rounds: how many rounds `ratio` comes from.
        rewrites: every rewrite considered, with its own measured ratio.
        elements_check: how the tuned elements were checked: "equal" (same
            elements in the same order as the original's first epoch), "same
            elements, any order" (a kept rewrite may reorder them) or
            "structure" (the pipeline is random: same number, types and shapes).
        pipeline: the original pipeline, as code.
        tuned_pipeline: the tuned pipeline, as code.
        epochs: epochs per pass.
        batches_per_epoch: batches per epoch (`None`: whole epochs).
        consumer_step_s: the simulated training step, if any.
        elapsed_s: how long tuning took.
        notes: caveats in plain words.
        code: the tuned pipeline as Python to paste in place of the original
            lines, with the user's function names (empty when nothing changed).
        epochs_run: how many epochs of the pipeline tuning ran, checks
            included (each runs the user's functions and their side effects).
        epoch_limit: the most epochs tuning could run, for a pipeline that
            calls Python; `None` when only the time budget bounds it.

    Example:

    ```python
    tuned_ds, result = kpt.tune(train_ds, consumer_step_s=0.01)
    print(f"{result.speedup:.2f}x", [r.change for r in result.applied])
    print(result.code)   # the tuned lines, to paste in place of the original
    ```
    """

    original_s: float
    tuned_s: float
    ratio: float = 1.0
    rounds: int = 0
    rewrites: List[RewriteOutcome] = dataclasses.field(default_factory=list)
    elements_check: str = "equal"
    pipeline: str = ""
    tuned_pipeline: str = ""
    epochs: int = 2
    batches_per_epoch: Optional[int] = None
    consumer_step_s: Optional[float] = None
    elapsed_s: float = 0.0
    notes: List[str] = dataclasses.field(default_factory=list)
    code: str = ""
    epochs_run: int = 0
    epoch_limit: Optional[int] = None

    @property
    def speedup(self) -> float:
        """How many times faster the tuned pipeline is (1 / ratio)."""
        return 1.0 / self.ratio if self.ratio > 0 else math.inf

    @property
    def applied(self) -> List[RewriteOutcome]:
        """The rewrites the tuned dataset has."""
        return [outcome for outcome in self.rewrites if outcome.applied]

    @property
    def changes_order(self) -> bool:
        """Whether any applied rewrite can change the order of the elements."""
        return any(outcome.changes_order for outcome in self.applied)

    @property
    def changes_determinism(self) -> bool:
        """Whether any applied rewrite can change the elements from run to run."""
        return any(outcome.changes_determinism for outcome in self.applied)


@dataclasses.dataclass
class TimedRewrite:
    """One rewrite timed on its own against the pipeline as written (`time_rewrites`).

    Attributes:
        outcome: the `RewriteOutcome`: `status` is "measured" when it was
            timed (`ratio` is then its median per-round time ratio), else why
            not ("not proven", "not measured", "failed", "changed the
            elements", "not applicable").
        without_s: median seconds per pass of the pipeline as written.
        with_s: median seconds per pass with the rewrite.
        batches: batches (elements of the final dataset) per pass.
    """

    outcome: RewriteOutcome
    without_s: Optional[float] = None
    with_s: Optional[float] = None
    batches: int = 0


def tune(
    dataset,
    consumer_step_s: Optional[float] = None,
    budget_s: float = DEFAULT_BUDGET_S,
    *,
    epochs: int = 2,
    num_batches: Optional[int] = None,
    cache_path: Optional[Union[str, os.PathLike]] = None,
    cache_memory_bytes: Optional[int] = None,
    allow_nondeterministic: bool = False,
    allow_reordering: bool = False,
    allow_unverified: bool = False,
    max_python_epochs: int = DEFAULT_PYTHON_EPOCHS,
    min_gain: float = 0.03,
    verbose: int = 1,
):
    """Rewrites a dataset's pipeline and keeps the rewrites that make it faster.

    The rewrites are made on the dataset's graph and rebuilt in this process,
    so the user's functions run unchanged: a sequential `map` or `interleave`
    becomes parallel (order kept), fixed parallelism and buffer sizes become
    AUTOTUNE, a cache goes after the last expensive stage that gives the same
    elements every epoch (never after a shuffle or a random augmentation; only
    if it fits in memory, or on `cache_path`), and a prefetch ends the
    pipeline. Each rewrite is timed side by side with the pipeline without it,
    on this machine, and kept only if it is at least `min_gain` faster. No
    rewrite changes what the model sees: the tuned dataset's elements are
    checked against the original's.

    Args:
        dataset: the `tf.data.Dataset` to tune, as passed to `model.fit`.
        consumer_step_s: seconds of a simulated training step after each
            batch (e.g. the step time the `PipelineTuner` measured); `None`
            times the dataset alone.
        budget_s: about how long tuning may take, in seconds.
        epochs: epochs per timed pass; a cache pays off from the second.
        num_batches: batches per epoch; `None` for whole epochs. Required
            for infinite datasets (pass your `steps_per_epoch`). Such passes
            time the steady state: a cache is filled by one whole untimed
            epoch before them, as training's first epoch fills it.
        cache_path: a file path prefix where a cache too big for memory may
            be written; `None` caches only in memory.
        cache_memory_bytes: the most memory a cache may take; defaults to a
            quarter of the memory available now.
        allow_nondeterministic: also parallelise maps that draw random
            numbers (the numbers then fall on other elements from run to run).
        allow_reordering: also try `deterministic=False` on maps and
            interleaves: elements then come out as they are ready, in an
            order that can change from run to run.
        allow_unverified: also measure and keep rewrites whose elements
            cannot be proven equal to the original's, e.g. parallel calls of
            a `tf.py_function` (right only if the Python function keeps no
            state between calls).
        max_python_epochs: the most epochs of the pipeline tuning runs when
            the pipeline calls Python (`tf.py_function`, `from_generator`),
            checks included: their side effects run on every epoch.
        min_gain: the least speed-up a rewrite must bring to be kept
            (0.03 = 3 % less time per pass).
        verbose: 1 shows a progress bar of the timed passes (plain text when
            the output is not a terminal), 0 is silent.

    Returns:
        `(tuned_dataset, result)`: the tuned `tf.data.Dataset` (the original
        object itself when nothing was kept) and a `TuneResult`.

    Raises:
        TypeError: if `dataset` is not a `tf.data.Dataset`.
        ValueError: for arguments out of range, an infinite dataset without
            `num_batches`, or an epoch too long for the budget.

    Example:

    ```python
    tuned_ds, result = kpt.tune(train_ds, consumer_step_s=0.01, budget_s=60)
    for outcome in result.rewrites:
        print(outcome.change, outcome.status, outcome.ratio)
    model.fit(tuned_ds, epochs=10)
    ```
    """
    tf = tensorflow()
    checked_dataset(dataset, "tune")
    plan = paired_timing.PassPlan(
        epochs=positive_int(epochs, "epochs"),
        num_batches=positive_int(num_batches, "num_batches", optional=True),
        consumer_step_s=seconds(consumer_step_s, "consumer_step_s"),
    )
    if not seconds(budget_s, "budget_s"):
        raise ValueError(f"`budget_s` must be a positive number of seconds, got {budget_s!r}.")
    if isinstance(min_gain, bool) or not isinstance(min_gain, (int, float)) or not 0 <= min_gain < 1:
        raise ValueError(f"`min_gain` must be in [0, 1), e.g. 0.03 for 3 %, got {min_gain!r}.")
    verbosity(verbose)
    positive_int(max_python_epochs, "max_python_epochs")
    if max_python_epochs < 5 + plan.epochs:
        raise ValueError(
            f"`max_python_epochs` must allow the 5 epochs that check the pipeline and "
            f"one timed pass of {plan.epochs} epochs: at least {5 + plan.epochs}, got "
            f"{max_python_epochs}."
        )
    for name, flag in (
        ("allow_nondeterministic", allow_nondeterministic),
        ("allow_reordering", allow_reordering),
        ("allow_unverified", allow_unverified),
    ):
        if not isinstance(flag, bool):
            raise TypeError(f"`{name}` must be True or False, got {flag!r}.")
    if cache_path is not None:
        if not isinstance(cache_path, (str, os.PathLike)):
            raise TypeError(f"`cache_path` must be a path, got {type(cache_path).__name__}.")
        cache_path = os.fspath(cache_path)
        if os.path.isdir(cache_path):
            raise ValueError(
                f"`cache_path` {cache_path!r} is a directory; pass a file prefix inside "
                f"it, e.g. {os.path.join(cache_path, 'train_cache')!r}."
            )
    if cache_memory_bytes is not None:
        positive_int(cache_memory_bytes, "cache_memory_bytes")
    if plan.num_batches is None and int(dataset.cardinality()) == tf.data.INFINITE_CARDINALITY:
        raise ValueError(
            "The dataset is infinite (it repeats forever), so an epoch never ends: "
            "pass num_batches=<batches per epoch>, e.g. your steps_per_epoch."
        )
    session = _TuningSession(
        dataset,
        plan,
        budget_s=float(budget_s),
        cache_path=cache_path,
        cache_memory_bytes=cache_memory_bytes,
        allow_nondeterministic=allow_nondeterministic,
        allow_reordering=allow_reordering,
        allow_unverified=allow_unverified,
        max_python_epochs=max_python_epochs,
        min_gain=float(min_gain),
        verbose=verbose,
    )
    try:
        return session.run()
    finally:
        session.close()


def time_rewrites(
    dataset,
    rewrites,
    budget_s: float,
    *,
    epochs: int = 1,
    num_batches: Optional[int] = None,
    allow_unverified: bool = False,
    max_python_epochs: int = DEFAULT_PYTHON_EPOCHS,
) -> List[TimedRewrite]:
    """Times each given rewrite on its own against the pipeline as written.

    The same machinery as `tune` (rebuild from the graph, element checks,
    side-by-side rounds with GC off, the time budget and the limit of epochs
    over Python code), but every rewrite is compared with the original and
    none is kept: what each change alone would bring.

    Args:
        dataset: the `tf.data.Dataset`.
        rewrites: `pipeline_rewrite.Rewrite`s planned for it
            (`plan_rewrites`).
        budget_s: about how long it may take, in seconds; a rewrite that does
            not fit is "not measured".
        epochs: epochs per timed pass (a cache pays off from the second).
        num_batches: batches per epoch; `None` for whole epochs.
        allow_unverified: also time rewrites whose elements cannot be proven
            equal to the original's (parallel calls of a Python function);
            they are "not proven" otherwise.
        max_python_epochs: the most epochs of a pipeline that calls Python.

    Returns:
        One `TimedRewrite` per rewrite, in order.

    Example:

    ```python
    pipeline = pipeline_graph.read_pipeline(ds)
    candidates, _ = pipeline_rewrite.plan_rewrites(pipeline)
    for timed in time_rewrites(ds, candidates, budget_s=5.0, num_batches=20):
        print(timed.outcome.change, timed.outcome.status, timed.outcome.ratio)
    ```
    """
    checked_dataset(dataset, "time_rewrites")
    plan = paired_timing.PassPlan(
        epochs=positive_int(epochs, "epochs"),
        num_batches=positive_int(num_batches, "num_batches", optional=True),
    )
    if not seconds(budget_s, "budget_s"):
        raise ValueError(f"`budget_s` must be a positive number of seconds, got {budget_s!r}.")
    session = _TuningSession(
        dataset,
        plan,
        budget_s,
        cache_path=None,
        cache_memory_bytes=None,
        allow_nondeterministic=False,
        allow_reordering=False,
        allow_unverified=allow_unverified,
        max_python_epochs=positive_int(max_python_epochs, "max_python_epochs"),
        min_gain=0.0,
        verbose=0,
    )
    try:
        return session.measure(list(rewrites))
    finally:
        session.close()


class _TuningSession:
    """The state of one `tune` call."""

    def __init__(
        self,
        dataset,
        plan,
        budget_s,
        cache_path,
        cache_memory_bytes,
        allow_nondeterministic,
        allow_reordering,
        allow_unverified,
        max_python_epochs,
        min_gain,
        verbose,
    ):
        self.dataset = dataset
        self.plan = plan
        self.budget_s = budget_s
        self.started = time.perf_counter()
        self.deadline = self.started + budget_s
        self.cache_path = cache_path
        self.cache_memory_bytes = cache_memory_bytes
        self.allow_nondeterministic = allow_nondeterministic
        self.allow_reordering = allow_reordering
        self.allow_unverified = allow_unverified
        self.max_python_epochs = max_python_epochs
        self.min_gain = min_gain
        self.verbose = verbose
        self.spec = dataset.element_spec
        self.graph_def = pipeline_rewrite.graph_def_of(dataset)
        self.notes: List[str] = []
        self._scratch = None
        self._pass_estimate_s = 0.0
        # Wall time a timed pass costs beyond the pass itself (building the
        # rewritten dataset, garbage collection between rounds), as measured.
        self._pass_overhead_s = 0.0
        self._epoch_s = 0.0
        self.epochs_run = 0
        self.epoch_limit: Optional[int] = None
        # False once a kept rewrite may reorder elements: later checks then
        # compare the elements as a multiset.
        self.ordered = True
        self._reference_rows: Optional[List[str]] = None
        self._progress = None
        # Seconds of each untimed epoch that filled a cache before passes of
        # `num_batches` batches (see `_factory`).
        self.fill_s: List[float] = []

    def close(self) -> None:
        self._stop_progress()
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)

    def run(self):
        pipeline = pipeline_graph.read_pipeline(self.dataset)
        python = self._read_reference(pipeline)
        candidates, skipped = pipeline_rewrite.plan_rewrites(
            pipeline, self.allow_nondeterministic, self.allow_reordering
        )
        outcomes = [
            RewriteOutcome(kind=item.kind, stage=item.stage, reason=item.reason)
            for item in skipped
        ]
        problem = self._rebuild_problem()
        if problem is not None:
            self.notes.append(
                f"The pipeline could not be rebuilt from its graph ({problem}), so it was "
                "left as it is."
            )
            outcomes += [
                RewriteOutcome(
                    kind=rewrite.kind,
                    stage=rewrite.stage,
                    change=rewrite.change,
                    status=FAILED,
                    reason="the pipeline cannot be rebuilt from its graph",
                )
                for rewrite in candidates
            ]
            candidates = []
        self._comparisons_left = len(candidates) + 1
        self.rounds = self._rounds(self._comparisons_left)
        self._start_progress(2 * self.rounds * (len(candidates) + 1))

        kept: List[pipeline_rewrite.Rewrite] = []
        # The one comparison of a single kept rewrite against the original
        # doubles as the final one.
        against_original = None
        # While nothing is kept, every comparison times the original too.
        original_alone = None
        for rewrite in candidates:
            self.rounds = self._rounds(self._comparisons_left)
            self._estimate_progress(2 * self.rounds * self._comparisons_left)
            outcome, times = self._try(rewrite, kept)
            self._comparisons_left -= 1
            outcomes.append(outcome)
            if times is not None and not kept:
                original_alone = times[0]
            if outcome.applied:
                against_original = times if not kept else None
                kept.append(rewrite)
                # Later comparisons time the pipeline with it: the budget
                # rule and the rounds go by its pass time.
                self._pass_estimate_s = statistics.median(times[1])
                self._epoch_s = self._pass_estimate_s / self.plan.epochs
        self.rounds = self._rounds(1)

        if against_original is not None:
            original_times, tuned_times = against_original
        elif kept:
            times = self._side_by_side(
                {"original": self._factory([]), "tuned": self._factory(kept)},
                self._affordable_rounds(final=False),
                deadline=self.deadline,
            )
            original_times, tuned_times = times["original"], times["tuned"]
        elif original_alone is not None:
            original_times = tuned_times = original_alone
        else:
            # Nothing to compare with: the original's own time, as rebuilt
            # (fresh caches) when that works.
            original = (lambda: self.dataset) if problem else (lambda: self._build([]))
            rounds = _MIN_ROUNDS if self.epoch_limit is None else max(1, min(
                _MIN_ROUNDS, (self.epoch_limit - self.epochs_run) // self.plan.epochs
            ))
            times = self._side_by_side({"original": original}, rounds, deadline=None)
            original_times = tuned_times = times["original"]
        self._stop_progress()

        if kept:
            ratio = paired_timing.median_ratio(tuned_times, original_times)
            tuned = self._build(kept, final=True)
            tuned_pipeline = pipeline_graph.read_pipeline(tuned)
            tuned_label = str(tuned_pipeline)
            code = pipeline_code.tuned_code(
                pipeline, tuned_pipeline, _kept_options(kept)
            )
        else:
            ratio = 1.0
            tuned = self.dataset
            tuned_label = str(pipeline)
            code = ""
        if self.epoch_limit is not None:
            self.notes.append(
                f"The pipeline calls Python ({', '.join(python)}), whose side effects run "
                f"on every epoch: tuning ran it for {self.epochs_run} epochs, at most "
                f"{self.epoch_limit} (max_python_epochs)."
            )
        if self.fill_s and kept and any(r.kind == pipeline_rewrite.CACHE for r in kept):
            self.notes.append(
                f"Passes of {self.plan.num_batches} batches time the steady state: the cache "
                f"was filled first by one whole, untimed epoch (median "
                f"{statistics.median(self.fill_s):.2f} s), as training's first epoch fills it."
            )
        if not self.ordered:
            check = "same elements, any order"
        else:
            check = "equal" if self.repeatable else "structure"
        result = TuneResult(
            original_s=statistics.median(original_times),
            tuned_s=statistics.median(tuned_times),
            ratio=ratio,
            rounds=len(tuned_times),
            rewrites=outcomes,
            elements_check=check,
            pipeline=str(pipeline),
            tuned_pipeline=tuned_label,
            epochs=self.plan.epochs,
            batches_per_epoch=self.plan.num_batches,
            consumer_step_s=self.plan.consumer_step_s,
            elapsed_s=time.perf_counter() - self.started,
            notes=self.notes,
            code=code,
            epochs_run=self.epochs_run,
            epoch_limit=self.epoch_limit,
        )
        logger.info(
            "keras-pipeline-tuner: tuned pipeline %s: %.3f s -> %.3f s per pass (x%.2f)",
            result.tuned_pipeline,
            result.original_s,
            result.tuned_s,
            result.speedup,
        )
        return tuned, result

    def _read_reference(self, pipeline) -> List[str]:
        """Reads the original's first epoch, twice; returns the stages that run Python.

        Sets the reference elements, whether they repeat (a random
        pipeline's do not), and the cost of an epoch.
        """
        python = _python_stages(pipeline)
        if python:
            self.epoch_limit = self.max_python_epochs
        # On a copy with seeds of its own: passes over the dataset itself would
        # move its shuffle seeds on, and the next fit on it would see another
        # order (rebuilt datasets get fresh seed generators too).
        source = pipeline_rewrite.independent_copy(self.dataset)
        source = self.dataset if source is None else source
        reference, epoch_s = self._epoch_digests(source, _EPOCH_BUDGET_SHARE * self.budget_s)
        again, _ = self._epoch_digests(source, None)
        self.repeatable = [value for value, _ in reference] == [value for value, _ in again]
        self.reference = reference
        if self.repeatable and pipeline_rewrite.draws_randomly(pipeline) and self._rebuild_problem() is not None:
            # Random, but its own cache replays the first pass: a rebuild,
            # with an empty cache, draws anew.
            self.repeatable = False
        if not self.repeatable:
            self.notes.append(
                "The pipeline gives different elements from one pass to the next (it is "
                "random), so the tuned elements were checked for number, types and shapes "
                "only."
            )
        self._epoch_s = epoch_s
        self._pass_estimate_s = self.plan.epochs * (
            epoch_s + len(reference) * (self.plan.consumer_step_s or 0.0)
        )
        return python

    def measure(self, rewrites) -> List["TimedRewrite"]:
        """Times each rewrite on its own against the pipeline as written; keeps none."""
        pipeline = pipeline_graph.read_pipeline(self.dataset)
        self._read_reference(pipeline)
        problem = self._rebuild_problem()
        timed = []
        for index, rewrite in enumerate(rewrites):
            if problem is not None:
                outcome = RewriteOutcome(
                    kind=rewrite.kind,
                    stage=rewrite.stage,
                    change=rewrite.change,
                    status=FAILED,
                    reason=f"the pipeline cannot be rebuilt from its graph ({problem})",
                )
                timed.append(TimedRewrite(outcome))
                continue
            self.rounds = self._rounds(len(rewrites) - index)
            outcome, times = self._try(rewrite, [], keep=False)
            item = TimedRewrite(outcome, batches=len(self.reference) * self.plan.epochs)
            if times is not None:
                item.without_s = statistics.median(times[0])
                item.with_s = statistics.median(times[1])
            timed.append(item)
        return timed

    def _rebuild_problem(self) -> Optional[str]:
        """Why the pipeline rebuilt from its own graph is not the original, if it is not."""
        try:
            digests, _ = self._epoch_digests(self._build([]), None)
        except Exception as error:  # noqa: BLE001 - then the pipeline is left alone.
            return f"{type(error).__name__}: {error}"
        return self._mismatch(digests)

    # One rewrite.

    def _try(
        self, rewrite, kept, keep: bool = True
    ) -> Tuple[RewriteOutcome, Optional[Tuple[list, list]]]:
        """Checks and times one rewrite on top of `kept`; returns its outcome and times.

        With `keep=False` the rewrite is only timed: its status is "measured"
        whatever the ratio, and later checks are left as they were.
        """
        unverified = rewrite.unverified is not None
        outcome = RewriteOutcome(
            kind=rewrite.kind,
            stage=rewrite.stage,
            change=rewrite.change,
            # A Python function with state, called in another order, pairs
            # its results with other elements: say so when it is allowed.
            changes_order=rewrite.changes_order or unverified,
            changes_determinism=rewrite.changes_determinism or unverified,
            caveat=rewrite.caveat,
            verified=not unverified,
        )
        if unverified and not self.allow_unverified:
            outcome.status = UNVERIFIED
            outcome.reason = (
                f"not applied: its elements cannot be proven equal to the original's "
                f"({rewrite.unverified}); pass allow_unverified=True to measure and keep it"
            )
            return outcome, None
        if (
            rewrite.kind == pipeline_rewrite.CACHE
            and self.plan.epochs == 1
            and self.plan.num_batches is None
        ):
            # Passes of a few batches read a cache filled beforehand (see
            # `_factory`); a whole-epoch pass would only fill it.
            outcome.status = NOT_APPLICABLE
            outcome.reason = (
                "a cache pays off from the second epoch, and a timed pass has one "
                "(epochs=1)"
            )
            return outcome, None
        # A cache's preparation may read its input twice more.
        extra = 2 if rewrite.kind == pipeline_rewrite.CACHE else 0
        shortfall = self._shortfall(final=bool(kept), extra_epochs=extra)
        if shortfall is not None:
            outcome.status = NOT_MEASURED
            outcome.reason = shortfall
            return outcome, None
        if rewrite.kind == pipeline_rewrite.CACHE:
            reason = self._prepare_cache(rewrite)
            if reason is not None:
                outcome.status = NOT_APPLICABLE
                outcome.reason = reason
                return outcome, None
            outcome.change = rewrite.change
        if rewrite.kind == pipeline_rewrite.VECTORIZE:
            problem = pipeline_rewrite.vectorized_trace_problem(self.graph_def, rewrite)
            if problem is not None:
                outcome.status = NOT_APPLICABLE
                outcome.reason = f"not element-wise: {problem}"
                return outcome, None
        trial = kept + [rewrite]
        try:
            mismatch, check = self._check(rewrite, kept, trial)
        except Exception as error:  # noqa: BLE001 - a failed candidate is skipped.
            outcome.status = FAILED
            outcome.reason = f"the rewritten pipeline did not run: {type(error).__name__}: {error}"
            return outcome, None
        outcome.elements_check = check
        if mismatch is not None:
            outcome.status = CHANGED_ELEMENTS
            outcome.reason = mismatch
            return outcome, None
        reserve = self._comparison_s() if kept else 0.0
        try:
            factories = {"without": self._factory(kept), "with": self._factory(trial)}
        except _FillTooLong as error:
            outcome.status = NOT_MEASURED
            outcome.reason = str(error)
            return outcome, None
        times = self._side_by_side(
            factories,
            self._affordable_rounds(final=bool(kept)),
            deadline=self.deadline - reserve,
        )
        outcome.ratio = paired_timing.median_ratio(times["with"], times["without"])
        outcome.rounds = len(times["with"])
        if not keep:
            outcome.status = MEASURED
            outcome.reason = f"time ratio {outcome.ratio:.2f}, measured side by side"
        elif outcome.ratio <= 1.0 - self.min_gain:
            outcome.applied = True
            outcome.status = KEPT
            outcome.reason = f"{1 / outcome.ratio:.2f}x faster, measured side by side"
            if unverified:
                outcome.reason += " (kept unproven: allow_unverified=True)"
            if rewrite.changes_order:
                self.ordered = False
            if check.startswith("equal within"):
                # Later rewrites are compared with this pipeline's values.
                self.reference, _ = self._epoch_digests(self._build(trial), None)
        else:
            outcome.status = SLOWER
            outcome.reason = (
                f"time ratio {outcome.ratio:.2f}: not at least {self.min_gain:.0%} faster"
            )
        return outcome, (times["without"], times["with"])

    def _comparison_s(self) -> float:
        """Seconds of the fewest rounds of one side-by-side comparison."""
        return 2 * _MIN_ROUNDS * self._pass_cost_s()

    def _pass_cost_s(self) -> float:
        """Wall seconds one timed pass costs the budget, building included."""
        return self._pass_estimate_s + self._pass_overhead_s

    def _shortfall(self, final: bool, extra_epochs: int = 0) -> Optional[str]:
        """Why a rewrite cannot be measured now (with its figures), or None."""
        passes = 2 * _MIN_ROUNDS
        needed_s = self._epoch_s + self._comparison_s()
        reserve_s = self._comparison_s() if final else 0.0
        left_s = self.deadline - time.perf_counter()
        used_s = time.perf_counter() - self.started
        return budget_shortfall(
            needed_s=needed_s,
            reserve_s=reserve_s,
            left_s=left_s,
            used_s=used_s,
            budget_s=self.budget_s,
            pass_s=self._pass_cost_s(),
            passes=passes,
        ) or self._epoch_shortfall(final, extra_epochs)

    def _epoch_shortfall(self, final: bool, extra_epochs: int) -> Optional[str]:
        if self.epoch_limit is None:
            return None
        # Its check (two more epochs for a vectorised map compared within a
        # tolerance), its timed passes, and the final comparison's.
        needed = 3 + extra_epochs + 2 * _MIN_ROUNDS * self.plan.epochs * (2 if final else 1)
        if self.epochs_run + needed <= self.epoch_limit:
            return None
        return (
            f"the pipeline calls Python, and measuring it needs {needed} more "
            f"epochs of it; {self.epochs_run} of the {self.epoch_limit} allowed "
            "(max_python_epochs) were run"
        )

    def _affordable_rounds(self, final: bool) -> int:
        """Rounds of a two-way comparison the epoch limit allows (the final one's kept)."""
        if self.epoch_limit is None:
            return self.rounds
        reserve = 2 * _MIN_ROUNDS * self.plan.epochs if final else 0
        left = self.epoch_limit - self.epochs_run - reserve
        return max(1, min(self.rounds, left // (2 * self.plan.epochs)))

    def _check(self, rewrite, kept, trial) -> Tuple[Optional[str], str]:
        """Compares the elements with the rewrite to those without: (mismatch, how)."""
        dataset = self._build(trial)
        if not self.repeatable:
            digests, _ = self._epoch_digests(dataset, None)
            return self._mismatch(digests), "structure"
        if rewrite.changes_order or not self.ordered:
            rows = self._rows(dataset)
            if self._reference_rows is None:
                self._reference_rows = self._rows(self._build([]))
            if rows != self._reference_rows:
                return "it gave other elements than the original's (in any order)", (
                    "same elements, any order"
                )
            return None, "same elements, any order"
        digests, _ = self._epoch_digests(dataset, None)
        mismatch = self._mismatch(digests)
        if mismatch is None or rewrite.kind != pipeline_rewrite.VECTORIZE:
            return mismatch, "equal"
        close = self._close(self._build(kept), self._build(trial))
        if close is not None:
            return f"{mismatch}: {close}", "equal"
        return None, f"equal within rtol={VECTORIZE_RTOL:g}"

    def _close(self, without, with_) -> Optional[str]:
        """Why two datasets' elements differ beyond the vectorisation tolerance, or None."""
        tf = tensorflow()
        self.epochs_run += 2
        for position, (one, other) in enumerate(itertools.zip_longest(
            _take(without, self.plan.num_batches), _take(with_, self.plan.num_batches)
        )):
            if one is None or other is None:
                return "the number of batches differs"
            for a, b in zip(
                tf.nest.flatten(one, expand_composites=True),
                tf.nest.flatten(other, expand_composites=True),
            ):
                a, b = a.numpy(), b.numpy()
                if a.dtype != b.dtype or a.shape != b.shape:
                    return f"batch {position} has other types or shapes"
                if a.dtype.kind in "fc":
                    if not np.allclose(a, b, rtol=VECTORIZE_RTOL, atol=0.0, equal_nan=True):
                        return f"batch {position} differs by more than rtol={VECTORIZE_RTOL:g}"
                elif not np.array_equal(a, b):
                    return f"batch {position} has other values"
        return None

    def _rows(self, dataset) -> List[str]:
        """Sorted digests of an epoch's elements, batches split into rows."""
        self.epochs_run += 1
        rows = []
        for element in _take(dataset, self.plan.num_batches):
            rows.extend(_row_digests(element))
        return sorted(rows)

    def _mismatch(self, digests) -> Optional[str]:
        if len(digests) != len(self.reference):
            return (
                f"it gave {len(digests)} batches in an epoch instead of {len(self.reference)}"
            )
        # Digests are (values, structure): values when the pipeline repeats itself.
        index = 0 if self.repeatable else 1
        for position, (got, want) in enumerate(zip(digests, self.reference)):
            if got[index] != want[index]:
                what = "values" if self.repeatable else "types or shapes"
                return f"batch {position} has other {what} than the original's"
        return None

    def _prepare_cache(self, rewrite) -> Optional[str]:
        """Sizes the cache and checks its input repeats; returns why not, or None."""
        cut, spec = pipeline_rewrite.cut_at(self.graph_def, rewrite.node)
        if spec is None:
            return "the elements at the cache point are not plain tensors"
        limit = self.cache_memory_bytes or _default_cache_memory()
        prefix = pipeline_rewrite.rebuild(cut, spec, self.dataset)
        count = int(prefix.cardinality())
        stage_bytes = _static_bytes(spec)
        if count >= 0 and stage_bytes is not None:
            total, complete = count * stage_bytes, True
        else:
            seconds = max(0.0, (self.deadline - time.perf_counter()) * _EPOCH_BUDGET_SHARE)
            self.epochs_run += 1
            total, complete = _scan_bytes(prefix, limit, seconds)
            if not complete and total <= limit:
                return (
                    "its size could not be known within the time budget (the number of "
                    "elements is unknown); give the dataset a known cardinality with "
                    "dataset.apply(tf.data.experimental.assert_cardinality(n)) or a larger "
                    "budget_s"
                )
        if total > limit:
            if self.cache_path is None:
                return (
                    f"the cached elements would take {_megabytes(total)} or more, over the "
                    f"{_megabytes(limit)} allowed in memory; pass cache_path=... to cache "
                    "on disk, or cache_memory_bytes=..."
                )
            rewrite.filename = self.cache_path
            rewrite.change = rewrite.change.replace(".cache()", f".cache({self.cache_path!r})")
        if not self.repeatable:
            first = self._digests_of(pipeline_rewrite.rebuild(cut, spec, self.dataset))
            second = self._digests_of(pipeline_rewrite.rebuild(cut, spec, self.dataset))
            if first != second:
                return (
                    f"{rewrite.stage} gives different elements from one pass to the next: "
                    "a cache would freeze them"
                )
        return None

    def _digests_of(self, dataset) -> List[str]:
        self.epochs_run += 1
        iterator = iter(dataset)
        found = []
        for _ in range(_REPEAT_CHECK_ELEMENTS):
            try:
                found.append(_digest(next(iterator))[0])
            except StopIteration:
                break
        return found

    # Building, reading and timing datasets.

    def _factory(self, rewrites) -> Callable[[], object]:
        """What gives a timed pass its dataset with `rewrites` applied.

        Whole-epoch passes build a fresh dataset each, so a cache starts empty
        and its first epoch is timed, as in a new training run. Passes of
        `num_batches` batches never finish an epoch of a long dataset, so a
        cache would never be read in them: they stand for training's steady
        state instead, and a dataset with a cache is built once, its cache
        filled by one whole untimed epoch, and read by every pass.
        """
        if self.plan.num_batches is None or not any(
            rewrite.kind == pipeline_rewrite.CACHE for rewrite in rewrites
        ):
            return lambda: self._build(rewrites)
        dataset = self._build(rewrites)
        self._fill(dataset)
        return lambda: dataset

    def _fill(self, dataset) -> None:
        """Runs one whole epoch of `dataset`, so that its cache is complete."""
        limit_s = max(0.0, self.deadline - time.perf_counter()) * _EPOCH_BUDGET_SHARE
        self.epochs_run += 1
        began = time.perf_counter()
        for _ in dataset:
            if time.perf_counter() - began > limit_s:
                raise _FillTooLong(
                    f"filling the cache takes a whole epoch, longer than the {limit_s:.1f} s "
                    "the budget leaves for it; pass a larger budget_s"
                )
        self.fill_s.append(time.perf_counter() - began)

    def _build(self, rewrites, final: bool = False):
        rewrites = [self._for_pass(rewrite, final) for rewrite in rewrites]
        graph_def = pipeline_rewrite.apply_rewrites(self.graph_def, rewrites)
        return pipeline_rewrite.rebuild(graph_def, self.spec, self.dataset)

    def _for_pass(self, rewrite, final):
        if rewrite.kind != pipeline_rewrite.CACHE or not rewrite.filename or final:
            return rewrite
        # Every timed pass writes its own file cache, as a new run would.
        if self._scratch is None:
            self._scratch = tempfile.mkdtemp(prefix="kpt-cache-")
        return dataclasses.replace(rewrite, filename=os.path.join(self._scratch, uuid.uuid4().hex))

    def _epoch_digests(self, dataset, time_limit_s: Optional[float]):
        self.epochs_run += 1
        began = time.perf_counter()
        found = []
        iterator = iter(dataset)
        while self.plan.num_batches is None or len(found) < self.plan.num_batches:
            try:
                element = next(iterator)
            except StopIteration:
                break
            found.append(_digest(element))
            if time_limit_s is not None and time.perf_counter() - began > time_limit_s:
                raise ValueError(
                    f"One epoch of the dataset takes longer than {time_limit_s:.0f} s, too "
                    f"long for budget_s={self.budget_s:g}: pass num_batches=... to time "
                    "fewer batches per epoch, or a larger budget_s."
                )
        return found, time.perf_counter() - began

    def _side_by_side(self, factories, rounds: int, deadline: Optional[float]):
        began = time.perf_counter()
        times = paired_timing.side_by_side(
            factories, self.plan, rounds, deadline=deadline, on_pass=self._advance
        )
        passes = sum(len(found) for found in times.values())
        timed = sum(sum(found) for found in times.values())
        if passes:
            self._pass_overhead_s = max(0.0, (time.perf_counter() - began - timed) / passes)
        self.epochs_run += self.plan.epochs * sum(len(found) for found in times.values())
        return times

    def _rounds(self, comparisons: int) -> int:
        """Rounds per comparison that let `comparisons` more of them fit the budget."""
        pass_s = max(self._pass_estimate_s, 1e-3)
        most = max(_MAX_ROUNDS, min(_MAX_FAST_ROUNDS, int(_FAST_SIDE_S / pass_s)))
        if self.epoch_limit is not None:
            # Every epoch runs the user's Python side effects: the epochs left
            # are shared among the comparisons left (each with its check).
            epochs_left = self.epoch_limit - self.epochs_run - max(comparisons, 1)
            shared = epochs_left // (max(comparisons, 1) * 2 * self.plan.epochs)
            most = max(_MIN_ROUNDS, min(most, shared))
        left = self.deadline - time.perf_counter()
        per_round = max(comparisons, 1) * 2 * max(self._pass_cost_s(), 1e-3)
        return int(min(most, max(_MIN_ROUNDS, left // per_round)))

    # Progress.

    def _start_progress(self, total_passes: int) -> None:
        if not self.verbose:
            return
        # rich writes no cursor codes when its output is not a terminal: a
        # log file gets the final line only.
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        self._progress = Progress(
            TextColumn("kpt.tune: timed passes"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[elapsed]}"),
        )
        self._task = self._progress.add_task("tune", total=total_passes, elapsed="")
        self._progress.start()

    def _estimate_progress(self, passes_left: int) -> None:
        if self._progress is not None:
            done = self._progress.tasks[0].completed
            self._progress.update(self._task, total=done + passes_left)

    def _advance(self) -> None:
        if self._progress is not None:
            used = time.perf_counter() - self.started
            self._progress.update(
                self._task, advance=1, elapsed=f"{used:.0f} s of {self.budget_s:g} s"
            )

    def _stop_progress(self) -> None:
        if self._progress is not None:
            task = self._progress.tasks[0]
            # Rewrites skipped or stopped early leave the estimate short of done.
            self._progress.update(self._task, total=task.completed)
            self._progress.stop()
            self._progress = None


def budget_shortfall(
    needed_s: float,
    reserve_s: float,
    left_s: float,
    used_s: float,
    budget_s: float,
    pass_s: float,
    passes: int,
) -> Optional[str]:
    """Why the time budget does not allow measuring one rewrite, or `None`.

    A rewrite needs one checking epoch and `passes` timed passes; when it
    would be kept on top of others, the final comparison with the original
    (`reserve_s`) must still fit after it.

    Args:
        needed_s: seconds the rewrite's own check and passes take.
        reserve_s: seconds kept for the final comparison.
        left_s: seconds of the budget left.
        used_s: seconds of the budget used.
        budget_s: the whole budget.
        pass_s: seconds of one timed pass.
        passes: timed passes the rewrite needs.

    Returns:
        The reason, with its figures, or `None` when it can be measured.

    Example:

    >>> budget_shortfall(3.0, 0.0, 5.0, 1.0, 6.0, 0.5, 6) is None
    True
    >>> budget_shortfall(13.0, 0.0, 20.0, 0.0, 20.0, 2.0, 6) is None
    True
    >>> budget_shortfall(30.0, 0.0, 9.0, 1.0, 10.0, 4.9, 6).split(":")[0]
    'too slow to measure within budget_s=10'
    """
    if needed_s > budget_s:
        return (
            f"too slow to measure within budget_s={budget_s:g}: one timed "
            f"pass takes about {pass_s:.2f} s, and measuring it needs {passes} passes and a "
            f"check (about {needed_s:.1f} s)"
        )
    if needed_s + reserve_s > left_s:
        final = (
            f", and {reserve_s:.1f} s kept for the final comparison with the original"
            if reserve_s
            else ""
        )
        return (
            f"the time budget was spent ({used_s:.1f} s of {budget_s:g} s "
            f"used, {max(left_s, 0.0):.1f} s left); measuring it needs about {needed_s:.1f} s "
            f"({passes} passes of {pass_s:.2f} s and a check){final}"
        )
    return None


def _python_stages(pipeline) -> List[str]:
    """Labels of the stages that run Python (py_function, from_generator)."""
    found = []
    for stage in pipeline.stages:
        function = stage.function
        runs_python = stage.kind == "from_generator" or (
            function is not None
            and (function.py_function_ops or "GeneratorDataset" in function.io_ops)
        )
        if runs_python:
            found.append(stage.label)
    return found


def _kept_options(kept) -> dict:
    options = {}
    for rewrite in kept:
        options.update(rewrite.options)
    return options


def _take(dataset, count: Optional[int]):
    iterator = iter(dataset)
    taken = 0
    while count is None or taken < count:
        try:
            yield next(iterator)
        except StopIteration:
            return
        taken += 1


def _row_digests(element) -> List[str]:
    """Digests of an element's rows (a batch's examples), or of the element itself."""
    tf = tensorflow()
    arrays = [t.numpy() for t in tf.nest.flatten(element, expand_composites=True)]
    rows = {array.shape[0] if array.ndim else None for array in arrays}
    if len(rows) != 1 or None in rows:
        return [_digest(element)[0]]
    (count,) = rows
    found = []
    for index in range(count):
        digest = hashlib.blake2b(digest_size=16)
        for array in arrays:
            row = array[index]
            digest.update(f"{array.dtype}{row.shape};".encode())
            if array.dtype == object:
                for item in np.ravel(row):
                    digest.update(len(item).to_bytes(8, "little"))
                    digest.update(item)
            else:
                digest.update(np.ascontiguousarray(row).tobytes())
        found.append(digest.hexdigest())
    return found


def _digest(element) -> Tuple[str, str]:
    """Digests of an element's values and of its structure (types and shapes)."""
    tf = tensorflow()
    values = hashlib.blake2b(digest_size=16)
    structure = hashlib.blake2b(digest_size=16)
    for tensor in tf.nest.flatten(element, expand_composites=True):
        array = tensor.numpy() if hasattr(tensor, "numpy") else tensor
        structure.update(f"{tensor.dtype.name}{tuple(array.shape)};".encode())
        if array.dtype == object:
            for item in array.ravel():
                values.update(len(item).to_bytes(8, "little"))
                values.update(item)
        else:
            values.update(array.tobytes())
    return values.hexdigest(), structure.hexdigest()


def _scan_bytes(dataset, limit: int, seconds: float) -> Tuple[int, bool]:
    """Bytes of a dataset's elements: (total so far, whether the scan ended)."""
    tf = tensorflow()
    began = time.perf_counter()
    total = 0
    for element in dataset:
        for tensor in tf.nest.flatten(element, expand_composites=True):
            array = tensor.numpy()
            total += sum(len(item) for item in array.ravel()) if array.dtype == object else array.nbytes
        if total > limit or time.perf_counter() - began > seconds:
            return total, False
    return total, True


def _static_bytes(spec) -> Optional[int]:
    total = 0
    for component in spec:
        if not component.shape.is_fully_defined() or component.dtype.name == "string":
            return None
        total += component.shape.num_elements() * component.dtype.size
    return total


def _default_cache_memory() -> int:
    try:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        available = 4 << 30
    return int(available * _CACHE_MEMORY_SHARE)


def _megabytes(count: int) -> str:
    return f"{count / 1e6:,.0f} MB" if count >= 1e6 else f"{count / 1e3:,.1f} kB"
