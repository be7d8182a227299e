"""Cost of the tuner's outputs: per-step scalars, report text, timeline image, trace.

Fills a step clock with synthetic steps and times each output on it, then runs
fits on in-memory data with and without `log_dir` alternately (GC off) and prints
the median wall time of each and their ratio. None of these run inside a step:
the per-step cost is what the user's training pays between steps, amortised.

    python bench/output_cost.py [--steps 5000] [--rounds 5]
"""

import argparse
import gc
import os
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_pipeline_tuner as kpt  # noqa: E402
from keras_pipeline_tuner._util.feature_guard import FeatureGuard  # noqa: E402
from keras_pipeline_tuner.outputs import trace as trace_export  # noqa: E402
from keras_pipeline_tuner.outputs.tensorboard import TensorBoardSink  # noqa: E402
from keras_pipeline_tuner.timing.step_clock import StepClock  # noqa: E402


def filled_clock(steps: int) -> StepClock:
    rng = np.random.default_rng(0)
    wait, compute = rng.uniform(0.001, 0.02, steps), rng.uniform(0.001, 0.02, steps)
    start = np.cumsum(wait + compute + 0.0005)
    clock = StepClock()
    clock.begin_epoch(0)
    clock.record("train", np.stack([start, start + wait, start + wait + compute], axis=1))
    return clock


def seconds(function) -> float:
    began = time.perf_counter()
    function()
    return time.perf_counter() - began


def component_costs(steps: int) -> None:
    clock = filled_clock(steps)
    report = kpt.Report()
    with tempfile.TemporaryDirectory() as log_dir:
        warm = TensorBoardSink(log_dir, FeatureGuard())
        first = seconds(lambda: warm.write_scalars(clock))
        # A new clock (a new fit) is written from its step 1 again, now compiled.
        clock = filled_clock(steps)
        bulk = seconds(lambda: warm.write_scalars(clock))
        small = TensorBoardSink(os.path.join(log_dir, "small"), FeatureGuard())
        eager = seconds(lambda: small.write_scalars(filled_clock(100)))
        text = seconds(lambda: warm.write_report(report, steps))
        image = seconds(lambda: warm.write_timeline(clock, report))
        image_again = seconds(lambda: warm.write_timeline(filled_clock(steps + 1), report))
        trace = seconds(lambda: trace_export.write_trace(clock, log_dir))
    print(f"scalars, compiled writer: {bulk / steps * 1e6:.1f} us/step "
          f"(first call {first * 1e3:.0f} ms, tracing included)")
    print(f"scalars, eager (100 steps): {eager / 100 * 1e6:.1f} us/step")
    print(f"report text: {text * 1e3:.1f} ms; timeline image: {image * 1e3:.0f} ms first, "
          f"{image_again * 1e3:.0f} ms after; Chrome trace of {steps} steps: {trace * 1e3:.0f} ms")


def fit_ratio(steps: int, rounds: int) -> None:
    x = np.random.default_rng(0).normal(size=(steps * 8, 32)).astype(np.float32)
    dataset = tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(8).cache()
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    model.fit(dataset, epochs=1, verbose=0, shuffle=False)
    times = {"profile off, no log_dir": [], "profile off, log_dir": []}
    for _ in range(rounds):
        for name in times:
            with tempfile.TemporaryDirectory() as log_dir:
                tuner = kpt.PipelineTuner(
                    log_dir=log_dir if name.endswith(" log_dir") else None,
                    verbose=0,
                    profile="off",
                )
                gc.disable()
                try:
                    fit = lambda: model.fit(  # noqa: E731
                        dataset, epochs=2, callbacks=[tuner], verbose=0, shuffle=False
                    )
                    times[name].append(seconds(fit))
                finally:
                    gc.enable()
    medians = {name: statistics.median(values) for name, values in times.items()}
    for name, median in medians.items():
        print(f"fit, {name}: {median:.3f} s (median of {rounds})")
    ratio = medians["profile off, log_dir"] / medians["profile off, no log_dir"]
    print(f"with outputs / without: {ratio:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    component_costs(args.steps)
    fit_ratio(args.steps // 2, args.rounds)


if __name__ == "__main__":
    main()
