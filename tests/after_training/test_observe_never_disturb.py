"""The tuner watches and never acts: no copy of the process, no second call of the user's Python.

Each test runs `tests.helpers.observed_training` in a process of its own, with
standard output to a pipe (as under nohup, Kubernetes or Slurm): a slow,
input-bound source that appends every element it gives to a file of its own
and prints it. Whatever the tuner runs after training, the file and the output
hold exactly what training read, and no `fork()` happens (the script's
`os.register_at_fork` hook counts them).
"""

import os
import signal
import subprocess
import sys
import time
import uuid

import psutil
import pytest

from tests.helpers.paths import REPO_ROOT

pytestmark = pytest.mark.multiprocess

EPOCHS = 3
ELEMENTS = 32
BATCH = 4
# Keras' own PyDataset reader starts on the next epoch's batches before it
# knows there is none: up to two batches more.
PY_DATASET_READ_AHEAD = 2 * BATCH


def _environment(mark: str = "") -> dict:
    environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", KPT_OBSERVED_MARK=mark)
    environment.pop("KERAS_BACKEND", None)
    return environment


def _train(tmp_path, source: str, mode: str) -> dict:
    log_file = tmp_path / "elements.txt"
    done = subprocess.run(
        [sys.executable, "-m", "tests.helpers.observed_training", source, mode, str(log_file)],
        cwd=REPO_ROOT,
        env=_environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    said = dict(line.split(" ", 1) for line in lines if not line.startswith("element "))
    return {
        "printed": [line for line in lines if line.startswith("element ")],
        "written": log_file.read_text().splitlines(),
        "calls": int(said["ELEMENTS"]),
        "forks": int(said["FORKS"]),
        "said": said,
    }


@pytest.mark.parametrize("mode", ["defaults", "measure_fixes"])
def test_a_generator_s_file_and_output_hold_what_training_read(tmp_path, mode):
    found = _train(tmp_path, "generator", mode)
    assert found["said"]["VERDICT"] == "highly input-bound", found["said"]
    # Three whole epochs of the generator: nothing more was read, written or printed.
    assert found["calls"] == EPOCHS * ELEMENTS
    assert len(found["written"]) == EPOCHS * ELEMENTS
    assert found["printed"] == [f"element {line}" for line in found["written"]]
    assert found["forks"] == 0


@pytest.mark.parametrize(
    "source, mode",
    # One worker: the advice is more workers, which measure_fixes used to time.
    [("py_dataset", "measure_fixes"), ("py_dataset_threads", "defaults")],
)
def test_a_py_dataset_s_file_and_output_hold_what_training_read(tmp_path, source, mode):
    found = _train(tmp_path, source, mode)
    assert found["said"]["VERDICT"] == "highly input-bound", found["said"]
    # Every call the process made, and no other: no copy wrote or printed.
    assert len(found["written"]) == found["calls"]
    assert sorted(found["printed"]) == sorted(f"element {line}" for line in found["written"])
    assert EPOCHS * ELEMENTS <= found["calls"] <= EPOCHS * ELEMENTS + PY_DATASET_READ_AHEAD
    assert found["forks"] == 0


@pytest.mark.parametrize("mode", ["defaults", "unverified"])
def test_a_grain_dataset_s_file_and_output_hold_what_training_read(tmp_path, mode):
    # Even where the user lets it run their Python again: the slow stage is
    # named from Grain's timing of the iterators training read.
    found = _train(tmp_path, "grain", mode)
    assert found["said"]["VERDICT"] == "highly input-bound", found["said"]
    assert found["said"]["BOTTLENECK"] == "map(give)", found["said"]
    # Keras reads two batches to learn their shapes before fit, then three
    # whole epochs: nothing more was read, written or printed.
    assert found["calls"] == 2 * BATCH + EPOCHS * ELEMENTS
    assert len(found["written"]) == found["calls"]
    assert found["printed"] == [f"element {line}" for line in found["written"]]
    assert found["forks"] == 0


def test_a_lock_held_at_the_end_of_fit_changes_nothing(tmp_path):
    # A thread takes the generator's lock as fit ends and keeps it for 6 s: a
    # copy of the process would wait for a lock that never opens there
    # (measure_fixes=True: the fixes are asked for).
    found = _train(tmp_path, "generator", "lock")
    after_s, budget_s = found["said"]["AFTER_TRAINING_S"].split(" BUDGET_S ")
    assert float(after_s) <= float(budget_s), found["said"]
    assert found["calls"] == EPOCHS * ELEMENTS == len(found["written"])
    assert found["forks"] == 0


def _marked(mark: str):
    found = []
    for process in psutil.process_iter():
        try:
            if process.environ().get("KPT_OBSERVED_MARK") == mark:
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def test_sigterm_after_an_input_bound_fit_leaves_no_process_behind(tmp_path):
    mark = uuid.uuid4().hex
    process = subprocess.Popen(
        [
            sys.executable, "-m", "tests.helpers.observed_training", "generator",
            "measure_fixes", str(tmp_path / "elements.txt"), "--ready-signal",
        ],
        cwd=REPO_ROOT,
        env=_environment(mark),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        for line in process.stdout:
            if line.strip() == "TRAINED":
                break
        # While the tuner's work after training runs (its profile conversion too).
        time.sleep(0.3)
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
        deadline = time.monotonic() + 10
        while _marked(mark) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = [(p.pid, p.cmdline()) for p in _marked(mark)]
        assert not left, left
    finally:
        for stray in _marked(mark):
            stray.kill()
        if process.poll() is None:
            process.kill()
