"""Grain's stage timing of the iterators training reads: turned on, read, and put back.

The fits themselves run on every backend in `test_backends.py`; here the timer
is driven as `tuner.iterate` drives it, on tiny Grain pipelines.
"""

import logging
import time

import grain
import numpy as np

from keras_pipeline_tuner.instrumentation.grain_stage_timing import GrainStageTimer

ELEMENT_S = 0.002


def slow_parse(index):
    time.sleep(ELEMENT_S)
    return {"x": np.full((2,), index, np.float32), "label": int(index % 2)}


def size_warning() -> logging.LogRecord:
    # The warning Grain logs through absl while it times stages.
    return logging.LogRecord(
        "absl", logging.WARNING, __file__, 1,
        "Unsupported type for estimating memory usage: %s", (int,), None,
    )


def test_a_loops_passes_are_timed_and_the_datasets_recorders_put_back():
    dataset = grain.MapDataset.range(16).map(slow_parse).batch(4)
    # Read once before (as Keras does to learn a Grain dataset's batch
    # shapes): its nodes hold Grain's recorders that do nothing.
    plain = [batch["x"].tolist() for batch in dataset]
    before = [vars(node)["_stats"] for node in (dataset, *_ancestors(dataset))]
    absl = logging.getLogger("absl")
    assert absl.filter(size_warning())

    timer = GrainStageTimer()
    timer.begin_tracking()
    assert timer.so_far() is None
    passes = []
    for _ in range(2):
        iterator = iter(dataset)
        timer.track(iterator)
        passes.append([batch["x"].tolist() for batch in iterator])
        del iterator
    # While the stages are timed, Grain's warning about element sizes is not shown.
    assert not absl.filter(size_warning())
    so_far = timer.so_far()
    evidence = timer.end()

    assert passes == [plain, plain]
    assert so_far.bottleneck == evidence.bottleneck == "map(slow_parse)"
    assert evidence.timed_in_training and evidence.stop_step == 2 * 4
    assert "2 iterators" in evidence.trigger and "the loop read" in evidence.trigger
    timed = next(row for row in evidence.iterators if row.stage == "map(slow_parse)")
    assert timed.calls == 2 * 16
    assert evidence.span() == "the 8 batches training read"
    # Put back: the dataset's nodes hold what they held, the warning shows again.
    after = [vars(node)["_stats"] for node in (dataset, *_ancestors(dataset))]
    assert all(a is b for a, b in zip(before, after))
    assert absl.filter(size_warning())
    # Ended: later iterators are not timed, the evidence stays.
    late = iter(dataset)
    timer.track(late)
    assert type(vars(late).get("_stats")).__name__ != "_ExecutionStats"
    assert timer.end() is evidence


def test_the_timing_is_turned_off_after_its_window():
    dataset = (
        grain.MapDataset.range(16)
        .to_iter_dataset(grain.ReadOptions(num_threads=0))
        .map(slow_parse)
        .batch(4)
    )
    plain = [batch["x"].tolist() for batch in dataset]
    timer = GrainStageTimer(window=3)
    timer.begin_tracking()
    first = iter(dataset)
    timer.track(first)
    passes = [[next(first)["x"].tolist() for _ in range(3)]]
    # Off on the thread reading the batches, once the window's third was made.
    assert type(first._stats).__name__ == "_DefaultStats"
    passes[0] += [batch["x"].tolist() for batch in first]
    second = iter(dataset)
    timer.track(second)  # the window is used up: not timed
    passes.append([batch["x"].tolist() for batch in second])
    assert type(second._stats).__name__ == "_DefaultStats"
    evidence = timer.end()
    assert passes == [plain, plain]
    assert evidence.stop_step == 3 and evidence.bottleneck == "map(slow_parse)"
    assert evidence.trigger.startswith("Grain's own stage timing of the first 3 batches")
    assert "then turned off" in evidence.trigger
    timed = next(row for row in evidence.iterators if row.stage == "map(slow_parse)")
    assert timed.calls == 3 * 4


def test_a_failure_is_reported_once_and_the_iterator_goes_on():
    failures = []
    timer = GrainStageTimer(on_failure=failures.append)
    timer.begin_tracking()
    timer.track(object())  # not a Grain iterator: Grain's timing cannot be set
    timer.track(object())
    assert len(failures) == 1 and "AttributeError" in failures[0]
    iterator = iter(grain.MapDataset.range(3))
    timer.track(iterator)  # after a failure: left alone
    assert list(iterator) == [0, 1, 2]
    assert timer.end() is None


def test_outside_a_fit_nothing_is_replaced():
    timer = GrainStageTimer()
    assert not timer.begin(object(), "jax")
    assert timer.notes == [] and timer.end() is None


def test_a_grain_data_loader_is_left_alone_and_said_so():
    import keras

    import keras_pipeline_tuner as kpt

    x = np.arange(64, dtype=np.float32).reshape(16, 4)
    loader = grain.DataLoader(
        data_source=[(row, row[:1]) for row in x],
        sampler=grain.samplers.IndexSampler(16, num_epochs=1, shuffle=False, seed=0),
        operations=[grain.transforms.Batch(4)],
        worker_count=0,
    )
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    tuner = kpt.PipelineTuner(verbose=0, profile="off")
    model.fit(loader, epochs=1, callbacks=[tuner], verbose=0)
    report = tuner.report
    assert any("fit was given a grain.DataLoader" in note for note in report.notes)
    assert not tuner.guard.failures and report.profile is None


def _ancestors(dataset):
    while dataset.parents:
        dataset = dataset.parents[0]
        yield dataset
