"""Overhead of PipelineTuner's step clock: fit with the tuner over plain fit.

Runs plain fits, fits with an empty callback (Keras' own cost of one more
callback, the floor under the tuner's) and fits with the tuner alternately in
one process on the same model and in-memory data (so only the tuner's cost
differs), with Python's GC off
during each fit, and prints the median ratio of wall times, for a model of about
1 ms per step and one of about 10 ms per step; the tuner with its defaults, and
with a log_dir (TensorBoard outputs and report files written as well). A last row
runs a long fit of a tiny model (about 0.1 ms a step on an idle machine), where
per-step output costs show most, and prints how much the log dir's event files
grew per fit (scalars of long runs are summarised, so they stay small).

Every Keras backend is measured, each in a process of its own (the backend is
fixed when Keras is imported): TensorFlow on a cached tf.data dataset, JAX and
torch on NumPy arrays (torch on one thread, as the tests run it).

    python bench/overhead.py [--rounds 7] [--backend tensorflow|jax|torch|all]
                             [--cases small large tiny] [--tiny-steps 100000]
"""

import argparse
import gc
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

BACKENDS = ("tensorflow", "jax", "torch")


def make_case(width: int, batch: int, steps: int, features: int = 64):
    import keras
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch * steps, features)).astype(np.float32)
    y = rng.normal(size=(batch * steps, 1)).astype(np.float32)
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        dataset = dict(x=tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).cache())
    else:
        dataset = dict(x=x, y=y, batch_size=batch)
    model = keras.Sequential(
        [
            keras.Input((features,)),
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
        model.fit(epochs=1, callbacks=callbacks, verbose=0, shuffle=False, **dataset)
        return time.perf_counter() - began
    finally:
        gc.enable()


def empty_callback():
    """A callback that does nothing in the hooks the tuner uses, `async_safe` as it is.

    Its cost over plain fit is Keras' own for one more callback: the floor
    under the tuner's.
    """
    import keras

    class EmptyCallback(keras.callbacks.Callback):
        async_safe = True

        def on_train_batch_begin(self, batch, logs=None):
            pass

        def on_train_batch_end(self, batch, logs=None):
            pass

    return EmptyCallback()


def event_bytes(log_dir: str) -> int:
    return sum(
        os.path.getsize(os.path.join(directory, name))
        for directory, _, names in os.walk(log_dir)
        for name in names
        if "tfevents" in name
    )


def measure(name, width, batch, steps, rounds, log_dir, features=64):
    import keras_pipeline_tuner as kpt

    model, dataset = make_case(width, batch, steps, features)
    tuners = {
        # The always-on part: the step clock, the lint and the advice.
        "clock": kpt.PipelineTuner(verbose=0, profile="off"),
        # Everything on: TensorBoard scalars, text, timeline image, report files,
        # and the "auto" profiler window, which opens (once per fit) when the
        # clock finds the job input-bound.
        "defaults+log_dir": kpt.PipelineTuner(log_dir=log_dir, verbose=0),
    }
    empty = empty_callback()
    # Warm up every path: tracing is reported apart, not part of the overhead.
    timed_fit(model, dataset, [])
    timed_fit(model, dataset, [empty])
    for tuner in tuners.values():
        timed_fit(model, dataset, [tuner])
    plain, tuned, floor = [], {key: [] for key in tuners}, []
    grown = []
    for _ in range(rounds):
        plain.append(timed_fit(model, dataset, []))
        floor.append(timed_fit(model, dataset, [empty]))
        for key, tuner in tuners.items():
            before = event_bytes(log_dir)
            tuned[key].append(timed_fit(model, dataset, [tuner]))
            if key == "defaults+log_dir":
                grown.append(event_bytes(log_dir) - before)
    step_ms = statistics.median(plain) / steps * 1e3
    print(f"{name}: {step_ms:.2f} ms/step plain, {steps} steps x {rounds} rounds", flush=True)
    ratios = [t / p for p, t in zip(plain, floor)]
    print(
        f"  empty callback         / plain: median {statistics.median(ratios):.4f} "
        f"(min {min(ratios):.4f}, max {max(ratios):.4f}); Keras' own cost of one more "
        "callback",
        flush=True,
    )
    for key, times in tuned.items():
        ratios = [t / p for p, t in zip(plain, times)]
        over_empty = [t / e for e, t in zip(floor, times)]
        report = tuners[key].report
        window = "a profiler window" if report.profile is not None else "no profiler window"
        print(
            f"  tuner ({key:<16}) / plain: median {statistics.median(ratios):.4f} "
            f"(min {min(ratios):.4f}, max {max(ratios):.4f}); over the empty callback "
            f"{statistics.median(over_empty):.4f}; {report.verdict.value}, {window}",
            flush=True,
        )
    print(
        f"  event files grew {statistics.median(grown) / 1e3:.0f} kB per fit of {steps} steps "
        f"({statistics.median(grown) / steps:.1f} bytes a step)",
        flush=True,
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--backend", choices=BACKENDS + ("all",), default="all")
    parser.add_argument("--tiny-steps", type=int, default=100_000)
    parser.add_argument(
        "--cases", nargs="+", choices=("small", "large", "tiny"), default=["small", "large", "tiny"]
    )
    args = parser.parse_args()
    if args.backend == "all":
        for backend in BACKENDS:
            # A process per backend: Keras fixes it at import.
            subprocess.run(
                [
                    sys.executable, __file__, "--rounds", str(args.rounds), "--backend", backend,
                    "--tiny-steps", str(args.tiny_steps), "--cases", *args.cases,
                ],
                env=dict(os.environ, KERAS_BACKEND=backend),
                check=True,
            )
        return
    os.environ["KERAS_BACKEND"] = args.backend
    if args.backend == "torch":
        import torch

        torch.set_num_threads(1)
    print(
        f"[{args.backend}] fit with PipelineTuner / plain fit, alternated, GC off during fit",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as log_dir:
        # Fits of a few seconds: the tuner's per-fit work (the lint before the first
        # step, the report, image and files after the last) is a fixed cost of
        # tens of milliseconds, which a sub-second fit would count as per-step cost.
        if "small" in args.cases:
            measure("~1 ms model", 128, 64, 2000, args.rounds, os.path.join(log_dir, "small"))
        if "large" in args.cases:
            measure("~10 ms model", 1024, 256, 300, args.rounds, os.path.join(log_dir, "large"))
        if "tiny" in args.cases:
            # Where per-step costs show most: Keras' own loop is nearly all of the step.
            measure(
                "tiny model, long fit", 4, 1, args.tiny_steps, args.rounds,
                os.path.join(log_dir, "tiny"), features=8,
            )


if __name__ == "__main__":
    main()
