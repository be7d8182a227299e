"""The replay after training: `what_if=True`, or the contention check, which also floors the fixes.

The model's compiled step replayed on a few cached batches times the step with
input free (`after_training.what_if_replay`). Asked for (`what_if`), it is the
what-if replay; on its own on the CPU, the contention check, which counts what
the pipeline's threads take from the step and, before the advised fixes of an
input-bound fit are timed, measures the floor their figures are capped at.
A pipeline that runs Python or keeps state is not run again for either
(`pipeline.graph.rerun`): the wait decides, and the fixes' figures are capped
at the compute measured in training.
"""

import functools
import time
from typing import Callable
from typing import Optional
from typing import Tuple

from keras_pipeline_tuner._util import features
from keras_pipeline_tuner._util.tf_import import is_tf_dataset
from keras_pipeline_tuner.advice import replay_comparison
from keras_pipeline_tuner.advice import verdict
from keras_pipeline_tuner.after_training import fix_timing
from keras_pipeline_tuner.after_training import framework_replay
from keras_pipeline_tuner.after_training import what_if_replay
from keras_pipeline_tuner.after_training.settings import ProbeSettings
from keras_pipeline_tuner.pipeline.graph import rerun
from keras_pipeline_tuner.pipeline.graph.in_memory import COPY_BYTES_PER_S
from keras_pipeline_tuner.pipeline.graph.in_memory import in_memory_bytes
from keras_pipeline_tuner.pipeline.tune.rebuild import copied_by_rebuild
from keras_pipeline_tuner.timing import measurement as measured_by
from keras_pipeline_tuner.timing import tuner_cost
from keras_pipeline_tuner.timing.cpu_usage import throttled
from keras_pipeline_tuner.timing.step_clock import TRAIN

# Reading a pipeline's graph (for its hazards) that takes less than this is
# done before the check is sized: its refusal is then said at once.
HAZARD_FIRST_S = 0.1
# A contention check run before timed fixes (their floor) may take this share
# of the fix timing's cap, when it is larger than the check's own.
FIX_FLOOR_SHARE = 0.25

LOOP_HAS_NO_STEP = (
    "it replays the model's compiled train step, which a custom training loop does not "
    "hand the tuner; call kpt.what_if(model, dataset) after the loop"
)


class ReplayProbe:
    """Runs the replay after training that the settings and the run call for.

    Args:
        settings: the `ProbeSettings`.
        guard: the tuner's `FeatureGuard`.
        announce: says one line before work that takes longer than a second.
        fix_budget_s: `fix_budget_s(run)`, the fix timing's cap in seconds,
            of which the fixes' floor may take a share.

    Example:

    ```python
    ReplayProbe(settings, guard, announce, fix_budget_s).run(run, model, None, ds, False)
    ```
    """

    def __init__(
        self,
        settings: ProbeSettings,
        guard,
        announce: Callable[[str], None],
        fix_budget_s: Callable[..., float],
    ):
        self.settings = settings
        self.guard = guard
        self.announce = announce
        self.fix_budget_s = fix_budget_s

    def run(self, run, model, traced_step, dataset, fixes_due: bool) -> None:
        """The what-if replay when asked for, else the contention check where it is due.

        Args:
            run: the `run.lifecycle.Run`, training ended.
            model: the model fit trained, or `None` for a custom loop.
            traced_step: fit's timed training function, traced already, or `None`.
            dataset: the `tf.data.Dataset` training read, or `None`.
            fixes_due: whether the advised fixes will be timed after it
                (`AfterTraining`), whose floor the check then measures.
        """
        steps = self.settings.what_if_steps
        if steps:
            reason = self._replay_blocker(run, model)
            if reason is not None:
                run.notes.append(f"The what-if replay did not run: {reason}.")
            elif self.guard.enabled(features.WHAT_IF):
                with self.guard(features.WHAT_IF), run.cost.part("what-if replay"):
                    # After training and with Keras' own functions back: the
                    # replay restores the model's state, so training is not changed.
                    try:
                        backend = _backend()
                        if backend in framework_replay.BACKENDS:
                            run.what_if = framework_replay.replay(
                                model,
                                backend,
                                steps,
                                what_if_replay.DEFAULT_CACHED_BATCHES,
                                run.clock.stats(TRAIN),
                            )
                        else:
                            run.what_if = what_if_replay.replay_after_fit(
                                model, steps, run.clock.stats(TRAIN), traced_step
                            )
                    except what_if_replay.ReplayUnsupported as limit:
                        # An expected limit (a strategy, a generator): a note.
                        run.notes.append(f"The what-if replay did not run. {limit}")
            return
        if model is None and self.settings.check_contention:
            run.notes.append(f"The contention check did not run: {LOOP_HAS_NO_STEP}.")
        elif self._contention_check_due(run, model):
            self._contention_check(run, model, traced_step, dataset, fixes_due)

    def _contention_check(self, run, model, traced_step, dataset, fixes_due: bool) -> None:
        """The contention check, when it may change the verdict or bound the fixes' figures.

        When the advised fixes are timed after it, the check runs for them too,
        where the wait alone decides the verdict: their figures are capped at
        steps as fast as the step's compute, and the compute measured in
        training includes what the pipeline's threads (a map holding the GIL)
        took from it. The replayed step, with the pipeline stopped, is that
        floor measured. It then counts with the fix timing, within the larger
        of its own cap and `FIX_FLOOR_SHARE` of theirs.
        """
        skipped = "The contention check did not run: "
        judgement = run.judgement()
        step_ms = run.clock.stats(TRAIN).step.mean_ms
        # Counted as the fixes' floor only where the wait already calls the fit
        # input-bound: a healthy job's check keeps its own cap and the budget.
        fixes_due = fixes_due and judgement.verdict.input_bound
        if not fixes_due and verdict.wait_decides(judgement, step_ms):
            run.notes.append(
                skipped + f"the wait alone decides ({judgement.wait_fraction * 100:.1f} % of "
                "steady-state step time at the fetch, beyond any fetch of a batch already in "
                "memory); the check could only raise the input's share."
            )
            return
        if not fixes_due and not verdict.check_can_change_class(judgement, step_ms):
            run.notes.append(skipped + _class_stands(judgement))
            return
        backend = _backend()
        if backend in framework_replay.BACKENDS and not framework_replay.input_runs_beside_the_step(
            model
        ):
            run.notes.append(
                skipped + f"on {backend} Keras slices NumPy arrays on the training thread, "
                "between steps, so the input does no work beside the step that could slow "
                "its compute: its cost is the wait."
            )
            return
        cap_s, budget_s = self._cap_and_budget(run, fixes_due)
        # fit's traced function, reused, is not traced again (nor is the
        # step JAX and torch compiled for the fit).
        reused = traced_step is not None or backend in framework_replay.BACKENDS
        tracing_s = 0.0 if reused else _tracing_s(run.clock)
        fresh_s = _fresh_iterator_s(run.clock)
        # Its set-up reads the pipeline's graph (and may copy it): the
        # in-memory arrays it holds take their time (large sources are read
        # as stand-ins, not copied).
        setup_s = 0.0
        if is_tf_dataset(dataset):
            setup_s = in_memory_bytes(copied_by_rebuild(dataset)) / COPY_BYTES_PER_S
        # A pipeline that must not run again is said first, where reading its
        # graph is cheap; else only once the check is known to fit.
        hazard_first = is_tf_dataset(dataset) and setup_s < HAZARD_FIRST_S
        if hazard_first and self._refused(run, dataset):
            return
        plan, smallest_s = what_if_replay.contention_plan(
            step_ms or 0.0, tracing_s, fresh_s, budget_s, cap_s, setup_s
        )
        needed_s = None
        # Whether it could change the verdict (the wait does not decide), with
        # the budget the tuner chose: then it is given the time it needs.
        given_time = run.cost.uses_default_budget and not verdict.wait_decides(
            judgement, step_ms
        )
        if given_time:
            # On a cap of its own when the usual one is too short, said in a note.
            needed_s = what_if_replay.needed_cap_s(smallest_s, run.cost.cost().fit_s)
            if needed_s is not None and needed_s > cap_s:
                cap_s = needed_s
                plan, smallest_s = what_if_replay.contention_plan(
                    step_ms or 0.0,
                    tracing_s,
                    fresh_s,
                    needed_s / what_if_replay.CONTENTION_BUDGET_SHARE,
                    needed_s,
                    setup_s,
                )
            else:
                needed_s = None
        if plan is None:
            run.notes.append(skipped + _too_long(
                smallest_s, cap_s, budget_s, fixes_due, self.settings.measure_fixes_s is None
            ) + _held_arrays(setup_s))
            return
        if is_tf_dataset(dataset) and not hazard_first and self._refused(run, dataset):
            return
        if plan.estimate_s > tuner_cost.ANNOUNCE_S:
            self.announce(f"checking contention (a short replay after training): up to "
                          f"{plan.estimate_s + plan.round_s:.1f} s")
        part = tuner_cost.FIX_FLOOR if fixes_due else tuner_cost.CONTENTION_CHECK
        given_s = None
        if needed_s is not None:
            part = tuner_cost.CONTENTION_CHECK
            given_s = what_if_replay.needed_bound_s(run.cost.cost().fit_s)
            run.cost.check_capped(given_s)
        began = time.monotonic()
        with self.guard(features.CONTENTION_CHECK), run.cost.part(part):
            try:
                # The outputs after it need the rest of the budget.
                first_round_by = time.monotonic() + cap_s
                if given_s is not None:
                    # Given the time it needs: its steps are planned within
                    # its cap, but a busy machine's slower set-up may take it
                    # on, and a second round (run only when the first showed
                    # contention) gets what is left, up to its bound.
                    deadline = first_round_by = time.monotonic() + given_s
                elif fixes_due:
                    deadline = time.monotonic() + cap_s
                else:
                    deadline = run.cost.deadline(what_if_replay.CONTENTION_BUDGET_SHARE)
                    if given_time:
                        # A set-up slower than planned (a busy machine) may
                        # take the first round on to the budget's share.
                        first_round_by = max(first_round_by, deadline)
                # Its cap bounds the first round; a second one, run only when
                # the first showed contention, may use the budget's share.
                replay = None
                if backend in framework_replay.BACKENDS:
                    replay = functools.partial(framework_replay.replay, model, backend)
                run.what_if = what_if_replay.contention_check(
                    model, replay_comparison.shows_contention, plan, deadline, traced_step,
                    first_round_by=first_round_by, wall_time=throttled(run.cpu_usage()),
                    replay=replay, given_s=given_s,
                )
            except what_if_replay.ReplayUnsupported as limit:
                # An expected limit: the wait decides, and the report says why.
                run.notes.append(f"The contention check did not run. {limit}")
        if needed_s is not None:
            run.notes.append(_needed_note(time.monotonic() - began, needed_s, budget_s))

    def _refused(self, run, dataset) -> bool:
        """Whether running `dataset` again would change what a later fit reads (then noted)."""
        # Variables it writes (a Keras random layer's seed) are put back.
        hazard = rerun.dataset_rerun_hazard(dataset, restores_variables=True)
        if hazard is not None:
            run.notes.append(
                f"The contention check did not run: the pipeline is not run again: {hazard}."
            )
        return hazard is not None

    def _cap_and_budget(self, run, fixes_due: bool) -> Tuple[float, float]:
        """`(cap_s, budget_s)`: the check's own cap, and the budget its plan may use."""
        cap_s = what_if_replay.contention_cap_s(run.cost.cost().fit_s)
        if not fixes_due:
            return cap_s, run.cost.remaining_s()
        # Counted with the fix timing, whose figures it bounds, and within a
        # share of its cap when that is the larger.
        fix_s = self.fix_budget_s(run)
        cap_s = max(cap_s, FIX_FLOOR_SHARE * fix_s)
        if self.settings.measure_fixes_s is None:
            # "auto" keeps the fixes the time to time one (a short fit's cap
            # is under a second): a floor with no timed fix bounds nothing.
            cap_s = max(min(cap_s, fix_s - fix_timing.AUTO_LEAST_S), 0.0)
        return cap_s, cap_s / what_if_replay.CONTENTION_BUDGET_SHARE

    def _replay_blocker(self, run, model) -> Optional[str]:
        if model is None:
            return LOOP_HAS_NO_STEP
        if not self.guard.enabled(features.STEP_CLOCK):
            return "it compares with the step clock's timings, and the step clock was turned off"
        if run.multi_worker:
            return (
                "under MultiWorkerMirroredStrategy its steps would run the all-reduce, which "
                "stalls unless every worker replays the same steps"
            )
        return None

    def _contention_check_due(self, run, model) -> bool:
        """Whether the wait alone may miss what the pipeline costs the step.

        On the CPU the pipeline's threads share the cores with the model, which
        the wait at the fetch does not show. A short replay of cached batches
        times the step with input free (see `advice.verdict`). An input-bound
        job needs it too: the replayed step bounds what any fix can bring, and
        a pipeline that competes for the cores costs more than its wait.
        """
        if not (self.settings.check_contention and self.guard.enabled(features.CONTENTION_CHECK)):
            return False
        if run.multi_worker or run.measurement != measured_by.IN_STEP or model is None:
            return False
        backend = _backend()
        if backend != "tensorflow" and backend not in framework_replay.BACKENDS:
            return False
        if not self.guard.enabled(features.REPORT):
            # No verdict can be built (that feature failed): none to refine.
            return False
        with self.guard(features.CONTENTION_CHECK):
            steady = run.clock.steady_share(TRAIN)
            if steady.steps < what_if_replay.CONTENTION_MIN_STEPS:
                return False
            if backend in framework_replay.BACKENDS:
                # The fit's own compiled step (JAX, torch), replayed.
                return framework_replay.computes_on_cpu(
                    backend
                ) and framework_replay.can_replay(model, backend)
            return what_if_replay.computes_on_cpu() and what_if_replay.can_replay(model)
        return False


def _held_arrays(setup_s: float) -> str:
    """What of a check's shortest form reading the pipeline's in-memory arrays takes, if any.

    Example:

    >>> _held_arrays(0.0)
    ''
    >>> _held_arrays(0.7)
    ' Of that, about 0.7 s reads the pipeline, which holds 9 MB of in-memory arrays.'
    """
    if setup_s <= 0.05:
        return ""
    held_mb = setup_s * COPY_BYTES_PER_S / 1e6
    return (
        f" Of that, about {setup_s:.1f} s reads the pipeline, which holds "
        f"{held_mb:,.0f} MB of in-memory arrays."
    )


def _backend() -> str:
    import keras

    return keras.backend.backend()


def _too_long(
    smallest_s: float, cap_s: float, budget_s: float, for_fixes: bool, auto: bool
) -> str:
    """Why a contention check of `smallest_s` at least did not run."""
    if for_fixes:
        kept = (
            f", less the {fix_timing.AUTO_LEAST_S:g} s measure_fixes=\"auto\" keeps for "
            "the fixes" if auto else ""
        )
        return (
            f"even its shortest form would take about {smallest_s:.1f} s, more than its cap "
            f"({cap_s:.1f} s, the larger of its own and {FIX_FLOOR_SHARE:.0%} of the fix "
            f"timing's, whose figures it bounds{kept}): they are capped at the compute "
            "measured in training, which the pipeline's threads may have slowed."
        )
    return (
        f"even its shortest form would take about {smallest_s:.1f} s, more "
        f"than its cap ({cap_s:.1f} s, the larger of "
        f"{what_if_replay.CONTENTION_LEAST_S:g} s and "
        f"{what_if_replay.CONTENTION_FIT_SHARE * 100:g} % of the fit) or its share of "
        f"what was left of the tuner's budget ({budget_s:.1f} s; "
        "PipelineTuner(cost_budget_s=...) changes it). The wait decides."
    )


def _needed_note(took_s: float, cap_s: float, budget_s: float) -> str:
    """What a contention check given the time it needs took, and why it was given it.

    Example:

    >>> _needed_note(9.5, 16.0, 1.5)[:60]
    'The contention check took 9.5 s, beyond its share of the tun'
    """
    return (
        f"The contention check took {took_s:.1f} s, beyond its share of the tuner's "
        f"budget ({budget_s:.1f} s): it could change the verdict, so it was given the "
        f"time it needs (its steps planned within {what_if_replay.CONTENTION_NEEDED_ROOM:g}x "
        f"its shortest form, {cap_s:.1f} s; a busy machine or a second round may take it on "
        f"to {what_if_replay.CONTENTION_NEEDED_FIT_SHARE:.0%} of the fit, never over "
        f"{what_if_replay.CONTENTION_NEEDED_MAX_S:g} s). PipelineTuner(cost_budget_s=...) "
        "keeps it within a budget you set."
    )


def _tracing_s(clock) -> float:
    """The training's first-step tracing, in seconds (0 when not measured)."""
    first = clock.first_steps.get(TRAIN)
    return (first.tracing_ms or 0.0) / 1e3 if first is not None else 0.0


def _fresh_iterator_s(clock) -> float:
    """What a training epoch took to set up its iterator and start, after the first.

    A new iterator of the pipeline pays it again: its set-up and its first
    steps' wait (a shuffle buffer filling, parallel calls starting). The first
    epoch's may fill a cache, which the check's iterator finds filled. Of the
    later epochs, the cheapest: on a busy machine one epoch's start can take a
    second longer for reasons of the machine's, not the pipeline's (and the
    check's rounds are sized by what its own calls take).
    """
    found = []
    for epoch in clock.epochs:
        if epoch.kind != TRAIN:
            continue
        start_ms = epoch.start.wait_ms if epoch.start is not None else 0.0
        found.append(((epoch.setup_ms or 0.0) + start_ms) / 1e3)
    return min(found[1:] or found or [0.0])


def _class_stands(judgement) -> str:
    """Why a check that cannot change the class did not run (`verdict.check_can_change_class`)."""
    return (
        f"tf.data's live model timed every stage of the pipeline, whose CPU can take at most "
        f"{judgement.contention_ceiling * 100:.1f} % of step time from the compute (a bound); "
        f"with the wait ({judgement.wait_fraction * 100:.1f} %), the verdict stays "
        f"\"{judgement.verdict.value}\" whatever the check finds."
    )
