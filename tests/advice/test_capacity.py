"""The capacity model's cores for input free: the job's measured CPU a step over the free step."""

import os
import threading
import time

import keras
import pytest
import tensorflow as tf

import keras_pipeline_tuner as kpt
from keras_pipeline_tuner.advice.capacity import PARALLEL
from keras_pipeline_tuner.advice.capacity import SPREAD
from keras_pipeline_tuner.advice.capacity import StepCpu
from keras_pipeline_tuner.advice.capacity import capacity_of
from keras_pipeline_tuner.profiling.live_model import StageRow
from keras_pipeline_tuner.profiling.live_model import StageTable
from keras_pipeline_tuner.timing.cpu_usage import CpuMeter
from tests.helpers.training_data import spinning_map
from tests.helpers.training_data import tiny_model


def table(*rows):
    return StageTable(rows=tuple(rows), batches=100, cpu_budget=2)


MAP = StageRow("map(decode, num_parallel_calls=AUTOTUNE)", ms_per_batch=40.0, parallelism=2)


def test_cores_are_the_jobs_cpu_a_step_over_the_step_with_input_free():
    # tf.data's clocks say 40 ms a batch (a loaded machine stretches them);
    # the CPU meter measured 12 ms a step for the whole job.
    found = capacity_of(table(MAP), compute_ms=28.0, cpu_budget=2,
                        step_cpu=StepCpu(12.0), gap_ms=2.0)
    assert found.free_step_ms == 30.0
    assert found.cores_for_input_free == pytest.approx(0.4)
    assert found.cpu_ms_per_step == 12.0
    assert "12.00 ms of CPU a step, measured" in found.line()
    # Without the meter, tf.data's stage times over the compute, and said so.
    fallback = capacity_of(table(MAP), compute_ms=28.0, cpu_budget=2)
    assert fallback.cores_for_input_free == pytest.approx(40.0 / 28.0)
    assert fallback.cpu_ms_per_step is None and "which load stretches" in fallback.line()


def test_the_training_threads_wait_for_a_core_is_not_part_of_the_free_step():
    # Other work on the cores kept the training thread waiting 10 ms a step.
    found = capacity_of(table(MAP), compute_ms=38.0, cpu_budget=2,
                        step_cpu=StepCpu(12.0, delayed_ms=10.0), gap_ms=2.0)
    assert found.free_step_ms == 30.0
    assert found.cores_for_input_free == pytest.approx(0.4)
    # Never below a quarter of the measured step.
    floored = capacity_of(table(MAP), compute_ms=38.0, cpu_budget=2,
                          step_cpu=StepCpu(12.0, delayed_ms=100.0), gap_ms=2.0)
    assert floored.free_step_ms == pytest.approx(10.0)


def test_no_core_count_frees_a_sequential_stage_slower_than_the_step():
    slow = StageRow("from_generator(read)", ms_per_batch=50.0)
    found = capacity_of(table(slow), compute_ms=20.0, cpu_budget=2, step_cpu=StepCpu(8.0))
    assert found.cores_for_input_free is None
    assert "no core count makes the input free" in found.line()


def test_a_prefetchs_own_time_is_not_work():
    prefetch = StageRow("prefetch(AUTOTUNE)", runs_as="Prefetch", ms_per_batch=30.0)
    found = capacity_of(table(MAP, prefetch), compute_ms=20.0, cpu_budget=2)
    assert [stage.stage for stage in found.stages] == [MAP.stage]


def test_the_cpu_meter_reads_the_marking_threads_wait_for_a_core():
    meter = CpuMeter()
    end = time.thread_time() + 0.02
    while time.thread_time() < end:
        pass
    usage = meter.usage()
    if not os.path.exists("/proc/thread-self/schedstat"):
        assert usage.thread_delay_s is None
        return
    assert usage.thread_delay_s is not None and usage.thread_delay_s >= 0.0
    # A span one thread began and another ended says nothing of either.
    marks = []
    worker = threading.Thread(target=lambda: marks.append(meter.mark()))
    worker.start()
    worker.join()
    assert meter.usage(marks[0]).thread_delay_s is None


class TrainingSpan(keras.callbacks.Callback):
    # Placed before the tuner: its on_train_end comes before the tuner's
    # work after training.
    def on_train_begin(self, logs=None):
        self.began = time.monotonic()

    def on_train_end(self, logs=None):
        self.wall_s = time.monotonic() - self.began


def test_a_fit_gives_its_cpu_a_step_and_the_meter_stops_with_training():
    # A map that burns 3 ms of CPU a batch on its thread's clock, into a step
    # that sleeps 10 ms: load stretches both, but cannot make the CPU less.
    data = spinning_map(30, 8, 0.003, parallel_calls=tf.data.AUTOTUNE)
    keras.utils.set_random_seed(0)
    model = tiny_model(compute_delay_s=0.01)
    span = TrainingSpan()
    # what_if: a replay after training, which the CPU figures must leave out.
    tuner = kpt.PipelineTuner(verbose=0, profile="off", measure_fixes=False, what_if=True)
    model.fit(data, epochs=2, verbose=0, callbacks=[span, tuner])
    report = tuner.report
    capacity = report.figures.capacity
    assert capacity is not None, report.stage_table
    assert capacity.cpu_ms_per_step >= 3.0
    assert capacity.free_step_ms <= report.figures.compute_ms + report.figures.step.median_ms
    assert capacity.cores_for_input_free == pytest.approx(
        capacity.cpu_ms_per_step / capacity.free_step_ms
    )
    assert "ms of CPU a step, measured" in capacity.line()
    assert report.cpu.wall_s <= span.wall_s


def test_a_generators_work_moved_into_a_parallel_map_spreads_over_the_cores():
    # A generator of 26 ms a batch, a 10 ms compute, two cores.
    generator = StageRow("from_generator()", ms_per_batch=26.0)
    found = capacity_of(table(generator), compute_ms=10.0, cpu_budget=2)
    assert found.step_ms == pytest.approx(26.0)
    # Its work in a parallel map: 13 ms a batch over the two cores, which
    # also share the compute: (10 + 26) / 2.
    assert found.predicted_step_ms("from_generator()", SPREAD) == pytest.approx(18.0)
    # Parallel calls of the generator itself: it stays sequential.
    assert found.predicted_step_ms("from_generator()", PARALLEL) == pytest.approx(26.0)
