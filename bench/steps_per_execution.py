"""The steps_per_execution advice's measured gain against what setting it delivers.

A tiny model on an in-memory tf.data pipeline: its step is mostly the host's
work between steps (Keras' loop). The tuner's fit advises
`steps_per_execution=32` with the gain its replay of cached batches measured
(`after_training.execution_replay`); then plain fits (no tuner) at 1 and 32,
alternated, GC off, give what the setting delivers: the mean step of each
fit's second epoch after its first call (the first epoch compiles; an epoch's
new iterator is set-up, reported apart by the tuner too), and the whole fit's
wall time.
Prints the ratio advised / delivered, which should lie within [0.67, 1.5].

    python bench/steps_per_execution.py [--rounds 5]   # KERAS_BACKEND=jax works too
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

ADVISED = 32


def dataset():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4096, 8)).astype("float32")
    y = (x.sum(axis=1, keepdims=True) > 0).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(16).prefetch(tf.data.AUTOTUNE)


def model(steps_per_execution=1):
    keras.utils.set_random_seed(1)
    built = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8), keras.layers.Dense(1)])
    built.compile("sgd", "mse", steps_per_execution=steps_per_execution)
    return built


class EpochClock(keras.callbacks.Callback):
    """The second epoch's steps after its first call: its set-up (a new iterator) apart."""

    def __init__(self):
        super().__init__()
        self.first_call_end = None
        self.first_batches = 0
        self.end = None

    def on_train_batch_end(self, batch, logs=None):
        if self.first_call_end is None and self._epoch == 1:
            self.first_call_end, self.first_batches = time.perf_counter(), batch + 1

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_epoch_end(self, epoch, logs=None):
        self.end = time.perf_counter()


def plain(steps_per_execution):
    clock = EpochClock()
    fitted = model(steps_per_execution)
    began = time.perf_counter()
    fitted.fit(dataset(), epochs=2, verbose=0, callbacks=[clock])
    wall = time.perf_counter() - began
    steps = 256 - clock.first_batches
    return (clock.end - clock.first_call_end) * 1e3 / steps, wall


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    rounds = parser.parse_args().rounds
    print(f"backend {keras.backend.backend()}, load average {os.getloadavg()[0]:.1f}")
    tuner = kpt.PipelineTuner(verbose=0, measure_fixes=False, profile="off")
    model().fit(dataset(), epochs=2, callbacks=[tuner], verbose=0)
    report = tuner.report
    top = report.recommendations[0] if report.recommendations else None
    print(f"tuner: {report.verdict.value}; top: {top.id if top else None}")
    if report.execution is None:
        print("no steps_per_execution replay ran:", report.notes)
        return
    advised = report.execution.speedup
    print(f"advised: {report.execution.sentence()}")
    gc.disable()
    steps, walls = {1: [], ADVISED: []}, {1: [], ADVISED: []}
    for _ in range(rounds):
        for setting in (1, ADVISED):
            step, wall = plain(setting)
            steps[setting].append(step)
            walls[setting].append(wall)
        gc.collect()
    step_gain = statistics.median(steps[1]) / statistics.median(steps[ADVISED])
    wall_gain = statistics.median(walls[1]) / statistics.median(walls[ADVISED])
    print(
        f"delivered (plain fits, medians of {rounds}): step {statistics.median(steps[1]):.3f} -> "
        f"{statistics.median(steps[ADVISED]):.3f} ms ({step_gain:.2f}x); whole 2-epoch fit "
        f"{wall_gain:.2f}x (with each epoch's set-up)"
    )
    ratio = advised / step_gain
    verdict = "within [0.67, 1.5]" if 0.67 <= ratio <= 1.5 else "OUTSIDE [0.67, 1.5]"
    print(f"advised / delivered step gain: {ratio:.2f} ({verdict})")
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
