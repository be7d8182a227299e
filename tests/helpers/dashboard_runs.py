"""Two real fits in one log dir, as the demo leaves them: a naive and a tuned pipeline.

- naive: a sequential map whose `tf.py_function` sleeps `MAP_DELAY_S` per
  element (input-bound; the profiler window names that map);
- tuned: the same pipeline with the tf.data guide's fix (the map parallel, a
  prefetch at the end), which waits clearly less whatever the machine's load,
  with `kpt.tune`'s result for the naive pipeline written beside it (what
  `kpt.tune` keeps on a busy shared machine varies; the fixed pipeline does not);
- with_grain: a fit on a Grain pipeline whose one map sleeps, after `to_iter_dataset`
  (input-bound; Grain's own stage timing names the map), only as `report.json`;
- workers: a two-worker job's report as the chief writes it, only as
  `report.json` (like a run older than the dashboard): the two workers' figures
  are the two fits' measured statistics, compared by the tuner's own code (the
  naive pipeline's worker is the straggler).

Run once per test session and shared by the dashboard's tests.
"""

import dataclasses
import pathlib
import time

import numpy as np
import tensorflow as tf

import keras_pipeline_tuner as kpt
from keras_pipeline_tuner.outputs.report import REPORT_FILENAME
from keras_pipeline_tuner.workers import exchange
from tests.helpers.advised_fits import load_slowly
from tests.helpers.training_data import FEATURES
from tests.helpers.training_data import cached_source
from tests.helpers.training_data import tiny_model

STEPS = 40
EPOCHS = 2
# Enough for kpt.tune to time the parallel map and the prefetch on a shared machine.
TUNE_BUDGET_S = 30
NAIVE = "naive"
TUNED = "tuned"
WORKERS = "workers"
# Listed after the naive and tuned runs, which the tab compares by default.
GRAIN = "with_grain"
GRAIN_ELEMENT_S = 0.004

_runs = {}


@dataclasses.dataclass
class TwoRuns:
    """The parent log dir and each run's tuner and tune result."""

    log_dir: pathlib.Path
    naive: object
    tuned: object
    tune_result: object


def two_runs(tmp_path_factory) -> TwoRuns:
    """Trains both runs once per session."""
    if "two" not in _runs:
        log_dir = tmp_path_factory.mktemp("dashboard")
        naive_ds = cached_source(STEPS).map(load_slowly).batch(1)
        naive = kpt.PipelineTuner(log_dir=log_dir / NAIVE, verbose=0)
        tiny_model().fit(naive_ds, epochs=EPOCHS, callbacks=[naive], verbose=0)
        # Its profiler window's evidence, and the outputs written again with it.
        naive.wait_for_profile()
        _, result = kpt.tune(naive_ds, budget_s=TUNE_BUDGET_S, verbose=0)
        tuned_ds = (
            cached_source(STEPS)
            .map(load_slowly, num_parallel_calls=tf.data.AUTOTUNE)
            .batch(1)
            .prefetch(tf.data.AUTOTUNE)
        )
        tuned = kpt.PipelineTuner(log_dir=log_dir / TUNED, verbose=0, profile="off")
        tiny_model().fit(tuned_ds, epochs=EPOCHS, callbacks=[tuned], verbose=0)
        kpt.write_tune_result(log_dir / TUNED, result)
        _write_workers_report(log_dir / WORKERS, naive.report, tuned.report)
        _write_grain_report(log_dir / GRAIN)
        _runs["two"] = TwoRuns(log_dir, naive, tuned, result)
    return _runs["two"]


def _write_workers_report(log_dir: pathlib.Path, slow, fast) -> None:
    tasks = ("worker:0", "worker:1")
    identity = exchange.WorkerIdentity(task=tasks[0], chief=tasks[0], tasks=tasks)
    workers = [
        exchange.WorkerSummary(
            task=tasks[0], chief=True, final=True, epochs=EPOCHS, train=fast.train
        ),
        exchange.WorkerSummary(task=tasks[1], final=True, epochs=EPOCHS, train=slow.train),
    ]
    report = dataclasses.replace(fast, workers=exchange.compare(identity, workers, final=True))
    log_dir.mkdir()
    (log_dir / REPORT_FILENAME).write_text(report.to_json())


def slow_parse(index):
    """The Grain run's map: sleeps `GRAIN_ELEMENT_S`, then makes element `index`."""
    time.sleep(GRAIN_ELEMENT_S)
    x = np.full((FEATURES,), index % 7, np.float32)
    return x, np.float32(index % 2)


def _write_grain_report(log_dir: pathlib.Path) -> None:
    import grain

    dataset = (
        grain.MapDataset.range(STEPS * 4)
        .to_iter_dataset(grain.ReadOptions(num_threads=0))
        .map(slow_parse)
        .batch(4)
    )
    # Grain's stage timing reads the dataset again, which runs its map again: asked for.
    tuner = kpt.PipelineTuner(
        verbose=0, profile="off", measure_fixes=True, allow_unverified=True
    )
    tiny_model().fit(dataset, epochs=1, callbacks=[tuner], verbose=0)
    log_dir.mkdir()
    (log_dir / REPORT_FILENAME).write_text(tuner.report.to_json())


def run_name(name: str) -> str:
    """The TensorBoard run holding the tuner's outputs for `name`."""
    from keras_pipeline_tuner.outputs.dashboard.summaries import RUN

    return f"{name}/{RUN}"
