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

Two rules for jobs that outgrow one host live in `scale_out_advice`: a
multi-worker job is judged by its straggler, named first; and when every stage
already runs in parallel on saturated CPUs, moving the pipeline to the tf.data
service ranks after the errors, or after the CPU budget's advice when the
job's quota throttled it.
"""

import dataclasses
import math
import re
from typing import TYPE_CHECKING
from typing import Iterable
from typing import List
from typing import Optional
from typing import Tuple

from keras_pipeline_tuner.advice import cpu_limits
from keras_pipeline_tuner.advice import python_stages
from keras_pipeline_tuner.advice import scale_out as scale_out_advice
from keras_pipeline_tuner.advice import timed_gains
from keras_pipeline_tuner.advice.recommendation import BOTTLENECK_STAGE
from keras_pipeline_tuner.advice.recommendation import BOUND
from keras_pipeline_tuner.advice.recommendation import FIND_THE_BOTTLENECK
from keras_pipeline_tuner.advice.recommendation import FIRST_EPOCH_ONLY
from keras_pipeline_tuner.advice.recommendation import FIX_TIMING
from keras_pipeline_tuner.advice.recommendation import LEAST_SHOWN_GAIN
from keras_pipeline_tuner.advice.recommendation import LINT
from keras_pipeline_tuner.advice.recommendation import MEASURED
from keras_pipeline_tuner.advice.recommendation import NOT_READ_BACK
from keras_pipeline_tuner.advice.recommendation import NOT_THE_BOTTLENECK
from keras_pipeline_tuner.advice.recommendation import PROFILER
from keras_pipeline_tuner.advice.recommendation import REPLAY
from keras_pipeline_tuner.advice.recommendation import STEP_CLOCK
from keras_pipeline_tuner.advice.recommendation import USER_CALLS
from keras_pipeline_tuner.advice.recommendation import Evidence
from keras_pipeline_tuner.advice.recommendation import ExpectedGain
from keras_pipeline_tuner.advice.recommendation import Recommendation
from keras_pipeline_tuner.advice.recommendation import describe_gain
from keras_pipeline_tuner.advice.recommendation import free_input_gain
from keras_pipeline_tuner.advice.verdict import WALL_STATISTIC
from keras_pipeline_tuner.advice.verdict import Judgement
from keras_pipeline_tuner.advice.verdict import judge
from keras_pipeline_tuner.after_training import fix_timing
from keras_pipeline_tuner.pipeline.graph import keras_made
from keras_pipeline_tuner.pipeline.graph import kinds
from keras_pipeline_tuner.pipeline.lint.catalogue import CACHE_MISSING
from keras_pipeline_tuner.pipeline.lint.catalogue import KERAS_ARRAY_INPUT
from keras_pipeline_tuner.pipeline.lint.catalogue import KINDS
from keras_pipeline_tuner.pipeline.lint.catalogue import MISSING_PREFETCH
from keras_pipeline_tuner.pipeline.lint.catalogue import PY_DATASET_WORKERS
from keras_pipeline_tuner.pipeline.lint.catalogue import SEQUENTIAL_INTERLEAVE
from keras_pipeline_tuner.pipeline.lint.catalogue import SEQUENTIAL_MAP
from keras_pipeline_tuner.pipeline.lint.keras_inputs import ADVISED_WORKERS
from keras_pipeline_tuner.profiling.evidence import GRAIN
from keras_pipeline_tuner.timing.cpu_usage import budget_cpus
from keras_pipeline_tuner.timing.cpu_usage import throttled
from keras_pipeline_tuner.timing.step_stats import StepStats
from keras_pipeline_tuner.timing.step_stats import Verdict
from keras_pipeline_tuner.timing.step_stats import format_ms

if TYPE_CHECKING:
    from keras_pipeline_tuner.advice.data_reuse import DataReuse
    from keras_pipeline_tuner.after_training.what_if_replay import WhatIfResult
    from keras_pipeline_tuner.instrumentation.user_calls import UserCallTiming
    from keras_pipeline_tuner.pipeline.lint.findings import Finding
    from keras_pipeline_tuner.profiling.evidence import ProfileEvidence
    from keras_pipeline_tuner.timing.cpu_usage import CpuUsage
    from keras_pipeline_tuner.workers.exchange import MultiWorkerSummary



_SEVERITY_RANK = {"error": 0, "warning": 1, "info": 2}
# A Python stage whose calls take this share of the steps' wait is what they
# wait for (where no profile named a stage).
PYTHON_BOTTLENECK_SHARE = 0.5
_DONE_AT_RUN_TIME = frozenset({MISSING_PREFETCH, SEQUENTIAL_MAP})
# The changes whose gain the stage's profiled time predicts.
PARALLEL = "parallel calls"
# Work spread over parallel readers or workers (an interleave, a generator's
# work moved into a parallel map, a PyDataset's workers): predicted over the
# cores like a map's parallel calls, but its ceiling is not capped by them
# (waiting reads overlap beyond the cores).
SPREAD = "spread over workers"
CACHE = "cache"
# Findings whose fix gives a sequential map AUTOTUNE parallel calls: at most
# one per core. (An interleave's parallelism is its cycle length, which may
# be larger: waiting reads get more than the cores, and keep their bound.)
_AUTOTUNED = frozenset({SEQUENTIAL_MAP})
_SPREAD = frozenset({SEQUENTIAL_INTERLEAVE, PY_DATASET_WORKERS})
# Notes with nothing to change: the inspection shows them, the advice does not.
_NOTHING_TO_CHANGE = frozenset({KERAS_ARRAY_INPUT})
_PARALLEL_KINDS = frozenset(
    {kinds.MAP, kinds.INTERLEAVE, kinds.TFRECORD, kinds.TEXT_LINE, kinds.FILTER}
)
_KERAS_DIRECTORY_UTILITIES = (keras_made.IMAGES, keras_made.TEXT, keras_made.AUDIO)
_STAGE = re.compile(r"^\s*([\w.]+)\s*(?:\(\s*([^,)\s]*)[^)]*\))?")

# What usually speeds up a stage of each kind, for a bottleneck no finding
# explains. Keys are the transformation as `stage_names` labels it.
_STAGE_FIXES = {
    kinds.MAP: (
        "Run the map on parallel threads (a Python function inside it, via "
        "tf.py_function, stays bound by the GIL: prefer TensorFlow ops).",
        "ds = ds.map({function}, num_parallel_calls=tf.data.AUTOTUNE)",
    ),
    kinds.INTERLEAVE: (
        "Read the interleaved inputs in parallel.",
        "ds = ds.interleave({function}, cycle_length=tf.data.AUTOTUNE,\n"
        "                   num_parallel_calls=tf.data.AUTOTUNE)",
    ),
    kinds.FROM_GENERATOR: (
        "The Python generator produces elements one at a time, holding the GIL. "
        "Yield only cheap items (file names, indices) and do the work in a parallel map.",
        "ds = tf.data.Dataset.from_generator(list_items, output_signature=...)\n"
        "ds = ds.map(load_item, num_parallel_calls=tf.data.AUTOTUNE)",
    ),
    kinds.TFRECORD: (
        "Read several files at once.",
        "ds = tf.data.Dataset.from_tensor_slices(files).interleave(\n"
        "    tf.data.TFRecordDataset, num_parallel_calls=tf.data.AUTOTUNE)",
    ),
    kinds.TEXT_LINE: (
        "Read several files at once.",
        "ds = tf.data.Dataset.from_tensor_slices(files).interleave(\n"
        "    tf.data.TextLineDataset, num_parallel_calls=tf.data.AUTOTUNE)",
    ),
    kinds.FILTER: (
        "Filter on parallel threads, or filter before expensive work.",
        "ds = ds.filter({function})  # before the expensive map",
    ),
    kinds.BATCH: (
        "Batch in parallel, and batch before cheap per-element maps (vectorise them).",
        "ds = ds.batch(batch_size, num_parallel_calls=tf.data.AUTOTUNE)",
    ),
}
_GENERIC_FIX = (
    "If this stage's output is the same every epoch and fits in memory or on disk, "
    "cache after it; otherwise make its work cheaper or run it in parallel.",
    "ds = ds.cache()  # right after {stage}, before any random transformation",
)


def advise(
    stats: StepStats,
    profile: Optional["ProfileEvidence"] = None,
    findings: Iterable["Finding"] = (),
    cpu_count: Optional[int] = None,
    what_if: Optional["WhatIfResult"] = None,
    cpu: Optional["CpuUsage"] = None,
    workers: Optional["MultiWorkerSummary"] = None,
    judgement: Optional[Judgement] = None,
    fix_timings: Iterable["fix_timing.FixTiming"] = (),
    reuse: Optional["DataReuse"] = None,
    user_calls: Iterable["UserCallTiming"] = (),
) -> List[Recommendation]:
    """Ranks what to change, from the evidence gathered for one run.

    Args:
        stats: `StepStats` of the training steps (the step clock).
        profile: `ProfileEvidence` of a TF Profiler window, if one was captured.
        findings: `Finding`s of the pipeline inspection, if it ran.
        cpu_count: CPU cores a parallelised stage can use: a fix that runs a
            stage on parallel threads is at most this many times faster; the
            run's CPU budget (`cpu.budget`: affinity and container quota) by
            default, read now when the run has none.
        what_if: `WhatIfResult` of a what-if replay, if one ran: the step time
            with input free, measured, replaces the step clock's compute time
            as the floor no input-pipeline change goes below.
        cpu: `CpuUsage` of the run: with every stage already parallel, saturated
            CPUs make the tf.data service the advice (see `scale_out_advice`);
            its CPU budget and throttling add the advice of `cpu_limits`.
        workers: the chief's `MultiWorkerSummary` of a multi-worker run: the job
            is judged by its straggler, which is named first.
        judgement: the run's `Judgement` (see `advice.verdict`), so that the
            advice follows the report's verdict; judged from `stats` and
            `profile` when not given, and always for a multi-worker job.
        fix_timings: `FixTiming`s of the advised fixes, timed on the pipeline
            (`PipelineTuner(measure_fixes=True)`): a timed fix's gain becomes
            the measured figure (`likely_speedup`), and the advice is ranked
            again: fixes timed faster first (largest first), then the
            untimed, which keep their bounds, fixes timed at no gain last.
        reuse: the fit's `DataReuse` (see `advice.data_reuse`): a cache in a
            fit that reads no element twice gets no gain, and one that does
            counts its filling pass over the fit's passes.
        user_calls: the user's Python calls timed during training
            (`Report.user_calls`): a stage that takes most of the wait is
            named the bottleneck where no profile named one, and a change to
            it gets a gain predicted from them (`python_stages`).

    Returns:
        `Recommendation`s, most important first. Never one without evidence.

    Example:

    ```python
    for recommendation in advise(report.train, report.profile, report.findings):
        print(recommendation.title, describe_gain(recommendation.expected_gain))
    ```
    """
    # Findings from `kpt.inspect` carry the pipeline they were read from.
    pipeline = getattr(findings, "pipeline", None)
    stats = scale_out_advice.job_stats(stats, workers)
    if workers is not None or judgement is None:
        judgement = judge(stats, profile)
    quota_throttled = throttled(cpu)
    run = _Run(stats, profile, cpu_count or budget_cpus(cpu), what_if, judgement, quota_throttled)
    run.reuse = reuse
    run.name_python_bottleneck(python_stages.stage_costs(user_calls, stats.steps))
    findings = [finding for finding in findings or () if not _already_done(finding)]
    run.pipeline = pipeline
    if run.verdict == Verdict.NOT_INPUT_BOUND:
        return (
            [_not_the_bottleneck(run)]
            + [_from_finding(run, finding) for finding in findings if _severity(finding) == "error"]
            + cpu_limits.cpu_limit_recommendations(pipeline, cpu, None)
        )

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
    return ([straggler] if straggler else []) + _one_per_stage(ranked) + limits + offload_last


def _ranked(run: "_Run", findings, offload, fix_timings) -> List[Recommendation]:
    """The input-bound run's recommendations in rank order (see the module's rules)."""
    bottleneck = run.bottleneck
    at_bottleneck, errors, others = _by_place(run, findings)
    input_bound = run.verdict.input_bound
    ranked = sorted(at_bottleneck, key=lambda item: _bottleneck_key(item, run))
    if bottleneck and not at_bottleneck and input_bound:
        ranked.append(_bottleneck_stage(run))
    others = sorted(others, key=lambda item: _rank_key(item, run))
    ranked += errors + ([offload] if offload else []) + others
    if input_bound and not bottleneck:
        # Findings say what departs from the guide, not what the steps wait for.
        ranked.append(_find_the_bottleneck(run))
    _apply_timings(run, ranked, fix_timings)
    _sort_by_figure(ranked)
    # What cannot make steps faster (a cache never read back, a fix timed at
    # no gain) comes after every speed fix, so that a stage's first
    # recommendation is the change that can help.
    ranked.sort(key=_no_speed_fix)
    # A ceiling under LEAST_SHOWN_GAIN says the change cannot help: no advice
    # (the inspection still lists the finding).
    ranked = [item for item in ranked if not _cannot_help(item)]
    if input_bound and not ranked:
        # Every finding was a change that cannot help (a prefetch where
        # compute is tiny): the wait still has a cause to point at.
        ranked.append(_bottleneck_stage(run) if bottleneck else _find_the_bottleneck(run))
    return ranked


def _by_place(run: "_Run", findings) -> Tuple[List[Recommendation], ...]:
    """The findings' recommendations: at the bottleneck, errors, the others."""
    at_bottleneck, errors, others = [], [], []
    for finding in findings:
        if run.at_bottleneck(finding.stage, _node(finding)):
            at_bottleneck.append(_from_finding(run, finding))
        elif _severity(finding) == "error":
            errors.append(_from_finding(run, finding))
        else:
            others.append(_from_finding(run, finding))
    return at_bottleneck, errors, others


def _sort_by_figure(ranked: List[Recommendation]) -> None:
    """Ranks by each change's own figure: measured or predicted first, largest first;
    then those with a bound only; then those measured or predicted at no gain.

    Stable: within a tier the rules' order stands, so that one stage's
    recommendation is its fix with the largest figure, or else its first with
    a bound. A bound never outranks a measured or predicted gain: an untimed
    cache of the bottleneck stage with no prediction follows a fix timed
    faster, and its ceiling is in its statement; one the evidence predicts
    larger than the timed fix leads it.
    """
    ranked.sort(key=_figure_key)


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


def _own_figure(gain: Optional[ExpectedGain]) -> Optional[float]:
    """The change's own figure: what timing it measured, else what is predicted, else `None`."""
    if gain is None:
        return None
    return gain.likely_speedup if gain.likely_speedup is not None else gain.predicted_speedup


def _figure_tier(recommendation: Recommendation) -> int:
    """0: measured or predicted faster; 1: a bound only; 2: measured or predicted at no gain."""
    gain = recommendation.expected_gain
    if _own_figure(gain) is None:
        return 1
    return 0 if gain.speeds_up else 2


def _figure_key(recommendation: Recommendation):
    tier = _figure_tier(recommendation)
    return (tier, -_own_figure(recommendation.expected_gain) if tier == 0 else 0.0)


def _bottleneck_key(recommendation: Recommendation, run: "_Run"):
    # At the stage the steps wait for, caching its output (where the lint found
    # it deterministic) removes the stage's work from every epoch after the
    # first, which no amount of parallelism does; Python under the GIL may not
    # parallelise at all. So among speed fixes of that stage, the cache leads.
    first = 0 if recommendation.severity == "error" else (
        1 if _cache_leads(recommendation, run) else 2
    )
    return (first,) + _rank_key(recommendation, run)


def _cache_leads(recommendation: Recommendation, run: "_Run") -> bool:
    """Whether a cache leads its stage: it speeds up, and the fit's passes are not known.

    Where they are (`DataReuse`), its gain counts its filling pass over the
    fit's, and it ranks by that figure like any other fix.
    """
    gain = recommendation.expected_gain
    if recommendation.id != CACHE_MISSING or (gain is not None and not gain.speeds_up):
        return False
    return run.reuse is None or run.reuse.repeats is None


def _cannot_help(recommendation: Recommendation) -> bool:
    gain = recommendation.expected_gain
    return (
        recommendation.severity != "error"
        and gain is not None
        and gain.basis == BOUND
        and gain.likely_speedup is None
        and gain.speedup is not None
        and (gain.predicted_speedup or gain.speedup) < LEAST_SHOWN_GAIN
    )


def _no_speed_fix(recommendation: Recommendation) -> bool:
    gain = recommendation.expected_gain
    return (
        recommendation.severity != "error"
        and recommendation.id != NOT_THE_BOTTLENECK
        and gain is not None
        and not gain.speeds_up
    )


def _already_done(finding) -> bool:
    # Info findings whose fix TensorFlow already applies at run time (a map it
    # parallelises, a prefetch it injects, an asynchronous last stage): stating
    # it in code changes nothing measurable, so it is no speed advice.
    if finding.id in _NOTHING_TO_CHANGE:
        return True
    return _severity(finding) == "info" and finding.id in _DONE_AT_RUN_TIME


def _one_per_stage(ranked: List[Recommendation]) -> List[Recommendation]:
    """Keeps the first recommendation of each stage; the others join its evidence.

    Two findings on one stage (a sequential map that also calls Python) are
    one change to make there; a second line would double-count its gain.
    Errors, about what the model sees, always stay.
    """
    kept, by_stage = [], {}
    for recommendation in ranked:
        key = recommendation.stage_node or recommendation.stage
        first = by_stage.get(key) if key else None
        if first is None or recommendation.severity == "error" or first.severity == "error":
            kept.append(recommendation)
            if key and key not in by_stage:
                by_stage[key] = recommendation
            continue
        timed = ""
        gain = recommendation.expected_gain
        if gain is not None and gain.likely_speedup is not None:
            timed = f" Timed: {describe_gain(gain)}."
        elif gain is not None and recommendation.id == CACHE_MISSING:
            # One change, one gain: the cache's own figure, and why.
            timed = f" Its gain: {describe_gain(gain)}. {gain.statement}"
        first.evidence.append(
            Evidence(
                LINT,
                f"Also at this stage: {recommendation.title}.{timed} {recommendation.reason}",
            )
        )
        first.also.append(recommendation.id)
    return kept


class _Run:
    """The evidence of one run, and what every rule derives from it."""

    def __init__(
        self,
        stats: StepStats,
        profile,
        cpu_count: int,
        what_if,
        judgement: Judgement,
        throttled: bool = False,
    ):
        self.stats = stats
        self.profile = profile
        self.cpu_count = cpu_count
        self.pipeline = None
        self.reuse: Optional["DataReuse"] = None
        self.clock_evidence = _clock_evidence(stats)
        replayed = _replayed_gain(what_if, throttled)
        if replayed is not None:
            self.clock_evidence.append(Evidence(REPLAY, replayed.statement))
        self.judgement = judgement
        self.verdict = judgement.verdict
        self.bound = input_free_gain(stats, what_if, judgement, throttled)
        self.python: List[python_stages.PythonStageCost] = []
        # The stage the steps wait for: the profile's, else the user's Python's.
        self.bottleneck = profile.bottleneck if profile is not None else None
        self.bottleneck_node = profile.bottleneck_node if profile is not None else None
        self.bottleneck_by = PROFILER if self.bottleneck else None

    def name_python_bottleneck(self, costs: List[python_stages.PythonStageCost]) -> None:
        """Keeps the Python stages' costs; names the bottleneck from them where no profile did.

        The costliest stage is the bottleneck when its calls take at least
        `PYTHON_BOTTLENECK_SHARE` of the step's wait: the steps wait for it.
        """
        self.python = costs
        wait_ms = self.stats.input_wait.mean_ms
        if self.bottleneck or not costs or not wait_ms:
            return
        if costs[0].step_ms >= PYTHON_BOTTLENECK_SHARE * wait_ms:
            self.bottleneck, self.bottleneck_by = costs[0].stage, USER_CALLS

    def at_bottleneck(self, stage: Optional[str], node: Optional[str] = None) -> bool:
        """Whether `stage` (at graph `node`) is the stage the steps wait for."""
        if not self.bottleneck:
            return False
        return _same(self.bottleneck, self.bottleneck_node, stage, node)

    def python_cost(self, stage: Optional[str]):
        """The `PythonStageCost` of `stage`, or `None`."""
        return python_stages.cost_of(self.python, _same_stage, stage)


def input_free_gain(
    stats: StepStats, what_if, judgement: Judgement, throttled: bool = False
) -> Optional[ExpectedGain]:
    """The one "input free" figure of a run: how much faster steps would be with free input.

    Decided here once, for the report, the advice's ceilings, the Text tab and
    the dashboard: the replay's measured step with input free when one ran,
    raised to what the verdict's input share implies (the wait and the replay
    each measure part of the input's cost; the verdict takes the larger).

    Args:
        stats: `StepStats` of the training steps.
        what_if: the run's `WhatIfResult`, or `None`.
        judgement: the run's `Judgement`.
        throttled: whether a CPU quota stopped the job in a meaningful share
            of its periods (`CpuUsage.throttled`): the replay's figure is then
            its wall time a step, as the verdict compares it.

    Returns:
        The `ExpectedGain` (a ceiling), or `None` when the wait was not measured.

    Example:

    >>> import numpy as np
    >>> stats = StepStats.from_arrays(np.array([0.03, 0.03]), np.array([0.01, 0.01]))
    >>> round(input_free_gain(stats, None, judge(stats)).speedup, 2)
    4.0
    """
    bound = _replayed_gain(what_if, throttled) or free_input_gain(stats)
    return _at_least_the_verdicts(bound, judgement)


def _free_input_ceiling(fraction: float) -> float:
    # Steps that spend `fraction` of their time on input are at most this much
    # faster with input free (capped: a share of 1 would be no finite bound).
    return 1.0 / (1.0 - min(fraction, 0.99))


def _at_least_the_verdicts(bound: Optional[ExpectedGain], judgement: Judgement):
    """The bound, raised to what the verdict's input share says free input would bring.

    The replay and the wait each measure part of the input's cost; the verdict
    takes the larger. A ceiling below it would be beaten by a fix that removes
    the input's cost (a cache), as measured.
    """
    fraction = judgement.input_fraction
    if bound is None or bound.speedup is None or bound.step_ms is None or fraction is None:
        return bound
    if bound.speedup <= 1.0:
        # A replay that ran no faster with input free: it measured that input
        # changes bring nothing, which the wait alone does not overrule.
        return bound
    ceiling = _free_input_ceiling(fraction)
    if ceiling <= bound.speedup:
        return bound
    return ExpectedGain(
        ceiling,
        bound.step_ms,
        bound.step_ms / ceiling,
        BOUND,
        f"The input costs {fraction * 100:.1f} % of steady-state step time "
        f"({judgement.source}): with input free a step would take about "
        f"{bound.step_ms / ceiling:.2f} ms instead of {bound.step_ms:.2f} ms, at most "
        f"{ceiling:.2f}x faster.",
    )


# Rules.


def _not_the_bottleneck(run: _Run) -> Recommendation:
    stats = run.stats
    fraction = run.judgement.input_fraction
    evidence = list(run.clock_evidence)
    if fraction is None:
        fraction = stats.input_fraction
    if fraction is None or run.judgement.source == PROFILER:
        fraction = run.profile.input_fraction
        evidence.append(
            Evidence(PROFILER, f"input is {fraction * 100:.1f} % of step time in the window.")
        )
    compute = stats.compute.median_ms
    raw = stats.input_fraction
    # The evidence gives the wait of all steps; the verdict's share may leave
    # out a fetch of a batch already in memory, epoch starts, one-off costs.
    apart = (
        f" (the {raw * 100:.1f} % in its evidence is every step's wait, including what the "
        "verdict leaves out, as its line says)"
        if raw is not None and raw - fraction > 0.05
        else ""
    )
    return Recommendation(
        id=NOT_THE_BOTTLENECK,
        title="The input pipeline is not the bottleneck: speed up the model's compute instead",
        severity="info",
        evidence=evidence,
        fix="",
        expected_gain=_steady_ceiling(run, fraction),
        reason=(
            f"Steps wait for input only {fraction * 100:.1f} % of the time{apart}"
            + (f" and compute for {compute:.2f} ms (median)" if compute is not None else "")
            + ". Changing the input pipeline cannot make training noticeably faster; "
            "look at the model, the batch size or mixed precision."
        ),
    )


def _steady_ceiling(run: _Run, fraction: float) -> ExpectedGain:
    # What free input would bring in the steady state the verdict describes:
    # the whole run's ceiling would count one-off costs (a first epoch filling
    # a cache) that no change to the pipeline's steady state removes.
    step_ms = run.bound.step_ms if run.bound is not None else run.stats.step.mean_ms
    speedup = _free_input_ceiling(fraction)
    return ExpectedGain(
        speedup,
        step_ms,
        step_ms / speedup if step_ms else None,
        BOUND,
        f"Input costs {fraction * 100:.1f} % of steady-state step time: even free input "
        f"would make steps at most {speedup:.2f}x faster.",
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
    kind, function = _parse_stage(stage)
    reason, fix = _STAGE_FIXES.get(kind, _GENERIC_FIX)
    written = _pipeline_stage(run, node)
    if written is not None and written.made_by in _KERAS_DIRECTORY_UTILITIES:
        # Keras' own loader: the user's call is what can change, not its lambda.
        reason, fix = keras_made.cache_advice(run.pipeline, written)
    elif kind in _PARALLEL_KINDS and written is not None and _runs_parallel(written):
        # Telling an already-parallel stage to run in parallel repeats the
        # user's own code: what is left is less work or doing it once.
        reason, fix = _parallel_stage_fix(written)
    # The fix runs a map with AUTOTUNE parallel calls (at most one per core), or caches.
    change = None
    if ".cache(" in fix:
        change = CACHE
    elif kind == kinds.MAP and "num_parallel_calls" in fix:
        change = PARALLEL
    elif "num_parallel_calls" in fix:
        change = SPREAD
    gain = _stage_gain(run, stage, change, node)
    if change == CACHE:
        # A cache gains only where the fit reads its elements again.
        gain = _cache_gain(run, gain)
    named_by = (
        "the profiler names it" if run.bottleneck_by == PROFILER
        else "your Python in it takes most of the steps' wait, timed during training, so it is"
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
    return evidence


def _pipeline_stage(run: _Run, node: Optional[str]):
    if run.pipeline is None or not node:
        return None
    return next((stage for stage in run.pipeline.stages if stage.node == node), None)


def _runs_parallel(stage) -> bool:
    return bool(stage.parallel or stage.parallel_at_runtime)


def _parallel_stage_fix(stage):
    function = stage.function
    name = function.name if function is not None else "fn"
    if function is not None and function.py_function_ops:
        reason = (
            f"{stage.label} already runs in parallel, but {name} calls Python "
            f"({', '.join(function.py_function_ops)}), which holds the GIL: more threads "
            "do not make it faster. Write it with TensorFlow ops, or, if its output is "
            "the same every epoch, cache after it."
        )
    else:
        reason = (
            f"{stage.label} already runs in parallel on every core it can get: make "
            f"{name} do less work, or, if its output is the same every epoch, cache "
            "after it."
        )
    if function is not None and function.random:
        return reason, f"# {name} is random: make it cheaper (TensorFlow ops, smaller inputs)"
    return reason, _GENERIC_FIX[1].format(stage=stage.label)


def _from_finding(run: _Run, finding) -> Recommendation:
    details = f"{finding.id} at {finding.stage}"
    if finding.op:
        details += f" ({finding.op})"
    evidence = [Evidence(LINT, details + ".")]
    gain = None
    # An error is about what the model sees: no speed is claimed for fixing it.
    if _severity(finding) != "error":
        evidence += _stage_evidence(run, finding.stage, _node(finding))
        evidence += run.clock_evidence
        cached_after = _cache_after(run.pipeline, _node(finding))
        if cached_after is not None:
            gain = _first_epoch_only(run, finding.stage, cached_after)
        elif finding.id == MISSING_PREFETCH:
            gain = _overlap_gain(run.stats)
        else:
            gain = _stage_gain(run, finding.stage, _change_of(finding.id), _node(finding))
        if finding.id == CACHE_MISSING:
            gain = _cache_gain(run, gain)
    return Recommendation(
        id=finding.id,
        title=_title(finding),
        severity=_severity(finding),
        evidence=evidence,
        fix=finding.fix,
        expected_gain=gain,
        stage=finding.stage,
        reason=finding.reason,
        stage_node=_node(finding),
    )


# Expected gains.


def _stage_gain(
    run: _Run, stage: str, change: Optional[str], node: Optional[str] = None
) -> Optional[ExpectedGain]:
    """The ceiling of changing `stage`, and what `change` is predicted to bring.

    `change` is PARALLEL for AUTOTUNE parallel calls of a sequential map, CACHE
    for a cache after the stage, `None` for any other change (no prediction).
    """
    cost = run.python_cost(stage)
    if cost is not None and change is not None and run.bound is not None:
        # Its own calls, timed in training, say what it costs a step: a
        # prediction from them, whatever a profile's share would bound.
        return _python_gain(run, cost, change, _within_cores if change == PARALLEL else None)
    gain, stage_ms = _stage_share_gain(run, stage, node)
    if change == PARALLEL:
        gain = _within_cores(run, gain)
    if gain is None or stage_ms is None or not gain.step_ms or change is None:
        return gain
    after = _predicted_step_ms(run, gain.step_ms, stage_ms, change)
    if after is None:
        return gain
    predicted = min(gain.step_ms / after, gain.speedup or math.inf)
    return dataclasses.replace(
        gain,
        predicted_speedup=predicted,
        statement=(
            f"{gain.statement} Predicted from the profiled stage ({stage_ms:.2f} ms a step"
            + (f" over {run.cpu_count} cores" if change != CACHE else ", served by the cache")
            + f"): a step of {after:.2f} ms, {predicted:.2f}x faster."
        ),
    )


def _python_gain(run: _Run, cost, change: str, within=None) -> Optional[ExpectedGain]:
    """The gain of `change` to a Python stage, predicted from its calls timed in training.

    The ceiling is the stage's cost given back in full (never past the step
    with input free); the prediction spreads it over the threads the change
    runs it on (`python_stages.predicted_step_ms`): the cores for AUTOTUNE
    parallel calls, `ADVISED_WORKERS` for a PyDataset's workers, none for a
    cache read back.
    """
    bound = run.bound
    step_ms, compute_ms = bound.step_ms, bound.step_ms_after or 0.0
    if not step_ms:
        return bound
    ceiling_ms = max(compute_ms, step_ms - cost.step_ms)
    gain = ExpectedGain(
        step_ms / ceiling_ms,
        step_ms,
        ceiling_ms,
        BOUND,
        f"{cost.sentence()} Removing that time from the step would make it "
        f"{ceiling_ms:.2f} ms instead of {step_ms:.2f} ms: at most "
        f"{step_ms / ceiling_ms:.2f}x faster.",
    )
    if within is not None:
        gain = within(run, gain)
    threads = {PARALLEL: run.cpu_count, SPREAD: run.cpu_count, CACHE: python_stages.CACHED}
    workers = threads.get(change)
    if change == SPREAD and _parse_stage(cost.stage)[0] == kinds.PY_DATASET:
        workers = ADVISED_WORKERS
    if workers is None:
        return gain
    ahead = fix_timing.ends_ahead(run.pipeline) if run.pipeline is not None else False
    after = python_stages.predicted_step_ms(step_ms, compute_ms, cost, workers, ahead)
    if after is None:
        return gain
    predicted = min(step_ms / after, gain.speedup or math.inf)
    over = "PyDataset workers" if workers == ADVISED_WORKERS and change == SPREAD else "threads"
    spread = (
        "served by a cache read back" if workers == python_stages.CACHED
        else f"spread over {workers} {over}, the {cost.serial_share * 100:.0f} % of its time "
        "that computes in Python or waits for the GIL staying serial"
    )
    return dataclasses.replace(
        gain,
        predicted_speedup=predicted,
        statement=(
            f"{gain.statement} Predicted from those calls timed during training, {spread}: "
            f"a step of {after:.2f} ms, {predicted:.2f}x faster (a prediction: your Python "
            "is not run again to measure it)."
        ),
    )


def _predicted_step_ms(run: _Run, step_ms: float, stage_ms: float, change: str):
    """The step after `change` by Plumber's operational analysis of the one stage it touches.

    The input prepares a batch in `t_in` (the wait, plus the compute it
    overlaps when the pipeline already runs ahead of the step); the stage's
    part of it is spread over the cores (AUTOTUNE parallel calls, which also
    run ahead of the step) or gone (a cache, on the passes that read it back).
    A step takes its compute plus the input, or the longer of the two when the
    input runs ahead. `None` without a compute time.
    """
    compute = run.bound.step_ms_after if run.bound is not None else None
    if not compute or compute >= step_ms:
        return None
    wait = step_ms - compute
    ahead = fix_timing.ends_ahead(run.pipeline) if run.pipeline is not None else False
    t_in = wait + (compute if ahead else 0.0)
    stage_in = min(stage_ms / wait, 1.0) * t_in
    if change in (PARALLEL, SPREAD):
        return max(compute, t_in - stage_in * (1.0 - 1.0 / run.cpu_count))
    left = t_in - stage_in
    return max(compute, left) if ahead else compute + left


def _change_of(finding_id: str) -> Optional[str]:
    if finding_id in _AUTOTUNED:
        return PARALLEL
    if finding_id in _SPREAD:
        return SPREAD
    return CACHE if finding_id == CACHE_MISSING else None


def _within_cores(run: _Run, gain: Optional[ExpectedGain]) -> Optional[ExpectedGain]:
    """The ceiling of a sequential map given AUTOTUNE parallel calls: `cpu_count` times.

    tf.data's AUTOTUNE runs at most as many parallel calls of a map as the
    cores the process may use, so a sequential map gets at most that many
    times faster, and with it the step (far below "steps as fast as their compute").
    A ceiling, not a prediction: threads do nothing for Python under the GIL,
    and TensorFlow ops share the cores with the model; timing the change says
    what it brings. A fixed, larger parallelism on waiting work (remote reads)
    may do better, which is why other parallelising fixes keep their bound.
    """
    cores = run.cpu_count
    if gain is None or gain.speedup is None or gain.step_ms is None or gain.speedup <= cores:
        return gain
    return dataclasses.replace(
        gain,
        speedup=float(cores),
        step_ms_after=gain.step_ms / cores,
        statement=(
            f"{gain.statement} AUTOTUNE runs at most {cores} parallel call"
            f"{'s' if cores != 1 else ''}, one per core this process may use: at most "
            f"{cores:.2f}x faster."
        ),
    )


def _stage_share_gain(run: _Run, stage: str, node: Optional[str]):
    """The ceiling of changing `stage` (its profiled share of the input's cost given back).

    Returns `(gain, stage_ms)`: the `ExpectedGain`, and the milliseconds of a
    step the profiled stage costs (`None` when no window timed it).
    """
    bound, stats = run.bound, run.stats
    if bound is None:
        return _unmeasured(), None
    profile = run.profile
    timed = _stage_time(profile, stage, node) if profile is not None else None
    if timed is None and profile is not None and profile.bottleneck and profile.iterators:
        # The window timed the pipeline and found no work of this stage's own:
        # it cannot outrank the stage that holds the wait.
        # A bound, like every gain read off a profiled share: the change itself
        # was not timed.
        step_ms = bound.step_ms
        return ExpectedGain(
            1.0,
            step_ms,
            step_ms,
            BOUND,
            f"The profiler timed no work of {stage}'s own in the input pipeline (it "
            f"names {profile.bottleneck} the bottleneck): changing it frees no "
            "measurable input time.",
        ), None
    if timed is None or stats.input_wait.mean_ms is None or bound.step_ms is None:
        return dataclasses.replace(
            bound,
            basis=BOUND,
            statement=bound.statement
            + " This change gets there only if this stage is what the input waits for "
            "(no profile timed it).",
        ), None
    wait_ms, step_ms = stats.input_wait.mean_ms, bound.step_ms
    # What the input costs a step in the steady state the verdict describes
    # (a cache-filling first epoch left out): its wait, or more where a replay
    # measured the step with input free (a pipeline that competes for the
    # cores slows the compute too).
    steady = run.judgement.input_fraction
    if steady is None:
        cost_ms = max(wait_ms, step_ms - (bound.step_ms_after or step_ms))
    else:
        wait_ms = min(wait_ms, (run.judgement.wait_fraction or 0.0) * step_ms)
        cost_ms = max(wait_ms, steady * step_ms)
    stage_ms = timed.self_share * cost_ms
    # Making the stage free removes at most its share of that cost, and a step
    # never gets faster than it does with input free.
    after = max(bound.step_ms_after or 0.0, step_ms - stage_ms)
    if after <= 0:
        return bound, None
    # A ceiling: the change gives back at most the stage's share; how much of
    # it a given fix (threads, a cache) gives back is what timing it shows.
    return ExpectedGain(
        step_ms / after,
        step_ms,
        after,
        BOUND,
        f"{_timed_by(profile)} puts {timed.self_share * 100:.0f} % of the input pipeline's "
        f"time in {stage}; removing that share of the {cost_ms:.2f} ms the input costs a step "
        f"({'measured by the replay' if run.judgement.source == REPLAY else 'its wait'}) would "
        "make a step "
        f"{after:.2f} ms instead of {step_ms:.2f} ms: at most {step_ms / after:.2f}x faster.",
    ), stage_ms


def _cache_gain(run: _Run, gain: Optional[ExpectedGain]) -> Optional[ExpectedGain]:
    """A cache's gain in this fit: none if it never reads an element twice.

    A cache computes each element once, in the first pass, and is read back
    on the next ones: the steady-state ceiling holds for those, and the fit as
    a whole gains less (see `DataReuse.fit_speedup`).
    """
    reuse = run.reuse
    if reuse is None or gain is None or gain.step_ms is None:
        return gain
    line = reuse.line[:1].upper() + reuse.line[1:] + "."
    if reuse.repeats is None or gain.speedup is None:
        return dataclasses.replace(gain, statement=f"{gain.statement} {line}".strip())
    if not reuse.repeats:
        return ExpectedGain(1.0, gain.step_ms, gain.step_ms, NOT_READ_BACK, line)
    speedup = reuse.fit_speedup(gain.speedup)
    predicted = gain.predicted_speedup
    return dataclasses.replace(
        gain,
        speedup=speedup,
        predicted_speedup=reuse.fit_speedup(predicted) if predicted is not None else None,
        step_ms_after=gain.step_ms / speedup,
        statement=(
            f"{gain.statement} {line} Over the fit's {reuse.passes:.1f} passes, the first "
            f"at today's speed to fill it: at most {speedup:.2f}x faster."
        ),
    )


def _cache_after(pipeline, node: Optional[str]):
    """The cache stage downstream of `node`, if the pipeline caches its output."""
    if pipeline is None or not node:
        return None
    stage = next((item for item in pipeline.stages if item.node == node), None)
    if stage is None:
        return None
    return next((item for item in pipeline.downstream(stage) if item.kind == kinds.CACHE), None)


def _first_epoch_only(run: _Run, stage: str, cache) -> ExpectedGain:
    # From the second epoch on the cache replays this stage's output: changing
    # the stage speeds up the first epoch only, a one-off cost, not the steady
    # state the verdict and the other gains describe.
    step_ms = run.bound.step_ms if run.bound is not None else run.stats.step.mean_ms
    return ExpectedGain(
        1.0,
        step_ms,
        step_ms,
        FIRST_EPOCH_ONLY,
        f"{cache.label} after {stage} replays its output from the second epoch on: "
        "changing it speeds up the first epoch only, not the steady state.",
    )


def _replayed_gain(what_if, throttled: bool = False) -> Optional[ExpectedGain]:
    """The replay's measured ceiling: the step on the pipeline over the step input free.

    Under a quota that throttled the job, by wall time a step over the check's
    rounds, as the verdict compares them: the kernel's stops fall between steps
    too, where the steps' own times miss them.
    """
    if what_if is None or what_if.speedup_if_input_free is None:
        return None
    step_ms, free_ms = what_if.pipeline_step.mean_ms, what_if.replay_step.mean_ms
    if step_ms is None or free_ms is None:
        return None
    speedup, how, by = what_if.speedup_if_input_free, "the training step took", ""
    walls = [found.compared(throttled) for found in what_if.rounds] if throttled else []
    if walls and all(walled for _, _, walled in walls):
        step_ms = sum(pipeline for pipeline, _, _ in walls) / len(walls)
        free_ms = sum(replay for _, replay, _ in walls) / len(walls)
        speedup, how, by = step_ms / free_ms, "a step took", f" ({WALL_STATISTIC})"
    if speedup < 1.0:
        # Slower with input free: the input costs nothing measurable, and the
        # difference is noise or the replay's conditions. Not a gain: no gain.
        return ExpectedGain(
            1.0,
            step_ms,
            step_ms,
            MEASURED,
            f"Replayed from cached batches (input free), {how} "
            f"{free_ms:.2f} ms, no faster than the {step_ms:.2f} ms it took with the real "
            f"pipeline{by} (the difference is timing noise or the replay's own conditions): "
            "free input would not make training faster.",
        )
    return ExpectedGain(
        speedup,
        step_ms,
        min(free_ms, step_ms),
        MEASURED,
        f"Replayed from cached batches (input free), {how} "
        f"{free_ms:.2f} ms instead of {step_ms:.2f} ms{by}: at most {speedup:.2f}x faster.",
    )


def _unmeasured() -> ExpectedGain:
    return ExpectedGain(
        basis=BOUND,
        statement="The input wait was not measured, so the gain cannot be bounded.",
    )


def _overlap_gain(stats) -> ExpectedGain:
    wait, compute, step = stats.input_wait.mean_ms, stats.compute.mean_ms, stats.step.mean_ms
    if wait is None or compute is None or step is None or max(wait, compute) <= 0:
        return _unmeasured()
    # With a prefetch buffer the next batch is prepared while the step computes,
    # so a step takes the longer of the two instead of their sum.
    after = max(wait, compute)
    speedup = step / after
    return ExpectedGain(
        speedup,
        step,
        after,
        BOUND,
        f"Prefetching at best overlaps preparing the next batch ({wait:.2f} ms) with "
        f"computing this one ({compute:.2f} ms): a step takes at least {after:.2f} ms "
        f"instead of {step:.2f} ms, so at most {speedup:.2f}x faster (a bound: the "
        "pipeline's threads also compete with the model for the cores).",
    )


# Evidence.


def _clock_evidence(stats: StepStats) -> List[Evidence]:
    if stats.input_fraction is None:
        return [
            Evidence(
                STEP_CLOCK,
                f"{stats.steps} steps timed as a whole: input wait not separated from compute.",
            )
        ]
    return [
        Evidence(
            STEP_CLOCK,
            f"{stats.input_fraction * 100:.1f} % of training step time waits for input "
            f"over {stats.steps} steps (median wait {format_ms(stats.input_wait.median_ms)} "
            f"ms, compute {format_ms(stats.compute.median_ms)} ms, "
            f"step {format_ms(stats.step.median_ms)} ms).",
        )
    ]


def _profile_evidence(profile, stage, node=None) -> List[Evidence]:
    timed = _stage_time(profile, stage, node)
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


def _timed_by(profile) -> str:
    return "Grain's stage timing" if profile.source == GRAIN else "The profiler"


def _stage_time(profile, stage, node=None):
    # A stage can run as several iterators (an interleave and the datasets its
    # function opens; Keras' wrapper around a PyDataset): its time is theirs.
    found = [
        iterator
        for iterator in profile.iterators
        if not iterator.waiting and _same(iterator.stage, iterator.stage_node, stage, node)
    ]
    if not found:
        return None
    return dataclasses.replace(
        found[0],
        self_ms=sum(iterator.self_ms for iterator in found),
        self_share=min(1.0, sum(iterator.self_share for iterator in found)),
    )


def _is_bottleneck(profile, stage, node=None) -> bool:
    if not profile.bottleneck:
        return False
    return _same(profile.bottleneck, profile.bottleneck_node, stage, node)


def _same(stage_a, node_a, stage_b, node_b) -> bool:
    # Graph nodes tell apart two stages written alike (two `map(f)`); labels
    # are all there is when either side did not read the graph.
    if node_a and node_b:
        return node_a == node_b
    return _same_stage(stage_a, stage_b)


def _node(finding) -> Optional[str]:
    return finding.node or None


# Small helpers.


def _parse_stage(stage: Optional[str]):
    match = _STAGE.match(stage or "")
    if not match:
        return "", None
    return match.group(1), (match.group(2) or None)


def _same_stage(a: Optional[str], b: Optional[str]) -> bool:
    """Whether two stage labels name the same transformation.

    The profiler and the inspection both label stages as code, e.g.
    "map(load_image)"; the inspection may add arguments
    ("map(load_image, num_parallel_calls=4)"), which do not change the stage.
    """
    if not a or not b:
        return False
    if a.strip() == b.strip():
        return True
    kind_a, function_a = _parse_stage(a)
    kind_b, function_b = _parse_stage(b)
    return bool(kind_a) and kind_a == kind_b and function_a is not None and function_a == function_b


def _severity(item) -> str:
    return str(getattr(item.severity, "value", item.severity))


def _rank_key(recommendation: Recommendation, run: Optional["_Run"] = None):
    gain = recommendation.expected_gain or ExpectedGain()
    return (
        _SEVERITY_RANK.get(recommendation.severity, len(_SEVERITY_RANK)),
        _figure_tier(recommendation),
        _looseness(gain, run),
        -(_own_figure(gain) or gain.speedup or 0.0),
    )


def _looseness(gain: ExpectedGain, run: Optional["_Run"]) -> int:
    """How loose a bound is: 0 predicted (or measured), 1 a tighter ceiling, 2 the run's own.

    Among bounds, the tightest honest estimate ranks first: a prediction from
    the stage's profiled time (over the cores, or served by a cache), then a
    ceiling tighter than the run's "input free" one (the cores a parallel map
    may use, a stage's profiled share), then that ceiling itself, which every
    input change shares (a rewrite in TensorFlow ops gets it).
    """
    if gain.basis != BOUND or gain.likely_speedup is not None or gain.predicted_speedup:
        return 0
    ceiling = run.bound.speedup if run is not None and run.bound is not None else None
    if gain.speedup is not None and ceiling is not None and gain.speedup < 0.9 * ceiling:
        return 1
    return 2


def _title(finding) -> str:
    kind = KINDS.get(finding.id)
    if kind is not None:
        return kind.title.format(stage=finding.stage)
    words = finding.id.replace("-", " ")
    return f"{words[:1].upper()}{words[1:]} at {finding.stage}"
