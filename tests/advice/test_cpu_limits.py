"""Advice from the CPU budget: rules on given usage, and fits under a real quota and mask.

The fits run in a child process that joins a cgroup with a CPU quota (or sets
its affinity to one CPU) after importing TensorFlow, so that the limit binds
the fit, not the import. Their pipeline runs a map of real TensorFlow work on
AUTOTUNE threads: two threads and the training step against one CPU of quota
are throttled however loaded the machine (the test cgroup's weight wins the
scheduler's share from other load).
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from keras_pipeline_tuner.advice.cpu_limits import cpu_limit_recommendations
from keras_pipeline_tuner.advice.recommendation import QUOTA_THREADS
from keras_pipeline_tuner.advice.recommendation import QUOTA_WORKERS
from keras_pipeline_tuner.advice.recommendation import THROTTLED
from keras_pipeline_tuner.after_training.fix_timing import FixTiming
from keras_pipeline_tuner.pipeline.graph import kinds
from keras_pipeline_tuner.pipeline.graph.model import Pipeline
from keras_pipeline_tuner.pipeline.graph.model import Stage
from keras_pipeline_tuner.timing.cpu_budget import CpuBudget
from keras_pipeline_tuner.timing.cpu_budget import Throttling
from keras_pipeline_tuner.timing.cpu_usage import CpuUsage


def usage(quota=None, affinity=8, throttled=0):
    budget = CpuBudget(
        host_count=8, affinity_count=affinity, quota_cpus=quota, cgroup=None, cgroup_version=2
    )
    return CpuUsage(
        wall_s=10.0,
        cpu_count=affinity,
        process_cores=1.0,
        budget=budget,
        throttling=Throttling(100, throttled_periods=throttled, throttled_s=0.01 * throttled),
    )


def tf_data(options=None):
    stage = Stage(node="map", op="ParallelMapDatasetV2", kind=kinds.MAP, params={})
    return Pipeline(stages=[stage], options=options or {})


def ids(pipeline, cpu):
    return [r.id for r in cpu_limit_recommendations(pipeline, cpu, None)]


def test_a_binding_quota_becomes_autotunes_cpu_budget():
    found = cpu_limit_recommendations(tf_data(), usage(quota=2.0), None)
    assert [r.id for r in found] == [QUOTA_THREADS]
    assert "options.autotune.cpu_budget = 2" in found[0].fix
    # A private pool of the budget's size only when timed faster (not timed here:
    # the fix says to time it first)...
    assert "private_threadpool_size" not in found[0].fix
    assert "# thread pool: a private pool of 2 was not timed here; time it with kpt.tune" in (
        found[0].fix
    )
    # ... but one set above the budget is advised down to it.
    larger = cpu_limit_recommendations(
        tf_data({"threading_options.private_threadpool_size": 8}), usage(quota=2.0), None
    )
    assert "options.threading.private_threadpool_size = 2" in larger[0].fix
    # No speed figure of its own, and none made up.
    assert found[0].expected_gain.speedup is None


def timed(before, after, status="measured", reason=""):
    measured = status == "measured"
    return FixTiming(
        QUOTA_THREADS,
        None,
        None,
        "options.threading.private_threadpool_size = 2",
        status,
        reason,
        batch_ms_before=before if measured else None,
        batch_ms_after=after if measured else None,
        rounds=3,
        batches=40,
    )


def quota_advice(*timings):
    (found,) = cpu_limit_recommendations(tf_data(), usage(quota=2.0), None, timings)
    return found.fix, [item.detail for item in found.evidence]


def test_a_private_pool_of_the_budgets_size_joins_the_advice_only_when_timed_faster():
    pool_line = "options.threading.private_threadpool_size = 2"
    fix, evidence = quota_advice(timed(4.0, 2.0))
    assert pool_line in fix and "options.autotune.cpu_budget = 2" in fix
    assert "every 4.00 ms as written, every 2.00 ms" in evidence[-1]
    assert "That is 2.00x faster. So the advice sets it too." in evidence[-1]
    # Slower, or faster by less than kpt.tune's rule for keeping a rewrite: left out.
    for after, how in ((2.4, "1.20x slower"), (1.96, "1.02x faster")):
        fix, evidence = quota_advice(timed(2.0, after))
        assert pool_line not in fix and "options.autotune.cpu_budget = 2" in fix
        # The fix still says what to do with the pool size, with the figure.
        assert f"# thread pool: keep tf.data's own; a private pool of 2 timed {how} here" in fix
        assert f"That is {how}. Left out: it joins the advice only when timed at least 3 %" in (
            evidence[-1]
        )
    # Not timed: left out, saying why.
    fix, evidence = quota_advice(
        timed(None, None, "not measured", "the budget was spent.")
    )
    assert pool_line not in fix
    assert "was not timed (not measured: the budget was spent): it joins" in evidence[-1]
    fix, evidence = quota_advice()
    assert pool_line not in fix
    assert "was not timed after training (measure_fixes times" in evidence[-1]


def test_a_quota_rule_beside_the_runs_ceiling_says_the_figure_is_that_ceiling():
    from keras_pipeline_tuner.advice.recommendation import BOUND
    from keras_pipeline_tuner.advice.recommendation import ExpectedGain

    ceiling = ExpectedGain(
        speedup=1.86, basis=BOUND, statement="With input free: at most 1.86x faster."
    )
    (found,) = cpu_limit_recommendations(tf_data(), usage(quota=2.0), ceiling)
    gain = found.expected_gain
    # The figure shown is the run's bound for any input change, labelled a bound,
    # and the statement does not deny the figure beside it.
    assert (gain.speedup, gain.basis) == (1.86, BOUND)
    assert "cannot be bounded" not in gain.statement
    assert "No change to the input can beat the run's ceiling: With input free" in gain.statement


def test_threads_already_within_the_quota_or_an_unbinding_quota_get_no_advice():
    sized = {"autotune_options.cpu_budget": 2}
    assert ids(tf_data(sized), usage(quota=2.0)) == []
    # A quota above the affinity count does not bind; nor does none; one that
    # rounds up to the affinity count leaves AUTOTUNE's own budget right.
    assert ids(tf_data(), usage(quota=16.0)) == []
    assert ids(tf_data(), usage(quota=7.5)) == []
    assert ids(tf_data(), usage()) == []


def test_loader_workers_above_the_budget_are_advised_down():
    loader = Stage(node="L", op="DataLoader", kind=kinds.DATA_LOADER, params={"num_workers": 8})
    found = cpu_limit_recommendations(Pipeline(stages=[loader]), usage(affinity=2), None)
    assert [r.id for r in found] == [QUOTA_WORKERS]
    assert "num_workers=2" in found[0].fix
    loader.params["num_workers"] = 2
    assert ids(Pipeline(stages=[loader]), usage(affinity=2)) == []


def test_a_throttled_job_is_told_so_with_its_figures():
    found = cpu_limit_recommendations(None, usage(quota=1.0, throttled=40), None)
    assert [r.id for r in found] == [THROTTLED]
    assert "40 %" in found[0].title
    assert "40 of 100" in found[0].reason
    # Below a tenth of the periods: not a finding.
    assert ids(None, usage(quota=1.0, throttled=5)) == []


# --- Fits under the kernel's limits ------------------------------------------------

FIT = textwrap.dedent(
    """
    import json, os, sys, time
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import numpy as np
    import tensorflow as tf
    import keras
    import keras_pipeline_tuner as kpt
    from keras_pipeline_tuner.outputs.markdown import render_markdown

    mode, target, measure_fixes = sys.argv[1], sys.argv[2], float(sys.argv[3]) or False
    if mode == "cgroup":
        with open(os.path.join(target, "cgroup.procs"), "w") as file:
            file.write(str(os.getpid()))
    elif mode == "affinity":
        os.sched_setaffinity(0, {int(target)})

    def work(i):
        x = tf.random.stateless_normal((96, 96), seed=tf.stack([i, i]))
        for _ in range(6):
            x = tf.tanh(tf.matmul(x, x) / 96.0)
        return tf.reduce_mean(x, axis=0), tf.cast(i % 2, tf.float32)

    class Sleep(keras.layers.Layer):
        # 5 ms of compute a step, known: the step clock must find it on one CPU.
        def call(self, inputs):
            def wait(x):
                time.sleep(0.005)
                return x
            outputs = tf.numpy_function(wait, [inputs], inputs.dtype, stateful=False)
            outputs.set_shape(inputs.shape)
            return outputs

    # Two hundred steps: the fit spans several quota periods (fifty steps,
    # mostly on batches prefetched while the first step traced, spanned one).
    ds = (tf.data.Dataset.range(1600).map(work, num_parallel_calls=tf.data.AUTOTUNE)
          .batch(8).prefetch(tf.data.AUTOTUNE))
    # Under the quota the job must want more CPU than it has: no sleep there.
    sleep = [Sleep()] if mode == "affinity" else []
    model = keras.Sequential([keras.Input((96,)), *sleep, keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    # With its fixes timed, the fit runs the contention check as a user's does.
    tuner = kpt.PipelineTuner(verbose=0, profile="off", check_contention=bool(measure_fixes),
                              measure_fixes=measure_fixes)
    # The tuner's lines, the early verdict's among them, go to its logger.
    import logging
    lines = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logging.getLogger("keras_pipeline_tuner").addHandler(handler)
    logging.getLogger("keras_pipeline_tuner").setLevel(logging.INFO)
    model.fit(ds, epochs=2, steps_per_epoch=100, callbacks=[tuner], verbose=0)
    report = tuner.report
    print(json.dumps({
        "cpus": report.cpu.budget.cpus,
        "binding": report.cpu.budget.binding,
        "quota": report.cpu.budget.quota_cpus,
        "throttling": None if report.cpu.throttling is None else
            [report.cpu.throttling.throttled_periods, report.cpu.throttling.periods],
        "compute_ms": report.train.compute.median_ms,
        "verdict": report.judgement.line,
        "input_free": report.figures.input_free and report.figures.input_free.statement,
        "early": [line for line in lines if "early verdict" in line],
        "advice": {r.id: r.fix for r in report.recommendations},
        "evidence": {r.id: [e.detail for e in r.evidence] for r in report.recommendations},
        "text": report.cpu.describe(),
        "markdown": render_markdown(report),
    }))
    """
)


def run_fit(mode, target, measure_fixes=0.0):
    process = subprocess.run(
        [sys.executable, "-c", FIT, mode, str(target), str(measure_fixes)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert process.returncode == 0, process.stderr[-3000:]
    return json.loads(process.stdout.strip().splitlines()[-1])


@pytest.mark.multiprocess
def test_a_fit_under_a_one_cpu_quota_reports_it_and_sizes_the_threads(quota_cgroup):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: a quota of one cannot bind below the affinity count")
    join, _ = quota_cgroup(1.0)
    # The advised fixes timed after training, in the quota (the copy of the
    # process that may time them stays in its cgroup).
    result = run_fit("cgroup", join, measure_fixes=8.0)
    assert (result["cpus"], result["binding"], result["quota"]) == (1, "quota", 1.0), result
    throttled, periods = result["throttling"]
    assert periods > 0 and throttled > 0, result
    assert "cgroup quota 1.00 CPU" in result["text"]
    # The Text tab (and the terminal) state the budget, what binds, the throttling.
    assert "CPU budget 1 CPU: cgroup quota 1.00 CPU" in result["markdown"]
    assert "the kernel throttled it in" in result["markdown"]
    # Its map's work costs training most of its quota, wherever the kernel's
    # stops fell: the contention check compares wall time a step under it (a
    # comparison of the steps alone read "not input-bound" in 1 fit of 3).
    assert result["verdict"].startswith("highly input-bound"), result["verdict"]
    # The early verdict, from the steps alone, says the quota's stops escape them.
    (early,) = result["early"]
    assert "The CPU quota stopped the job in" in early and "between steps too" in early, early
    # The input-free ceiling: the run's one figure, of its steady-state step.
    assert result["input_free"].startswith("The step, the steady state's median"), (
        result["input_free"]
    )
    fix, evidence = result["advice"][QUOTA_THREADS], result["evidence"][QUOTA_THREADS]
    assert "options.autotune.cpu_budget = 1" in fix
    # The private pool of the budget's size was timed under the quota, and is
    # advised exactly when that timing found it faster (here it is mostly slower).
    (pool,) = [line for line in evidence if "A private thread pool" in line or "pool_size" in line]
    assert "every" in pool and "ms with options.threading.private_threadpool_size = 1" in pool, (
        result["markdown"][:1200]
    )
    assert ("options.threading.private_threadpool_size = 1" in fix) == (
        "So the advice sets it too" in pool
    ), (fix, pool)
    # Either way the fix says what to do with the pool size.
    assert (
        "options.threading.private_threadpool_size = 1" in fix
        or "# thread pool: keep tf.data's own; a private pool of 1 timed" in fix
    ), fix


@pytest.mark.multiprocess
def test_a_fit_on_one_cpu_of_its_mask_has_an_affinity_budget_and_no_throttling():
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: a mask of one cannot bind")
    result = run_fit("affinity", min(os.sched_getaffinity(0)))
    assert (result["cpus"], result["binding"]) == (1, "affinity"), result
    assert "CPU budget 1 CPU: affinity 1 of" in result["markdown"]
    assert result["throttling"] is None or result["throttling"][0] == 0, result
    assert QUOTA_THREADS not in result["advice"] and THROTTLED not in result["advice"]
    assert not any("CPU quota" in line for line in result["early"]), result["early"]
    # The step's 5 ms of compute, found on one CPU: its executor's one thread
    # once ran the compute before the fetch's timestamp (compute read 0.00 ms).
    assert result["compute_ms"] > 4.0, result["compute_ms"]


TUNE = textwrap.dedent(
    """
    import json, os, sys, time
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import tensorflow as tf
    import keras_pipeline_tuner as kpt

    with open(os.path.join(sys.argv[1], "cgroup.procs"), "w") as file:
        file.write(str(os.getpid()))
    ds = tf.data.Dataset.range(64).map(
        lambda i: tf.reduce_sum(tf.matmul(tf.ones((64, 64)) * tf.cast(i, tf.float32),
                                          tf.ones((64, 64)))),
        num_parallel_calls=tf.data.AUTOTUNE).batch(8)
    _, result = kpt.tune(ds, budget_s=8, verbose=0)
    print(json.dumps({o.kind: [o.change, o.status] for o in result.rewrites if o.change}))
    """
)


@pytest.mark.multiprocess
def test_tune_times_autotunes_budget_at_the_quota(quota_cgroup):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: a quota of one cannot bind below the affinity count")
    join, _ = quota_cgroup(1.0)
    process = subprocess.run(
        [sys.executable, "-c", TUNE, join], capture_output=True, text=True, timeout=240
    )
    assert process.returncode == 0, process.stderr[-3000:]
    outcomes = json.loads(process.stdout.strip().splitlines()[-1])
    change, status = outcomes["autotune-cpu-budget"]
    assert change == "options.autotune.cpu_budget = 1"
    # Timed: under a binding quota the rewrites sized to it come right after
    # the parallelism ones, before a short budget runs out.
    assert status in ("kept", "not faster"), outcomes
    tried = list(outcomes)
    assert tried[:2] == ["autotune-cpu-budget", "private-threadpool"], tried
    # The private pool is sized to the budget too.
    assert outcomes["private-threadpool"][0] == "options.threading.private_threadpool_size = 1"
