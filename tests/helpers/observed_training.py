"""A training script whose input has side effects a user would see twice if the tuner re-ran it.

`python -m tests.helpers.observed_training SOURCE MODE LOG_FILE` fits a tiny model
for three whole epochs on a slow, input-bound source that, for every element it
gives, appends a line to `LOG_FILE` and prints a line to standard output (left in
Python's buffer: with stdout a pipe, as under nohup, Kubernetes or Slurm, a copy
of the process would write it again). SOURCE is "generator" (a
`tf.data.Dataset.from_generator`), "py_dataset" (a `keras.utils.PyDataset` with
one worker, which the advice tells to take more), "py_dataset_threads" (the
same read by two threads) or "grain" (a Grain pipeline whose map gives the
elements, on the thread that reads the batches). MODE is "plain" (an empty
callback), "defaults" (`PipelineTuner()`), "measure_fixes"
(`measure_fixes=True`), "unverified" (`measure_fixes=True,
allow_unverified=True`: the user lets the tuner run their Python again) or
"lock" (`measure_fixes=True`, and a background thread that takes the source's
lock at the end of fit and holds it for `LOCK_HELD_S`).

Before the fit it registers an `os.register_at_fork` hook; at the end it prints
`FORKS <n>` (copies of the process made), `ELEMENTS <n>` (the source's calls),
and with a tuner its verdict, the slowest stage it names (`BOTTLENECK`) and
`AFTER_TRAINING_S <s> BUDGET_S <s>` (its work after training, and the budget
it had), then exits.
With `--ready-signal`, it prints `TRAINED` from a callback that runs before the
tuner's `on_train_end` and flushes it, so a test can stop the process then.
"""

import os
import sys
import threading
import time

FORKS = [0]
os.register_at_fork(before=lambda: FORKS.__setitem__(0, FORKS[0] + 1))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_pipeline_tuner as kpt  # noqa: E402

FEATURES = 8
BATCH = 4
ELEMENTS = 32  # 8 batches an epoch
DELAY_S = 0.015  # per element: 60 ms a batch against a step of about a millisecond
EPOCHS = 3
LOCK_HELD_S = 6.0
LOCK = threading.Lock()
CALLS = [0]


def _give(index: int, log_file: str):
    with LOCK:
        CALLS[0] += 1
        time.sleep(DELAY_S)
        with open(log_file, "a") as file:
            file.write(f"{index}\n")
        print(f"element {index}")
    return np.full((FEATURES,), index % 7, np.float32) / 7, np.float32(index % 2)


def generator_source(log_file: str) -> tf.data.Dataset:
    def generate():
        for index in range(ELEMENTS):
            yield _give(index, log_file)

    signature = (tf.TensorSpec((FEATURES,), tf.float32), tf.TensorSpec((), tf.float32))
    return tf.data.Dataset.from_generator(generate, output_signature=signature).batch(BATCH)


def grain_source(log_file: str):
    import grain

    def give(index):
        return _give(index, log_file)

    return (
        grain.MapDataset.range(ELEMENTS)
        .to_iter_dataset(grain.ReadOptions(num_threads=0))
        .map(give)
        .batch(BATCH)
    )


class Batches(keras.utils.PyDataset):
    def __init__(self, log_file: str, workers: int):
        super().__init__(workers=workers, use_multiprocessing=False)
        self.log_file = log_file

    def __len__(self):
        return ELEMENTS // BATCH

    def __getitem__(self, index):
        items = [_give(index * BATCH + i, self.log_file) for i in range(BATCH)]
        return np.stack([x for x, _ in items]), np.stack([y for _, y in items])


class Trained(keras.callbacks.Callback):
    """Says `TRAINED` when fit's training ends, before the callbacks after it."""

    def on_train_end(self, logs=None):
        print("TRAINED", flush=True)


class HoldTheLock(keras.callbacks.Callback):
    """At the end of fit, a thread takes the source's lock and keeps it."""

    def on_train_end(self, logs=None):
        taken = threading.Event()

        def hold():
            with LOCK:
                taken.set()
                time.sleep(LOCK_HELD_S)

        threading.Thread(target=hold, daemon=True).start()
        taken.wait()


def main(argv) -> int:
    source, mode, log_file = argv[:3]
    ready_signal = "--ready-signal" in argv
    keras.utils.set_random_seed(1)
    model = keras.Sequential(
        [keras.Input((FEATURES,)), keras.layers.Dense(4), keras.layers.Dense(1)]
    )
    model.compile(optimizer="sgd", loss="mse")
    if source == "generator":
        data = generator_source(log_file)
    elif source == "grain":
        data = grain_source(log_file)
    else:
        data = Batches(log_file, workers=2 if source == "py_dataset_threads" else 1)
    callbacks = [Trained()] if ready_signal else []
    if mode == "lock":
        callbacks.append(HoldTheLock())
    tuner = None
    if mode == "plain":
        callbacks.append(keras.callbacks.Callback())
    else:
        kwargs = {"measure_fixes": True} if mode in ("measure_fixes", "lock") else {}
        if mode == "unverified":
            kwargs = {"measure_fixes": True, "allow_unverified": True}
        tuner = kpt.PipelineTuner(verbose=0, **kwargs)
        callbacks.append(tuner)
    model.fit(data, epochs=EPOCHS, callbacks=callbacks, verbose=0)
    if tuner is not None:
        report = tuner.report
        print(f"VERDICT {report.verdict.value}")
        print(f"BOTTLENECK {report.profile.bottleneck if report.profile else None}")
        cost = report.tuner_cost
        print(f"AFTER_TRAINING_S {cost.after_training_s:.3f} BUDGET_S {cost.budget_s:.3f}")
    print(f"ELEMENTS {CALLS[0]}")
    print(f"FORKS {FORKS[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
