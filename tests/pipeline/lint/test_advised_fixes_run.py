"""Every code fix the lint prints runs on the pipeline it is about, as written.

Each pipeline below is written as a user would write it, one line a stage. For
every finding whose fix is code (`ds = ...`), the fix is applied as it says:
in place of the finding's stage, or of the stages its `# in place of:` comment
lists, or `# after:` a stage. The fixed pipeline must build, yield elements,
and, inspected again, show no finding the original did not have and not the
one that was fixed.
"""

import re

import pytest
import tensorflow as tf

import keras_pipeline_tuner as kpt
from keras_pipeline_tuner.pipeline.graph.reader import read_pipeline
from tests.helpers import guide_pipelines as guide


def load(path):
    return guide.decode_image(path)


def augment(image, label):
    return tf.image.random_flip_left_right(image), label


def increment(x):
    return x + 1


def slow_python(x):
    return tf.py_function(lambda v: v, [x], tf.int64)


PIPELINES = {
    "load after shuffle, no cache": [
        "ds = tf.data.Dataset.from_tensor_slices(paths)",
        "ds = ds.shuffle(8)",
        "ds = ds.map(load)",
        "ds = ds.batch(4)",
    ],
    "cache after augmentation": [
        "ds = tf.data.Dataset.from_tensor_slices(paths)",
        "ds = ds.map(load, num_parallel_calls=tf.data.AUTOTUNE)",
        "ds = ds.map(augment, num_parallel_calls=tf.data.AUTOTUNE)",
        "ds = ds.cache()",
        "ds = ds.batch(4)",
    ],
    "scalar map before batch": [
        "ds = tf.data.Dataset.range(1000)",
        "ds = ds.map(increment)",
        "ds = ds.batch(256)",
    ],
    "shuffle after batch": [
        "ds = tf.data.Dataset.range(100)",
        "ds = ds.batch(10)",
        "ds = ds.shuffle(5)",
    ],
    "cache after shuffle": [
        "ds = tf.data.Dataset.range(100)",
        "ds = ds.shuffle(10)",
        "ds = ds.cache()",
        "ds = ds.batch(10)",
    ],
    "hard-coded parallelism": [
        "ds = tf.data.Dataset.range(100)",
        "ds = ds.map(slow_python, num_parallel_calls=2)",
        "ds = ds.batch(10)",
        "ds = ds.prefetch(2)",
    ],
    "shuffle buffers decoded images": [
        "ds = tf.data.Dataset.from_tensor_slices(paths)",
        "ds = ds.map(load, num_parallel_calls=tf.data.AUTOTUNE)",
        "ds = ds.shuffle(8)",
        "ds = ds.batch(4)",
    ],
    "sequential Python map": [
        "ds = guide.artificial_source(3)",
        "ds = ds.map(guide.mapped_function)",
    ],
    "sequential interleave": [
        "ds = tf.data.Dataset.range(2)",
        "ds = ds.interleave(guide.open_artificial_source)",
    ],
    "files read one after another": [
        "ds = tf.data.TFRecordDataset(files)",
        "ds = ds.batch(2)",
    ],
    "autotune off": [
        "ds = tf.data.Dataset.range(100)",
        "ds = ds.batch(10)",
        "options = tf.data.Options(); options.autotune.enabled = False",
        "ds = ds.with_options(options)",
    ],
}
_PLACE = re.compile(r"#\s*(in place of|after):\s*(.+?)(?:;|$)", re.MULTILINE)


@pytest.fixture(scope="module")
def namespace(tmp_path_factory):
    directory = tmp_path_factory.mktemp("fixes")
    return dict(
        tf=tf,
        guide=guide,
        load=load,
        augment=augment,
        increment=increment,
        mapped_function=guide.mapped_function,
        open_artificial_source=guide.open_artificial_source,
        slow_python=slow_python,
        paths=guide.write_images(directory / "images", count=8),
        files=guide.write_tfrecords(directory / "records", count=3),
    )


def build(lines, names):
    """Runs the lines; returns the dataset and the final stage's label after each."""
    scope, labels = dict(names), []
    for line in lines:
        exec(line, scope)  # noqa: S102 - the test's own pipeline code
        ds = scope.get("ds")
        labels.append(read_pipeline(ds).final.label if ds is not None else None)
    return scope["ds"], labels


def apply(lines, labels, finding, names):
    """The pipeline's lines with the finding's fix applied as the fix says."""
    place = _PLACE.search(finding.fix)
    where, span = ("in place of", [finding.stage]) if place is None else (
        place.group(1),
        [label.strip() for label in place.group(2).split("->")],
    )
    indices = []
    for label in span:
        assert label in labels, f"{finding.id}: {label!r} is not a stage of {labels}"
        indices.append(labels.index(label))
    first, last = min(indices), max(indices)
    assert indices == list(range(first, last + 1)), f"{finding.id}: span {span} not contiguous"
    if where == "after":
        return lines[: last + 1] + [finding.fix] + lines[last + 1 :]
    return lines[:first] + [finding.fix] + lines[last + 1 :]


def code_fixes(findings):
    return [finding for finding in findings if finding.fix.startswith("ds = ")]


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_every_code_fix_runs_and_adds_no_finding(name, namespace):
    lines = PIPELINES[name]
    ds, labels = build(lines, namespace)
    before = kpt.inspect(ds)
    fixes = code_fixes(before)
    assert fixes, f"{name}: no code fix to check ({[f.id for f in before]})"
    for finding in fixes:
        fixed_lines = apply(lines, labels, finding, namespace)
        fixed, _ = build(fixed_lines, namespace)
        assert list(fixed.take(2)), f"{name}: {finding.fix!r} yields nothing"
        after = kpt.inspect(fixed)
        new = set(after.ids) - set(before.ids)
        assert not new, f"{name}: applying {finding.fix!r} raised {new}:\n{after}"
        def count(findings):
            return sum(f.id == finding.id and f.severity == finding.severity for f in findings)

        assert count(after) < count(before), f"{name}: {finding.fix!r} did not fix it:\n{after}"


def test_cache_missing_after_shuffle_moves_the_shuffle(namespace):
    ds, _ = build(PIPELINES["load after shuffle, no cache"], namespace)
    missing = next(f for f in kpt.inspect(ds) if f.id == "cache-missing")
    # One change per fix: the map stays as written (its parallelism is a finding of its own).
    assert missing.fix.startswith("ds = ds.map(load).cache().shuffle(8)")
    assert "in place of: shuffle(8) -> map(load)" in missing.fix


def test_a_parallel_python_map_is_not_told_to_run_in_parallel(namespace):
    ds, _ = build(PIPELINES["hard-coded parallelism"], namespace)
    python = next(f for f in kpt.inspect(ds) if f.id == "py-function-in-map")
    assert "num_parallel_calls" not in python.fix
    sequential, _ = build(PIPELINES["sequential Python map"], namespace)
    python = next(f for f in kpt.inspect(sequential) if f.id == "py-function-in-map")
    assert "num_parallel_calls=tf.data.AUTOTUNE" in python.fix
