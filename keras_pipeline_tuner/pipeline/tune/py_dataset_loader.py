"""A `keras.utils.PyDataset` as `tune` tunes it: `workers`, `use_multiprocessing`, `max_queue_size`.

Keras reads a PyDataset one `__getitem__` at a time when `workers` is 1, and
through a queue of `max_queue_size` batches that `workers` threads (or
processes, with `use_multiprocessing`) fill otherwise, in order. An epoch is
read here through Keras' own adapter, the path `fit` takes, from batch 0. A
copy of the PyDataset with other settings shares its state (its arrays, its
files); processes are tried only for workers that compute, where the budget
has CPUs for them (threads of Python code share one).
"""

import copy
from typing import Any
from typing import Dict
from typing import List

from keras_pipeline_tuner.pipeline.tune.loader_kind import LoaderKind

NAME = "PyDataset"
KNOBS = ("workers", "use_multiprocessing", "max_queue_size")


class PyDatasetKind(LoaderKind):
    """The `LoaderKind` of a `keras.utils.PyDataset` (see `loader_tuning`).

    Example:

    >>> import keras
    >>> class Ones(keras.utils.PyDataset):
    ...     def __len__(self):
    ...         return 4
    ...     def __getitem__(self, index):
    ...         return [index], [index]
    >>> kind = PyDatasetKind()
    >>> kind.settings(Ones())
    {'workers': 1, 'use_multiprocessing': False, 'max_queue_size': 10}
    >>> kind.describe({"workers": 4, "use_multiprocessing": False, "max_queue_size": 10})
    'workers=4, use_multiprocessing=False, max_queue_size=10'
    """

    name = NAME
    knobs = KNOBS

    def with_workers(self, setting: Dict[str, Any], workers: int) -> Dict[str, Any]:
        queue = max(setting["max_queue_size"], 2 * workers)
        return dict(setting, workers=workers, max_queue_size=queue)

    def candidates(
        self, original: Dict[str, Any], counts: List[int], cpus: int, waits: bool
    ) -> List[Dict[str, Any]]:
        """Threads at each count (a queue of twice the workers at least); processes
        at the budget's count for workers that compute on several CPUs."""
        found = [self.with_workers(dict(original, use_multiprocessing=False), n) for n in counts]
        if original["use_multiprocessing"] or (not waits and cpus > 1):
            found += [
                self.with_workers(dict(original, use_multiprocessing=True), n)
                for n in counts
                if n > 1
            ]
        return found

    def build(self, loader, setting: Dict[str, Any]):
        """A shallow copy of the PyDataset with `setting` (the original when equal)."""
        if setting == self.settings(loader):
            return loader
        built = copy.copy(loader)
        for knob in KNOBS:
            setattr(built, knob, setting[knob])
        return built

    def epoch(self, loader):
        """The batches of one epoch, read through Keras' adapter as `fit` reads them."""
        # Keras' own reading path (not public API): its enqueuer when workers
        # > 1, else one call at a time.
        from keras.src.trainers.data_adapters.py_dataset_adapter import PyDatasetAdapter

        adapter = PyDatasetAdapter(loader, shuffle=False)
        adapter.on_epoch_begin()
        try:
            yield from adapter.get_numpy_iterator()
        finally:
            adapter.on_epoch_end()

    def code(self, loader, setting: Dict[str, Any]) -> str:
        within = f"  # in {type(loader).__name__}.__init__"
        return f"super().__init__({self.describe(setting)}, **kwargs){within}"
