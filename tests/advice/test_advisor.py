"""The advisor: rules on hand-built evidence, then on two real fits."""

import os

import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

import keras_pipeline_tuner as kpt
from keras_pipeline_tuner.advice import advisor
from keras_pipeline_tuner.advice import recommendation
from keras_pipeline_tuner.advice.data_reuse import DataReuse
from keras_pipeline_tuner.advice.recommendation import Evidence
from keras_pipeline_tuner.advice.recommendation import ExpectedGain
from keras_pipeline_tuner.advice.recommendation import Recommendation
from keras_pipeline_tuner.advice.verdict import judge
from keras_pipeline_tuner.pipeline.lint.findings import Finding
from keras_pipeline_tuner.pipeline.lint.findings import Severity
from keras_pipeline_tuner.profiling.evidence import IteratorTime
from keras_pipeline_tuner.profiling.evidence import ProfileEvidence
from keras_pipeline_tuner.timing.step_stats import StepStats
from keras_pipeline_tuner.timing.step_stats import Verdict
from tests.helpers import advised_fits
from tests.helpers import advising


def stats(wait_ms: float, compute_ms: float, steps: int = 20) -> StepStats:
    return StepStats.from_arrays(
        np.full(steps, wait_ms / 1e3), np.full(steps, compute_ms / 1e3)
    )


def finding(id, severity, stage, function=None):
    return Finding(
        id=id,
        severity=Severity(severity),
        stage=stage,
        node=f"{stage}/node",
        op="MapDataset" if stage.startswith("map") else "BatchDatasetV2",
        function=function,
        reason=f"why {id} matters",
        fix=f"# the fix for {id}",
    )


def profile(bottleneck="map(load_image)", share=0.75, verdict=Verdict.HIGHLY_INPUT_BOUND):
    iterators = [
        IteratorTime(
            iterator="Iterator::Root::Prefetch",
            stage="prefetch",
            stage_node=None,
            dataset_op=None,
            calls=20,
            self_ms=500.0,
            total_ms=600.0,
            self_share=0.9,
            waiting=True,
        ),
        IteratorTime(
            iterator="Iterator::Root::Prefetch::Map",
            stage=bottleneck,
            stage_node=None,
            dataset_op="MapDataset:1",
            calls=20,
            self_ms=300.0 * share,
            total_ms=300.0,
            self_share=share,
            waiting=False,
        ),
    ]
    return ProfileEvidence(
        first_step=10,
        stop_step=25,
        # The window's own share: evidence, which the verdict weighs.
        input_fraction=0.01 if verdict == Verdict.NOT_INPUT_BOUND else 0.7,
        iterators=iterators,
        bottleneck=bottleneck,
        bottleneck_iterator="Iterator::Root::Prefetch::Map",
    )


MIXED_FINDINGS = [
    finding("missing-prefetch", "info", "batch(32)"),
    finding("cache-after-random", "error", "map(augment)", "augment"),
    finding("vectorize-map", "warning", "map(scale)", "scale"),
    finding("sequential-map", "warning", "map(load_image)", "load_image"),
]


# The expected gain.


def test_free_input_gain_is_step_over_compute():
    gain = recommendation.free_input_gain(stats(30.0, 10.0))
    assert gain.speedup == pytest.approx(4.0)
    assert gain.step_ms == pytest.approx(40.0)
    assert gain.step_ms_after == pytest.approx(10.0)
    assert gain.basis == recommendation.BOUND
    assert "10.00 ms instead of 40.00 ms" in gain.statement


def test_free_input_gain_needs_a_measured_wait():
    whole_steps = StepStats.from_arrays(np.full(5, np.nan), np.full(5, 0.01))
    assert recommendation.free_input_gain(whole_steps) is None


# The rules.


def test_input_bound_bottleneck_finding_ranks_first():
    ranked = advising.advise(stats(30.0, 10.0), profile(), MIXED_FINDINGS, cpu_count=2)
    assert [r.id for r in ranked] == [
        "sequential-map",  # at the profiler's bottleneck
        "cache-after-random",  # errors next
        # vectorize-map: the profile timed no work of map(scale)'s own, so it
        # cannot help and is no advice (the inspection still lists it);
        # missing-prefetch (info: TensorFlow injects one) is no advice either.
    ]
    top = ranked[0]
    assert top.stage == "map(load_image)"
    assert top.title == "Parallelise map(load_image)"
    assert [e.source for e in top.evidence] == [
        recommendation.LINT,
        recommendation.PROFILER,
        recommendation.STEP_CLOCK,
    ]
    assert "the bottleneck stage" in top.evidence[1].detail
    # Free, the stage gives back 75 % of the 30 ms wait: 40 ms -> 17.5 ms; on
    # 2 cores, parallel calls are at most 2x faster.
    assert top.expected_gain.basis == recommendation.BOUND
    assert top.expected_gain.speedup == pytest.approx(2.0)
    assert "AUTOTUNE runs at most 2 parallel calls" in top.expected_gain.statement
    many = advising.advise(stats(30.0, 10.0), profile(), MIXED_FINDINGS, cpu_count=8)
    assert many[0].expected_gain.speedup == pytest.approx(40.0 / 17.5)
    assert top.expected_gain.likely_speedup is None
    assert top.fix == "# the fix for sequential-map"


def test_errors_carry_no_speed_claim():
    ranked = advising.advise(stats(30.0, 10.0), profile(), MIXED_FINDINGS)
    error = next(r for r in ranked if r.id == "cache-after-random")
    assert error.severity == "error"
    assert error.expected_gain is None
    assert recommendation.describe_gain(error.expected_gain) == "correctness, not speed"


def test_missing_prefetch_gain_is_the_overlap():
    prefetch = finding("missing-prefetch", "warning", "batch(32)")
    ranked = advising.advise(stats(30.0, 10.0), None, [prefetch])
    gain = ranked[0].expected_gain
    # Overlapped, a step takes the longer of wait and compute: 40 ms -> 30 ms.
    assert gain.speedup == pytest.approx(40.0 / 30.0)
    assert gain.basis == recommendation.BOUND
    assert "at most" in gain.statement


def test_finding_without_profile_is_stated_as_the_bound():
    sequential = finding("sequential-map", "warning", "map(f)")
    ranked = advising.advise(stats(30.0, 10.0), None, [sequential], cpu_count=8)
    assert ranked[0].expected_gain.speedup == pytest.approx(4.0)
    # On one core, parallel calls cannot help (at most 1.00x): no advice.
    one_core = advising.advise(stats(30.0, 10.0), None, [sequential], cpu_count=1)
    assert [r.id for r in one_core] == ["input-bound"]
    assert ranked[0].expected_gain.basis == recommendation.BOUND
    assert "no profile timed it" in ranked[0].expected_gain.statement


def test_bottleneck_without_finding_is_recommended_from_the_profile():
    ranked = advising.advise(stats(30.0, 10.0), profile("map(decode_jpeg)"), [])
    assert [r.id for r in ranked] == [advisor.BOTTLENECK_STAGE]
    assert "map(decode_jpeg" in ranked[0].fix and "num_parallel_calls" in ranked[0].fix
    assert {e.source for e in ranked[0].evidence} == {
        recommendation.PROFILER,
        recommendation.STEP_CLOCK,
    }


def test_input_bound_without_any_other_evidence_says_where_to_look():
    ranked = advising.advise(stats(30.0, 10.0))
    assert [r.id for r in ranked] == [advisor.FIND_THE_BOTTLENECK]
    assert ranked[0].expected_gain.speedup == pytest.approx(4.0)
    assert "kpt.inspect" in ranked[0].fix


def test_not_input_bound_gets_no_speed_advice():
    quiet = profile(verdict=Verdict.NOT_INPUT_BOUND)
    ranked = advising.advise(stats(0.2, 20.0), quiet, MIXED_FINDINGS)
    assert [r.id for r in ranked] == [advisor.NOT_THE_BOTTLENECK, "cache-after-random"]
    assert ranked[0].expected_gain.speedup == pytest.approx(20.2 / 20.0)
    assert ranked[0].fix == ""


def test_a_verdict_share_below_the_raw_wait_is_not_contradicted_by_its_evidence():
    # 0.25 ms of 1.15 ms at the fetch: within what a fetch of a batch already
    # in memory may take, which the verdict leaves out (0.0 %).
    ranked = advising.advise(stats(0.25, 0.9))
    top = ranked[0]
    assert top.id == advisor.NOT_THE_BOTTLENECK
    # One share, the verdict's, in the evidence and the reason alike.
    assert top.evidence[0].detail.startswith(
        "The input costs 0.0 % of steady-state step time (step clock)"
    ), top.evidence[0].detail
    assert top.reason.startswith("Steps wait for input only 0.0 % of the time"), top.reason
    assert "21.7" not in top.reason + top.evidence[0].detail


def test_whole_step_timing_falls_back_to_the_profiler_verdict():
    whole_steps = StepStats.from_arrays(np.full(5, np.nan), np.full(5, 0.02))
    quiet = profile(verdict=Verdict.NOT_INPUT_BOUND)
    quiet.input_fraction = 0.01
    ranked = advising.advise(whole_steps, quiet, MIXED_FINDINGS)
    assert ranked[0].id == advisor.NOT_THE_BOTTLENECK
    assert any(e.source == recommendation.PROFILER for e in ranked[0].evidence)


def test_finding_and_profile_stage_labels_match_across_arguments():
    ranked = advising.advise(
        stats(30.0, 10.0),
        profile("map(load_image)"),
        [finding("fixed-parallelism", "warning", "map(load_image, num_parallel_calls=2)")],
    )
    assert ranked[0].id == "fixed-parallelism"
    assert any(e.source == recommendation.PROFILER for e in ranked[0].evidence)


finding_ids = st.sampled_from(
    ["missing-prefetch", "sequential-map", "cache-after-random", "vectorize-map", "cache-missing"]
)
stages = st.sampled_from(["map(load_image)", "map(other)", "batch(8)", "interleave(read)"])
severities = st.sampled_from(["error", "warning", "info"])


@settings(max_examples=60, deadline=None)
@given(
    wait_ms=st.floats(0.0, 100.0),
    compute_ms=st.floats(0.01, 100.0),
    drawn=st.lists(st.tuples(finding_ids, severities, stages), max_size=5),
    bottleneck=st.none() | stages,
)
def test_every_recommendation_rests_on_evidence(wait_ms, compute_ms, drawn, bottleneck):
    findings = [finding(i, s, stage) for i, s, stage in drawn]
    step_stats = stats(wait_ms, compute_ms)
    evidence = profile(bottleneck) if bottleneck else None
    ranked = advising.advise(step_stats, evidence, findings, cpu_count=4)
    for ranked_one in ranked:
        assert ranked_one.evidence, ranked_one
        gain = ranked_one.expected_gain
        if gain is not None and gain.speedup is not None:
            # Nothing in the input pipeline beats free input.
            assert 1.0 <= gain.speedup <= (1.0 / (1.0 - step_stats.input_fraction)) * (1 + 1e-9)
            if gain.likely_speedup is not None:
                assert 1.0 <= gain.likely_speedup <= gain.speedup + 1e-9
    # The report's verdict (a wait any fetch may take does not decide it).
    if judge(step_stats, evidence).verdict == Verdict.NOT_INPUT_BOUND:
        assert ranked[0].id == advisor.NOT_THE_BOTTLENECK
        assert all(r.severity == "error" for r in ranked[1:])
    else:
        assert ranked, "an input-bound job always gets advice"
        at_bottleneck = [r for r in ranked if bottleneck and r.stage == bottleneck]
        if at_bottleneck:
            assert ranked[0].stage == bottleneck


# The report carries recommendations through JSON.


def test_recommendations_round_trip_through_json():
    ranked = advising.advise(stats(30.0, 10.0), profile(), MIXED_FINDINGS, cpu_count=2)
    report = kpt.Report(
        verdict=Verdict.HIGHLY_INPUT_BOUND, input_fraction=0.75, recommendations=ranked
    )
    again = kpt.Report.from_json(report.to_json())
    assert again.recommendations == ranked
    assert isinstance(again.recommendations[0], Recommendation)
    assert isinstance(again.recommendations[0].evidence[0], Evidence)
    assert isinstance(again.recommendations[0].expected_gain, ExpectedGain)


def test_bad_recommendation_names_the_field():
    with pytest.raises(ValueError, match=r"report\.recommendations\[0\]\.expected_gain\.speedup"):
        kpt.Report.from_json(
            '{"recommendations": [{"id": "x", "title": "t", "severity": "info", '
            '"expected_gain": {"speedup": "fast"}}]}'
        )


# Real fits.


def test_input_bound_fit_recommends_parallelising_the_profiled_map(tmp_path_factory):
    run = advised_fits.input_bound_run(tmp_path_factory)
    report = run.report
    assert report.verdict == Verdict.HIGHLY_INPUT_BOUND
    assert report.profile is not None, report.notes
    assert report.profile.bottleneck == "map(load_slowly)"
    top = report.recommendations[0]
    assert top.id in ("cache-missing", "sequential-map", "py-function-in-map")
    assert top.stage == report.profile.bottleneck
    assert "num_parallel_calls=tf.data.AUTOTUNE" in top.fix
    profiler = [e for e in top.evidence if e.source == recommendation.PROFILER]
    assert profiler and "map(load_slowly)" in profiler[0].detail
    assert "bottleneck" in profiler[0].detail
    gain = top.expected_gain
    assert gain.basis == recommendation.BOUND
    # The wait is ~15 ms a step and compute well under one: free input would be
    # many times faster; the map spread over this process's cores, at most
    # that many times.
    cores = len(os.sched_getaffinity(0))
    assert gain.speedup >= min(3.0, cores) - 1e-9
    # The step the gain starts from: the run's one step, the steady state's median.
    assert gain.step_ms == pytest.approx(report.figures.step_ms)
    if gain.likely_speedup is not None:
        assert 1.0 < gain.likely_speedup <= gain.speedup


def test_compute_bound_fit_gets_no_speed_advice(tmp_path_factory):
    run = advised_fits.compute_bound_run(tmp_path_factory)
    report = run.report
    assert report.verdict == Verdict.NOT_INPUT_BOUND
    finding_ids = {f.id for f in report.findings}
    assert {"cache-after-random", "sequential-map"} <= finding_ids
    assert [r.id for r in report.recommendations] == [
        advisor.NOT_THE_BOTTLENECK,
        "cache-after-random",
    ]
    assert report.recommendations[0].expected_gain.speedup < 1.1


def test_graph_nodes_tell_apart_stages_written_alike():
    first = finding("sequential-map", "warning", "map(f)")
    second = finding("py-function-in-map", "warning", "map(f)")
    first.node, second.node = "MapDataset/_1", "MapDataset/_4"
    evidence = profile("map(f)")
    evidence.bottleneck_node = evidence.iterators[1].stage_node = "MapDataset/_4"
    ranked = advising.advise(stats(30.0, 10.0), evidence, [first, second])
    # The other map(f), in which the profile timed no work, cannot help: no advice.
    assert [r.id for r in ranked] == ["py-function-in-map"]
    assert ranked[0].stage_node == "MapDataset/_4"


def test_unmeasured_wait_gives_advice_without_a_number():
    whole_steps = StepStats.from_arrays(np.full(5, np.nan), np.full(5, 0.02))
    ranked = advising.advise(whole_steps, None, MIXED_FINDINGS)
    assert ranked[0].id == "cache-after-random"
    speed = [r for r in ranked if r.severity != "error"]
    assert speed and all(
        recommendation.describe_gain(r.expected_gain) == "gain not measured" for r in speed
    )


def replayed(pipeline_ms: float, replay_ms: float):
    """A what-if replay that timed the real pipeline's step and the replayed one."""
    from keras_pipeline_tuner.after_training.what_if_replay import WhatIfResult
    from keras_pipeline_tuner.timing.step_stats import Distribution

    return WhatIfResult(
        speedup_if_input_free=pipeline_ms / replay_ms,
        pipeline_step=Distribution(pipeline_ms, pipeline_ms, p90_ms=pipeline_ms + 1),
        replay_step=Distribution(replay_ms, replay_ms, p90_ms=replay_ms + 1),
    )


def test_a_what_if_replay_measures_the_floor():
    replay = replayed(40.0, 8.0)
    ranked = advising.advise(stats(30.0, 10.0), None, [], what_if=replay)
    gain = ranked[0].expected_gain
    # Replayed, the step takes 8 ms, not the 10 ms of compute the clock saw:
    # the pipeline's threads also slowed the compute.
    assert gain.speedup == pytest.approx(5.0)
    assert gain.step_ms_after == pytest.approx(8.0)
    assert any(e.source == recommendation.REPLAY for e in ranked[0].evidence)


def test_no_bound_is_below_what_the_verdicts_input_share_says_free_input_brings():
    # The replay found little (40 ms against 37 ms), the wait 75 %: the
    # verdict's share wins, and no ceiling may be lower than it.
    replay = replayed(40.0, 37.0)
    ranked = advising.advise(stats(30.0, 10.0), None, [], what_if=replay)
    assert ranked[0].expected_gain.speedup == pytest.approx(4.0)
    assert ranked[0].expected_gain.basis == recommendation.BOUND


def test_at_the_bottleneck_a_missing_cache_leads_the_stage():
    sequential = finding("sequential-map", "warning", "map(load_image)", "load_image")
    cache = finding("cache-missing", "info", "map(load_image)", "load_image")
    ranked = advising.advise(stats(30.0, 10.0), profile(), [sequential, cache])
    # One stage, one recommendation: the cache, with the other as evidence.
    assert [r.id for r in ranked] == ["cache-missing"]
    assert ranked[0].also == ["sequential-map"]
    assert any("Parallelise map(load_image)" in e.detail for e in ranked[0].evidence)


def test_a_cache_the_fit_never_reads_back_gets_no_gain_and_yields_the_stage():
    # fit(steps_per_epoch=30, epochs=2) on 12 500 batches: 60 read, none twice.
    sequential = finding("sequential-map", "warning", "map(load_image)", "load_image")
    cache = finding("cache-missing", "info", "map(load_image)", "load_image")
    reuse = DataReuse(batches_read=60, batches_per_pass=12500)
    ranked = advising.advise(stats(30.0, 10.0), profile(), [sequential, cache], reuse=reuse)
    assert [r.id for r in ranked] == ["sequential-map"]
    assert ranked[0].also == ["cache-missing"]
    assert ranked[0].expected_gain.speeds_up
    folded = " ".join(e.detail for e in ranked[0].evidence).lower()
    assert "this fit read 60 of the dataset's 12500 batches: a cache is never read back" in folded
    # Alone, it is listed with no gain and the reason, never as a speed fix.
    alone = advising.advise(stats(30.0, 10.0), profile(), [cache], reuse=reuse)
    gain = alone[0].expected_gain
    assert alone[0].id == "cache-missing" and not gain.speeds_up
    assert recommendation.describe_gain(gain) == "no gain: this fit never reads a cache back"


def test_a_bottleneck_stage_whose_fix_is_a_cache_follows_the_fits_reuse():
    # A stage with no fix of its own kind: its fix is a cache after it.
    window = profile("flat_map(parse)")
    never = DataReuse(batches_read=60, batches_per_pass=12500)
    ranked = advising.advise(stats(30.0, 10.0), window, [], reuse=never)
    assert ranked[0].id == "bottleneck-stage" and ".cache()" in ranked[0].fix
    assert recommendation.describe_gain(ranked[0].expected_gain) == (
        "no gain: this fit never reads a cache back"
    )
    twice = DataReuse(batches_read=40, batches_per_pass=20)
    gain = advising.advise(stats(30.0, 10.0), window, [], reuse=twice)[0].expected_gain
    steady = advising.advise(stats(30.0, 10.0), window, [])[0].expected_gain
    assert gain.speedup < steady.speedup and "2.0 passes" in gain.statement


def test_where_the_passes_are_known_a_cache_ranks_by_its_figure_over_them():
    sequential = finding("sequential-map", "warning", "map(load_image)", "load_image")
    cache = finding("cache-missing", "info", "map(load_image)", "load_image")
    two_passes = DataReuse(batches_read=40, batches_per_pass=20)
    ranked = advising.advise(
        stats(30.0, 10.0), profile(), [sequential, cache], cpu_count=8, reuse=two_passes
    )
    # The map over 8 cores runs ahead of the step: 40 ms -> max(10, 30 - 22.5 * 7/8)
    # ms, beyond the stage's share (40 / 17.5 = 2.29x), which caps it; the cache
    # serves half the fit: 1.39x. The parallel map leads, the cache folded into it.
    assert [r.id for r in ranked] == ["sequential-map"]
    assert ranked[0].expected_gain.predicted_speedup == pytest.approx(40.0 / 17.5)
    folded = " ".join(e.detail for e in ranked[0].evidence)
    assert "Its gain: 1.39x faster (predicted)" in folded


def test_reads_spread_over_workers_are_predicted_over_the_cores_but_not_capped_by_them():
    # 30 ms of wait, 22.5 of it in the stage, on 2 cores: spread over them the
    # input prepares a batch in 30 - 22.5 / 2 = 18.75 ms, ahead of the step.
    stage = "interleave(read)"
    interleave = finding("sequential-interleave", "warning", stage, "read")
    interleave.op = "InterleaveDataset"
    gain = advising.advise(stats(30.0, 10.0), profile(stage), [interleave], cpu_count=2)[
        0
    ].expected_gain
    assert gain.predicted_speedup == pytest.approx(40.0 / 18.75)
    # Waiting reads overlap beyond the cores: the ceiling stays the stage's share.
    assert gain.speedup == pytest.approx(40.0 / 17.5)
    # A map's parallel calls are capped by the cores.
    sequential = finding("sequential-map", "warning", "map(load_image)", "load_image")
    capped = advising.advise(stats(30.0, 10.0), profile(), [sequential], cpu_count=2)
    assert capped[0].expected_gain.speedup == pytest.approx(2.0)


def test_a_cache_read_back_counts_its_filling_pass_over_the_fit():
    cache = finding("cache-missing", "info", "map(load_image)", "load_image")
    steady = advising.advise(stats(30.0, 10.0), None, [cache])[0].expected_gain.speedup
    two_passes = DataReuse(batches_read=40, batches_per_pass=20)
    gain = advising.advise(stats(30.0, 10.0), None, [cache], reuse=two_passes)[0].expected_gain
    # Half the fit fills the cache at today's speed: 1 / (0.5 + 0.5 / 4) = 1.6x.
    assert steady == pytest.approx(4.0)
    assert gain.speedup == pytest.approx(1.6)
    assert "2.0 passes" in gain.statement
    unknown = DataReuse(batches_read=40, batches_per_pass=-2)
    gain = advising.advise(stats(30.0, 10.0), None, [cache], reuse=unknown)[0].expected_gain
    assert gain.speedup == pytest.approx(4.0) and "unknown length" in gain.statement


def test_a_profiled_run_is_not_told_to_open_a_profiler_window():
    window = profile()
    window.bottleneck = None
    ranked = advising.advise(stats(30.0, 10.0), window, [])
    assert ranked[-1].id == "input-bound"
    assert "profile=" not in ranked[-1].fix and "kpt.inspect" in ranked[-1].fix
    # No window: "auto" (the default) may not have opened one, so the fix
    # chooses the steps, which always opens one, rather than repeat "auto".
    unprofiled = advising.advise(stats(30.0, 10.0), None, [])
    fix = unprofiled[-1].fix
    assert "profile=(10, 25)" in fix and 'profile="auto"' not in fix
    assert '"auto" window opens only when' in unprofiled[-1].reason
    kpt.PipelineTuner(verbose=0, profile=(10, 25))  # the fix's arguments are valid


def test_a_note_with_nothing_to_change_is_no_recommendation():
    arrays = finding("keras-array-input", "info", "arrays")
    ranked = advising.advise(stats(30.0, 10.0), None, [arrays])
    assert "keras-array-input" not in [r.id for r in ranked]


def test_a_recommendation_that_cannot_speed_up_ranks_after_every_speed_fix():
    no_gain = finding("sequential-map", "warning", "map(random_flip)", "random_flip")
    helps = finding("missing-prefetch", "info", "batch(32)")
    window = profile()
    ranked = advising.advise(stats(30.0, 10.0), window, [no_gain, helps])
    gains = [r.expected_gain for r in ranked if r.expected_gain is not None]
    speed = [g.speeds_up for g in gains]
    assert speed == sorted(speed, reverse=True), [r.id for r in ranked]


def test_a_stage_whose_output_is_cached_gets_no_steady_state_gain():
    import tensorflow as tf

    def decode(value):
        return value * 2

    def load(index):
        value = tf.py_function(decode, [index], tf.int64)
        value.set_shape(())
        return value

    def jitter(value):
        return value + tf.random.uniform((), maxval=2, dtype=tf.int64)

    # The Python map runs in the first epoch only; the random map after the
    # cache runs in every epoch.
    dataset = tf.data.Dataset.range(16).map(load).cache().map(jitter).batch(4)
    findings = kpt.inspect(dataset)
    before_cache = [f for f in findings if f.stage.startswith("map(load")]
    assert before_cache, [f.id for f in findings]
    ranked = advising.advise(stats(20.0, 10.0), findings=findings)
    about_load = [r for r in ranked if r.stage and r.stage.startswith("map(load")]
    assert about_load
    for advice in about_load:
        assert advice.expected_gain.basis == recommendation.FIRST_EPOCH_ONLY
        assert "first epoch only" in recommendation.describe_gain(advice.expected_gain)
        assert "cache() after map(load" in advice.expected_gain.statement
    # It never outranks advice of a stage that runs every epoch.
    every_epoch = [i for i, r in enumerate(ranked) if r.stage and r.stage.startswith("map(jitter")]
    if every_epoch:
        assert every_epoch[0] < ranked.index(about_load[0])
