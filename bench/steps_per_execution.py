"""The steps_per_execution advice's gain against what setting it delivers.

A tiny model on an in-memory tf.data pipeline: its step is mostly the host's
work between steps (Keras' loop). Each round, in an order rotated every round
(GC off, one process):

- advised: a fit with `PipelineTuner` (a cost budget that leaves its replay
  room) gives the `steps-per-execution` advice and its gain, measured by its
  replay of a copy of the pipeline at 1 and 32 (`after_training.execution_replay`);
- delivered: plain fits (no tuner) at `steps_per_execution` 1 and 32, each
  `EPOCHS` epochs of `BATCHES` batches: a fit's step is its later epochs' wall
  time, from each epoch's first call's end to the epoch's end, over their
  steps (the first epoch compiles; an epoch's new iterator is set-up, which
  the tuner reports apart too).

Prints each round's advised and delivered gains and their ratio, then the
medians; the ratio of the medians should lie within [0.67, 1.5]. Also the gain
the advice predicts where its replay has no room (`cost_budget_s=0`, once).

    python bench/steps_per_execution.py [--rounds 9] [--load 0]   # KERAS_BACKEND=jax too
"""

import argparse
import gc
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import busy_loops  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_pipeline_tuner as kpt  # noqa: E402

ADVISED = 32
BATCHES = 1024  # a pass over the data, at batch 16: 32 calls at 32
EPOCHS = 2
ADVICE = "steps-per-execution"


def dataset():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16 * BATCHES, 8)).astype("float32")
    y = (x.sum(axis=1, keepdims=True) > 0).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(16).prefetch(tf.data.AUTOTUNE)


def model(steps_per_execution=1):
    keras.utils.set_random_seed(1)
    built = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8), keras.layers.Dense(1)])
    built.compile("sgd", "mse", steps_per_execution=steps_per_execution)
    return built


class LaterEpochs(keras.callbacks.Callback):
    """Each later epoch's time from its first call's end to its end, and its steps."""

    def __init__(self):
        super().__init__()
        self.ms, self.steps, self.first_end = 0.0, 0, None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch, self.first_end = epoch, None

    def on_train_batch_end(self, batch, logs=None):
        # Once a call: at 32 steps a call Keras calls it with the call's last batch.
        if self.first_end is None and self.epoch > 0:
            self.first_end, self.first_steps = time.perf_counter(), batch + 1

    def on_epoch_end(self, epoch, logs=None):
        if epoch > 0:
            self.ms += (time.perf_counter() - self.first_end) * 1e3
            self.steps += BATCHES - self.first_steps


def delivered(setting):
    """A plain fit's step at `setting` (ms)."""
    clock = LaterEpochs()
    model(setting).fit(dataset(), epochs=EPOCHS, verbose=0, callbacks=[clock])
    return clock.ms / clock.steps


def advised(budget_s=30.0):
    """The tuner's advice: (its gain, how it was obtained, the sentence), or None."""
    tuner = kpt.PipelineTuner(verbose=0, measure_fixes=False, profile="off",
                              cost_budget_s=budget_s)
    model().fit(dataset(), epochs=2, callbacks=[tuner], verbose=0)
    report = tuner.report
    found = [r for r in report.recommendations if r.id == ADVICE]
    if not found:
        top = report.recommendations[0].id if report.recommendations else None
        print(f"  no {ADVICE} advice ({report.verdict.value}; top: {top}); notes: {report.notes}")
        return None
    gain = found[0].expected_gain
    figure = gain.likely_speedup or gain.predicted_speedup or gain.speedup
    return figure, gain.basis, gain.statement


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--load", type=int, default=0, help="busy-loop processes beside it")
    args = parser.parse_args()
    loads = busy_loops.start(args.load)
    began = time.monotonic()
    try:
        run(args.rounds, args.load)
    finally:
        busy_loops.stop(loads)
    print(f"load average {os.getloadavg()[0]:.1f} at the end; {time.monotonic() - began:.0f} s")


def run(rounds, load):
    print(f"backend {keras.backend.backend()}, {load} busy loops beside, load average "
          f"{os.getloadavg()[0]:.1f} at the start")
    predicted = advised(budget_s=0)
    if predicted is not None:
        print(f"untimed advice (no budget for the replay, {predicted[1]}): {predicted[2]}")
    gc.disable()
    sides = ["advised", 1, ADVISED]
    found = {side: [] for side in sides}
    print(f"\n{'round':>5} {'advised':>8} {'step at 1':>10} {f'at {ADVISED}':>8} "
          f"{'delivered':>10} {'ratio':>6} {'load':>5}")
    for index in range(rounds):
        shift = index % len(sides)
        for side in sides[shift:] + sides[:shift]:
            if side == "advised":
                result = advised()
                if result is None:
                    return
                found[side].append(result[0])
                statement = result[2]
            else:
                found[side].append(delivered(side))
        gain = found[1][-1] / found[ADVISED][-1]
        print(f"{index + 1:>5} {found['advised'][-1]:8.2f} {found[1][-1]:10.3f} "
              f"{found[ADVISED][-1]:8.3f} {gain:10.2f} {found['advised'][-1] / gain:6.2f} "
              f"{os.getloadavg()[0]:5.1f}")
        gc.collect()
    print(f"\nthe last advice's figure: {statement}")
    median_advised = statistics.median(found["advised"])
    at_one, at_advised = statistics.median(found[1]), statistics.median(found[ADVISED])
    gain = at_one / at_advised
    ratio = median_advised / gain
    verdict = "within [0.67, 1.5]" if 0.67 <= ratio <= 1.5 else "OUTSIDE [0.67, 1.5]"
    print(f"medians of {rounds} rounds: advised (measured by the tuner's replay) "
          f"{median_advised:.2f}x; delivered by plain fits {at_one:.3f} -> {at_advised:.3f} ms "
          f"a step, {gain:.2f}x")
    print(f"advised / delivered: {ratio:.2f} ({verdict}), {load} busy loops beside")
    if predicted is not None:
        print(f"untimed advice / delivered: {predicted[0] / gain:.2f} ({predicted[1]})")


if __name__ == "__main__":
    main()
