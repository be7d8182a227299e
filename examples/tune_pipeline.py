"""kpt.tune: rewrite a slow pipeline, prove the rewrite is faster, then train on it.

The pipeline reads records with a slow Python function, one at a time: the
sequential map of the tf.data performance guide. `kpt.tune` rewrites the
pipeline's graph (here: the map made parallel, and a cache once the map's output
is shown to be the same every epoch), checks that the tuned dataset yields the
same elements in the same order, times each rewrite side by side with the
original on this machine, and keeps only what is faster.

Run it as is:

    python examples/tune_pipeline.py

Set KPT_EXAMPLE_QUICK=1 for a shorter run.
"""

import os
import time

import numpy as np
import tensorflow as tf

import keras_pipeline_tuner as kpt

QUICK = os.environ.get("KPT_EXAMPLE_QUICK") == "1"
RECORDS = 32 if QUICK else 128
READ_DELAY_S = 0.005
TRAINING_STEP_S = 0.002


def read_record(index):
    # Stands in for reading and parsing one record in Python.
    time.sleep(READ_DELAY_S)
    return np.full((8,), index, np.float32)


def parse(index):
    record = tf.py_function(read_record, [index], tf.float32)
    record.set_shape((8,))
    return record


dataset = tf.data.Dataset.range(RECORDS).map(parse).batch(4)

# `parse` runs Python (tf.py_function), whose equality across threads tune cannot
# prove; it keeps no state, so running it on several threads is safe to allow.
tuned, result = kpt.tune(
    dataset, consumer_step_s=TRAINING_STEP_S, budget_s=20 if QUICK else 60, allow_unverified=True
)
print(f"Original: {result.pipeline}")
print(f"Tuned:    {result.tuned_pipeline}")
for outcome in result.rewrites:
    ratio = "-" if outcome.ratio is None else f"{outcome.ratio:.2f}"
    print(f"  {outcome.kind:<20} {outcome.status:<22} ratio {ratio}  {outcome.reason}")
print(
    f"Speed-up: {result.speedup:.2f}x per pass "
    f"({result.original_s:.3f} s -> {result.tuned_s:.3f} s)"
)

same = all(
    np.array_equal(a, b) for a, b in zip(dataset.as_numpy_iterator(), tuned.as_numpy_iterator())
)
print(f"Same elements in the same order: {same}")
