"""Overhead of PipelineTuner's step clock: fit with the tuner over plain fit.

Runs plain fits and fits with the tuner alternately in one process on the same
model and in-memory data (so only the clock's cost differs), with Python's GC off
during each fit, and prints the median wall time of each and their ratio, for a
model of about 1 ms per step and one of about 10 ms per step.

    python bench/overhead.py [--rounds 7]
"""

import argparse
import gc
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_pipeline_tuner as kpt  # noqa: E402


def make_case(width: int, batch: int, steps: int):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch * steps, 64)).astype(np.float32)
    y = rng.normal(size=(batch * steps, 1)).astype(np.float32)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).cache()
    model = keras.Sequential(
        [
            keras.Input((64,)),
            keras.layers.Dense(width, activation="relu"),
            keras.layers.Dense(width, activation="relu"),
            keras.layers.Dense(1),
        ]
    )
    model.compile("adam", "mse")
    return model, dataset


def timed_fit(model, dataset, callbacks):
    gc.collect()
    gc.disable()
    try:
        began = time.perf_counter()
        model.fit(dataset, epochs=1, callbacks=callbacks, verbose=0, shuffle=False)
        return time.perf_counter() - began
    finally:
        gc.enable()


def measure(name, width, batch, steps, rounds):
    model, dataset = make_case(width, batch, steps)
    tuner = kpt.PipelineTuner(verbose=0, profile="off")
    # Warm up both paths: tracing is reported apart, not part of the overhead.
    timed_fit(model, dataset, [])
    timed_fit(model, dataset, [tuner])
    plain, tuned = [], []
    for _ in range(rounds):
        plain.append(timed_fit(model, dataset, []))
        tuned.append(timed_fit(model, dataset, [tuner]))
    ratios = [t / p for p, t in zip(plain, tuned)]
    step_ms = statistics.median(plain) / steps * 1e3
    print(
        f"{name:<10} {step_ms:7.2f} ms/step  plain {statistics.median(plain):.3f} s  "
        f"tuner {statistics.median(tuned):.3f} s  ratio median {statistics.median(ratios):.4f} "
        f"(min {min(ratios):.4f}, max {max(ratios):.4f}), {steps} steps x {rounds} rounds"
    )
    return statistics.median(ratios)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    print("fit with PipelineTuner / plain fit, alternated, GC off during fit")
    measure("~1 ms", width=128, batch=64, steps=300, rounds=args.rounds)
    measure("~10 ms", width=1024, batch=256, steps=60, rounds=args.rounds)


if __name__ == "__main__":
    main()
