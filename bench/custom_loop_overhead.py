"""Overhead of timing a custom training loop: each timing variant over the plain loop.

Runs epochs of a `tf.function` train step over in-memory, cached data in each
variant, alternately in one process (so only the timing differs), with Python's GC
off during each epoch, and prints the median wall time per step of each variant and
its ratio to the plain loop, for a step of about 1 ms and one of about 10 ms. Each
variant's tuner measures one run over all its epochs (an epoch ends as in a user's
loop: at the end of `iterate`, or with `tuner.end_epoch()`); the once-per-run lint
of the iterated dataset happens in the untimed warm-up epoch and is printed apart.

- plain: `for x, y in dataset: train_step(x, y)`
- decorator: `@tuner.instrument` above `@tf.function` (timed from Python)
- decorator in graph: `@tf.function` above `@tuner.instrument` (timestamps in the
  graph, handed back by a `tf.py_function`)
- iterate: `tuner.iterate(dataset)` only
- decorator + iterate: both

It also prints the cost per call of each variant in microseconds, measured on a
trivial step (the fastest of several rounds, which noise can only slow down), and
of the device sync in it that makes "compute" end when the outputs are ready
(`tf.test.experimental.sync_devices`).

    python bench/custom_loop_overhead.py [--rounds 7]
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

VARIANTS = ("plain", "decorator", "decorator in graph", "iterate", "decorator + iterate")


def make_case(width: int, batch: int, steps: int):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch * steps, 64)).astype(np.float32)
    y = rng.normal(size=(batch * steps, 1)).astype(np.float32)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).cache().prefetch(2)
    model = keras.Sequential(
        [
            keras.Input((64,)),
            keras.layers.Dense(width, activation="relu"),
            keras.layers.Dense(width, activation="relu"),
            keras.layers.Dense(1),
        ]
    )
    optimizer = keras.optimizers.Adam()
    loss_fn = keras.losses.MeanSquaredError()

    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return loss

    return train_step, dataset


def make_loops(train_step, dataset):
    """One (tuner or None, step, batches) per variant, sharing the model."""
    tuners = {variant: kpt.PipelineTuner(verbose=0, profile="off") for variant in VARIANTS}
    steps = {
        "plain": tf.function(train_step),
        "decorator": tuners["decorator"].instrument(tf.function(train_step)),
        "decorator in graph": tf.function(tuners["decorator in graph"].instrument(train_step)),
        "iterate": tf.function(train_step),
        "decorator + iterate": tuners["decorator + iterate"].instrument(tf.function(train_step)),
    }
    loops = {}
    for variant in VARIANTS:
        tuner = None if variant == "plain" else tuners[variant]
        iterated = variant in ("iterate", "decorator + iterate")
        batches = (lambda t: t.iterate(dataset)) if iterated else (lambda t: dataset)
        loops[variant] = (tuner, steps[variant], batches)
    return loops


def timed_epoch(tuner, step, batches) -> float:
    gc.collect()
    gc.disable()
    try:
        began = time.perf_counter()
        for x, y in batches(tuner):
            step(x, y)
        if tuner is not None:
            tuner.end_epoch()
        return time.perf_counter() - began
    finally:
        gc.enable()


def alternate(train_step, dataset, rounds: int) -> dict:
    """Wall time of each epoch of each variant, the variants taking turns."""
    loops = make_loops(train_step, dataset)
    # Warm up every variant: tracing is reported apart, not part of the overhead.
    for loop in loops.values():
        timed_epoch(*loop)
    times = {variant: [] for variant in VARIANTS}
    for _ in range(rounds):
        for variant in VARIANTS:
            times[variant].append(timed_epoch(*loops[variant]))
    for tuner, _, _ in loops.values():
        if tuner is not None:
            tuner.close()
    return times


def sync_cost_us(calls: int = 2000) -> float:
    sync = tf.test.experimental.sync_devices
    sync()
    began = time.perf_counter()
    for _ in range(calls):
        sync()
    return (time.perf_counter() - began) / calls * 1e6


def per_call_cost_us(rounds: int, steps: int = 2000) -> dict:
    dataset = tf.data.Dataset.range(steps).map(lambda i: (tf.cast(i, tf.float32), 0.0)).cache()
    list(dataset)  # fill the cache
    times = alternate(lambda x, y: x + y, dataset, rounds)
    fastest = {variant: min(times[variant]) for variant in VARIANTS}
    return {
        variant: (fastest[variant] - fastest["plain"]) / steps * 1e6 for variant in VARIANTS[1:]
    }


def measure(name, width, batch, steps, rounds):
    train_step, dataset = make_case(width, batch, steps)
    began = time.perf_counter()
    kpt.inspect(dataset)
    lint_s = time.perf_counter() - began
    times = alternate(train_step, dataset, rounds)
    plain = times["plain"]
    print(
        f"{name}: {statistics.median(plain) / steps * 1e3:.3f} ms/step plain, "
        f"{steps} steps x {rounds} rounds; once per run: lint of the dataset {lint_s:.3f} s"
    )
    for variant in VARIANTS[1:]:
        ratios = [t / p for p, t in zip(plain, times[variant])]
        print(
            f"  {variant:<20} {statistics.median(times[variant]) / steps * 1e3:7.3f} ms/step  "
            f"ratio median {statistics.median(ratios):.4f} "
            f"(min {min(ratios):.4f}, max {max(ratios):.4f})"
        )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    print("custom loop with timing / plain custom loop, alternated, GC off during each epoch")
    print(f"device sync per call: {sync_cost_us():.1f} us")
    costs = per_call_cost_us(args.rounds)
    print("cost per call on a trivial step: " + ", ".join(
        f"{variant} {cost:.1f} us" for variant, cost in costs.items()
    ))
    measure("~1 ms step", width=128, batch=64, steps=300, rounds=args.rounds)
    measure("~10 ms step", width=1024, batch=256, steps=60, rounds=args.rounds)


if __name__ == "__main__":
    main()
