"""Per-worker summaries: who is who, the straggler rule, the exchange through log_dir."""

import io
import time

import numpy as np
import pytest

import keras_pipeline_tuner as kpt
from keras_pipeline_tuner._util.feature_guard import FeatureGuard
from keras_pipeline_tuner.outputs.markdown import render_markdown
from keras_pipeline_tuner.outputs.terminal import print_summary
from keras_pipeline_tuner.profiling.window import ProfilerWindow
from keras_pipeline_tuner.run.lifecycle import Run
from keras_pipeline_tuner.run.lifecycle import RunSettings
from keras_pipeline_tuner.timing.cpu_usage import CpuMeter
from keras_pipeline_tuner.timing.cpu_usage import CpuUsage
from keras_pipeline_tuner.timing.step_stats import StepStats
from keras_pipeline_tuner.workers import exchange as worker_reports
from keras_pipeline_tuner.workers.exchange import WorkerExchange
from keras_pipeline_tuner.workers.exchange import WorkerSummary

TWO_WORKERS = {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}


def stats(wait_ms, compute_ms, steps=20):
    return StepStats.from_arrays(
        np.full(steps, wait_ms / 1e3), np.full(steps, compute_ms / 1e3)
    )


def summary(task, wait_ms, compute_ms, final=True):
    return WorkerSummary(
        task=task,
        host="host-" + task[-1],
        chief=task == "worker:0",
        final=final,
        epochs=2,
        train=stats(wait_ms, compute_ms),
        cpu=CpuUsage(wall_s=3.0, cpu_count=2, process_cores=1.5, host_busy=0.9),
    )


@pytest.mark.parametrize(
    "cluster, task_type, task_id, expected",
    [
        (TWO_WORKERS, "worker", 0, ("worker:0", "worker:0", True)),
        (TWO_WORKERS, "worker", 1, ("worker:1", "worker:0", False)),
        ({"chief": ["a:1"], "worker": ["b:1"]}, "worker", 0, ("worker:0", "chief:0", False)),
        ({"chief": ["a:1"], "worker": ["b:1"]}, "chief", 0, ("chief:0", "chief:0", True)),
    ],
)
def test_identity_follows_tensorflows_chief_rule(cluster, task_type, task_id, expected):
    identity = worker_reports.identity_from_cluster(cluster, task_type, task_id)
    assert (identity.task, identity.chief, identity.is_chief) == expected


@pytest.mark.parametrize(
    "cluster, task_type",
    [
        ({"worker": ["a:1"]}, "worker"),  # one worker: nothing to compare
        ({"worker": ["a:1", "b:1"], "evaluator": ["c:1"]}, "evaluator"),
        ({"worker": ["a:1", "b:1"], "ps": ["c:1"]}, "ps"),
    ],
)
def test_no_identity_outside_a_training_cluster(cluster, task_type):
    assert worker_reports.identity_from_cluster(cluster, task_type, 0) is None


def test_the_straggler_is_the_worker_that_waits_longest_for_input():
    workers = [summary("worker:0", 0.5, 40.0), summary("worker:1", 30.0, 8.0)]
    task, reason = worker_reports.find_straggler(workers)
    assert task == "worker:1"
    assert "worker:1 waits 30.00 ms per step" in reason
    assert "all-reduce" in reason


@pytest.mark.parametrize(
    "workers",
    [
        [summary("worker:0", 10.0, 30.0), summary("worker:1", 10.5, 30.0)],  # too close
        [summary("worker:0", 10.0, 30.0)],  # alone
    ],
)
def test_no_straggler_is_named_without_a_clear_difference(workers):
    task, reason = worker_reports.find_straggler(workers)
    assert task is None
    assert "none is named" in reason


def test_summaries_round_trip_through_the_log_dir(tmp_path):
    written = summary("worker:1", 30.0, 8.0)
    path = worker_reports.write_summary(written, str(tmp_path))
    assert path.endswith("workers/worker_1/worker_summary.json")
    assert worker_reports.read_summary(str(tmp_path), "worker:1") == written
    assert worker_reports.read_summary(str(tmp_path), "worker:2") is None
    worker_reports.remove_summaries(str(tmp_path), ["worker:1"])
    assert worker_reports.read_summary(str(tmp_path), "worker:1") is None


def test_the_chief_waits_a_bounded_time_and_names_the_missing_worker(tmp_path):
    identity = worker_reports.identity_from_cluster(TWO_WORKERS, "worker", 0)
    exchange = WorkerExchange(identity, str(tmp_path), timeout_s=0.5)
    # An epoch-end summary of worker:1 does not count at the end of fit.
    worker_reports.write_summary(summary("worker:1", 30.0, 8.0, final=False), str(tmp_path))
    began = time.monotonic()
    view = exchange.collect(summary("worker:0", 0.5, 40.0), final=True)
    assert 0.5 <= time.monotonic() - began < 5
    assert view.missing == ["worker:1"]
    assert view.straggler is None
    note = worker_reports.missing_note(view, str(tmp_path))
    assert "worker:1" in note and "same log_dir" in note
    # At the end of an epoch the chief reads what is there, without waiting.
    began = time.monotonic()
    view = exchange.collect(summary("worker:0", 0.5, 40.0, final=False), final=False)
    assert time.monotonic() - began < 0.5
    assert view.missing == [] and view.straggler == "worker:1"


def test_the_chief_stops_waiting_when_every_worker_has_finished(tmp_path):
    identity = worker_reports.identity_from_cluster(TWO_WORKERS, "worker", 0)
    exchange = WorkerExchange(identity, str(tmp_path), timeout_s=30)
    worker_reports.write_summary(summary("worker:1", 30.0, 8.0), str(tmp_path))
    began = time.monotonic()
    view = exchange.collect(summary("worker:0", 0.5, 40.0), final=True)
    assert time.monotonic() - began < 5
    assert view.straggler == "worker:1" and view.missing == []


def test_a_report_with_workers_and_cpu_round_trips_and_renders(tmp_path):
    identity = worker_reports.identity_from_cluster(TWO_WORKERS, "worker", 0)
    view = worker_reports.compare(
        identity, [summary("worker:0", 0.5, 40.0), summary("worker:1", 30.0, 8.0)], True, 0.1
    )
    report = kpt.Report(
        train=stats(0.5, 40.0),
        workers=view,
        cpu=CpuUsage(wall_s=2.0, cpu_count=2, process_cores=1.9, host_busy=0.97),
    )
    again = kpt.Report.from_json(report.to_json())
    assert again == report
    assert isinstance(again.workers.workers[1], WorkerSummary)
    assert isinstance(again.cpu, CpuUsage) and again.cpu.saturated
    markdown = render_markdown(again)
    assert "### Workers" in markdown and "straggler" in markdown
    out = io.StringIO()
    print_summary(again, file=out)
    assert "worker:1" in out.getvalue() and "straggler" in out.getvalue()


def test_a_worker_other_than_the_chief_writes_into_its_own_folder(tmp_path):
    identity = worker_reports.identity_from_cluster(TWO_WORKERS, "worker", 1)

    def begun(tensorboard_workers, who):
        settings = RunSettings(log_dir=str(tmp_path), tensorboard_workers=tensorboard_workers)
        guard = FeatureGuard()
        run = Run(settings, guard, ProfilerWindow("off", None, str(tmp_path), guard))
        run.begin(who)
        return run

    default = begun("chief", identity)
    worker_dir = str(tmp_path / "workers" / "worker_1")
    assert default.files.output_dir == worker_dir
    # Only the chief writes TensorBoard summaries unless asked otherwise.
    assert default.tensorboard is None
    everyone = begun("all", identity)
    assert everyone.tensorboard.run_dir.startswith(worker_dir)
    chief = begun("chief", worker_reports.identity_from_cluster(TWO_WORKERS, "worker", 0))
    assert chief.files.output_dir == str(tmp_path)
    assert chief.tensorboard is not None


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"tensorboard_workers": "some"}, "tensorboard_workers"),
        ({"tensorboard_workers": ["all"]}, "tensorboard_workers"),
        ({"worker_timeout_s": -1}, "worker_timeout_s"),
        ({"worker_timeout_s": float("inf")}, "worker_timeout_s"),
        ({"worker_timeout_s": "30"}, "worker_timeout_s"),
    ],
)
def test_bad_multi_worker_arguments_are_named(arguments, message):
    with pytest.raises(ValueError, match=message):
        kpt.PipelineTuner(**arguments)


def test_cpu_meter_measures_a_busy_process():
    meter = CpuMeter()
    began = time.monotonic()
    while time.monotonic() - began < 0.3:
        pass
    meter.stop()
    usage = meter.usage()
    # One busy thread: about one core, whatever else the host runs.
    assert 0.3 < usage.process_cores <= usage.cpu_count + 0.1
    assert usage.host_busy is None or 0.0 < usage.host_busy <= 1.0
    time.sleep(0.05)
    assert meter.usage() == usage
