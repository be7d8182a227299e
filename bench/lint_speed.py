"""How long `kpt.inspect` takes on a 20-stage pipeline (target: under 50 ms).

Prints the median and spread of whole inspections, and of their parts: reading
the dataset's graph, reading the pipeline TensorFlow runs (finalisation), and
the rules. Garbage collection is off while timing: a full collection with
TensorFlow loaded takes long enough to swamp one run.

Usage: python bench/lint_speed.py [--runs 30]
"""

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_pipeline_tuner as kpt  # noqa: E402

# The guide's pipelines live with the tests, which share them with the benches.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from keras_pipeline_tuner.pipeline.graph import reader  # noqa: E402
from keras_pipeline_tuner.pipeline.lint import tf_data_rules  # noqa: E402
from tests.helpers import guide_pipelines as guide  # noqa: E402

TARGET_MS = 50.0
no_autograph = tf.autograph.experimental.do_not_convert


def twenty_stage_pipeline(image_dir: str) -> tf.data.Dataset:
    """A realistic 20-stage image pipeline with augmentation, filters and options."""
    flip = keras.layers.RandomFlip("horizontal")
    files = tf.data.Dataset.list_files(os.path.join(image_dir, "*.png"), seed=0)  # 1-2
    decode = no_autograph(lambda path: guide.decode_image(path, 16))
    ds = files.map(decode, num_parallel_calls=4)  # 3
    ds = ds.filter(no_autograph(lambda image, label: label >= 0))  # 4
    ds = ds.cache()  # 5
    ds = ds.repeat(2)  # 6
    ds = ds.shuffle(16, seed=0)  # 7
    ds = ds.map(no_autograph(lambda image, label: (image * 2.0 - 1.0, label)))  # 8
    ds = ds.map(no_autograph(lambda image, label: (tf.image.resize(image, (12, 12)), label)))  # 9
    ds = ds.take(64)  # 10
    ds = ds.skip(1)  # 11
    ds = ds.batch(4)  # 12
    ds = ds.map(no_autograph(guide.random_flip), num_parallel_calls=tf.data.AUTOTUNE)  # 13
    ds = ds.map(no_autograph(lambda images, labels: (flip(images), labels)))  # 14
    ds = ds.unbatch()  # 15
    ds = ds.batch(8, drop_remainder=True)  # 16
    ds = ds.map(no_autograph(lambda images, labels: (images, tf.one_hot(labels, 2))))  # 17
    options = tf.data.Options()
    options.deterministic = False
    ds = ds.with_options(options)  # 18
    ds = ds.prefetch(2)  # 19
    return ds.apply(tf.data.experimental.assert_cardinality(15))  # 20


def timed(function, runs):
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        result = function()
        times.append((time.perf_counter() - start) * 1e3)
    return result, times


def describe(times):
    quartiles = statistics.quantiles(times, n=4)
    return (
        f"median {statistics.median(times):6.2f} ms   "
        f"quartiles {quartiles[0]:6.2f}-{quartiles[2]:6.2f} ms   "
        f"min {min(times):6.2f} ms"
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as image_dir:
        guide.write_images(image_dir, count=8, size=16)
        dataset = twenty_stage_pipeline(image_dir)
        # Warm up: first calls load op definitions and trace helper functions.
        kpt.inspect(dataset)
        gc.collect()
        gc.disable()
        try:
            findings, whole = timed(lambda: kpt.inspect(dataset), args.runs)
            pipeline, reading = timed(lambda: reader.read_pipeline(dataset), args.runs)
            _, static = timed(
                lambda: reader.pipeline_from_graph_def(reader.graph_def_of(dataset)),
                args.runs,
            )
            _, rules = timed(lambda: tf_data_rules.lint(pipeline), args.runs)
        finally:
            gc.enable()
    print(f"pipeline ({len(pipeline.stages)} stages): {pipeline}")
    print(f"findings: {', '.join(findings.ids)}")
    print(f"runs: {args.runs}")
    print(f"inspect (whole)          {describe(whole)}")
    print(f"  read pipeline + runtime {describe(reading)}")
    print(f"  read pipeline only     {describe(static)}")
    print(f"  rules                  {describe(rules)}")
    median = statistics.median(whole)
    print(
        f"target {TARGET_MS:.0f} ms: {'met' if median < TARGET_MS else 'MISSED'} "
        f"(median / target = {median / TARGET_MS:.2f})"
    )


if __name__ == "__main__":
    main()
