"""`kpt.inspect` on a pipeline over 208 MB of in-memory arrays, against the same on 0.4 MB.

The large pipeline is read over one-element stand-ins of its sources, so its
inspection should cost what the small one costs; reading it with its data
(`max_in_memory_bytes=None`, what inspection did before) is timed alongside.
Medians of alternated runs in one process, GC off.

    python bench/inspect_in_memory.py [--rounds 5]
"""

import argparse
import gc
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_pipeline_tuner as kpt  # noqa: E402


def scale(x, y):
    return x * 2.0, y


def pipeline(x, y):
    return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(1000).map(scale).batch(32)


def timed(function) -> float:
    gc.collect()
    gc.disable()
    try:
        began = time.perf_counter()
        function()
        return time.perf_counter() - began
    finally:
        gc.enable()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    x = np.ones((52_000, 1_000), np.float32)
    y = np.zeros(len(x), np.int64)
    large, small = pipeline(x, y), pipeline(x[:100], y[:100])
    runs = {
        "208 MB, stand-ins": lambda: kpt.inspect(large),
        "0.4 MB": lambda: kpt.inspect(small),
        "208 MB, copied (max_in_memory_bytes=None)": lambda: kpt.inspect(
            large, max_in_memory_bytes=None
        ),
    }
    for run in runs.values():
        run()  # warm-up: tracing of the map function
    times = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, run in runs.items():
            times[name].append(timed(run))
    base = statistics.median(times["0.4 MB"])
    for name, values in times.items():
        median = statistics.median(values)
        print(
            f"kpt.inspect {name:<42} median {median * 1e3:8.1f} ms  "
            f"({median / base:.2f}x the 0.4 MB one)"
        )


if __name__ == "__main__":
    main()
