"""Grain's own stage timing names the slow stage of a Grain pipeline, and where it runs."""

import time

import grain
import numpy as np
import pytest

from keras_pipeline_tuner.pipeline.lint.catalogue import CATALOGUE
from keras_pipeline_tuner.pipeline.lint.grain_findings import grain_stage_findings
from keras_pipeline_tuner.profiling import grain_stages
from keras_pipeline_tuner.profiling.evidence import GRAIN

# A sleep well beyond a busy machine's scheduling slices (beside three busy
# loops, a batch of four tiny arrays once took longer than four 2 ms sleeps).
ELEMENT_S = 0.010


def slow_parse(index):
    time.sleep(ELEMENT_S)
    return np.full((3,), index, np.float32)


def cheap_scale(value):
    return value * 2


def test_map_after_to_iter_dataset_is_named_and_runs_on_the_reading_thread():
    dataset = (
        grain.MapDataset.range(64)
        .map(cheap_scale)
        .to_iter_dataset(grain.ReadOptions(num_threads=0))
        .map(slow_parse)
        .batch(4)
    )
    evidence = grain_stages.time_stages(dataset, batches=4)
    assert evidence.source == GRAIN
    assert evidence.stop_step == 4
    rows = {row.stage: (row.self_ms, row.calls) for row in evidence.iterators}
    assert evidence.bottleneck == "map(slow_parse)", rows
    labels = [row.stage for row in evidence.iterators]
    assert {"map(slow_parse)", "map(cheap_scale)", "batch", "to_iter_dataset", "range"} <= set(
        labels
    )
    slowest = evidence.iterators[0]
    assert slowest.stage == "map(slow_parse)"
    # Grain's own figure against the known sleep (generous: a shared machine).
    assert ELEMENT_S * 1e3 <= slowest.self_ms / slowest.calls <= 5 * ELEMENT_S * 1e3
    assert slowest.self_share > 0.5
    prefetch = next(row for row in evidence.iterators if row.stage == "to_iter_dataset")
    assert prefetch.waiting and prefetch.self_share == 0.0
    stage = grain_stages.placement(evidence)
    assert stage == grain_stages.GrainStage("map(slow_parse)", False, 0)
    assert "separate pass over 4 batches" in evidence.span()


def test_a_tracked_iterator_gives_the_same_elements_and_is_summed_at_once():
    dataset = (
        grain.MapDataset.range(32)
        .to_iter_dataset(grain.ReadOptions(num_threads=0))
        .map(slow_parse)
        .batch(4)
    )
    plain = [batch.tolist() for batch in dataset]
    iterator = iter(dataset)
    recorder = grain_stages.track_stages(iterator)
    tracked = [next(iterator).tolist() for _ in range(3)]
    # Read at once: Grain folds its times in every 5 s, the rest are added.
    summary = grain_stages.stage_summary(recorder)
    counts = {
        grain_stages.stage_label(node.name): node.num_produced_elements
        for node in summary.nodes.values()
    }
    assert counts["batch"] == 3 and counts["map(slow_parse)"] == 12, counts
    tracked += [batch.tolist() for batch in iterator]
    assert tracked == plain
    # Twice over the same pipeline (two epochs): each stage's figures added up.
    merged = grain_stages.merged_summary([summary, grain_stages.stage_summary(recorder)])
    assert merged.nodes[0].num_produced_elements == 3 + 8
    evidence = grain_stages.stage_evidence(merged, "timed here", "a note", batches=11)
    assert evidence.bottleneck == "map(slow_parse)" and evidence.stop_step == 11
    assert evidence.notes == ["a note"] and not evidence.timed_in_training


def test_an_untracked_iterator_has_no_summary():
    iterator = iter(grain.MapDataset.range(4))
    next(iterator)
    with pytest.raises(ValueError, match="not on"):
        grain_stages.stage_summary(iterator._stats)


def test_map_dataset_stage_is_read_on_threads_and_the_advice_runs():
    dataset = grain.MapDataset.range(64).map(slow_parse).batch(4)
    evidence = grain_stages.time_stages(dataset, batches=4)
    assert evidence.bottleneck == "map(slow_parse)"
    stage = grain_stages.placement(evidence)
    # `iter()` (and Keras) read a MapDataset through to_iter_dataset(): 16 threads.
    assert stage.on_read_threads and stage.read_threads == 16
    findings = grain_stage_findings(
        stage.label,
        evidence.bottleneck_node,
        evidence.bottleneck_iterator,
        stage.on_read_threads,
        stage.read_threads,
    )
    assert findings.ids == ["grain-read-threads"]
    finding = findings[0]
    assert finding.node == evidence.bottleneck_node and finding.function == "slow_parse"
    # The fix is code that runs on the user's MapDataset, with the same elements.
    namespace = {"grain": grain, "ds": dataset}
    exec(finding.fix, namespace)  # noqa: S102 - the advice is code to run.
    assert [b.tolist() for b in namespace["ds"]] == [b.tolist() for b in dataset]


def test_sequential_stage_fix_runs_as_written():
    finding = grain_stage_findings(
        "map(slow_parse)", "grain:1", "MapDatasetIterator(transform=slow_parse)", False, 0
    )[0]
    assert finding.id == "grain-sequential-stage"
    namespace = {
        "grain": grain,
        "slow_parse": slow_parse,
        "ds_before_to_iter_dataset": grain.MapDataset.range(8),
    }
    exec(finding.fix, namespace)  # noqa: S102 - the advice is code to run.
    assert isinstance(namespace["ds"], grain.IterDataset)
    assert [v.tolist() for v in namespace["ds"]] == [slow_parse(i).tolist() for i in range(8)]


def test_finding_ids_are_in_the_catalogue():
    assert {"grain-sequential-stage", "grain-read-threads"} <= set(CATALOGUE)


@pytest.mark.parametrize(
    "name, label",
    [
        ("MapDatasetIterator(transform=slow_parse @ .../data.py:3)", "map(slow_parse)"),
        ("MapMapDataset(transform=decode @ .../data.py:9)", "map(decode)"),
        ("BatchDatasetIterator(batch_size=4, drop_remainder=False)", "batch"),
        ("PrefetchDatasetIterator(read_options=ReadOptions(num_threads=0))", "to_iter_dataset"),
        ("SourceMapDataset(source=ArrayRecordDataSource)", "source"),
        ("ShuffleMapDataset(seed=1)", "shuffle"),
        ("RandomMapMapDataset(transform=augment)", "random_map(augment)"),
    ],
)
def test_grain_names_become_stages_as_written(name, label):
    assert grain_stages.stage_label(name) == label


def test_not_a_grain_dataset_is_refused():
    assert not grain_stages.is_grain_dataset([1, 2])
    assert grain_stages.is_grain_dataset(grain.MapDataset.range(2))
    with pytest.raises(TypeError, match="grain.MapDataset or grain.IterDataset"):
        grain_stages.time_stages([1, 2])


def test_a_fold_by_grains_thread_while_the_summary_is_read_loses_no_time(monkeypatch):
    # Grain's reporting thread folds the recorded times into its summary every
    # 5 s; here it does so (Grain's own `report()`) just after the folded
    # summary was copied and before the times waiting to be folded are read.
    dataset = (
        grain.MapDataset.range(16)
        .to_iter_dataset(grain.ReadOptions(num_threads=0))
        .map(slow_parse)
        .batch(4)
    )
    iterator = iter(dataset)
    recorder = grain_stages.track_stages(iterator)
    for _ in range(3):
        next(iterator)
    read = grain_stages._grain_summary
    folds = []

    def read_then_fold(stats):
        summary = read(stats)
        if not folds:
            folds.append(stats)
            stats.report()
        return summary

    monkeypatch.setattr(grain_stages, "_grain_summary", read_then_fold)
    summary = grain_stages.stage_summary(recorder)
    assert folds, "Grain's fold was not simulated"
    counts = {
        grain_stages.stage_label(node.name): node.num_produced_elements
        for node in summary.nodes.values()
    }
    assert counts["batch"] == 3 and counts["map(slow_parse)"] == 12, counts
    slow = next(node for node in summary.nodes.values() if node.name.startswith("MapDataset"))
    assert slow.total_processing_time_ns >= 12 * ELEMENT_S * 1e9
