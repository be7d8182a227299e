"""The contention check where it used to be refused or capped: whether it runs, and what it takes.

Four fits that the check used to miss (issue: contention measured where it
happens), each with a fresh `PipelineTuner(verbose=0, profile="off")` and
defaults otherwise:

- recipe: keras.io's data-augmentation recipe (Keras `RandomFlip` and
  `RandomRotation` in a tf.data `map` with AUTOTUNE, shuffled, prefetched)
  into a small CNN, 64x64 images, 3 epochs (TensorFlow backend). The random
  layers' seed variables used to refuse the check.
- numpy: keras.io's mnist_convnet shape, `fit(x, y)` on 18 MB of NumPy arrays
  (TensorFlow backend). The arrays used to refuse it.
- jax, torch: a tf.data source into a small Dense model on those backends,
  where no check ran at all.

Each case runs in a process of its own (the backend is fixed at import), GC
off during fits. Per fit it prints whether the check ran (or the note that
says why not), the seconds it took (`report.tuner_cost.parts`), the cap it ran
on when it was given the time it needs (`check_cap_s`), the fit's own seconds,
the verdict and the input share, and the replay's speed-up (the real step over
the replayed one). Quiet, then beside `--busy-loops` (2) processes spinning in
pure Python.

    python bench/replay_check.py [--condition quiet|loaded|both] [--fits 3]
                                 [--cases recipe,numpy,jax,torch] [--busy-loops 2]
"""

import argparse
import gc
import json
import os
import subprocess
import sys
import time

import busy_loops as loads

CASES = ("recipe", "numpy", "jax", "torch")
BACKEND = {"recipe": "tensorflow", "numpy": "tensorflow", "jax": "jax", "torch": "torch"}


def _recipe():
    import keras
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x = rng.random((1024, 64, 64, 3), dtype=np.float32)
    y = rng.integers(0, 2, 1024).astype(np.float32)
    augmentation = [keras.layers.RandomFlip("horizontal"), keras.layers.RandomRotation(0.1)]

    def augment(images, labels):
        for layer in augmentation:
            images = layer(images)
        return images, labels

    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(1024).batch(32)
    dataset = dataset.map(augment, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
    model = keras.Sequential(
        [
            keras.Input((64, 64, 3)),
            keras.layers.Conv2D(32, 3, strides=2, activation="relu"),
            keras.layers.Conv2D(64, 3, strides=2, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(1),
        ]
    )
    model.compile("adam", keras.losses.BinaryCrossentropy(from_logits=True))
    return model, (dataset,), {"epochs": 3}


def _numpy():
    import keras
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.random((6000, 28, 28, 1), dtype=np.float32)
    y = keras.utils.to_categorical(rng.integers(0, 10, 6000), 10)
    model = keras.Sequential(
        [
            keras.Input((28, 28, 1)),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(64, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dropout(0.5),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile("adam", "categorical_crossentropy", metrics=["accuracy"])
    return model, (x, y), {"batch_size": 128, "epochs": 3}


def _dense():
    import keras
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x = rng.random((8192, 64), dtype=np.float32)
    y = rng.random(8192, dtype=np.float32)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(8192).batch(64)
    dataset = dataset.map(lambda a, b: (tf.sqrt(a + 1.0), b)).prefetch(2)
    model = keras.Sequential(
        [keras.Input((64,)), keras.layers.Dense(256, activation="relu"), keras.layers.Dense(1)]
    )
    model.compile("adam", "mse")
    return model, (dataset,), {"epochs": 3}


def run_case(case: str, fits: int) -> list:
    """In this process (its backend set): `fits` tuned fits of `case`, one line of figures each."""
    import keras_pipeline_tuner as kpt

    make = {"recipe": _recipe, "numpy": _numpy}.get(case, _dense)
    found = []
    for _ in range(fits):
        model, data, kwargs = make()
        tuner = kpt.PipelineTuner(verbose=0, profile="off")
        gc.disable()
        began = time.perf_counter()
        try:
            model.fit(*data, callbacks=[tuner], verbose=0, **kwargs)
        finally:
            gc.enable()
        wall_s = time.perf_counter() - began
        report = tuner.report
        cost = report.tuner_cost
        why_not = [note for note in report.notes if note.startswith("The contention check did")]
        found.append(
            {
                "ran": report.what_if is not None,
                "check_s": (cost.parts or {}).get("contention check") if cost else None,
                "check_cap_s": cost.check_cap_s if cost else None,
                "fit_s": cost.fit_s if cost else wall_s,
                "verdict": str(getattr(report.verdict, "value", report.verdict)),
                "input_fraction": report.input_fraction,
                "speedup": report.what_if.speedup_if_input_free if report.what_if else None,
                "why_not": why_not[0][:160] if why_not else "",
            }
        )
    return found


def busy_loops(count: int):
    return loads.running(count)


def _in_process(case: str, fits: int) -> list:
    env = dict(os.environ, KERAS_BACKEND=BACKEND[case], TF_CPP_MIN_LOG_LEVEL="2")
    result = subprocess.run(
        [sys.executable, __file__, "--run-case", case, "--fits", str(fits)],
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if result.returncode != 0:
        return [{"error": result.stderr[-600:]}]
    return json.loads(result.stdout.strip().splitlines()[-1])


def _print(condition: str, case: str, rows: list) -> None:
    for row in rows:
        if "error" in row:
            print(f"{condition:6} {case:6} error: {row['error']}")
            continue
        check = f"{row['check_s']:.2f} s" if row["check_s"] is not None else "-"
        cap = f"{row['check_cap_s']:.1f} s" if row["check_cap_s"] is not None else "budget"
        speedup = f"{row['speedup']:.2f}x" if row["speedup"] else "-"
        fraction = row["input_fraction"]
        share = f"{fraction * 100:5.1f} %" if fraction is not None else "   - "
        print(
            f"{condition:6} {case:6} ran={str(row['ran']):5} check={check:8} cap={cap:7} "
            f"fit={row['fit_s']:6.1f} s  {row['verdict']:24} {share}  replay {speedup}"
            + (f"  [{row['why_not']}]" if row["why_not"] else "")
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--condition", choices=("quiet", "loaded", "both"), default="both")
    parser.add_argument("--fits", type=int, default=3)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--busy-loops", type=int, default=2)
    parser.add_argument("--run-case", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run_case:
        print(json.dumps(run_case(args.run_case, args.fits)))
        return
    conditions = ("quiet", "loaded") if args.condition == "both" else (args.condition,)
    for condition in conditions:
        with busy_loops(args.busy_loops if condition == "loaded" else 0):
            for case in args.cases.split(","):
                _print(condition, case, _in_process(case, args.fits))


if __name__ == "__main__":
    main()
