"""The advisor: joins the evidence into one ranked list of recommendations.

Three kinds of evidence reach it, each from its own module:

- the step clock's `StepStats`: how long steps wait for input and compute;
- the profiler window's `ProfileEvidence`: which tf.data stage holds the
  input time;
- the pipeline inspection's `Finding`s: where the pipeline departs from the
  tf.data performance guide, with the code to write instead;
- optionally, a what-if replay's `WhatIfResult`: the step time with input free;
- the user's Python calls timed during training (`UserCallTiming`): what a
  generator, a `py_function` or a PyDataset's `__getitem__` costs a step, which
  names the slow stage where no profile did and predicts a change's gain
  (`python_stages`).

Every recommendation names the evidence it rests on, and states its expected
gain from measurement. The step clock gives compute time, and if input were
free a step would take about its compute time, so no input-pipeline change can
make steps faster than `step / compute` (or, measured more directly, than the
replayed step with input free): that is the upper bound stated. A stage
the profiler timed can at most remove its own share of the input wait, which
bounds the gain of changing that stage more tightly.

Rules, in rank order:

1. A job that is not input-bound gets "the input pipeline is not the
   bottleneck", and apart from that only errors (findings that mean the model
   sees wrong data): no speed advice.
2. Otherwise, a finding about the stage the profiler names as the bottleneck
   (or, without a profile, the Python stage that takes most of the wait, as
   timed during training) ranks first; when no finding is about that stage, the bottleneck itself is
   recommended, with the change that usually speeds up a stage of its kind.
3. Then errors, then the other findings: warnings before infos, larger gains first.
4. An input-bound job whose bottleneck no profile named is also told how to
   find it, with the gain at stake.
5. When fixes were timed (`fix_timing`), those timed faster lead, fastest
   first: a bound never outranks a measured gain.

The parts live in modules of their own: how stages are named and matched
(`stages`), what fixes a stage of each kind (`stage_fixes`), what each change
is expected to bring (`gains`), and the order of the advice (`ranking`). This
module joins them: the run's evidence (`_Run`) and the rules that make each
recommendation.

Two rules for jobs that outgrow one host live in `scale_out_advice`: a
multi-worker job is judged by its straggler, named first; and when every stage
already runs in parallel on saturated CPUs, moving the pipeline to the tf.data
service ranks after the errors, or after the CPU budget's advice when the
job's quota throttled it.
"""

import dataclasses
from typing import TYPE_CHECKING
from typing import Any
from typing import List
from typing import Optional
from typing import Sequence
from typing import Tuple

from keras_pipeline_tuner.advice import cpu_limits
from keras_pipeline_tuner.advice import python_stages
from keras_pipeline_tuner.advice import scale_out as scale_out_advice
from keras_pipeline_tuner.advice import timed_gains
from keras_pipeline_tuner.advice.figures import Figures
from keras_pipeline_tuner.advice.gains import cache_after
from keras_pipeline_tuner.advice.gains import cache_gain
from keras_pipeline_tuner.advice.gains import first_epoch_only
from keras_pipeline_tuner.advice.gains import overlap_gain
from keras_pipeline_tuner.advice.gains import replayed_gain
from keras_pipeline_tuner.advice.gains import stage_gain
from keras_pipeline_tuner.advice.gains import stage_time
from keras_pipeline_tuner.advice.ranking import bottleneck_key
from keras_pipeline_tuner.advice.ranking import cannot_help
from keras_pipeline_tuner.advice.ranking import no_speed_fix
from keras_pipeline_tuner.advice.ranking import one_per_stage
from keras_pipeline_tuner.advice.ranking import rank_key
from keras_pipeline_tuner.advice.ranking import sort_by_figure
from keras_pipeline_tuner.advice.recommendation import BOTTLENECK_STAGE
from keras_pipeline_tuner.advice.recommendation import FIND_THE_BOTTLENECK
from keras_pipeline_tuner.advice.recommendation import FIX_TIMING
from keras_pipeline_tuner.advice.recommendation import LINT
from keras_pipeline_tuner.advice.recommendation import LIVE_MODEL
from keras_pipeline_tuner.advice.recommendation import NOT_READ_BACK
from keras_pipeline_tuner.advice.recommendation import NOT_THE_BOTTLENECK
from keras_pipeline_tuner.advice.recommendation import PROFILER
from keras_pipeline_tuner.advice.recommendation import REPLAY
from keras_pipeline_tuner.advice.recommendation import STEP_CLOCK
from keras_pipeline_tuner.advice.recommendation import USER_CALLS
from keras_pipeline_tuner.advice.recommendation import Evidence
from keras_pipeline_tuner.advice.recommendation import Recommendation
from keras_pipeline_tuner.advice.stage_fixes import CACHE
from keras_pipeline_tuner.advice.stage_fixes import GENERIC_FIX
from keras_pipeline_tuner.advice.stage_fixes import KERAS_DIRECTORY_UTILITIES
from keras_pipeline_tuner.advice.stage_fixes import PARALLEL
from keras_pipeline_tuner.advice.stage_fixes import PARALLEL_KINDS
from keras_pipeline_tuner.advice.stage_fixes import SPREAD
from keras_pipeline_tuner.advice.stage_fixes import STAGE_FIXES
from keras_pipeline_tuner.advice.stage_fixes import change_of
from keras_pipeline_tuner.advice.stage_fixes import parallel_stage_fix
from keras_pipeline_tuner.advice.stage_fixes import runs_parallel
from keras_pipeline_tuner.advice.stages import finding_node
from keras_pipeline_tuner.advice.stages import parse_stage
from keras_pipeline_tuner.advice.stages import same_place
from keras_pipeline_tuner.advice.stages import same_stage
from keras_pipeline_tuner.advice.stages import severity_of
from keras_pipeline_tuner.advice.step_overhead import overhead_recommendation
from keras_pipeline_tuner.pipeline.graph import keras_made
from keras_pipeline_tuner.pipeline.graph import kinds
from keras_pipeline_tuner.pipeline.lint.catalogue import CACHE_MISSING
from keras_pipeline_tuner.pipeline.lint.catalogue import KERAS_ARRAY_INPUT
from keras_pipeline_tuner.pipeline.lint.catalogue import KINDS
from keras_pipeline_tuner.pipeline.lint.catalogue import MISSING_PREFETCH
from keras_pipeline_tuner.pipeline.lint.catalogue import SEQUENTIAL_MAP
from keras_pipeline_tuner.pipeline.lint.memory_forecast import fits
from keras_pipeline_tuner.timing.cpu_usage import budget_cpus
from keras_pipeline_tuner.timing.cpu_usage import throttled
from keras_pipeline_tuner.timing.step_stats import StepStats
from keras_pipeline_tuner.timing.step_stats import Verdict

if TYPE_CHECKING:
    from keras_pipeline_tuner.advice.data_reuse import DataReuse


# A Python stage whose calls take this share of the steps' wait is what they
# wait for (where no profile named a stage).
PYTHON_BOTTLENECK_SHARE = 0.5
_DONE_AT_RUN_TIME = frozenset({MISSING_PREFETCH, SEQUENTIAL_MAP})
# Notes with nothing to change: the inspection shows them, the advice does not.
_NOTHING_TO_CHANGE = frozenset({KERAS_ARRAY_INPUT})


@dataclasses.dataclass(frozen=True)
class RunEvidence:
    """What the advice reads of a run besides its `Figures`.

    Attributes:
        stats: `StepStats` of the job's training steps (a multi-worker job's
            straggler's): how many steps its Python calls are spread over.
        profile: `ProfileEvidence` of a TF Profiler window (or Grain's stage
            timing), if one ran: which stage holds the input time.
        findings: `Finding`s of the pipeline inspection, if it ran (from
            `kpt.inspect`, with the pipeline they were read from).
        what_if: `WhatIfResult` of a what-if replay, if one ran.
        cpu: `CpuUsage` of the run: with every stage already parallel,
            saturated CPUs make the tf.data service the advice (see
            `scale_out_advice`); its CPU budget and throttling add the
            advice of `cpu_limits`.
        workers: the chief's `MultiWorkerSummary` of a multi-worker run: the
            straggler is named first.
        fix_timings: `FixTiming`s of the advised fixes, timed on the pipeline
            (`measure_fixes`): a timed fix's gain becomes the measured figure,
            and the advice is ranked again.
        reuse: the fit's `DataReuse` (see `advice.data_reuse`): a cache in a
            fit that reads no element twice gets no gain.
        user_calls: the user's Python calls timed during training
            (`Report.user_calls`): a stage that takes most of the wait is
            named the bottleneck where no profile named one, and a change to
            it gets a gain predicted from them (`python_stages`).
        cpu_count: CPU cores a parallelised stage can use, where the figures
            hold no CPU budget (read now when neither says).
        execution: the `ExecutionReplay` of cached batches at a larger
            `steps_per_execution`, if one ran (`advice.step_overhead`).
    """

    stats: StepStats
    profile: Any = None
    findings: Sequence = ()
    what_if: Any = None
    cpu: Any = None
    workers: Any = None
    fix_timings: Sequence = ()
    reuse: Any = None
    user_calls: Sequence = ()
    cpu_count: Optional[int] = None
    execution: Any = None


def advise(evidence: RunEvidence, figures: Figures) -> List[Recommendation]:
    """Ranks what to change, from a run's evidence and its figures.

    The verdict, the step, the input share and the input-free ceiling are the
    run's `Figures` (built once from `advice.verdict.judge`'s judgement, see
    `advice.figures`): the advice follows them and decides none again.

    Args:
        evidence: the `RunEvidence`.
        figures: the run's `Figures` (for a multi-worker job, its straggler's).

    Returns:
        `Recommendation`s, most important first. Never one without evidence.

    Example:

    ```python
    evidence = RunEvidence(report.train, report.profile, report.findings)
    for recommendation in advise(evidence, report.figures):
        print(recommendation.title, describe_gain(recommendation.expected_gain))
    ```
    """
    findings = evidence.findings
    # Findings from `kpt.inspect` carry the pipeline they were read from.
    pipeline = getattr(findings, "pipeline", None)
    cpu, workers = evidence.cpu, evidence.workers
    quota_throttled = throttled(cpu)
    cpus = figures.cpu_budget or evidence.cpu_count or budget_cpus(cpu)
    run = _Run(evidence, figures, cpus, quota_throttled)
    run.pipeline, run.memory = pipeline, getattr(findings, "memory", None)
    run.name_python_bottleneck(python_stages.stage_costs(evidence.user_calls, evidence.stats.steps))
    findings = [finding for finding in findings or () if not _already_done(finding)]
    host = overhead_recommendation(evidence.stats, evidence.execution)
    if run.verdict == Verdict.NOT_INPUT_BOUND:
        return (
            ([host] if host is not None else []) + [_not_the_bottleneck(run)]
            + [
                _from_finding(run, finding)
                for finding in findings
                if severity_of(finding) == "error"
            ]
            + cpu_limits.cpu_limit_recommendations(pipeline, cpu, None)
        )

    fix_timings = evidence.fix_timings
    offload = scale_out_advice.offload_recommendation(run, findings, pipeline, cpu)
    # A job its quota throttled is out of the CPU time the container gives it:
    # the same-host ways out (a larger limit, fewer threads) come before moving
    # the pipeline to other hosts.
    offload_last = [offload] if offload is not None and quota_throttled else []
    ranked = _ranked(run, findings, None if offload_last else offload, fix_timings)
    straggler = scale_out_advice.straggler_recommendation(workers)
    # Advice from the CPU budget comes after the pipeline's own: it has no
    # speed figure of its own (see `cpu_limits`).
    limits = cpu_limits.cpu_limit_recommendations(pipeline, cpu, run.bound, fix_timings)
    ranked = one_per_stage(ranked)
    if host is not None:
        # The input bounds this run: the host's work between steps comes after
        # the pipeline's fixes, whose waits it cannot remove (and on a loader
        # fetched outside the step, its "gap" holds some of that wait).
        ranked.append(host)
    return ([straggler] if straggler else []) + ranked + limits + offload_last


def _ranked(run: "_Run", findings, offload, fix_timings) -> List[Recommendation]:
    """The input-bound run's recommendations in rank order (see the module's rules)."""
    bottleneck = run.bottleneck
    at_bottleneck, errors, others = _by_place(run, findings)
    input_bound = run.verdict.input_bound
    ranked = sorted(at_bottleneck, key=lambda item: bottleneck_key(item, run))
    if bottleneck and not at_bottleneck and input_bound:
        ranked.append(_bottleneck_stage(run))
    others = sorted(others, key=lambda item: rank_key(item, run))
    ranked += errors + ([offload] if offload else []) + others
    if input_bound and not bottleneck:
        # Findings say what departs from the guide, not what the steps wait for.
        ranked.append(_find_the_bottleneck(run))
    _apply_timings(run, ranked, fix_timings)
    sort_by_figure(ranked)
    # What cannot make steps faster (a cache never read back, a fix timed at
    # no gain) comes after every speed fix, so that a stage's first
    # recommendation is the change that can help.
    ranked.sort(key=no_speed_fix)
    # A ceiling under LEAST_SHOWN_GAIN says the change cannot help: no advice
    # (the inspection still lists the finding).
    ranked = [item for item in ranked if not cannot_help(item) and fits(run.memory, item)]
    if input_bound and not ranked:
        # Every finding was a change that cannot help (a prefetch where
        # compute is tiny): the wait still has a cause to point at.
        ranked.append(_bottleneck_stage(run) if bottleneck else _find_the_bottleneck(run))
    return ranked


def _by_place(run: "_Run", findings) -> Tuple[List[Recommendation], ...]:
    """The findings' recommendations: at the bottleneck, errors, the others."""
    at_bottleneck, errors, others = [], [], []
    for finding in findings:
        if run.at_bottleneck(finding.stage, finding_node(finding)):
            at_bottleneck.append(_from_finding(run, finding))
        elif severity_of(finding) == "error":
            errors.append(_from_finding(run, finding))
        else:
            others.append(_from_finding(run, finding))
    return at_bottleneck, errors, others


def _apply_timings(run, ranked: List[Recommendation], timings) -> bool:
    """Puts each timed fix's measured gain on its recommendation; whether any was."""
    timings = list(timings or ())
    applied = False
    for recommendation in ranked:
        if recommendation.expected_gain is None:
            continue
        timing = next((item for item in timings if item.matches(recommendation)), None)
        if timing is None:
            continue
        gain = timed_gains.measured_gain(timing, run.bound, run.reuse)
        if gain is None:
            if recommendation.expected_gain.basis == NOT_READ_BACK:
                # Not timed for the reason its gain already states.
                continue
            recommendation.expected_gain = dataclasses.replace(
                recommendation.expected_gain,
                statement=(
                    recommendation.expected_gain.statement
                    + " "
                    + timed_gains.untimed_statement(timing)
                ).strip(),
            )
            continue
        predicted = recommendation.expected_gain.predicted_speedup
        recommendation.expected_gain = dataclasses.replace(gain, predicted_speedup=predicted)
        recommendation.evidence.append(Evidence(FIX_TIMING, gain.statement))
        applied = True
    return applied


def _already_done(finding) -> bool:
    # Info findings whose fix TensorFlow already applies at run time (a map it
    # parallelises, a prefetch it injects, an asynchronous last stage): stating
    # it in code changes nothing measurable, so it is no speed advice.
    if finding.id in _NOTHING_TO_CHANGE:
        return True
    return severity_of(finding) == "info" and finding.id in _DONE_AT_RUN_TIME


class _Run:
    """The evidence of one run and its figures, and what every rule derives from them."""

    def __init__(self, evidence: RunEvidence, figures: Figures, cpu_count: int, throttled=False):
        self.stats = evidence.stats
        self.profile = evidence.profile
        self.figures = figures
        self.cpu_count = cpu_count
        self.pipeline = None
        self.memory = None
        self.reuse: Optional["DataReuse"] = evidence.reuse
        self.clock_evidence = _clock_evidence(figures)
        replayed = replayed_gain(evidence.what_if, throttled)
        if replayed is not None:
            self.clock_evidence.append(Evidence(REPLAY, replayed.statement))
        self.verdict = figures.verdict
        self.bound = figures.input_free
        self.python: List[python_stages.PythonStageCost] = []
        # The stage the steps wait for: the profile's, else the user's Python's.
        profile = self.profile
        self.bottleneck = profile.bottleneck if profile is not None else None
        self.bottleneck_node = profile.bottleneck_node if profile is not None else None
        self.bottleneck_by = PROFILER if self.bottleneck else None
        capacity = figures.capacity
        if not self.bottleneck and capacity is not None and capacity.input_caps():
            # No window ran (torch, or none opened): tf.data's own statistics
            # of the fit's iterator name the stage that sustains the fewest
            # batches, where the input's rate is what caps the step.
            slowest = capacity.stage(capacity.slowest)
            self.bottleneck, self.bottleneck_by = capacity.slowest, LIVE_MODEL
            self.bottleneck_node = slowest.node if slowest is not None else None

    def name_python_bottleneck(self, costs: List[python_stages.PythonStageCost]) -> None:
        """Keeps the Python stages' costs; names the bottleneck from them where no profile did.

        The costliest stage is the bottleneck when its calls take at least
        `PYTHON_BOTTLENECK_SHARE` of the step's wait: the steps wait for it.
        """
        self.python = costs
        figures = self.figures
        wait_ms = None
        if figures.wait_fraction is not None and figures.step_ms:
            wait_ms = figures.wait_fraction * figures.step_ms
        if self.bottleneck or not costs or not wait_ms:
            return
        if costs[0].step_ms >= PYTHON_BOTTLENECK_SHARE * wait_ms:
            self.bottleneck, self.bottleneck_by = costs[0].stage, USER_CALLS
            # Its graph node, as a profile would give it: the stage the lint read.
            stages = self.pipeline.stages if self.pipeline is not None else []
            self.bottleneck_node = next(
                (stage.node for stage in stages if same_stage(stage.label, self.bottleneck)), None
            )

    def at_bottleneck(self, stage: Optional[str], node: Optional[str] = None) -> bool:
        """Whether `stage` (at graph `node`) is the stage the steps wait for."""
        if not self.bottleneck:
            return False
        return same_place(self.bottleneck, self.bottleneck_node, stage, node)

    def python_cost(self, stage: Optional[str]):
        """The `PythonStageCost` of `stage`, or `None`."""
        return python_stages.cost_of(self.python, same_stage, stage)


# Rules.


def _not_the_bottleneck(run: _Run) -> Recommendation:
    figures = run.figures
    fraction = figures.input_fraction
    evidence = list(run.clock_evidence)
    if figures.source == PROFILER:
        evidence.append(
            Evidence(PROFILER, f"input is {fraction * 100:.1f} % of step time in the window.")
        )
    compute = figures.compute_ms
    return Recommendation(
        id=NOT_THE_BOTTLENECK,
        title="The input pipeline is not the bottleneck: speed up the model's compute instead",
        severity="info",
        evidence=evidence,
        fix="",
        expected_gain=run.bound,
        reason=(
            f"Steps wait for input only {fraction * 100:.1f} % of the time ({figures.scope})"
            + (f" and compute for {compute:.2f} ms (median)" if compute is not None else "")
            + ". Changing the input pipeline cannot make training noticeably faster; "
            "look at the model, the batch size or mixed precision."
        ),
    )


def _find_the_bottleneck(run: _Run) -> Recommendation:
    inspect = "# where the pipeline departs from the tf.data guide\nprint(kpt.inspect(train_ds))"
    if run.profile is not None:
        # The window ran: telling the user to open one repeats what was done.
        fix = inspect
        reason = (
            "The step clock shows the wait, but the profiler window found no tf.data "
            "stage at work (the time is spent outside tf.data: a Python generator, "
            "Keras' own adapter, or the host between steps)."
        )
    else:
        # "auto" (the default) may have been asked for and not opened: the
        # first steps' wait did not show clearly. Steps chosen always open one.
        fix = (
            "# which stage the steps wait for: a profiler window on steps you choose\n"
            "# (on the TensorFlow backend, or on JAX given a tf.data dataset)\n"
            "tuner = kpt.PipelineTuner(log_dir=\"logs/run1\", profile=(10, 25))\n" + inspect
        )
        reason = (
            "The step clock shows the wait, but no profiler window was captured to name "
            "the stage that causes it (an \"auto\" window opens only when the first steps "
            "show the wait clearly): a window on steps you choose captures one."
        )
    return Recommendation(
        id=FIND_THE_BOTTLENECK,
        title="Training waits for its input: find the slow stage",
        severity="warning",
        evidence=run.clock_evidence,
        fix=fix,
        expected_gain=run.bound,
        reason=reason,
    )


def _bottleneck_stage(run: _Run) -> Recommendation:
    stage, node = run.bottleneck, run.bottleneck_node
    kind, function = parse_stage(stage)
    reason, fix = STAGE_FIXES.get(kind, GENERIC_FIX)
    written = _pipeline_stage(run, node)
    if written is not None and written.made_by in KERAS_DIRECTORY_UTILITIES:
        # Keras' own loader: the user's call is what can change, not its lambda.
        reason, fix = keras_made.cache_advice(run.pipeline, written)
    elif kind in PARALLEL_KINDS and written is not None and runs_parallel(written):
        # Telling an already-parallel stage to run in parallel repeats the
        # user's own code: what is left is less work or doing it once.
        reason, fix = parallel_stage_fix(written)
    # The fix runs a map with AUTOTUNE parallel calls (at most one per core), or caches.
    change = None
    if ".cache(" in fix:
        change = CACHE
    elif kind == kinds.MAP and "num_parallel_calls" in fix:
        change = PARALLEL
    elif "num_parallel_calls" in fix:
        change = SPREAD
    gain = stage_gain(run, stage, change, node)
    if change == CACHE:
        # A cache gains only where the fit reads its elements again.
        gain = cache_gain(run, gain)
    named_by = {
        PROFILER: "the profiler names it",
        LIVE_MODEL: "tf.data's live model of the fit's iterator names it",
    }.get(
        run.bottleneck_by,
        "your Python in it takes most of the steps' wait, timed during training, so it is",
    )
    return Recommendation(
        id=BOTTLENECK_STAGE,
        title=f"Speed up {stage}: {named_by} the input pipeline's bottleneck",
        severity="warning",
        evidence=_stage_evidence(run, stage, node) + run.clock_evidence,
        fix=fix.format(function=function or "fn", stage=stage),
        expected_gain=gain,
        stage=stage,
        reason=reason,
        stage_node=node,
    )


def _stage_evidence(run: _Run, stage, node=None) -> List[Evidence]:
    """What the profile and the user's Python timed in training say of `stage`."""
    evidence = _profile_evidence(run.profile, stage, node) if run.profile is not None else []
    cost = run.python_cost(stage)
    if cost is not None:
        evidence.append(Evidence(USER_CALLS, cost.sentence()))
    capacity = run.figures.capacity
    held = capacity.evidence(stage, node) if capacity is not None and stage else None
    return evidence + ([Evidence(LIVE_MODEL, held)] if held else [])


def _pipeline_stage(run: _Run, node: Optional[str]):
    if run.pipeline is None or not node:
        return None
    return next((stage for stage in run.pipeline.stages if stage.node == node), None)


def _from_finding(run: _Run, finding) -> Recommendation:
    details = f"{finding.id} at {finding.stage}"
    if finding.op:
        details += f" ({finding.op})"
    evidence = [Evidence(LINT, details + ".")]
    gain = None
    # An error is about what the model sees: no speed is claimed for fixing it.
    if severity_of(finding) != "error":
        evidence += _stage_evidence(run, finding.stage, finding_node(finding))
        evidence += run.clock_evidence
        cached_after = cache_after(run.pipeline, finding_node(finding))
        if cached_after is not None:
            gain = first_epoch_only(run, finding.stage, cached_after)
        elif finding.id == MISSING_PREFETCH:
            gain = overlap_gain(run.figures)
        else:
            gain = stage_gain(run, finding.stage, change_of(finding.id), finding_node(finding))
        if finding.id == CACHE_MISSING:
            gain = cache_gain(run, gain)
    return Recommendation(
        id=finding.id,
        title=_title(finding),
        severity=severity_of(finding),
        evidence=evidence,
        fix=finding.fix,
        expected_gain=gain,
        stage=finding.stage,
        reason=finding.reason,
        stage_node=finding_node(finding),
    )


# Expected gains.


# Evidence.


def _clock_evidence(figures: Figures) -> List[Evidence]:
    if figures.input_fraction is None or figures.source == PROFILER:
        return [
            Evidence(
                STEP_CLOCK,
                f"{figures.steps} steps timed as a whole: input wait not separated from compute.",
            )
        ]
    return [
        Evidence(
            STEP_CLOCK,
            f"The input costs {figures.input_fraction * 100:.1f} % of steady-state step time "
            f"({figures.source}), over {figures.steps} steps ({figures.scope}): median step "
            f"{_ms(figures.step_ms)} ms, wait {_ms(figures.wait_ms)} ms, compute "
            f"{_ms(figures.compute_ms)} ms.",
        )
    ]


def _ms(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.2f}"


def _profile_evidence(profile, stage, node=None) -> List[Evidence]:
    timed = stage_time(profile, stage, node)
    if timed is None:
        return []
    named = _is_bottleneck(profile, stage, node)
    detail = (
        f"{timed.stage} holds {timed.self_share * 100:.0f} % of the input pipeline's time "
        f"({timed.self_ms:.1f} ms own time in {profile.span()})"
    )
    if named:
        detail += ": the bottleneck stage"
    if profile.input_fraction is not None:
        detail += f"; input is {profile.input_fraction * 100:.1f} % of step time in the window"
    return [Evidence(PROFILER, detail + ".")]


def _is_bottleneck(profile, stage, node=None) -> bool:
    if not profile.bottleneck:
        return False
    return same_place(profile.bottleneck, profile.bottleneck_node, stage, node)


# Small helpers.


def _title(finding) -> str:
    kind = KINDS.get(finding.id)
    if kind is not None:
        return kind.title.format(stage=finding.stage)
    words = finding.id.replace("-", " ")
    return f"{words[:1].upper()}{words[1:]} at {finding.stage}"
