"""The advice of made-up evidence, as a run gives it: judged once, figures built, advised.

A run decides its verdict once (`advice.verdict.judge`), builds its figures from
it (`advice.figures.build_figures`) and hands both to the advisor. Tests that
give the advisor statistics of their own go the same way here.
"""

from keras_pipeline_tuner.advice import advisor
from keras_pipeline_tuner.advice.figures import build_figures
from keras_pipeline_tuner.advice.scale_out import job_stats
from keras_pipeline_tuner.advice.verdict import judge
from keras_pipeline_tuner.timing.cpu_usage import throttled


def figures_for(stats, profile=None, what_if=None, judgement=None, cpu=None, cpu_count=None):
    """The figures of a run with these statistics (the verdict judged from them if not given)."""
    if judgement is None:
        judgement = judge(stats, profile, what_if=what_if, throttled=throttled(cpu))
    budget = cpu_count
    if budget is None and cpu is not None and cpu.budget is not None:
        budget = cpu.budget.cpus
    return build_figures(
        judgement, stats, profile=profile, what_if=what_if, throttled=throttled(cpu),
        cpu_budget=budget,
    )


def advise(
    stats,
    profile=None,
    findings=(),
    cpu_count=None,
    what_if=None,
    cpu=None,
    workers=None,
    judgement=None,
    fix_timings=(),
    reuse=None,
    user_calls=(),
):
    """The recommendations for this evidence: a multi-worker job judged by its straggler."""
    stats_of_job = job_stats(stats, workers)
    if workers is not None:
        judgement = None
    figures = figures_for(stats_of_job, profile, what_if, judgement, cpu, cpu_count)
    evidence = advisor.RunEvidence(
        stats_of_job,
        profile,
        findings,
        what_if=what_if,
        cpu=cpu,
        workers=workers,
        fix_timings=fix_timings,
        reuse=reuse,
        user_calls=user_calls,
        cpu_count=cpu_count,
    )
    return advisor.advise(evidence, figures)
