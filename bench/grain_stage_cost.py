"""Cost of Grain's stage timing, which the tuner turns on for the iterators fit reads.

Two measurements, in one process, each variant alternated with the other in
every round (so that only the timing differs), with Python's GC off while
timed:

1. Per element: a Grain pipeline read to its end, its iterator plain or with
   Grain's stage timing on (`grain_stages.track_stages`), for a few pipeline
   shapes: read on Grain's 16 threads (a `MapDataset` given to fit as it is)
   or on the reading thread (stages after `to_iter_dataset(num_threads=0)`),
   elements of arrays or a dict holding a Python int. Prints the best of the
   rounds, in microseconds an element, and the difference.
2. Per step: `model.fit` of a small model on a cheap Grain pipeline read on
   the training thread, with a tuner whose Grain stage timing is off (as
   after a failure), on for the whole fit, and as the tuner has it (on for
   its first `WINDOW_BATCHES` batches); the median wall time a step of the
   epochs after the first (compilation), and the ratios to "off".

    KERAS_BACKEND=jax python bench/grain_stage_cost.py [--rounds 7]
"""

import argparse
import gc
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import grain  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_pipeline_tuner as kpt  # noqa: E402
from keras_pipeline_tuner._util import features  # noqa: E402
from keras_pipeline_tuner.instrumentation import grain_stage_timing  # noqa: E402
from keras_pipeline_tuner.profiling import grain_stages  # noqa: E402

ELEMENTS = 4096
BATCH = 32
FEATURES = 16


def _arrays(index, x):
    return x[index], np.float32(index % 2)


def _dict(index, x):
    return {"x": x[index], "label": int(index % 2)}


def pipeline(shape: str, element):
    x = np.random.default_rng(0).normal(size=(ELEMENTS, FEATURES)).astype(np.float32)
    source = grain.MapDataset.range(ELEMENTS)
    make = _arrays if element == "arrays" else _dict
    if shape == "16 read threads":
        return source.map(lambda i: make(i, x)).map(lambda e: e).batch(BATCH)
    return (
        source.to_iter_dataset(grain.ReadOptions(num_threads=0))
        .map(lambda i: make(i, x))
        .map(lambda e: e)
        .batch(BATCH)
    )


def read_all(dataset, timed: bool) -> float:
    """Seconds an element to read `dataset` to its end."""
    if isinstance(dataset, grain.MapDataset):
        dataset = dataset.to_iter_dataset()
    iterator = iter(dataset)
    if timed:
        grain_stages.track_stages(iterator)
    gc.disable()
    try:
        began = time.perf_counter()
        batches = sum(1 for _ in iterator)
        elapsed = time.perf_counter() - began
    finally:
        gc.enable()
    return elapsed / (batches * BATCH)


def per_element(rounds: int) -> None:
    print("Per element (best of rounds, µs): plain | stage timing | added")
    for shape in ("16 read threads", "reading thread"):
        for element in ("arrays", "dict with an int"):
            dataset = pipeline(shape, element)
            read_all(dataset, False)  # warm-up
            plain, timed = [], []
            for _ in range(rounds):
                plain.append(read_all(dataset, False))
                timed.append(read_all(dataset, True))
            best_plain, best_timed = min(plain) * 1e6, min(timed) * 1e6
            print(
                f"  {shape:16s} {element:17s} {best_plain:7.2f} | {best_timed:7.2f} | "
                f"{best_timed - best_plain:+6.2f} ({(best_timed - best_plain) * BATCH:+.0f} "
                f"µs a batch of {BATCH})"
            )


class _EpochClock(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.seconds = []

    def on_epoch_begin(self, epoch, logs=None):
        gc.disable()
        self._began = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.seconds.append(time.perf_counter() - self._began)
        gc.enable()


def fit_step_s(width: int, variant: str, epochs: int) -> float:
    """Median seconds a step of the epochs after the first."""
    keras.utils.set_random_seed(1)
    layers = [keras.Input((FEATURES,))]
    layers += [keras.layers.Dense(width, activation="relu") for _ in range(3)]
    model = keras.Sequential(layers + [keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    tuner = kpt.PipelineTuner(verbose=0, profile="off", check_contention=False)
    if variant == "off":
        # The same tuner, with Grain's stage timing off (as after a failure).
        tuner.guard.failures[features.GRAIN_STAGES] = "off for the benchmark"
    window = grain_stage_timing.WINDOW_BATCHES
    if variant == "always on":
        grain_stage_timing.WINDOW_BATCHES = 2**62
    clock = _EpochClock()
    try:
        model.fit(
            pipeline("reading thread", "arrays"),
            epochs=epochs,
            callbacks=[clock, tuner],
            verbose=0,
        )
    finally:
        grain_stage_timing.WINDOW_BATCHES = window
    steps = ELEMENTS // BATCH
    return statistics.median(clock.seconds[1:]) / steps


def per_step(rounds: int, epochs: int) -> None:
    variants = ("off", "always on", "window")
    print(
        f"Per step of fit on {keras.backend.backend()}, {ELEMENTS // BATCH} steps an epoch "
        f"(median of rounds, ms): " + " | ".join(variants)
    )
    for width in (16, 512):
        seconds = {variant: [] for variant in variants}
        for _ in range(rounds):
            for variant in variants:
                seconds[variant].append(fit_step_s(width, variant, epochs))
        ms = {variant: statistics.median(seconds[variant]) * 1e3 for variant in variants}
        print(
            f"  3 Dense({width}) layers: "
            + " | ".join(f"{ms[variant]:6.3f}" for variant in variants)
            + "   ratios to off: "
            + ", ".join(f"{variant} {ms[variant] / ms['off']:.3f}x" for variant in variants[1:])
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args()
    per_element(args.rounds)
    per_step(args.rounds, args.epochs)


if __name__ == "__main__":
    main()
