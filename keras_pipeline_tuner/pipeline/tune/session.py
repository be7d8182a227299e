"""A tuning session: one rewrite at a time rebuilt, checked, timed, and kept or not.

A rewrite is tried on top of the rewrites kept so far: the rewritten graph is
rebuilt in this process (`rebuild`), its elements are checked against the
original's (`element_checks`), and it is timed side by side with the pipeline
without it (`paired_timing`), within the session's `budget`. `tune` tries its
candidates in turn (`search`); `time_rewrites` times each alone (`measure`).
"""

import dataclasses
import statistics
import time
from typing import Callable
from typing import List
from typing import Optional
from typing import Tuple

from keras_pipeline_tuner.pipeline.graph import kinds
from keras_pipeline_tuner.pipeline.graph.reader import pipeline_from_graph_def
from keras_pipeline_tuner.pipeline.tune import paired_timing
from keras_pipeline_tuner.pipeline.tune import pass_size
from keras_pipeline_tuner.pipeline.tune.budget import REFERENCE_SHARE
from keras_pipeline_tuner.pipeline.tune.budget import Budget
from keras_pipeline_tuner.pipeline.tune.cache_point import draws_randomly
from keras_pipeline_tuner.pipeline.tune.cache_scratch import CacheScratch
from keras_pipeline_tuner.pipeline.tune.cache_scratch import FillTooLong
from keras_pipeline_tuner.pipeline.tune.element_checks import ElementChecks
from keras_pipeline_tuner.pipeline.tune.graph_editing import apply_rewrites
from keras_pipeline_tuner.pipeline.tune.progress import PassProgress
from keras_pipeline_tuner.pipeline.tune.rebuild import graph_for_rebuild
from keras_pipeline_tuner.pipeline.tune.rebuild import independent_copy
from keras_pipeline_tuner.pipeline.tune.rebuild import pipeline_for_rebuild
from keras_pipeline_tuner.pipeline.tune.rebuild import rebuild
from keras_pipeline_tuner.pipeline.tune.results import CHANGED_ELEMENTS
from keras_pipeline_tuner.pipeline.tune.results import FAILED
from keras_pipeline_tuner.pipeline.tune.results import KEPT
from keras_pipeline_tuner.pipeline.tune.results import MEASURED
from keras_pipeline_tuner.pipeline.tune.results import NOT_APPLICABLE
from keras_pipeline_tuner.pipeline.tune.results import NOT_MEASURED
from keras_pipeline_tuner.pipeline.tune.results import SLOWER
from keras_pipeline_tuner.pipeline.tune.results import UNVERIFIED
from keras_pipeline_tuner.pipeline.tune.results import RewriteOutcome
from keras_pipeline_tuner.pipeline.tune.results import TimedRewrite
from keras_pipeline_tuner.pipeline.tune.results import fast_enough_to_keep
from keras_pipeline_tuner.pipeline.tune.rewrites import CACHE
from keras_pipeline_tuner.pipeline.tune.rewrites import VECTORIZE
from keras_pipeline_tuner.pipeline.tune.vectorize import vectorized_trace_problem


class TuningSession:
    """The state of one `tune` or `time_rewrites` call.

    Args:
        dataset: the `tf.data.Dataset` tuned.
        plan: the `PassPlan` of every timed pass.
        budget_s: about how long the session may take, in seconds.
        cache_path: where a cache too big for memory may be written, or `None`.
        cache_memory_bytes: the most memory a cache may take, or `None`.
        allow_nondeterministic: also parallelise maps that draw random numbers.
        allow_reordering: also try `deterministic=False`.
        allow_unverified: also measure and keep rewrites whose elements
            cannot be proven equal to the original's.
        max_python_epochs: the most epochs of a pipeline that calls Python.
        min_gain: the least speed-up a rewrite must bring to be kept.
        verbose: 1 shows a progress bar of the timed passes, 0 is silent.

    Attributes:
        budget: the session's `Budget` (time, epochs, rounds).
        checks: its `ElementChecks` (the original's elements).
        scratch: its `CacheScratch` (cache files, cache preparation).
        progress: its `PassProgress` bar.
        notes: caveats for the result, in plain words.

    Example:

    ```python
    session = TuningSession(ds, PassPlan(num_batches=20), 5.0, None, None, False, False,
                            False, 60, 0.0, 0)
    try:
        timed = session.measure(candidates)
    finally:
        session.close()
    ```
    """

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
        self.budget = Budget(plan, budget_s)
        self.allow_nondeterministic = allow_nondeterministic
        self.allow_reordering = allow_reordering
        self.allow_unverified = allow_unverified
        self.max_python_epochs = max_python_epochs
        self.min_gain = min_gain
        self.spec = dataset.element_spec
        self.graph_def = graph_for_rebuild(dataset)
        self.notes: List[str] = []
        # The pipeline as read, and whether it draws random numbers (with its reference).
        self.pipeline = None
        self.random = False
        self.checks = ElementChecks(plan, self.budget, self.build)
        self.scratch = CacheScratch(
            dataset, self.graph_def, self.budget, self.checks, cache_path, cache_memory_bytes
        )
        self.progress = PassProgress(verbose, self.budget)

    def close(self) -> None:
        """Stops the progress bar and removes the cache files of the timed passes."""
        self.progress.stop()
        self.scratch.close()

    def measure(self, rewrites) -> List[TimedRewrite]:
        """Times each rewrite on its own against the pipeline as written; keeps none."""
        pipeline = pipeline_for_rebuild(self.dataset)
        self.read_reference(pipeline)
        self.size_passes(len(rewrites))
        problem = self.rebuild_problem()
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
            self.budget.rounds = self.budget.rounds_for(len(rewrites) - index)
            outcome, times = self.try_rewrite(rewrite, [], keep=False)
            item = TimedRewrite(outcome, batches=len(self.checks.reference) * self.plan.epochs)
            if times is not None:
                item.without_s = statistics.median(times[0])
                item.with_s = statistics.median(times[1])
            timed.append(item)
        return timed

    def read_reference(self, pipeline) -> List[str]:
        """Reads the original's first epoch, twice; returns the stages that run Python.

        Sets the reference elements, whether they repeat (a random
        pipeline's do not), and the cost of an epoch.
        """
        self.pipeline = pipeline
        python = _python_stages(pipeline)
        if python:
            self.budget.epoch_limit = self.max_python_epochs
        # On a copy with seeds of its own: passes over the dataset itself would
        # move its shuffle seeds on, and the next fit on it would see another
        # order (rebuilt datasets get fresh seed generators too).
        source = independent_copy(self.dataset)
        source = self.dataset if source is None else source
        epoch_s = self.checks.read_reference(source, REFERENCE_SHARE * self.budget.budget_s)
        self.random = draws_randomly(pipeline)
        if self.checks.repeatable and self.random and self.rebuild_problem() is not None:
            # Random, but its own cache replays the first pass: a rebuild,
            # with an empty cache, draws anew.
            self.checks.repeatable = False
        if not self.checks.repeatable:
            self.notes.append(
                "The pipeline gives different elements from one pass to the next (it is "
                "random), so the tuned elements were checked for number, types and shapes "
                "only."
            )
        self.budget.epoch_s = epoch_s
        self.budget.pass_estimate_s = self.plan.epochs * (
            epoch_s + len(self.checks.reference) * (self.plan.consumer_step_s or 0.0)
        )
        return python

    def size_passes(self, comparisons: int) -> None:
        """Cuts the timed passes to a few batches when whole epochs do not fit (`pass_size`).

        An epoch cut at its first read (`ElementChecks.cut`) is always timed
        in part, with a note, a shuffled one's passes from their start where
        its buffer holds more batches than were read.

        Args:
            comparisons: side-by-side comparisons still to run.
        """
        batches = len(self.checks.reference)
        if not batches:
            return
        epoch_s = self.budget.pass_estimate_s / self.plan.epochs
        left_s = self.budget.deadline - time.perf_counter()
        sized, note = pass_size.sized_plan(
            self.plan,
            epoch_s,
            batches,
            left_s,
            comparisons,
            _buffer_batches(self.pipeline),
            whole_epoch=self.checks.cut is None,
        )
        if note is None:
            return
        # One plan object is shared with the budget and the checks: changed in place.
        for field in dataclasses.fields(sized):
            setattr(self.plan, field.name, getattr(sized, field.name))
        batch_s = epoch_s / batches
        # Checks read the same batches as a pass: compared with the reference's first.
        self.checks.reference = self.checks.reference[: sized.num_batches]
        self.budget.epoch_s = sized.num_batches * batch_s
        self.budget.pass_estimate_s = (sized.num_batches + sized.warmup_batches) * batch_s
        self.notes.append(note)

    def rebuild_problem(self) -> Optional[str]:
        """Why the pipeline rebuilt from its own graph is not the original, if it is not."""
        try:
            digests, _ = self.checks.epoch_digests(self.build([]), None)
        except Exception as error:  # noqa: BLE001 - then the pipeline is left alone.
            return f"{type(error).__name__}: {error}"
        return self.checks.mismatch(digests)

    def try_rewrite(
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
        refusal = self._refusal(rewrite, kept)
        if refusal is not None:
            outcome.status, outcome.reason = refusal
            return outcome, None
        # Preparing a cache may have given it a file (`cache_path`).
        outcome.change = rewrite.change
        trial = kept + [rewrite]
        try:
            mismatch, check = self.checks.check(rewrite, kept, trial)
        except paired_timing.OutOfTime as error:
            outcome.status = NOT_MEASURED
            outcome.reason = self._out_of_time(error)
            return outcome, None
        except Exception as error:  # noqa: BLE001 - a failed candidate is skipped.
            outcome.status = FAILED
            outcome.reason = f"the rewritten pipeline did not run: {type(error).__name__}: {error}"
            return outcome, None
        outcome.elements_check = check
        if mismatch is not None:
            outcome.status = CHANGED_ELEMENTS
            outcome.reason = mismatch
            return outcome, None
        reserve = self.budget.comparison_s() if kept else 0.0
        try:
            factories = {"without": self.factory(kept), "with": self.factory(trial)}
        except FillTooLong as error:
            outcome.status = NOT_MEASURED
            outcome.reason = str(error)
            return outcome, None
        self.progress.timing(rewrite.change)
        try:
            times = self.side_by_side(
                factories,
                self.budget.affordable_rounds(final=bool(kept)),
                deadline=self.budget.deadline - reserve,
                # A rewrite clearly faster or slower after its first rounds is
                # decided: the rest of the budget goes to the next candidate.
                settled=lambda found: paired_timing.clearly_apart(found["with"], found["without"]),
            )
        except paired_timing.OutOfTime as error:
            outcome.status = NOT_MEASURED
            outcome.reason = self._out_of_time(error)
            return outcome, None
        outcome.ratio = paired_timing.median_ratio(times["with"], times["without"])
        outcome.rounds = len(times["with"])
        self._judge(outcome, rewrite, trial, keep)
        return outcome, (times["without"], times["with"])

    def _out_of_time(self, error) -> str:
        """Why a rewrite was not measured when the budget ran out under it."""
        return (
            f"{error} ({time.perf_counter() - self.budget.started:.1f} s of "
            f"budget_s={self.budget.budget_s:g} used)"
        )

    def _refusal(self, rewrite, kept) -> Optional[Tuple[str, str]]:
        """Why the rewrite is not measured, as `(status, reason)`, or `None`."""
        if rewrite.unverified is not None and not self.checks.repeatable and not self.random:
            # Two passes in the same order gave other elements, and no random
            # op draws: the Python keeps state between calls (a counter).
            return NOT_APPLICABLE, (
                "not applied, even with allow_unverified=True: the pipeline's Python gave "
                "other elements on a second pass over the same inputs, so it depends on "
                "the calls before it (a counter, a generator's state); parallel calls would "
                "change which element gets which result"
            )
        if rewrite.unverified is not None and not self.allow_unverified:
            return UNVERIFIED, (
                f"not applied: its elements cannot be proven equal to the original's "
                f"({rewrite.unverified}); pass allow_unverified=True to measure and keep it"
            )
        if rewrite.kind == CACHE and self.plan.epochs == 1 and self.plan.num_batches is None:
            # Passes of a few batches read a cache filled beforehand (see
            # `factory`); a whole-epoch pass would only fill it.
            return NOT_APPLICABLE, (
                "a cache pays off from the second epoch, and a timed pass has one "
                "(epochs=1)"
            )
        # A cache's preparation may read its input twice more.
        extra = 2 if rewrite.kind == CACHE else 0
        shortfall = self.budget.shortfall(final=bool(kept), extra_epochs=extra)
        if shortfall is not None:
            return NOT_MEASURED, shortfall
        if rewrite.kind == CACHE:
            reason = self.scratch.prepare(rewrite)
            if reason is not None:
                return NOT_APPLICABLE, reason
        if rewrite.kind == VECTORIZE:
            problem = vectorized_trace_problem(self.graph_def, rewrite)
            if problem is not None:
                return NOT_APPLICABLE, f"not element-wise: {problem}"
        return None

    def _judge(self, outcome, rewrite, trial, keep: bool) -> None:
        """Keeps a timed rewrite that is at least `min_gain` faster (with `keep`)."""
        if not keep:
            outcome.status = MEASURED
            outcome.reason = f"time ratio {outcome.ratio:.2f}, measured side by side"
        elif fast_enough_to_keep(outcome.ratio, self.min_gain):
            outcome.applied = True
            outcome.status = KEPT
            outcome.reason = f"{1 / outcome.ratio:.2f}x faster, measured side by side"
            if rewrite.unverified is not None:
                outcome.reason += " (kept unproven: allow_unverified=True)"
            if rewrite.changes_order:
                self.checks.ordered = False
            if rewrite.changes_determinism:
                # Its draws land on other elements: later checks compare structure.
                self.checks.repeatable = False
            if outcome.elements_check.startswith("equal within"):
                # The tuned pipeline's values then equal the original's within it.
                self.checks.tolerance = outcome.elements_check
                # Later rewrites are compared with this pipeline's values.
                self.checks.reference, _ = self.checks.epoch_digests(self.build(trial), None)
        else:
            outcome.status = SLOWER
            outcome.reason = (
                f"time ratio {outcome.ratio:.2f}: not at least {self.min_gain:.0%} faster"
            )

    # Building and timing datasets.

    def build(self, rewrites, final: bool = False):
        """The dataset with `rewrites` applied, rebuilt from the graph (fresh caches)."""
        rewrites = [self.scratch.for_pass(rewrite, final) for rewrite in rewrites]
        graph_def = apply_rewrites(self.graph_def, rewrites)
        return rebuild(graph_def, self.spec, self.dataset)

    def pipeline_of(self, rewrites, final: bool = False):
        """The `Pipeline` `build(rewrites, final)` runs, read from its rewritten graph.

        Not from the built dataset: that one's graph would serialise its
        large in-memory sources (1.3 s for 120 MB), which this graph holds
        as stand-ins.
        """
        rewrites = [self.scratch.for_pass(rewrite, final) for rewrite in rewrites]
        return pipeline_from_graph_def(apply_rewrites(self.graph_def, rewrites))

    def factory(self, rewrites) -> Callable[[], object]:
        """What gives a timed pass its dataset with `rewrites` applied.

        Whole-epoch passes build a fresh dataset each, so a cache starts empty
        and its first epoch is timed, as in a new training run. Passes of
        `num_batches` batches never finish an epoch of a long dataset, so a
        cache would never be read in them: they stand for training's steady
        state instead, and a dataset with a cache is built once, its cache
        filled by one untimed epoch, and read by every pass: an epoch of the
        elements a pass reads (`CacheScratch.partial`), or else a whole one.
        """
        if self.plan.num_batches is None or not any(
            rewrite.kind == CACHE for rewrite in rewrites
        ):
            return lambda: self.build(rewrites)
        batches = self.plan.warmup_batches + self.plan.epochs * self.plan.num_batches
        timed = [self.scratch.partial(rewrite, batches) for rewrite in rewrites]
        dataset = self.build(timed)
        self.scratch.fill(dataset, partial=timed != list(rewrites))
        return lambda: dataset

    def side_by_side(self, factories, rounds: int, deadline: Optional[float], settled=None):
        """Times the factories' datasets in alternating passes (`paired_timing`).

        Counts the passes' epochs and cost against the budget, and shows them
        on the progress bar.
        """
        began = time.perf_counter()
        times = paired_timing.side_by_side(
            factories,
            self.plan,
            rounds,
            deadline=deadline,
            on_pass=self.progress.advance,
            settled=settled,
            stop_at=self.budget.stop_at,
        )
        self.budget.record_passes(times, began)
        return times


def _buffer_batches(pipeline) -> Optional[int]:
    """Batches that fill the pipeline's costly shuffle buffers; `None` when not known.

    A buffer of elements before a batch stage holds `buffer / batch_size`
    batches; one after it holds `buffer` batches. A buffer filled by cheap
    stages only (a shuffle of `range` or of file names) fills in the first
    batch's time: it needs no warm-up of its own.
    """
    batches = 0
    for stage in pipeline.stages:
        if stage.kind != kinds.SHUFFLE or not _costly_upstream(pipeline, stage):
            continue
        buffer = stage.params.get("buffer_size")
        if not isinstance(buffer, int) or isinstance(buffer, bool) or buffer < 0:
            return None
        batch = next((s for s in pipeline.downstream(stage) if s.kind == kinds.BATCH), None)
        size = batch.params.get("batch_size") if batch is not None else 1
        if not isinstance(size, int) or size <= 0:
            return None
        batches += -(-buffer // size)
    return batches


def _costly_upstream(pipeline, stage) -> bool:
    """Whether a stage before `stage` reads files, runs Python or computes much."""
    for item in pipeline.upstream(stage):
        if item.kind in _READS:
            return True
        function = item.function
        if function is not None and not (function.cheap or function.trivial):
            return True
    return False


_READS = (kinds.FROM_GENERATOR, kinds.TFRECORD, kinds.TEXT_LINE, kinds.FIXED_LENGTH_RECORD)


def _python_stages(pipeline) -> List[str]:
    """Labels of the stages that run Python (py_function, from_generator)."""
    found = []
    for stage in pipeline.stages:
        function = stage.function
        runs_python = stage.kind == kinds.FROM_GENERATOR or (
            function is not None
            and (function.py_function_ops or "GeneratorDataset" in function.io_ops)
        )
        if runs_python:
            found.append(stage.label)
    return found
