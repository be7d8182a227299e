"""`tune`'s search: each candidate rewrite tried on top of those kept, then the final comparison.

The candidates come from `planning.plan_rewrites`, in the order they should be
tried, the rewrites of single stages costliest stage first (`stage_order`, from
short reads of the pipeline's prefixes). Each one is checked and timed side by
side with the pipeline without it (`TuningSession.try_rewrite`) and kept only
when it is measurably faster. The
pipeline with every kept rewrite is finally timed against the original, and
that ratio is the one reported, with the tuned pipeline as code.
"""

import logging
import statistics
import time

from keras_pipeline_tuner.pipeline.tune import stage_order
from keras_pipeline_tuner.pipeline.tune.cache_scratch import FillTooLong
from keras_pipeline_tuner.pipeline.tune.code import tuned_code
from keras_pipeline_tuner.pipeline.tune.paired_timing import OutOfTime
from keras_pipeline_tuner.pipeline.tune.paired_timing import median_ratio
from keras_pipeline_tuner.pipeline.tune.planning import plan_rewrites
from keras_pipeline_tuner.pipeline.tune.rebuild import pipeline_for_rebuild
from keras_pipeline_tuner.pipeline.tune.results import FAILED
from keras_pipeline_tuner.pipeline.tune.results import SLOWER
from keras_pipeline_tuner.pipeline.tune.results import UNVERIFIED
from keras_pipeline_tuner.pipeline.tune.results import RewriteOutcome
from keras_pipeline_tuner.pipeline.tune.results import TuneResult
from keras_pipeline_tuner.pipeline.tune.results import not_delivered
from keras_pipeline_tuner.pipeline.tune.rewrites import CACHE

logger = logging.getLogger("keras_pipeline_tuner")


class Search:
    """`tune`'s search over the candidate rewrites of one tuning session.

    Args:
        session: the `TuningSession` of the `tune` call.

    Example:

    ```python
    session = TuningSession(ds, PassPlan(epochs=2), 60.0, None, None, False, False,
                            False, 60, 0.03, 1)
    try:
        tuned_ds, result = Search(session).run()
    finally:
        session.close()
    ```
    """

    def __init__(self, session):
        self.session = session

    def run(self):
        """Tries every candidate rewrite; returns `(tuned_dataset, TuneResult)`."""
        session = self.session
        pipeline = pipeline_for_rebuild(session.dataset)
        python = session.read_reference(pipeline)
        candidates, outcomes, problem = self._plan(pipeline)
        session.size_passes(len(candidates) + 1)
        kept, against_original, original_alone = self._try_all(candidates, outcomes)
        session.budget.rounds = session.budget.rounds_for(1)
        try:
            original_times, tuned_times = self._final_times(
                kept, against_original, original_alone, problem
            )
        except (FillTooLong, OutOfTime) as error:
            original_times, tuned_times = self._chained_times(kept, outcomes, original_alone)
            session.notes.append(
                f"The final comparison with the original did not run ({error}): the "
                "speed-up is the product of each kept rewrite's own measured ratio, each "
                "against the pipeline before it."
            )
        else:
            kept = self._delivered(kept, outcomes, original_times, tuned_times)
        session.progress.stop()
        return self._result(pipeline, python, kept, outcomes, original_times, tuned_times)

    def _delivered(self, kept, outcomes, original_times, tuned_times):
        """The kept rewrites, or none when the final comparison did not find them faster.

        Each rewrite was kept against the pipeline before it; together, timed
        against the original, they may still not be faster (a zip pipeline
        came back 1.5x slower): then the original is returned, and a note
        says what was measured.
        """
        if not kept:
            return kept
        reason = not_delivered(original_times, tuned_times, self.session.min_gain)
        if reason is None:
            return kept
        changes = ", ".join(rewrite.change for rewrite in kept)
        self.session.notes.append(
            f"The original pipeline is returned unchanged: with {changes}, {reason}."
        )
        for outcome in outcomes:
            if outcome.applied:
                outcome.applied = False
                outcome.status = SLOWER
                outcome.reason += (
                    "; not kept: the tuned pipeline was not faster than the original in "
                    "the final comparison"
                )
        return []

    def _plan(self, pipeline):
        """The candidate rewrites, the outcomes of those not made, why no rebuild works."""
        session = self.session
        candidates, skipped = plan_rewrites(
            pipeline, session.allow_nondeterministic, session.allow_reordering
        )
        outcomes = [
            RewriteOutcome(kind=item.kind, stage=item.stage, reason=item.reason)
            for item in skipped
        ]
        problem = session.rebuild_problem()
        if problem is not None:
            session.notes.append(
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
        return self._by_stage_cost(pipeline, candidates), outcomes, problem

    def _by_stage_cost(self, pipeline, candidates):
        """The candidates with the costliest stage's rewrites first (`stage_order`)."""
        session = self.session
        nodes = list(
            dict.fromkeys(
                rewrite.node for rewrite in candidates if rewrite.kind in stage_order.STAGE_KINDS
            )
        )
        if len(nodes) < 2:
            return candidates
        costs = stage_order.stage_costs(
            pipeline,
            session.graph_def,
            session.dataset,
            nodes,
            stage_order.READ_SHARE * session.budget.budget_s,
        )
        if not costs:
            return candidates
        session.notes.append(stage_order.order_note(costs))
        return stage_order.ordered(candidates, costs)

    def _try_all(self, candidates, outcomes):
        """Tries each candidate on top of those kept, adding its outcome to `outcomes`.

        Returns:
            The rewrites kept; the times of the comparison of the one rewrite
            kept with the original, which doubles as the final one (else
            `None`); and the original's times from a comparison while nothing
            was kept, if there was one.
        """
        session = self.session
        comparisons_left = len(candidates) + 1
        session.budget.rounds = session.budget.rounds_for(comparisons_left)
        session.progress.start(2 * session.budget.rounds * (len(candidates) + 1))
        kept = []
        against_original = None
        # While nothing is kept, every comparison times the original too.
        original_alone = None
        for rewrite in candidates:
            session.budget.rounds = session.budget.rounds_for(comparisons_left)
            session.progress.estimate(2 * session.budget.rounds * comparisons_left)
            outcome, times = session.try_rewrite(rewrite, kept)
            comparisons_left -= 1
            outcomes.append(outcome)
            if times is not None and not kept:
                original_alone = times[0]
            if outcome.applied:
                against_original = times if not kept else None
                kept.append(rewrite)
                # Later comparisons time the pipeline with it: the budget
                # rule and the rounds go by its pass time.
                session.budget.pass_estimate_s = statistics.median(times[1])
                session.budget.epoch_s = session.budget.pass_estimate_s / session.plan.epochs
        return kept, against_original, original_alone

    def _final_times(self, kept, against_original, original_alone, problem):
        """The original's and the tuned pipeline's pass times, from one comparison."""
        session = self.session
        if against_original is not None:
            return against_original
        if kept:
            session.progress.timing("the tuned pipeline against the original")
            times = session.side_by_side(
                {"original": session.factory([]), "tuned": session.factory(kept)},
                session.budget.affordable_rounds(final=False),
                deadline=session.budget.deadline,
            )
            return times["original"], times["tuned"]
        if original_alone is not None:
            return original_alone, original_alone
        # Nothing to compare with: the original's own time, as rebuilt (fresh
        # caches) when that works.
        original = (lambda: session.dataset) if problem else (lambda: session.build([]))
        times = session.side_by_side(
            {"original": original}, session.budget.rounds_alone(), deadline=None
        )
        return times["original"], times["original"]

    def _chained_times(self, kept, outcomes, original_alone):
        """The original's times, and the tuned pipeline's by the kept rewrites' ratios."""
        ratio = 1.0
        for outcome in outcomes:
            if outcome.applied and outcome.ratio:
                ratio *= outcome.ratio
        original = list(original_alone or [self.session.budget.pass_estimate_s])
        return original, [seconds * ratio for seconds in original]

    def _result(self, pipeline, python, kept, outcomes, original_times, tuned_times):
        """The tuned dataset and the `TuneResult`, with its notes; logs the outcome."""
        session = self.session
        if not kept:
            # Nothing is delivered: the original's own times, on both sides.
            tuned_times = original_times
        if kept:
            ratio = median_ratio(tuned_times, original_times)
            tuned = session.build(kept, final=True)
            tuned_pipeline = session.pipeline_of(kept, final=True)
            tuned_label = str(tuned_pipeline)
            code = tuned_code(pipeline, tuned_pipeline, _kept_options(kept))
        else:
            ratio = 1.0
            tuned = session.dataset
            tuned_label = str(pipeline)
            code = ""
        unproven = [o.change for o in outcomes if o.status == UNVERIFIED and o.change]
        if unproven:
            session.notes.append(
                f"Not tried: {', '.join(unproven)}, which would call the pipeline's Python "
                "from several threads; pass allow_unverified=True to time and keep it if "
                "the function keeps no state between calls."
            )
        if session.budget.epoch_limit is not None:
            session.notes.append(
                f"The pipeline calls Python ({', '.join(python)}), whose side effects run "
                f"on every epoch: tuning ran it for {session.budget.epochs_run} epochs, at most "
                f"{session.budget.epoch_limit} (max_python_epochs)."
            )
        if session.scratch.fill_s and kept and any(r.kind == CACHE for r in kept):
            session.notes.append(
                f"Passes of {session.plan.num_batches} batches time the steady state: the cache "
                f"was filled first, untimed, with the elements the passes read (a whole epoch "
                f"where the dataset's length is not known; median "
                f"{statistics.median(session.scratch.fill_s):.2f} s), as training's first epoch "
                "fills it."
            )
        result = TuneResult(
            original_s=statistics.median(original_times),
            tuned_s=statistics.median(tuned_times),
            ratio=ratio,
            rounds=len(tuned_times),
            rewrites=outcomes,
            elements_check=session.checks.description,
            pipeline=str(pipeline),
            tuned_pipeline=tuned_label,
            epochs=session.plan.epochs,
            batches_per_epoch=session.plan.num_batches,
            consumer_step_s=session.plan.consumer_step_s,
            elapsed_s=time.perf_counter() - session.budget.started,
            notes=session.notes,
            code=code,
            epochs_run=session.budget.epochs_run,
            epoch_limit=session.budget.epoch_limit,
        )
        logger.info(
            "keras-pipeline-tuner: tuned pipeline %s: %.3f s -> %.3f s per pass (x%.2f)",
            result.tuned_pipeline,
            result.original_s,
            result.tuned_s,
            result.speedup,
        )
        return tuned, result


def _kept_options(kept) -> dict:
    options = {}
    for rewrite in kept:
        options.update(rewrite.options)
    return options
