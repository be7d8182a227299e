"""The probes that run once training has ended: one phase, for fit and custom loops.

- the what-if replay (`what_if=True`) or, on its own on the CPU, the contention
  check: the model's compiled step on replayed batches (TensorFlow backend,
  fit only: a custom loop does not hand the tuner its model's step; see
  `after_training.replay_probe`);
- the timing of the advised fixes (`measure_fixes`), on the tf.data dataset fit
  was given or the loop iterated through `tuner.iterate`, where its stages are
  TensorFlow ops;
- the fetch floor: the fetch of an in-memory batch, timed through the fit's
  own kind of fetch on zeros of its batches' structure (`timing.fetch_floor`;
  no user code runs), first, where it could change the class (with it, the
  contention check may find that nothing it measures could), and on JAX and
  torch beside a replay of NumPy arrays, which hands the step its batches
  without Keras' iterator;
- the advice on a Grain pipeline's slow stage, from Grain's timing of the
  iterators training read;
- where the host's work between steps bounds a fit that does not wait for
  input: Keras' fit on cached batches at a larger `steps_per_execution`
  (`after_training.execution_replay`);
- only when the user asks (`ProbeSettings.reruns_python`): the fixes of a
  pipeline that runs Python, a PyDataset's advised workers and, where
  training's Grain iterators were not timed, Grain's stage timing in a pass of
  its own, which run the user's Python again, in this process.

Each probe that does not run says why in the report, where the user asked for it
or would expect it. None reads from the iterator training used, copies the
process, or moves state a later fit sees (see `pipeline.rerun` and
`after_training.what_if_replay`).
"""

import logging
from typing import Optional

from keras_pipeline_tuner._util import features
from keras_pipeline_tuner._util.random_state import preserved_random_state
from keras_pipeline_tuner._util.tf_import import is_tf_dataset
from keras_pipeline_tuner.advice import verdict
from keras_pipeline_tuner.after_training import execution_replay
from keras_pipeline_tuner.after_training import fix_timing
from keras_pipeline_tuner.after_training import framework_replay
from keras_pipeline_tuner.after_training import py_dataset_timing
from keras_pipeline_tuner.after_training.replay_probe import ReplayProbe
from keras_pipeline_tuner.after_training.settings import ProbeSettings
from keras_pipeline_tuner.pipeline.lint.grain_findings import grain_stage_findings
from keras_pipeline_tuner.profiling import grain_stages
from keras_pipeline_tuner.profiling.evidence import GRAIN
from keras_pipeline_tuner.timing import fetch_floor
from keras_pipeline_tuner.timing import tuner_cost
from keras_pipeline_tuner.timing.cpu_budget import quota_span_s
from keras_pipeline_tuner.timing.cpu_usage import budget_cpus
from keras_pipeline_tuner.timing.step_clock import TRAIN

logger = logging.getLogger("keras_pipeline_tuner")


class AfterTraining:
    """Runs the probes of a run whose training has ended.

    Args:
        settings: the `ProbeSettings`.
        guard: the tuner's `FeatureGuard`.
        announce: says one line before work that takes longer than a second
            (the terminal, when the tuner is verbose); logs it by default.

    Example:

    ```python
    AfterTraining(ProbeSettings(what_if_steps=20), guard).run(run, model=model, dataset=ds)
    ```
    """

    def __init__(self, settings: ProbeSettings, guard, announce=None):
        self.settings = settings
        self.guard = guard
        self.announce = announce or _log_line
        self.replay = ReplayProbe(settings, guard, self.announce, self._fix_budget_s)

    def run(
        self,
        run,
        model=None,
        dataset=None,
        traced_step=None,
        py_dataset=None,
        fetched: Optional[tuple] = None,
    ) -> None:
        """Runs each probe that applies to `run`, or notes why it did not.

        Args:
            run: the `run.lifecycle.Run`, training ended.
            model: the model fit trained (its fit's frame on the stack), or
                `None` for a custom loop.
            dataset: the `tf.data.Dataset` training read (fit's, or a loop's
                through `tuner.iterate`), or `None`.
            traced_step: fit's timed training function, traced already
                (`FitTiming.traced_train_step()`), which the replay reuses
                rather than trace the step again; `None` traces its own.
            py_dataset: the `keras.utils.PyDataset` fit read, or `None`.
            fetched: `(backend, kind, element_spec)` of the fetch training ran,
                for the fetch floor (`timing.fetch_floor.measure_fetch_floor`),
                or `None`.
        """
        # The floor first, where it could change the class: with it, the
        # contention check may then find that nothing it measures could.
        self._fetch_floor(run, fetched)
        self.replay.run(run, model, traced_step, dataset, self._fixes_due(run, dataset, py_dataset))
        if run.what_if is not None:
            self._floor_beside_replay(run, fetched)
        self._grain_stages(run)
        self._execution_replay(run, model, dataset)
        if py_dataset is not None:
            self._py_dataset_timing(run, py_dataset)
        else:
            self._fix_timing(run, dataset)

    # The fetch floor.

    def _fetch_floor(self, run, fetched: Optional[tuple], always: bool = False) -> None:
        """Times the fetch of an in-memory batch, before any replay (up to 0.3 s).

        Only where it could change the class (`verdict.floor_can_change_class`),
        unless `always`.
        """
        if fetched is None or not self.guard.enabled(features.FETCH_FLOOR):
            return
        if not self.guard.enabled(features.REPORT):
            # No verdict can be built (that feature failed): none to refine.
            return
        run.flush_rows()
        if not always:
            due = False
            with self.guard(features.REPORT):
                due = verdict.floor_can_change_class(run.judgement())
            if not due:
                # The floor would only lower a wait already under the
                # boundary (a healthy fit), and it takes some 0.3 s.
                return
        with self.guard(features.FETCH_FLOOR), run.cost.part("fetch floor"):
            steady = run.clock.steady_share(TRAIN)
            compute_ms = None
            if steady is not None and steady.steps:
                compute_ms = (steady.step_ms - steady.wait_ms) / steady.steps
            # Keras' torch iterator makes a DataLoader, which draws a seed.
            with preserved_random_state():
                run.fetch_floor = fetch_floor.measure_fetch_floor(
                    *fetched, compute_ms=compute_ms
                )

    def _floor_beside_replay(self, run, fetched: Optional[tuple]) -> None:
        """After a replay: where it fetched as fit did its floor stands, elsewhere one is measured.

        TensorFlow's replay fetches through the fit's own fetch op. On JAX and
        torch a tf.data dataset's replayed batches come through Keras'
        iterator, whose fetch its wait then holds: a floor measured first is
        kept beside it, none is measured again. NumPy arrays' replayed batches
        come from a list, without Keras' iterator, whose fetch the floor
        measures beside it.
        """
        if fetched is None:
            return
        if fetched[0] == "tensorflow":
            run.fetch_floor = None
        elif run.fetch_floor is None and not framework_replay.fetches_as_fit(fetched[1]):
            self._fetch_floor(run, fetched, always=True)

    # Grain.

    def _grain_stages(self, run) -> None:
        """After training on a Grain dataset that kept steps waiting: the advice on its slow stage.

        Grain timed the stages of the iterators training read (see
        `instrumentation.grain_stage_timing`); this names the slowest and adds
        the finding about it. Only for a run the report judges input-bound:
        otherwise no stage limits training. Where training's own iterators
        were not timed (a Keras version whose iterator the tuner does not
        reach), a few batches of the dataset are read apart with Grain's
        timing on (see `profiling.grain_stages`): that runs the user's
        transformations again, so only when the user asks
        (`ProbeSettings.reruns_python`); otherwise the report says so.
        """
        dataset, run.grain_dataset = run.grain_dataset, None
        timed = run.stage_timing
        if not (timed is not None and timed.source == GRAIN and timed.timed_in_training):
            timed = None
        if (dataset is None and timed is None) or not self.guard.enabled(features.GRAIN_STAGES):
            return
        with self.guard(features.GRAIN_STAGES), run.cost.part("Grain stage timing"):
            # The report's own verdict, so that the stage is named when the
            # advice would look for the stage that holds the wait.
            run.flush_rows()
            if not run.report().verdict.input_bound:
                return
            evidence = timed
            if evidence is None:
                if not self.settings.reruns_python:
                    run.notes.append(
                        "Grain's stages were not timed during training, and the separate "
                        "pass that times them reads the dataset again, which runs your "
                        "transformations again; PipelineTuner(measure_fixes=True, "
                        "allow_unverified=True) asks for it."
                    )
                    return
                # The user's Python in the pipeline may draw from the global
                # generators: their next draws stay as without the tuner.
                with preserved_random_state():
                    evidence = grain_stages.time_stages(dataset)
                run.stage_timing = evidence
            stage = grain_stages.placement(evidence)
            if stage is None:
                return
            found = grain_stage_findings(
                stage.label,
                evidence.bottleneck_node,
                evidence.bottleneck_iterator,
                stage.on_read_threads,
                stage.read_threads,
            )
            run.findings = list(run.findings) + list(found) if run.findings else found

    # What bounds a step that does not wait for input.

    def _execution_replay(self, run, model, dataset) -> None:
        """Where the host's work between steps bounds training: fit on cached batches at
        a larger `steps_per_execution`, timed (see `after_training.execution_replay`)."""
        if model is None or dataset is None or not self.guard.enabled(features.EXECUTION_REPLAY):
            return
        report = run.built_report()
        if report is None or not execution_replay.due(model, report):
            return
        needs_s = execution_replay.estimated_s(report.train)
        left_s = run.cost.budget_s - run.cost.spent_s()
        if needs_s > left_s:
            run.notes.append(
                f"steps_per_execution was not timed: its replay would take about {needs_s:.1f} s "
                f"and {max(left_s, 0.0):.1f} s of the tuner's budget is left "
                "(PipelineTuner(cost_budget_s=...) gives it more); its gain is predicted."
            )
            return
        with self.guard(features.EXECUTION_REPLAY), run.cost.part("steps_per_execution replay"):
            try:
                run.execution = execution_replay.replay_execution(model, dataset)
            except ValueError as reason:
                run.notes.append(f"steps_per_execution was not timed: {reason}")

    # The advised fixes.

    def _fixes_due(self, run, dataset, py_dataset) -> bool:
        """Whether the fix timing will time fixes of this run's tf.data pipeline.

        Decided before the replay (the verdict's input-bound test comes after
        it, in `_fix_timing`): the settings, the dataset and "auto"'s budget.
        """
        asked_s = self.settings.measure_fixes_s
        if asked_s == 0.0 or py_dataset is not None:
            return False
        if not self.guard.enabled(features.FIX_TIMING) or not is_tf_dataset(dataset):
            return False
        if asked_s is None:
            return fix_timing.auto_budget(run.cost.cost().fit_s) >= fix_timing.AUTO_LEAST_S
        return True

    def _fix_timing(self, run, dataset) -> None:
        """Times the advised fixes on the dataset training read (`measure_fixes`)."""
        asked_s = self.settings.measure_fixes_s
        if asked_s == 0.0 or not self.guard.enabled(features.FIX_TIMING):
            return
        if asked_s is None and not is_tf_dataset(dataset):
            # "auto": nothing to time without a tf.data dataset, and nothing to say.
            return
        report = None
        with self.guard(features.FIX_TIMING):
            if not is_tf_dataset(dataset):
                if asked_s is not None:
                    run.notes.append(
                        "measure_fixes timed no fix: it times rewrites of a tf.data pipeline, "
                        "and training was not given one (or was given one distributed by a "
                        "strategy; a custom loop's is the one it iterates through "
                        "tuner.iterate)."
                    )
                return
            report = run.built_report()
        if report is None or not report.verdict.input_bound:
            return
        with self.guard(features.FIX_TIMING), run.cost.part(tuner_cost.FIX_TIMING):
            budget_s = self._fix_timing_budget(run, asked_s)
            if budget_s is None:
                return
            # The user's Python functions run again: their draws from the global
            # generators must not move the user's next ones.
            with preserved_random_state():
                run.fix_timings = fix_timing.time_fixes(
                    dataset,
                    report.recommendations,
                    report.train,
                    budget_s,
                    self.settings.reruns_python,
                    report.reuse,
                    cpus=budget_cpus(report.cpu),
                    min_pass_s=quota_span_s(report.cpu and report.cpu.budget),
                )

    def _py_dataset_timing(self, run, py_dataset) -> None:
        """Times a PyDataset's advised workers, when the user asked (`reruns_python`).

        The passes call its `__getitem__` again, in this process; by default
        the advice predicts the change from the calls timed in training.
        """
        import keras

        asked_s = self.settings.measure_fixes_s
        if asked_s == 0.0 or not self.guard.enabled(features.FIX_TIMING):
            return
        with self.guard(features.FIX_TIMING):
            report = run.built_report()
            if report is None or not report.verdict.input_bound:
                return
            if not self.settings.reruns_python:
                if asked_s is not None:
                    run.notes.append(
                        "measure_fixes timed no PyDataset workers: that calls your "
                        "__getitem__ again after training; pass allow_unverified=True too "
                        "if it can run again (it reads data or files, no queue or feed)."
                    )
                return
            with run.cost.part(tuner_cost.FIX_TIMING):
                budget_s = self._fix_timing_budget(run, asked_s)
                if budget_s is None:
                    return
                run.fix_timings = py_dataset_timing.time_workers(
                    py_dataset,
                    report.recommendations,
                    report.train,
                    budget_s,
                    backend=keras.backend.backend(),
                    min_pass_s=quota_span_s(report.cpu and report.cpu.budget),
                )

    def _fix_budget_s(self, run) -> float:
        """The fix timing's cap, with any replay for its floor: as asked, or "auto"'s."""
        asked_s = self.settings.measure_fixes_s
        if asked_s is None:
            return fix_timing.auto_budget(run.cost.cost().fit_s)
        return asked_s

    def _fix_timing_budget(self, run, asked_s: Optional[float]) -> Optional[float]:
        """The fix timing's seconds: as asked, or "auto"'s cap (`None`: too short, noted).

        Less what the replay for the fixes' floor took of it (`_contention_check`).
        """
        budget_s = self._fix_budget_s(run)
        run.cost.fix_timing_capped(budget_s)
        if asked_s is None:
            fit_s = run.cost.cost().fit_s
            if budget_s < fix_timing.AUTO_LEAST_S:
                run.notes.append(
                    f"The advised fixes were not timed: measure_fixes=\"auto\" gives them "
                    f"the smaller of {fix_timing.AUTO_CAP_S:g} s and "
                    f"{fix_timing.AUTO_FIT_SHARE * 100:g} % of the fit's {fit_s:.1f} s, "
                    f"{budget_s:.2f} s, too short to time one (measure_fixes=True gives them "
                    f"{fix_timing.DEFAULT_BUDGET_S:g} s). Their figures stay bounds."
                )
                return None
        floor_s = run.cost.cost().parts.get(tuner_cost.FIX_FLOOR, 0.0)
        left_s = budget_s - floor_s
        if floor_s and left_s <= (fix_timing.AUTO_LEAST_S if asked_s is None else 0.0):
            run.notes.append(
                f"The advised fixes were not timed: the replay for their floor (the step with "
                f"input free) took {floor_s:.2f} s of their cap of {budget_s:.2f} s, leaving "
                f"{max(left_s, 0.0):.2f} s, too short to time one. Their figures stay bounds "
                "(a larger measure_fixes gives them more)."
            )
            return None
        budget_s = left_s
        if budget_s > tuner_cost.ANNOUNCE_S:
            self.announce(f"timing the advised fixes on the pipeline: up to {budget_s:.1f} s")
        if asked_s is None:
            # Planned within a share of the cap, so that it ends within it.
            return budget_s * fix_timing.AUTO_PLANNED_SHARE
        return budget_s


def _log_line(line: str) -> None:
    logger.info("keras-pipeline-tuner: %s", line)

