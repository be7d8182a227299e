"""A torch `DataLoader` as `tune` tunes it: `num_workers`, `prefetch_factor`, `persistent_workers`.

A DataLoader's settings are fixed when it is made, so each setting is a new
DataLoader over the same dataset, sampler and collate function (and
`pin_memory` where a CUDA device exists to pin for). Workers are processes
the DataLoader starts itself, as in training; with `persistent_workers` they
outlive an epoch, which each timed pass of two epochs or more shows. A map-style
dataset only: an `IterableDataset` hands every worker the whole dataset
unless it splits itself, so more workers could change its batches.
"""

from typing import Any
from typing import Dict
from typing import List

from keras_pipeline_tuner.pipeline.tune.loader_kind import LoaderKind

NAME = "DataLoader"
KNOBS = ("num_workers", "prefetch_factor", "persistent_workers", "pin_memory")
# prefetch_factor values tried with workers: torch's default, and twice it.
PREFETCH_FACTORS = (2, 4)


class TorchLoaderKind(LoaderKind):
    """The `LoaderKind` of a torch `DataLoader` (see `loader_tuning`).

    Example:

    >>> kind = TorchLoaderKind()
    >>> kind.describe({"num_workers": 4, "prefetch_factor": 2, "persistent_workers": True,
    ...                "pin_memory": False})
    'num_workers=4, prefetch_factor=2, persistent_workers=True, pin_memory=False'
    """

    name = NAME
    knobs = KNOBS
    worker_knob = "num_workers"
    tried_settings_warnings = ("This DataLoader will create",)
    least_workers = 0

    def with_workers(
        self, setting: Dict[str, Any], workers: int, prefetch: int = PREFETCH_FACTORS[0]
    ) -> Dict[str, Any]:
        if not workers:
            return dict(setting, num_workers=0, prefetch_factor=None, persistent_workers=False)
        return dict(
            setting,
            num_workers=workers,
            prefetch_factor=prefetch,
            persistent_workers=True,
            pin_memory=setting["pin_memory"] or _has_cuda(),
        )

    def candidates(
        self, original: Dict[str, Any], counts: List[int], cpus: int, waits: bool
    ) -> List[Dict[str, Any]]:
        """Each count; with workers, each prefetch factor, workers kept across epochs."""
        found = []
        for count in counts:
            factors = PREFETCH_FACTORS if count else (None,)
            found += [self.with_workers(original, count, factor) for factor in factors]
        return found

    def build(self, loader, setting: Dict[str, Any]):
        """A DataLoader like `loader` with `setting` (the original when equal)."""
        if setting == self.settings(loader):
            return loader
        from torch.utils.data import DataLoader

        batching = (
            {"batch_sampler": loader.batch_sampler}
            if loader.batch_sampler is not None
            else {"batch_size": None, "sampler": loader.sampler}
        )
        extra = {"in_order": loader.in_order} if hasattr(loader, "in_order") else {}
        return DataLoader(
            loader.dataset,
            **batching,
            num_workers=setting["num_workers"],
            collate_fn=loader.collate_fn,
            pin_memory=setting["pin_memory"],
            timeout=loader.timeout,
            worker_init_fn=loader.worker_init_fn,
            multiprocessing_context=loader.multiprocessing_context,
            generator=loader.generator,
            prefetch_factor=setting["prefetch_factor"],
            persistent_workers=setting["persistent_workers"],
            pin_memory_device=loader.pin_memory_device,
            **extra,
        )

    def persists(self, setting: Dict[str, Any]) -> bool:
        return bool(setting["num_workers"] and setting["persistent_workers"])

    def keeps_order(self, loader) -> bool:
        return getattr(loader, "in_order", True)

    def code(self, loader, setting: Dict[str, Any]) -> str:
        return f"DataLoader(dataset, ..., {self.describe(setting)})"


def iterable_dataset(loader) -> bool:
    """Whether the DataLoader reads an `IterableDataset` (not tuned: see the module)."""
    from torch.utils.data import IterableDataset

    return isinstance(loader.dataset, IterableDataset)


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()
