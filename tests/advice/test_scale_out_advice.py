"""Advice beyond one host: the straggler first, the tf.data service for saturated CPUs."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_pipeline_tuner as kpt
from keras_pipeline_tuner.advice.scale_out import OFFLOAD
from keras_pipeline_tuner.advice.scale_out import STRAGGLER
from keras_pipeline_tuner.pipeline.graph.model import Pipeline
from keras_pipeline_tuner.pipeline.graph.model import Stage
from keras_pipeline_tuner.pipeline.lint.tf_data_rules import lint
from keras_pipeline_tuner.timing.cpu_usage import CpuUsage
from keras_pipeline_tuner.timing.step_stats import StepStats
from keras_pipeline_tuner.workers import exchange as worker_reports
from keras_pipeline_tuner.workers.exchange import WorkerSummary
from tests.helpers.advising import advise

BUSY = CpuUsage(wall_s=20.0, cpu_count=2, process_cores=1.95, host_busy=0.97)
IDLE = CpuUsage(wall_s=20.0, cpu_count=2, process_cores=0.6, host_busy=0.35)


def stats(wait_ms, compute_ms, steps=50):
    return StepStats.from_arrays(
        np.full(steps, wait_ms / 1e3), np.full(steps, compute_ms / 1e3)
    )


def heavy(index):
    values = tf.random.normal([64, 64])
    return tf.reduce_sum(tf.matmul(values, values)) + tf.cast(index, tf.float32)


def parallel_pipeline():
    return (
        tf.data.Dataset.range(64)
        .map(heavy, num_parallel_calls=tf.data.AUTOTUNE)
        .batch(8)
        .prefetch(tf.data.AUTOTUNE)
    )


def ids(recommendations):
    return [recommendation.id for recommendation in recommendations]


def test_saturated_cpus_and_parallel_stages_recommend_the_data_service():
    findings = kpt.inspect(parallel_pipeline())
    recommendations = advise(stats(30.0, 5.0), findings=findings, cpu=BUSY, cpu_count=2)
    assert OFFLOAD in ids(recommendations)
    offload = recommendations[ids(recommendations).index(OFFLOAD)]
    assert "tf.data.experimental.service.distribute(" in offload.fix
    assert "https://www.tensorflow.org/" in offload.reason
    sources = {item.source for item in offload.evidence}
    assert {"step clock", "pipeline inspection", "CPU usage"} <= sources
    assert "map(heavy, num_parallel_calls=AUTOTUNE)" in " ".join(
        item.detail for item in offload.evidence
    )
    assert offload.expected_gain.basis == "bound"


@pytest.mark.parametrize(
    "case",
    ["idle CPUs", "not input-bound", "sequential map", "python function", "no pipeline"],
)
def test_no_data_service_advice_without_all_its_evidence(case):
    dataset, cpu, step = parallel_pipeline(), BUSY, stats(30.0, 5.0)
    if case == "idle CPUs":
        cpu = IDLE
    elif case == "not input-bound":
        step = stats(0.1, 20.0)
    elif case == "sequential map":
        dataset = tf.data.Dataset.range(64).map(heavy).batch(8)
    elif case == "python function":
        dataset = tf.data.Dataset.range(64).map(
            lambda i: tf.py_function(lambda x: x, [i], tf.int64),
            num_parallel_calls=tf.data.AUTOTUNE,
        )
    findings = kpt.inspect(dataset)
    if case == "no pipeline":
        findings = list(findings)
    assert OFFLOAD not in ids(advise(step, findings=findings, cpu=cpu, cpu_count=2))


def test_a_pipeline_already_on_the_service_is_told_to_add_service_workers():
    # Hand-built: the graph of a real service read needs a running dispatcher.
    stage = Stage(
        node="DataServiceDatasetV4/_9",
        op="DataServiceDatasetV4",
        kind="distribute",
        params={"processing_mode": "distributed_epoch", "service": "grpc://dispatcher:5050"},
    )
    findings = lint(Pipeline(stages=[stage]))
    assert "data-service" in findings.ids
    recommendations = advise(stats(30.0, 5.0), findings=findings, cpu=BUSY, cpu_count=2)
    assert OFFLOAD not in ids(recommendations)
    assert recommendations[0].id == "data-service"
    assert "more workers" in recommendations[0].title
    assert stage.label.startswith("distribute(processing_mode='distributed_epoch'")


def multi_worker(chief_wait_ms, chief_compute_ms, other_wait_ms, other_compute_ms):
    identity = worker_reports.identity_from_cluster(
        {"worker": ["a:1", "b:1"]}, "worker", 0
    )
    workers = [
        WorkerSummary(task="worker:0", chief=True, final=True,
                      train=stats(chief_wait_ms, chief_compute_ms)),
        WorkerSummary(task="worker:1", host="b", final=True,
                      train=stats(other_wait_ms, other_compute_ms)),
    ]
    return worker_reports.compare(identity, workers, final=True)


def test_the_job_is_judged_by_its_straggler_named_first():
    # The chief hardly waits for input: it waits for worker:1 in the all-reduce.
    view = multi_worker(0.5, 40.0, 30.0, 10.0)
    chief_stats = view.worker("worker:0").train
    alone = advise(chief_stats, cpu_count=2)
    assert ids(alone) == ["input-not-bottleneck"]
    recommendations = advise(chief_stats, workers=view, cpu_count=2)
    assert recommendations[0].id == STRAGGLER
    assert "worker:1" in recommendations[0].title
    assert "input-not-bottleneck" not in ids(recommendations)
    evidence = recommendations[0].evidence[0]
    assert evidence.source == "workers" and "all-reduce" in evidence.detail
    # Free input on worker:1 would make its 40 ms steps take 10 ms.
    assert recommendations[0].expected_gain.speedup == pytest.approx(4.0, rel=0.01)


def test_workers_that_wait_alike_are_judged_by_this_workers_own_steps():
    view = multi_worker(10.0, 30.0, 10.5, 30.0)
    assert view.straggler is None
    recommendations = advise(view.worker("worker:0").train, workers=view, cpu_count=2)
    assert STRAGGLER not in ids(recommendations)
    assert recommendations == advise(view.worker("worker:0").train, cpu_count=2)


def test_a_cpu_bound_fit_gets_the_data_service_advice():
    def augment(index):
        # Random, so nothing can be cached; a few large products per example.
        values = tf.random.normal([160, 160])
        for _ in range(3):
            values = tf.tanh(tf.matmul(values, values) / 160.0)
        return tf.reduce_mean(values, axis=0), tf.cast(index % 2, tf.float32)

    dataset = (
        tf.data.Dataset.range(384)
        .map(augment, num_parallel_calls=tf.data.AUTOTUNE)
        .batch(16)
        .prefetch(tf.data.AUTOTUNE)
    )
    model = keras.Sequential([keras.Input((160,)), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    tuner = kpt.PipelineTuner(profile="off", verbose=0)
    model.fit(dataset, epochs=2, verbose=0, callbacks=[tuner])
    report = tuner.report
    assert report.cpu is not None and report.cpu.wall_s > 0
    if report.verdict.value != "highly input-bound" or not report.cpu.saturated:
        pytest.skip(
            f"this run was not CPU-bound on input ({report.verdict.value}, CPUs "
            f"{report.cpu.busy * 100:.0f} % busy): the advice needs both"
        )
    assert OFFLOAD in ids(report.recommendations)


def test_a_job_its_quota_throttled_is_told_the_same_host_ways_out_before_other_hosts():
    from keras_pipeline_tuner.advice.cpu_limits import cpu_limit_recommendations
    from keras_pipeline_tuner.timing.cpu_budget import CpuBudget
    from keras_pipeline_tuner.timing.cpu_budget import Throttling

    quota = CpuBudget(host_count=2, affinity_count=2, quota_cpus=1.0)
    # The job used its whole quota while the host's two CPUs were half idle.
    cpu = CpuUsage(wall_s=20.0, cpu_count=2, process_cores=0.98, host_busy=0.5, budget=quota)
    findings = kpt.inspect(parallel_pipeline())
    step = stats(30.0, 5.0)
    unthrottled = ids(advise(step, findings=findings, cpu=cpu, cpu_count=1))
    assert OFFLOAD in unthrottled
    cpu.throttling = Throttling(200, throttled_periods=150, throttled_s=4.0)
    recommendations = advise(step, findings=findings, cpu=cpu, cpu_count=1)
    found = ids(recommendations)
    limits = ids(cpu_limit_recommendations(findings.pipeline, cpu, None))
    assert limits == ["cpu-quota-threads", "cpu-throttled"]
    # The quota's own advice (a budget for AUTOTUNE, a larger limit) first,
    # moving the pipeline to other hosts last.
    assert found[-1] == OFFLOAD and found[-3:-1] == limits, found
    assert found.index(OFFLOAD) > unthrottled.index(OFFLOAD)
    assert "the job used 98 % of its 1.00-CPU quota" in recommendations[-1].reason
