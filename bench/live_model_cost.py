"""Cost of reading tf.data's live model of the fit's iterator (the tuner's stage table).

Two measurements, in one process, with Python's GC off while timed:

1. Per read: `tf.data.experimental.get_model_proto` on a running iterator
   and the stage table built from it (`profiling.live_model`), the median
   of many reads, in milliseconds.
2. Per fit: `model.fit` of a small model on a tf.data pipeline whose map
   runs TensorFlow ops, with a tuner whose live-model reads are off (as after
   a failure) and on (as the tuner has them: each epoch's end, once in the
   steady state), alternated round by round; the median fit wall time of
   each, their ratio, and what the reads took in all against the fit
   (`StageTable.read_ms`, the cost on the training thread).

    KERAS_BACKEND=torch python bench/live_model_cost.py [--rounds 7]

Run it quiet, then beside two busy loops (`python -c "while True: pass"`).
"""

import argparse
import gc
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_pipeline_tuner as kpt  # noqa: E402
from keras_pipeline_tuner._util import features  # noqa: E402
from keras_pipeline_tuner.pipeline.graph.reader import read_pipeline  # noqa: E402
from keras_pipeline_tuner.profiling import live_model  # noqa: E402

ELEMENTS = 2048
BATCH = 32
EPOCHS = 3


def decode(i):
    t = tf.random.stateless_uniform([48, 48], seed=tf.stack([i, i]))
    for _ in range(4):
        t = tf.matmul(t, t) / 48.0
    x = tf.fill([16], tf.reduce_mean(t)) + tf.cast(i % 5, tf.float32) / 5.0
    return x, tf.cast(i % 2, tf.float32)[None]


def dataset():
    return (
        tf.data.Dataset.range(ELEMENTS)
        .shuffle(256, seed=1)
        .map(decode, num_parallel_calls=tf.data.AUTOTUNE)
        .batch(BATCH)
        .prefetch(tf.data.AUTOTUNE)
    )


def per_read(reads: int = 200) -> float:
    ds = dataset()
    pipeline = read_pipeline(ds)
    iterator = iter(ds)
    for _ in range(20):
        next(iterator)
    times = []
    for _ in range(reads):
        began = time.perf_counter()
        live_model.stage_table(live_model.read_model(iterator), pipeline)
        times.append((time.perf_counter() - began) * 1e3)
    return statistics.median(times)


def model():
    keras.utils.set_random_seed(1)
    built = keras.Sequential(
        [keras.Input((16,)), keras.layers.Dense(64, "relu"), keras.layers.Dense(1)]
    )
    built.compile("sgd", "mse")
    return built


def one_fit(reads_on: bool):
    tuner = kpt.PipelineTuner(verbose=0, profile="off", check_contention=False, measure_fixes=False)
    if not reads_on:
        tuner.guard.disable(features.LIVE_MODEL, "off for the benchmark")
    fitted = model()
    began = time.perf_counter()
    fitted.fit(dataset(), epochs=EPOCHS, callbacks=[tuner], verbose=0)
    wall = time.perf_counter() - began
    table = tuner.report.stage_table
    return wall, (table.read_ms / 1e3 if table is not None else 0.0), table


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    rounds = parser.parse_args().rounds
    import logging

    logging.getLogger("keras_pipeline_tuner").setLevel(logging.ERROR)
    gc.disable()
    print(f"backend {keras.backend.backend()}, load average {os.getloadavg()[0]:.1f}")
    print(f"one read (model proto + stage table): {per_read():.3f} ms (median of 200)")
    one_fit(True)  # warm-up: tracing, imports
    walls = {False: [], True: []}
    read_s = []
    table = None
    for _ in range(rounds):
        for on in (False, True):
            wall, reads, found = one_fit(on)
            walls[on].append(wall)
            if on:
                read_s.append(reads)
                table = found
            gc.collect()
    off, on = statistics.median(walls[False]), statistics.median(walls[True])
    print(
        f"fit wall, reads off: {off:.3f} s; on: {on:.3f} s; on/off {on / off:.3f} "
        f"(medians of {rounds})"
    )
    spent = statistics.median(read_s)
    print(
        f"reads on the training thread: {spent * 1e3:.2f} ms in a fit of {on:.2f} s "
        f"({spent / on * 100:.3f} % of the fit; {table.reads if table else 0} reads)"
    )
    if table is not None:
        print(f"stage table: {table.line()}")
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
