"""The tuned pipeline as Python: the lines a user pastes in place of their own."""

import tensorflow as tf

from keras_pipeline_tuner.pipeline.graph.reader import read_pipeline
from keras_pipeline_tuner.pipeline.tune import code


def double(x):
    return x * 2


def test_changed_stages_and_options_become_lines_that_build_the_same_pipeline():
    original = tf.data.Dataset.range(10).map(double).batch(3)
    options = tf.data.Options()
    options.threading.private_threadpool_size = 2
    more = tf.data.Options()
    more.autotune.enabled = False
    tuned = (
        tf.data.Dataset.range(10)
        .map(double, num_parallel_calls=tf.data.AUTOTUNE)
        .batch(3)
        .prefetch(tf.data.AUTOTUNE)
        .with_options(options)
        .with_options(more)
    )
    text = code.tuned_code(
        read_pipeline(original),
        read_pipeline(tuned),
        {"threading.private_threadpool_size": 2, "autotune.enabled": False},
    )
    assert text.splitlines() == [
        "# ds: your pipeline up to and including range(0, 10, 1)",
        "ds = ds.map(double, num_parallel_calls=tf.data.AUTOTUNE)",
        "ds = ds.batch(3)",
        "ds = ds.prefetch(tf.data.AUTOTUNE)",
        "options = tf.data.Options()",
        "options.threading.private_threadpool_size = 2",
        "options.autotune.enabled = False",
        "ds = ds.with_options(options)",
    ]
    namespace = {"tf": tf, "double": double, "ds": tf.data.Dataset.range(10)}
    exec(compile(text, "<tuned code>", "exec"), namespace)  # noqa: S102 - the test's point.
    built = namespace["ds"]
    assert [b.numpy().tolist() for b in built] == [b.numpy().tolist() for b in original]

    def labels(dataset):
        stages = read_pipeline(dataset).stages
        return [stage.label for stage in stages if stage.kind != "with_options"]

    assert labels(built) == labels(tuned)
    options_of = [read_pipeline(d).options for d in (built, tuned)]
    assert options_of[0] == options_of[1]


def test_unchanged_pipeline_has_no_code_and_lambdas_are_named_as_such():
    dataset = tf.data.Dataset.range(4).map(lambda x: x + 1)
    pipeline = read_pipeline(dataset)
    assert code.tuned_code(pipeline, pipeline, {}) == ""
    parallel = read_pipeline(
        tf.data.Dataset.range(4).map(lambda x: x + 1, num_parallel_calls=2)
    )
    assert code.tuned_code(pipeline, parallel, {}).splitlines()[-1].endswith(
        "# <lambda>: your function"
    )
