"""A Grain `DataLoader` as `tune` tunes it: `worker_count` and `worker_buffer_size`.

Grain runs a DataLoader's operations in the consumer's process when
`worker_count` is 0, else in worker processes that each keep
`worker_buffer_size` batches ready, in order. Grain starts its workers anew
for every epoch (every `iter`), by spawning Python processes: their start is
part of an epoch's time, and a timed pass of a few batches shows it. A setting
is a new DataLoader over the same source, sampler, operations, sharding and
read options.
"""

from typing import Any
from typing import Dict
from typing import List

from keras_pipeline_tuner.pipeline.tune.loader_kind import LoaderKind

NAME = "Grain DataLoader"
KNOBS = ("worker_count", "worker_buffer_size")
# worker_buffer_size values tried with workers: Grain's default, and two more.
BUFFER_SIZES = (1, 3)


class GrainLoaderKind(LoaderKind):
    """The `LoaderKind` of a `grain.DataLoader` (see `loader_tuning`).

    Example:

    >>> GrainLoaderKind().describe({"worker_count": 2, "worker_buffer_size": 1})
    'worker_count=2, worker_buffer_size=1'
    """

    name = NAME
    knobs = KNOBS
    worker_knob = "worker_count"
    least_workers = 0

    def settings(self, loader) -> Dict[str, Any]:
        # Grain keeps its options in private fields only (0.2.x): read, not changed.
        options = loader._multiprocessing_options
        return {
            "worker_count": options.num_workers,
            "worker_buffer_size": options.per_worker_buffer_size,
        }

    def with_workers(
        self, setting: Dict[str, Any], workers: int, buffer: int = BUFFER_SIZES[0]
    ) -> Dict[str, Any]:
        return {"worker_count": workers, "worker_buffer_size": buffer if workers else 1}

    def candidates(
        self, original: Dict[str, Any], counts: List[int], cpus: int, waits: bool
    ) -> List[Dict[str, Any]]:
        """Each count; with workers, each buffer size."""
        found = []
        for count in counts:
            sizes = BUFFER_SIZES if count else (1,)
            found += [self.with_workers(original, count, size) for size in sizes]
        return found

    def build(self, loader, setting: Dict[str, Any]):
        """A Grain DataLoader like `loader` with `setting` (the original when equal)."""
        if setting == self.settings(loader):
            return loader
        import grain

        return grain.DataLoader(
            data_source=loader._data_source,
            sampler=loader._sampler,
            operations=loader._operations,
            worker_count=setting["worker_count"],
            worker_buffer_size=setting["worker_buffer_size"],
            shard_options=loader._shard_options,
            read_options=loader._read_options,
        )

    def code(self, loader, setting: Dict[str, Any]) -> str:
        return (
            "grain.DataLoader(data_source=..., sampler=..., operations=..., "
            f"{self.describe(setting)})"
        )
