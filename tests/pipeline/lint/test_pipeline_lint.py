"""The lint of tf.data pipelines: the guide's cases, each rule, random pipelines."""

import json

import hypothesis
import keras
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import strategies as st

import keras_pipeline_tuner as kpt
from keras_pipeline_tuner.pipeline.lint.catalogue import CATALOGUE
from keras_pipeline_tuner.pipeline.lint.findings import Finding
from keras_pipeline_tuner.pipeline.lint.findings import Findings
from keras_pipeline_tuner.pipeline.lint.findings import Severity
from tests.helpers import guide_pipelines as guide

no_autograph = tf.autograph.experimental.do_not_convert


def severities(findings):
    return {finding.id: str(finding.severity) for finding in findings}


def findings_pipeline_kinds(findings):
    return [stage.kind for stage in findings.pipeline.stages]


def check_well_formed(findings):
    nodes = {stage.node for stage in findings.pipeline.stages}
    for finding in findings:
        assert finding.id in CATALOGUE
        assert finding.severity in ("error", "warning", "info")
        assert finding.node in nodes, finding
        assert finding.stage == findings.pipeline.stage(finding.node).label
        assert finding.reason and finding.fix


# The guide's cases: the ids each must give, and no others.
GUIDE_EXPECTATIONS = {
    "naive": {"missing-prefetch": "info"},
    "prefetch": {},
    "sequential interleave": {"sequential-interleave": "warning", "missing-prefetch": "info"},
    "parallel interleave": {"missing-prefetch": "info"},
    "sequential map": {
        "sequential-map": "warning",
        "py-function-in-map": "warning",
        "cache-missing": "info",
        "missing-prefetch": "info",
    },
    "parallel map": {
        "py-function-in-map": "info",
        "cache-missing": "info",
        "missing-prefetch": "info",
    },
    # The cache is after the expensive map: nothing says cache-missing.
    "cache": {
        "sequential-map": "warning",
        "py-function-in-map": "warning",
        "missing-prefetch": "info",
    },
    "scalar map": {"vectorize-map": "warning", "missing-prefetch": "info"},
    "vectorised map": {"missing-prefetch": "info"},
}


@pytest.mark.parametrize("name", sorted(GUIDE_EXPECTATIONS))
def test_guide_cases(name):
    findings = kpt.inspect(guide.CASES[name].build())
    check_well_formed(findings)
    assert severities(findings) == GUIDE_EXPECTATIONS[name]


def test_guide_details():
    naive = kpt.inspect(guide.naive())
    assert "injects" in naive[0].reason
    sequential = kpt.inspect(guide.sequential_map())
    by_id = {finding.id: finding for finding in sequential}
    assert by_id["sequential-map"].function == "mapped_function"
    assert by_id["sequential-map"].fix == (
        "ds = ds.map(mapped_function, num_parallel_calls=tf.data.AUTOTUNE)"
    )
    assert "EagerPyFunc" in by_id["py-function-in-map"].reason
    scalar = kpt.inspect(guide.scalar_map())
    assert scalar[0].fix == (
        "ds = ds.batch(256).map(increment, num_parallel_calls=tf.data.AUTOTUNE)"
        "  # in place of: map(increment) -> batch(256)"
    )


def test_cache_before_the_expensive_map_is_missing_a_cache():
    findings = kpt.inspect(guide.cache_before_map())
    check_well_formed(findings)
    (missing,) = [finding for finding in findings if finding.id == "cache-missing"]
    assert missing.function == "mapped_function"
    assert "stores its input, not its output" in missing.reason


@pytest.fixture(scope="module")
def image_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("images")
    guide.write_images(directory, count=8, size=16)
    return directory


@pytest.mark.parametrize("augment", ["tf", "keras"])
def test_recommended_image_pipeline_is_clean(image_dir, augment):
    ds = guide.image_pipeline(image_dir, augment=augment)
    findings = kpt.inspect(ds)
    check_well_formed(findings)
    assert [s.kind for s in findings.pipeline.stages] == [
        "list_files",
        "shuffle",
        "map",
        "cache",
        "shuffle",
        "batch",
        "map",
        "prefetch",
    ]
    assert not findings.of_severity("error") and not findings.of_severity("warning"), findings
    images, labels = next(iter(ds))
    assert images.shape == (4, 16, 16, 3) and labels.shape == (4,)


@pytest.mark.parametrize(
    "augment, function", [("tf", "random_flip"), ("keras", "random_flip_layer")]
)
def test_cache_after_random_flip_is_an_error(image_dir, augment, function):
    ds = guide.image_pipeline(image_dir, augment=augment, cache_after_augment=True)
    findings = kpt.inspect(ds)
    check_well_formed(findings)
    errors = findings.of_severity("error")
    assert errors.ids == ["cache-after-random"]
    assert errors[0].function == function
    assert findings[0].id == "cache-after-random"  # errors come first
    assert set(findings.ids) == {"cache-after-random", "cache-after-shuffle", "memory-order"}


def test_each_rule_on_its_own():
    numbers = tf.data.Dataset.range(64)
    double = no_autograph(lambda x: x * 2)

    shuffled_batches = kpt.inspect(numbers.batch(8).shuffle(4).prefetch(tf.data.AUTOTUNE))
    assert severities(shuffled_batches) == {"shuffle-after-batch": "warning"}
    # A buffer of 4 batches of 8 becomes one of 32 examples, not of 4.
    assert shuffled_batches[0].fix.startswith("ds = ds.shuffle(32).batch(8)")

    fixed = kpt.inspect(numbers.map(double, num_parallel_calls=4).prefetch(2))
    assert [f.id for f in fixed] == ["fixed-parallelism", "fixed-parallelism"]
    assert {f.op for f in fixed} == {"ParallelMapDatasetV2", "PrefetchDataset"}

    frozen_order = kpt.inspect(numbers.shuffle(64).cache().batch(8).prefetch(tf.data.AUTOTUNE))
    assert severities(frozen_order) == {"cache-after-shuffle": "warning"}
    reshuffled = kpt.inspect(numbers.shuffle(64).cache().shuffle(64).prefetch(tf.data.AUTOTUNE))
    assert reshuffled.ids == []

    options = tf.data.Options()
    options.autotune.enabled = False
    options.experimental_optimization.map_parallelization = False
    switched_off = kpt.inspect(numbers.batch(8).with_options(options))
    assert severities(switched_off) == {
        "autotune-disabled": "warning",
        "missing-prefetch": "warning",
    }
    (options_finding,) = [f for f in switched_off if f.id == "autotune-disabled"]
    assert "map_parallelization" in options_finding.reason
    assert options_finding.op == "OptionsDataset"

    @no_autograph
    def grow(x):
        return tf.fill((64, 64), tf.cast(x, tf.float32))

    grown = kpt.inspect(numbers.map(grow, num_parallel_calls=tf.data.AUTOTUNE).shuffle(32))
    (memory,) = [f for f in grown if f.id == "memory-order"]
    assert "2048x larger" in memory.reason and "512.0 KB" in memory.reason

    @no_autograph
    def seeded_flip(x):
        return tf.image.stateless_random_flip_left_right(x, seed=(1, 2))

    images = tf.data.Dataset.from_tensor_slices(np.zeros((4, 8, 8, 3), np.float32))
    same_every_epoch = kpt.inspect(images.map(seeded_flip).cache())
    assert "cache-after-random" not in same_every_epoch.ids

    @no_autograph
    def jitter(x):
        return x + tf.random.uniform([], maxval=3, dtype=tf.int64)

    in_memory = numbers.interleave(no_autograph(tf.data.Dataset.from_tensors), cycle_length=2)
    assert "sequential-interleave" not in kpt.inspect(in_memory).ids

    opaque = kpt.inspect(numbers.unique().map(jitter).cache())
    check_well_formed(opaque)
    assert findings_pipeline_kinds(opaque)[:2] == ["range", "UniqueDataset"]
    assert "cache-after-random" in opaque.ids

    random_sequential = kpt.inspect(numbers.map(jitter).prefetch(tf.data.AUTOTUNE))
    assert severities(random_sequential) == {"sequential-map": "warning"}
    assert "random" in random_sequential[0].reason


def test_files(tmp_path):
    files = guide.write_tfrecords(tmp_path, count=3)
    sequential = kpt.inspect(tf.data.TFRecordDataset(files).prefetch(tf.data.AUTOTUNE))
    assert severities(sequential) == {"sequential-file-read": "warning"}
    assert "num_parallel_reads=tf.data.AUTOTUNE" in sequential[0].fix
    parallel = kpt.inspect(
        tf.data.TFRecordDataset(files, num_parallel_reads=tf.data.AUTOTUNE).prefetch(
            tf.data.AUTOTUNE
        )
    )
    assert parallel.ids == []
    flat = kpt.inspect(
        tf.data.Dataset.list_files(str(tmp_path / "*.tfrecord"))
        .flat_map(tf.data.TFRecordDataset)
        .prefetch(tf.data.AUTOTUNE)
    )
    assert flat.ids == ["sequential-interleave"]
    assert flat[0].stage == "flat_map(TFRecordDataset)"


class Batches(keras.utils.PyDataset):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)

    def __len__(self):
        return 2

    def __getitem__(self, index):
        return np.zeros((4, 8), np.float32), np.zeros((4,), np.float32)


def test_py_dataset_advice_is_about_workers():
    single = kpt.inspect(Batches())
    check_well_formed(single)
    assert severities(single) == {"py-dataset-workers": "warning"}
    assert "workers=4" in single[0].fix
    assert severities(kpt.inspect(Batches(workers=4))) == {"py-dataset-threads": "info"}
    assert kpt.inspect(Batches(workers=2, use_multiprocessing=True)).ids == []


def test_bad_input_names_the_fix():
    with pytest.raises(TypeError, match="from_tensor_slices"):
        kpt.inspect(np.zeros((4, 2)))


def test_large_in_memory_data_is_read_over_stand_ins_or_refused_before_copying_it():
    megabyte = tf.data.Dataset.from_tensor_slices(np.zeros((2**16, 4), np.float32))
    assert kpt.inspect(megabyte.batch(8), max_in_memory_bytes=2**19).ids == ["missing-prefetch"]
    # A transformation the stand-in reading does not rebuild: refused, with the way out.
    with pytest.raises(ValueError, match=r"about 1 MB .* x\[:1000\]"):
        kpt.inspect(megabyte.padded_batch(8), max_in_memory_bytes=2**19)


def test_findings_print_and_round_trip_through_the_report():
    findings = kpt.inspect(guide.sequential_map())
    text = str(findings)
    for finding in findings:
        assert finding.id in text
    assert "Pipeline inspection: 2 warnings, 2 infos" in text
    assert str(Findings()).startswith("Pipeline inspection: no findings")
    report = kpt.Report(findings=list(findings))
    again = kpt.Report.from_json(report.to_json())
    assert again.findings == list(findings)
    assert isinstance(again.findings[0].severity, Severity)
    assert json.loads(report.to_json())["findings"][0]["severity"] in ("warning", "info")
    with pytest.raises(ValueError, match="findings"):
        kpt.Report.from_json(json.dumps({"findings": [{"id": "x", "severity": "fatal"}]}))


def test_finding_is_plain_data():
    finding = Finding("vectorize-map", Severity.WARNING, "map(f)", "n", "MapDataset", "f", "r", "x")
    assert finding.severity == "warning"
    assert Finding("x", "info", "s", "n", "op", None, "r", "f").severity is Severity.INFO
    with pytest.raises(ValueError, match="severity must be one of"):
        Finding("x", "fatal", "s", "n", "op", None, "r", "f")
    with pytest.raises(ValueError, match="severity"):
        Findings([finding]).of_severity("fatal")


# Random pipelines from the common transformations.

TRANSFORMATIONS = [
    "map",
    "parallel map",
    "random map",
    "python map",
    "batch",
    "unbatch",
    "shuffle",
    "cache",
    "prefetch",
    "repeat",
    "take",
    "filter",
    "interleave",
    "flat_map",
    "zip",
    "options",
]


def _source(kind):
    if kind == "range":
        return tf.data.Dataset.range(12)
    if kind == "slices":
        return tf.data.Dataset.from_tensor_slices(np.arange(12, dtype=np.int64))

    def generate():
        yield from range(12)

    return tf.data.Dataset.from_generator(
        generate, output_signature=tf.TensorSpec((), tf.int64)
    )


@no_autograph
def _python_identity(x):
    y = tf.py_function(lambda a: a, [x], tf.int64)
    return tf.reshape(y, tf.shape(x))


@no_autograph
def _jitter(x):
    return x + tf.random.uniform(tf.shape(x), maxval=2, dtype=tf.int64)


def _apply(ds, name, rank):
    """Applies one transformation; returns the dataset and its element rank."""
    if name == "map":
        return ds.map(no_autograph(lambda x: x * 2)), rank
    if name == "parallel map":
        return ds.map(no_autograph(lambda x: x + 1), num_parallel_calls=tf.data.AUTOTUNE), rank
    if name == "random map":
        return ds.map(_jitter), rank
    if name == "python map":
        return ds.map(_python_identity), rank
    if name == "batch":
        return ds.batch(2), rank + 1
    if name == "unbatch":
        return ds.unbatch(), rank - 1
    if name == "shuffle":
        return ds.shuffle(4), rank
    if name == "cache":
        return ds.cache(), rank
    if name == "prefetch":
        return ds.prefetch(tf.data.AUTOTUNE), rank
    if name == "repeat":
        return ds.repeat(2), rank
    if name == "take":
        return ds.take(20), rank
    if name == "filter":
        return ds.filter(no_autograph(lambda x: tf.reduce_all(x >= 0))), rank
    if name == "interleave":
        return (
            ds.interleave(
                no_autograph(lambda x: tf.data.Dataset.from_tensors(x).repeat(2)),
                cycle_length=2,
                num_parallel_calls=tf.data.AUTOTUNE,
            ),
            rank,
        )
    if name == "flat_map":
        return ds.flat_map(no_autograph(lambda x: tf.data.Dataset.from_tensors(x))), rank
    if name == "zip":
        return tf.data.Dataset.zip((ds, ds)).map(no_autograph(lambda a, b: a + b)), rank
    options = tf.data.Options()
    options.autotune.enabled = False
    return ds.with_options(options), rank


def _has_pair(names, first, second, broken_by=()):
    """Whether `first` comes before `second` with none of `broken_by` in between."""
    for i, name in enumerate(names):
        if name != first:
            continue
        for later in names[i + 1 :]:
            if later in broken_by:
                break
            if later == second:
                return True
    return False


@hypothesis.settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[hypothesis.HealthCheck.too_slow],
    derandomize=True,
)
@hypothesis.given(
    source=st.sampled_from(["range", "slices", "generator"]),
    names=st.lists(st.sampled_from(TRANSFORMATIONS), min_size=0, max_size=8),
)
def test_random_pipelines(source, names):
    ds, rank, applied = _source(source), 0, []
    for name in names:
        if name == "unbatch" and rank == 0:
            # A dataset of scalars cannot be unbatched.
            name = "batch"
        ds, rank = _apply(ds, name, rank)
        applied.append(name)
    findings = kpt.inspect(ds)
    check_well_formed(findings)
    assert str(findings).startswith("Pipeline inspection")
    # Oracles: the rules about wrong data fire exactly when the pipeline has the flaw.
    assert ("cache-after-random" in findings.ids) == _has_pair(applied, "random map", "cache")
    assert ("shuffle-after-batch" in findings.ids) == _has_pair(
        applied, "batch", "shuffle", broken_by=("unbatch",)
    )


# vectorize-map: advise only code that runs, and gives the same batches.


@tf.autograph.experimental.do_not_convert
def _ranges(x):
    return tf.range(x)


@tf.autograph.experimental.do_not_convert
def _scaled(x):
    return tf.cast(x, tf.float32) * 2.0 + 1.0


@tf.autograph.experimental.do_not_convert
def _filled(x):
    return tf.fill([3], x)


def _run_advice(fix, source, function):
    namespace = {"ds": source, "tf": tf, function.__name__: function}
    exec(fix, namespace)  # the advised code, as the user would paste it
    return [batch.numpy() for batch in namespace["ds"]]


@pytest.mark.parametrize(
    "function, batching",
    [(_ranges, "ragged_batch"), (_filled, "batch")],
    ids=["ragged_batch after map(tf.range)", "map(tf.fill) before batch"],
)
def test_vectorize_map_is_not_advised_where_batching_first_breaks(function, batching):
    source = tf.data.Dataset.range(1, 9)
    dataset = getattr(source.map(function), batching)(2)
    assert "vectorize-map" not in [finding.id for finding in kpt.inspect(dataset)]
    # Why not: the advised form raises on these pipelines.
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError)):
        [batch for batch in source.batch(2).map(function)]


def test_vectorize_map_advice_runs_and_gives_the_same_batches():
    source = tf.data.Dataset.range(1, 9)
    dataset = source.map(_scaled).batch(2)
    (finding,) = [f for f in kpt.inspect(dataset) if f.id == "vectorize-map"]
    advised = _run_advice(finding.fix, source, _scaled)
    expected = [batch.numpy() for batch in dataset]
    assert len(advised) == len(expected) == 4
    for got, want in zip(advised, expected):
        np.testing.assert_array_equal(got, want)


def test_large_constants_inside_flat_map_are_refused_before_copying_them():
    array = np.zeros((2**16, 4), np.float32)  # 1 MB, a constant of the flat_map function
    nested = tf.data.Dataset.range(2).flat_map(
        lambda _: tf.data.Dataset.from_tensor_slices(array)
    ).batch(8)
    with pytest.raises(ValueError, match=r"about 1 MB"):
        kpt.inspect(nested, max_in_memory_bytes=2**19)
    assert "missing-prefetch" in kpt.inspect(nested).ids
