"""Contention from CPU use: the input's threads and workers against the CPU budget."""

import dataclasses
import subprocess
import sys
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_pipeline_tuner as kpt
from keras_pipeline_tuner.advice.cpu_contention import CHILDREN_RESOLUTION_S
from keras_pipeline_tuner.advice.cpu_contention import cpu_contention
from keras_pipeline_tuner.advice.figures import input_free
from keras_pipeline_tuner.advice.recommendation import CPU_USE
from keras_pipeline_tuner.advice.recommendation import REPLAY
from keras_pipeline_tuner.advice.verdict import judge
from keras_pipeline_tuner.after_training.what_if_replay import WhatIfResult
from keras_pipeline_tuner.instrumentation.user_calls import UserCallTiming
from keras_pipeline_tuner.timing.cpu_budget import CpuBudget
from keras_pipeline_tuner.timing.cpu_usage import CpuUsage
from keras_pipeline_tuner.timing.step_clock import StepClock
from keras_pipeline_tuner.timing.step_stats import Distribution
from keras_pipeline_tuner.timing.step_stats import Verdict
from tests.helpers.training_data import cached_source
from tests.helpers.training_data import slow_source
from tests.helpers.training_data import spinning_map
from tests.helpers.training_data import tiny_model


def usage(busy=1.0, children=0.0, quota=None, process=None):
    return CpuUsage(
        wall_s=10.0,
        cpu_count=2,
        process_cores=2.0 * busy if process is None else process,
        host_busy=busy,
        budget=CpuBudget(2, 2, quota_cpus=quota),
        children_cores=children,
    )


def python_calls(cpu_ms, source="tf.py_function"):
    """Calls of `cpu_ms` each, one a 10 ms step over the meter's 10 s: 1000 calls."""
    return UserCallTiming(
        "map(load)", "load", source, calls=1000, wall_ms=cpu_ms, wall_ms_median=cpu_ms,
        cpu_ms=cpu_ms, threads=2, per_batch_calls=1.0,
    )


def test_the_input_costs_its_share_of_the_jobs_cpu_work():
    # 4 ms of Python CPU a 10 ms step, the process alone keeping the CPUs 80 %
    # busy, the whole step computing: 0.4 cores of input, of the 1.6 the
    # process used: with the input free the step's own 1.2 cores of work would
    # take 25 % less time.
    found = cpu_contention(
        usage(busy=0.8, process=1.6), [python_calls(4.0)], step_ms=10.0, compute_ms=10.0
    )
    assert found.input_cores == pytest.approx(0.4)
    assert found.fraction == pytest.approx(0.25)
    assert "Python calls of map(load) 0.40 cores" in found.describe()
    assert "25 % of the 1.60 the job used, of 2 CPUs" in found.describe()
    # Worker processes count too; a quota is the budget the line names.
    workers = cpu_contention(
        usage(children=0.5, quota=1.0, process=1.0), [], step_ms=10.0, compute_ms=10.0
    )
    assert workers.budget_cpus == 1.0 and workers.fraction == pytest.approx(0.5)
    # Idle CPUs absorb the input's work: at 40 % busy, half of it counts.
    idle = cpu_contention(
        usage(busy=0.4, process=0.8), [python_calls(3.0)], step_ms=10.0, compute_ms=10.0
    )
    assert idle.fraction == pytest.approx(0.3 * 0.5)
    # Only the compute part of the step can be slowed.
    waiting = cpu_contention(
        usage(busy=0.8, process=1.6), [python_calls(5.0)], step_ms=10.0, compute_ms=2.0
    )
    assert waiting.fraction == pytest.approx(0.2)


def test_children_count_as_workers_only_where_the_input_may_start_them():
    spinning = usage(busy=1.0, children=1.0)
    # A DataLoader with workers, or an input of unknown kind: the children are its workers.
    for workers in (True, None):
        found = cpu_contention(spinning, [], step_ms=10.0, compute_ms=10.0,
                               worker_processes=workers)
        assert found.parts == ["worker processes 1.00 cores"], workers
    # tf.data ops, arrays: another job's processes started from this one.
    assert cpu_contention(spinning, [], step_ms=10.0, compute_ms=10.0,
                          worker_processes=False) is None


def fit_beside_a_spinning_child(dataset) -> kpt.PipelineTuner:
    """A tuned fit of `dataset` while a child process of the job spins (a busy loop, a server)."""
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        # A step that sleeps 30 ms: over the later epochs' 1.9 s and more, the
        # child's CPU is above what the kernel's clock ticks resolve, even with
        # a third of a core on a busy machine.
        model = tiny_model(compute_delay_s=0.03)
        tuner = kpt.PipelineTuner(verbose=0, profile="off")
        model.fit(dataset, epochs=3, verbose=0, callbacks=[tuner])
    finally:
        child.kill()
        child.wait()
    return tuner


def test_a_child_process_of_the_job_is_not_a_tf_data_pipelines_worker():
    # The cached tf.data pipeline starts no processes, so the child's CPU is
    # not the input's, and the meter does not list the children (reading every
    # process of the host twice an epoch): the child's CPU is nowhere.
    tuner = fit_beside_a_spinning_child(cached_source(512).batch(16))
    cpu = tuner.report.cpu
    assert cpu.children_cores is None, cpu
    found = tuner.report.judgement.cpu_contention
    assert found is None or not any("worker processes" in part for part in found.parts), found


def test_children_are_listed_where_the_input_may_start_processes():
    # A generator may start processes of its own: the meter lists the
    # children, and sees the spinning child's CPU.
    tuner = fit_beside_a_spinning_child(slow_source(512, 0.0).batch(16))
    cpu = tuner.report.cpu
    assert cpu.children_cores * cpu.wall_s >= CHILDREN_RESOLUTION_S, cpu


def test_other_processes_on_the_cpus_share_what_a_free_input_frees():
    # The same 0.3 cores of input, the CPUs saturated: with the process alone
    # (2 cores) a free input frees 15 % of the work done; beside other
    # processes that used 1.2 of the 2 cores, the freed cores go to them too,
    # in proportion, and the step gains 15 % all the same: the input is 15 %
    # of all the work the CPUs did, not 37 % of the job's 0.8 cores.
    alone = cpu_contention(usage(process=2.0), [python_calls(3.0)], step_ms=10.0, compute_ms=10.0)
    beside = cpu_contention(
        usage(process=0.8), [python_calls(3.0)], step_ms=10.0, compute_ms=10.0
    )
    assert alone.fraction == pytest.approx(0.15) and alone.others_cores == 0.0
    assert beside.others_cores == pytest.approx(1.2)
    assert beside.fraction == pytest.approx(0.15)
    assert "37 % of the 0.80 the job used (other processes used 1.20 beside it)" in (
        beside.describe()
    )
    # Under a quota the job's CPU is its quota's, whatever others use: 37 % of
    # the job's work, but never more of the step than its own 0.3 cores.
    quota = cpu_contention(
        usage(process=0.8, quota=1.0), [python_calls(3.0)], step_ms=10.0, compute_ms=10.0
    )
    assert quota.others_cores == 0.0 and quota.fraction == pytest.approx(0.3)


def test_calls_on_the_training_thread_are_the_wait_not_contention():
    # A generator's next() on JAX and torch runs inside the fetch, on the
    # training thread: the step clock's wait holds it already.
    fetched = python_calls(5.0, source="generator next")
    assert cpu_contention(usage(), [fetched], step_ms=10.0, compute_ms=10.0) is None
    # Nothing measured, or next to nothing: no estimate.
    assert cpu_contention(usage(), [], step_ms=10.0, compute_ms=10.0) is None
    assert cpu_contention(None, [python_calls(5.0)], step_ms=10.0, compute_ms=10.0) is None
    assert cpu_contention(usage(), [python_calls(0.05)], step_ms=10.0, compute_ms=10.0) is None


def clock_of(wait_ms, compute_ms, epochs=3, steps=30):
    clock, now = StepClock(), 0.0
    for epoch in range(epochs):
        clock.begin_epoch(epoch)
        rows = []
        for _ in range(steps):
            ready = now + wait_ms / 1e3
            end = ready + compute_ms / 1e3
            rows.append((now, ready, end))
            now = end
        clock.record("train", np.array(rows))
        clock.end_epoch("train", epoch)
    return clock


def judged(clock, **kwargs):
    return judge(
        clock.stats("train"), None, clock.epochs, clock.steady_share("train"),
        clock.epoch_start_share("train"), **kwargs,
    )


def test_without_a_replay_the_cpu_estimate_adds_to_the_wait_and_says_it_is_predicted():
    clock = clock_of(wait_ms=0.5, compute_ms=9.5)
    found = cpu_contention(usage(), [python_calls(5.0)], step_ms=10.0, compute_ms=9.5)
    judgement = judged(clock, cpu_contention=found)
    assert judgement.source == CPU_USE
    assert judgement.verdict == Verdict.HIGHLY_INPUT_BOUND
    assert judgement.input_fraction == pytest.approx(judgement.wait_fraction + found.fraction)
    assert "predicted" in judgement.line and "(CPU use)" in judgement.line
    # Serialised with the report and read back whole.
    report = kpt.Report(judgement=judgement)
    assert kpt.Report.from_json(report.to_json()).judgement.cpu_contention == found


def replayed(free_ms, real_ms=10.0):
    """A replay that stepped in `free_ms` on cached batches against `real_ms` on the pipeline."""
    return WhatIfResult(
        replay_step=Distribution(mean_ms=free_ms),
        replay_input_wait=Distribution(mean_ms=0.05),
        pipeline_step=Distribution(mean_ms=real_ms),
        pipeline_source="measured",
    )


def test_a_replay_measurement_decides_and_the_cpu_estimate_is_shown_beside_it():
    clock = clock_of(wait_ms=0.5, compute_ms=9.5)
    found = cpu_contention(usage(), [python_calls(5.0)], step_ms=10.0, compute_ms=9.5)
    judgement = judged(clock, what_if=replayed(6.0), cpu_contention=found)
    assert judgement.source == REPLAY
    assert judgement.input_fraction == pytest.approx(0.4)
    assert "Beside it, from CPU use:" in judgement.line


def test_a_python_map_that_keeps_ahead_is_measured_as_cpu_the_step_shares():
    # A parallel py_function map that computes in Python (holding the GIL) for
    # 2 ms a batch, prefetched, into a step that computes for a few ms: the
    # estimate counts its CPU time as the input's cores, whatever the load.
    data = spinning_map(40, 64, 0.002, features=256)
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((256,)), keras.layers.Dense(1024), keras.layers.Dense(1024),
         keras.layers.Dense(1)]
    )
    model.compile("sgd", "mse")
    tuner = kpt.PipelineTuner(verbose=0)

    class Span(keras.callbacks.Callback):
        # The steady state the estimate is of: the later epochs, to training's end
        # (the tuner's work after training is not the job's).
        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 1:
                self.began = time.monotonic()

        def on_train_end(self, logs=None):
            self.wall_s = time.monotonic() - self.began

    span = Span()
    # Before the tuner: its on_train_end comes before the tuner's work after training.
    model.fit(data, epochs=3, verbose=0, callbacks=[span, tuner])
    found = tuner.report.judgement.cpu_contention
    assert found is not None, tuner.report.judgement.line
    assert "Python calls of map(mapped, num_parallel_calls=2)" in found.parts[0]
    # 80 calls of 2 ms of CPU in the two later epochs (tf.data's other stages,
    # timed on its threads' clocks, add what load stretches).
    python_cores = float(found.parts[0].split()[-2])  # as printed, to 0.01
    assert python_cores == pytest.approx(80 * 0.002 / span.wall_s, rel=0.25)
    assert python_cores - 0.005 <= found.input_cores <= 2.0


def test_tf_data_stages_count_by_their_own_time_and_never_past_the_process():
    from keras_pipeline_tuner.profiling.live_model import StageRow
    from keras_pipeline_tuner.profiling.live_model import StageTable

    table = StageTable(
        rows=(
            StageRow("map(decode)", ms_per_batch=5.0),
            # Timed by its calls' CPU time instead of tf.data's clocks.
            StageRow("map(load)", ms_per_batch=50.0),
            StageRow("prefetch (added by tf.data)", ms_per_batch=1.0, added_by_tf=True),
            # A prefetch's own time is waiting for room or for its input.
            StageRow("prefetch(4)", runs_as="Prefetch", ms_per_batch=3.0),
        )
    )
    # 1000 batches of 5 ms over the meter's 10 s: half a core of the two.
    found = cpu_contention(
        usage(), [python_calls(0.0)], step_ms=10.0, compute_ms=10.0, stage_table=table,
        steps=1000,
    )
    assert found.parts == ["tf.data's map(decode) 0.50 cores"]
    # Half a core of the two the process kept busy.
    assert found.fraction == pytest.approx(0.25)
    # A stretched clock on a busy machine cannot claim more than the process used.
    stretched = cpu_contention(
        usage(busy=0.2), [], step_ms=10.0, compute_ms=10.0, stage_table=table, steps=10000
    )
    assert stretched.input_cores == pytest.approx(0.4)


def test_a_map_before_a_cache_counts_only_where_the_verdict_looks():
    # The map computes in Python for 4 ms a batch in the first epoch only,
    # which fills the cache; the later epochs, the verdict's steady state,
    # read the cache and call nothing. The CPU it took in the first epoch is
    # not the steady state's contention.
    def spin(x):
        end = time.thread_time() + 0.004
        while time.thread_time() < end:
            pass
        return x

    def mapped(x, y):
        x = tf.py_function(spin, [x], tf.float32)
        x.set_shape((None, 64))
        return x, y

    x = np.random.default_rng(0).random((32 * 40, 64), dtype=np.float32)
    data = tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(32)
    data = data.map(mapped).cache().prefetch(2)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    tuner = kpt.PipelineTuner(verbose=0)
    model.fit(data, epochs=3, verbose=0, callbacks=[tuner])
    judgement = tuner.report.judgement
    assert judgement.from_epoch == 1, judgement.line
    found = judgement.cpu_contention
    assert found is None or not any("Python calls" in part for part in found.parts), found


def test_a_replay_within_its_noise_bounds_the_cpu_estimate_instead_of_zeroing_it():
    clock = clock_of(wait_ms=0.0, compute_ms=10.0)
    found = cpu_contention(usage(process=1.0), [python_calls(1.0)], step_ms=10.0, compute_ms=10.0)
    # 9.0 against 10.0 ms: 1.11x, under the replay's 1.15x resolution.
    unresolved = replayed(9.0)
    judgement = judged(clock, what_if=unresolved, cpu_contention=found)
    assert judgement.source == CPU_USE
    assert judgement.input_fraction == pytest.approx(found.fraction)
    assert "within its noise" in judgement.line
    # One figure: the input-free ceiling is the share's, not a replay's "no gain".
    even = dataclasses.replace(
        unresolved, replay_step=Distribution(mean_ms=10.1), speedup_if_input_free=10.0 / 10.1
    )
    judgement = judged(clock, what_if=even, cpu_contention=found)
    assert judgement.source == CPU_USE
    ceiling = input_free(judgement, 10.0, compute_ms=10.0, what_if=even)
    assert ceiling.speedup == pytest.approx(1 / (1 - found.fraction))
    # A prediction above what the replay could have missed is capped there.
    heavy = cpu_contention(
        usage(process=1.0), [python_calls(6.0)], step_ms=10.0, compute_ms=10.0
    )
    capped = judged(clock, what_if=unresolved, cpu_contention=heavy)
    assert capped.source == CPU_USE
    assert capped.input_fraction == pytest.approx(1 - 1 / 1.15)


def test_a_step_that_uses_little_cpu_is_slowed_by_no_more_than_the_inputs_cpu():
    # The step sleeps (or waits on a device): the input is 80 % of the job's
    # 0.125 cores of CPU, yet its 0.1 cores can take at most 10 % of the step
    # (under a quota of one CPU, used up by others' work on the host or not).
    found = cpu_contention(
        usage(process=0.125, quota=1.0), [python_calls(1.0)], step_ms=10.0, compute_ms=10.0
    )
    assert found.fraction == pytest.approx(0.1)
