"""Two MultiWorkerMirroredStrategy workers, each with a tuner: the chief compares them.

Each test starts two real worker processes on loopback ports (in a private
network namespace, see `private_network`) that fit the same model in lockstep.
"""

import json
import os
import sys

import pytest

from keras_pipeline_tuner.outputs.report import Report
from tests.helpers import private_network
from tests.helpers.paths import HELPERS

# Clusters of worker processes, some 15 s each: CI's slow pass.
pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]
SCRIPT = HELPERS / "multi_worker_training.py"


def run_cluster(tmp_path, *options):
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    result = private_network.run_isolated(
        [sys.executable, str(SCRIPT), "launch", "--log-dir", str(log_dir), *options],
        timeout=170,
        cwd=tmp_path,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    cluster = json.loads(result.stdout.strip().splitlines()[-1])
    for worker in cluster["workers"]:
        assert worker["returncode"] == 0, worker["stderr"]
        assert worker["result"] is not None, worker["stderr"]
    chief, other = (worker["result"] for worker in cluster["workers"])
    return log_dir, chief, other, cluster["workers"]


@pytest.fixture(autouse=True)
def namespace():
    private_network.require()


def test_the_chief_names_the_worker_with_slow_input(tmp_path):
    # worker:1 sleeps 200 ms per batch (far longer than a step, however busy the
    # machine); worker:0's input is in memory.
    log_dir, chief, other, _ = run_cluster(
        tmp_path, "--slow-task", "1", "--delay", "0.2", "--tensorboard-workers", "all"
    )
    # Synchronous training: both ran every step and trained the same model.
    assert chief["steps"] == other["steps"] == 23
    assert chief["loss"] == pytest.approx(other["loss"])
    assert chief["straggler"] == "worker:1"
    assert chief["missing"] == []
    # The slow input shows as input wait on worker:1 only; worker:0 waits for
    # it inside the all-reduce, counted as compute.
    assert other["input_wait_ms"] > 2 * chief["input_wait_ms"]
    assert chief["compute_ms"] > other["compute_ms"]

    report = Report.from_json((log_dir / "report.json").read_text())
    assert report.workers.task == "worker:0" and report.workers.straggler == "worker:1"
    assert [worker.task for worker in report.workers.workers] == ["worker:0", "worker:1"]
    assert all(worker.final for worker in report.workers.workers)
    assert report.recommendations[0].id == "input-straggler"
    assert "worker:1" in report.recommendations[0].title
    # worker:1 wrote its report and, with tensorboard_workers="all", its run
    # into its own folder; nothing of the chief's was overwritten.
    worker_dir = log_dir / "workers" / "worker_1"
    own = Report.from_json((worker_dir / "report.json").read_text())
    assert own.workers.task == "worker:1" and own.workers.straggler is None
    assert list((worker_dir / "pipeline_tuner").glob("events.out.tfevents.*"))
    assert list((log_dir / "pipeline_tuner").glob("events.out.tfevents.*"))


def test_a_worker_whose_tuner_fails_delays_the_chief_boundedly(tmp_path):
    # worker:1's tuner cannot write anything (its log dir is under a file);
    # training must go on, and the chief waits for it 3 s at most.
    log_dir, chief, other, workers = run_cluster(
        tmp_path, "--blocked-task", "1", "--worker-timeout-s", "3"
    )
    assert chief["steps"] == other["steps"] == 23
    assert chief["loss"] == pytest.approx(other["loss"])
    assert "worker summary" in other["failures"]
    assert "turned off" in workers[1]["stderr"]
    assert chief["missing"] == ["worker:1"]
    assert chief["straggler"] is None
    assert 2.5 <= chief["waited_s"] <= 20
    report = Report.from_json((log_dir / "report.json").read_text())
    assert any("worker:1" in note for note in report.notes)
    # By default only the chief writes TensorBoard summaries.
    assert list((log_dir / "pipeline_tuner").glob("events.out.tfevents.*"))
    assert not list((log_dir / "workers").glob("*/pipeline_tuner"))


def test_custom_training_loops_are_compared_too(tmp_path):
    # The same training as a custom loop: `tuner.instrument` on a step that
    # runs `strategy.run`, the cluster found from TF_CONFIG.
    log_dir, chief, other, _ = run_cluster(
        tmp_path, "--slow-task", "1", "--delay", "0.2", "--loop", "custom"
    )
    assert chief["steps"] == other["steps"] == 23
    assert chief["loss"] == pytest.approx(other["loss"])
    assert chief["straggler"] == "worker:1" and chief["missing"] == []
    assert chief["recommendations"][0] == "input-straggler"
    report = Report.from_json((log_dir / "report.json").read_text())
    assert report.workers.straggler == "worker:1"
    assert (log_dir / "workers" / "worker_1" / "report.json").is_file()
