"""Loaders whose batches take a known time: a sleeping read (waiting) or a busy loop (computing).

Also a script entry point, so that a loader can be tuned in a process of its
own (a Keras backend of its choice, a cgroup it joins): `python -m
tests.helpers.slow_loaders SCENARIO [CGROUP_DIR]` prints one JSON line.
"""

import json
import os
import statistics
import sys
import time

import numpy as np


def sleeping_py_dataset(batch_s=0.03, batches=80, workers=1):
    """A `keras.utils.PyDataset` whose `__getitem__` sleeps `batch_s` (a slow read)."""
    import keras

    class SlowRead(keras.utils.PyDataset):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)

        def __len__(self):
            return batches

        def __getitem__(self, index):
            time.sleep(batch_s)
            return np.full((8, 4), index, np.float32), np.full((8,), index, np.float32)

    return SlowRead(workers=workers)


def busy_py_dataset(batch_s=0.02, batches=40):
    """A PyDataset whose `__getitem__` computes in Python for `batch_s` (holds the GIL)."""
    import keras

    class BusyRead(keras.utils.PyDataset):
        def __len__(self):
            return batches

        def __getitem__(self, index):
            end = time.thread_time() + batch_s
            total = 0
            while time.thread_time() < end:
                total += 1
            return np.full((8, 4), index, np.float32), np.full((8,), index % 2, np.float32)

    return BusyRead()


def sleeping_data_loader(sample_s=0.001, batch_size=32, batches=24, **settings):
    """A torch `DataLoader` over a dataset whose `__getitem__` sleeps `sample_s` a sample."""
    import torch
    from torch.utils.data import DataLoader
    from torch.utils.data import Dataset

    class SlowSamples(Dataset):
        def __len__(self):
            return batch_size * batches

        def __getitem__(self, index):
            time.sleep(sample_s)
            return torch.full((4,), float(index))

    return DataLoader(SlowSamples(), batch_size=batch_size, **settings)


def staggered_start(worker_id):
    """A DataLoader's `worker_init_fn`: worker i starts 0.1 s after worker i - 1.

    As forks of a large process do on a busy machine: eight workers take 0.7 s
    to start, where the epoch they read warm takes a tenth of a second.
    """
    time.sleep(0.1 * worker_id)


def epoch_s(batches, epochs=3):
    """The median seconds of `epochs` epochs of `batches()` (a fresh epoch iterable each)."""
    found = []
    for _ in range(epochs):
        began = time.perf_counter()
        for _ in batches():
            pass
        found.append(time.perf_counter() - began)
    return statistics.median(found)


def _py_dataset_epochs(loader):
    from keras_pipeline_tuner.pipeline.tune.py_dataset_loader import PyDatasetKind

    return lambda: PyDatasetKind().epoch(loader)


def _torch_sweep():
    """Tunes a DataLoader (num_workers=0, 1 ms a sample), then times 0-8 workers itself."""
    import keras_pipeline_tuner as kpt

    loader = sleeping_data_loader()
    tuned, result = kpt.tune(loader, budget_s=30, verbose=0)
    sweep = {}
    for workers in (0, 1, 2, 4, 6, 8):
        swept = sleeping_data_loader(num_workers=workers)
        sweep[workers] = epoch_s(lambda: iter(swept))
    return {
        "tuned_s": epoch_s(lambda: iter(tuned)),
        "sweep": sweep,
        "chosen": result.chosen,
        "code": result.code,
        "check": result.elements_check,
        "type": type(tuned).__name__,
        "backend": os.environ.get("KERAS_BACKEND"),
    }


def _busy_in_quota(cgroup):
    """Joins `cgroup` (a 1-CPU quota), then tunes a PyDataset that computes in Python."""
    with open(os.path.join(cgroup, "cgroup.procs"), "w") as file:
        file.write(str(os.getpid()))
    import keras_pipeline_tuner as kpt

    _, result = kpt.tune(busy_py_dataset(), budget_s=15, verbose=0)
    return {
        "chosen": result.chosen,
        "waiting": result.waiting,
        "budget": result.cpu_budget,
        "settings": [row.setting for row in result.table],
    }


if __name__ == "__main__":
    scenario = sys.argv[1]
    outcome = _torch_sweep() if scenario == "torch" else _busy_in_quota(sys.argv[2])
    print(json.dumps(outcome, default=str))
