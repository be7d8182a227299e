"""kpt.tune's claimed speed-up against the user's own timing: loaders, a shuffled tf.data pipeline.

Three inputs whose cost is a known sleep (so the right answer does not depend
on the machine's load):

- a `PyDataset` on one worker whose `__getitem__` sleeps 30 ms, 80 batches;
- a torch `DataLoader` with `num_workers=0` over samples that sleep 1 ms,
  batches of 32, 24 batches;
- the README's tf.data case: `range(1024).shuffle(1024).map(py_function
  sleeping 5 ms).batch(32)`, tuned with the README's call as written
  (`kpt.tune(train_ds, budget_s=20)`), and again with `allow_unverified=True`
  (so that its map may run in parallel).

Each is tuned (`budget_s` 30, 30, 20 and 20), then the original and the tuned
input are timed as a user would, whole epochs, in alternating rounds
(`--rounds`, 5), Python's GC off, medians. Printed per input: the settings
chosen, tune's speed-up, the user's, and their ratio (1.0 = tune's claim is
what the user sees), once quiet and once beside `--busy-loops` (2) processes
spinning in pure Python (not this process's children: the tuner counts its
children's CPU as the loader's workers').

    PYTHONPATH=. python bench/loader_tune.py [--rounds 5] [--busy-loops 2] [--quiet-only]

Quiet figures are taken at real-time priority (`chrt -r 10 python
bench/loader_tune.py --quiet-only`), loaded ones at normal priority
(`--loaded-only`): busy loops started at real-time priority share the CPUs
otherwise (see `busy_loops`).
"""

import argparse
import gc
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import busy_loops  # noqa: E402
from verdict_stability import load_average  # noqa: E402

from tests.helpers import slow_loaders  # noqa: E402


def _readme_pipeline():
    import tensorflow as tf

    def slow(x):
        time.sleep(0.005)
        return x * 2

    def load(x):
        y = tf.py_function(slow, [x], tf.int64)
        y.set_shape([])
        return y

    return tf.data.Dataset.range(1024).shuffle(1024).map(load).batch(32)


def _cases():
    from keras_pipeline_tuner.pipeline.tune.py_dataset_loader import PyDatasetKind

    def py_epochs(loader):
        return lambda: PyDatasetKind().epoch(loader)

    def plain(loader):
        return lambda: iter(loader)

    return [
        ("PyDataset 30 ms", lambda: slow_loaders.sleeping_py_dataset(0.03, 80), 30, {},
         py_epochs),
        ("DataLoader 1 ms/sample", slow_loaders.sleeping_data_loader, 30, {}, plain),
        ("tf.data README shuffled 5 ms, as written", _readme_pipeline, 20, {"verbose": 1},
         plain),
        ("tf.data README shuffled 5 ms, allow_unverified", _readme_pipeline, 20,
         {"allow_unverified": True}, plain),
    ]


def _epoch_s(epochs) -> float:
    began = time.perf_counter()
    for _ in epochs():
        pass
    return time.perf_counter() - began


def measure(name, make, budget_s, extra, epochs, rounds):
    import keras_pipeline_tuner as kpt

    original = make()
    tuned, result = kpt.tune(original, budget_s=budget_s, **{"verbose": 0, **extra})
    chosen = getattr(result, "chosen", None) or [o.change for o in result.applied]
    sides = {"original": epochs(original), "tuned": epochs(tuned)}
    times = {side: [] for side in sides}
    gc.disable()
    try:
        for index in range(rounds):
            order = list(sides) if index % 2 == 0 else list(reversed(sides))
            for side in order:
                times[side].append(_epoch_s(sides[side]))
            gc.collect(1)
    finally:
        gc.enable()
    own = statistics.median(o / t for o, t in zip(times["original"], times["tuned"]))
    print(
        f"  {name}: chosen {chosen}; tune says {result.speedup:.2f}x, user's epochs "
        f"{statistics.median(times['original']):.2f} s -> {statistics.median(times['tuned']):.2f}"
        f" s = {own:.2f}x; ratio {result.speedup / own:.2f}",
        flush=True,
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--busy-loops", type=int, default=2)
    parser.add_argument("--quiet-only", action="store_true")
    parser.add_argument("--loaded-only", action="store_true")
    args = parser.parse_args()
    conditions = ["quiet"] if args.quiet_only else ["loaded"] if args.loaded_only else [
        "quiet", "loaded"]
    for condition in conditions:
        with busy_loops.running(args.busy_loops if condition == "loaded" else 0):
            print(f"{condition} (load average {load_average()}):", flush=True)
            for case in _cases():
                measure(*case, rounds=args.rounds)
            print(f"  load average at the end: {load_average()}", flush=True)


if __name__ == "__main__":
    main()
