"""A cache rewrite made ready to time: sized, its input checked, its files kept apart.

Before a cache is tried, its elements are sized (from static shapes, or by
reading them within the budget): a cache larger than the memory it may take
goes to `cache_path`, or is not tried. In a random pipeline, the cache's input
must give the same elements from one pass to the next, or the cache would
freeze them. Every timed pass writes its own cache file, as a new run would,
in a scratch directory removed when the session ends; and passes of a few
batches read a cache filled beforehand by one untimed epoch: of the elements
they read, where both cardinalities give how many (`partial`), else a whole one.
"""

import dataclasses
import math
import os
import shutil
import tempfile
import time
import uuid
from typing import Dict
from typing import List
from typing import Optional
from typing import Tuple

from keras_pipeline_tuner.pipeline.tune.budget import EPOCH_BUDGET_SHARE
from keras_pipeline_tuner.pipeline.tune.element_checks import element_arrays
from keras_pipeline_tuner.pipeline.tune.graph_editing import cut_at
from keras_pipeline_tuner.pipeline.tune.rebuild import rebuild
from keras_pipeline_tuner.pipeline.tune.rewrites import CACHE

# Share of the available memory a cache may take: training needs the rest.
_CACHE_MEMORY_SHARE = 0.25
# Elements read to size a cache of known length whose elements' shapes vary.
_SAMPLED_ELEMENTS = 4


class FillTooLong(Exception):
    """Filling a cache would take longer than the budget leaves."""


class CacheScratch:
    """The cache files of one tuning session, and the preparation of a cache rewrite.

    Args:
        dataset: the dataset tuned.
        graph_def: its `tf.compat.v1.GraphDef`.
        budget: the session's `Budget`.
        checks: the session's `ElementChecks`.
        cache_path: a file path prefix where a cache too big for memory may
            be written, or `None`.
        cache_memory_bytes: the most memory a cache may take; `None` for a
            quarter of the memory available.

    Attributes:
        fill_s: seconds of each untimed epoch that filled a cache before
            passes of `num_batches` batches (see `fill`).

    Example:

    >>> scratch = CacheScratch(None, None, None, None, cache_path=None, cache_memory_bytes=None)
    >>> scratch.close()  # removes the scratch directory, if one was made
    """

    def __init__(self, dataset, graph_def, budget, checks, cache_path, cache_memory_bytes):
        self.dataset = dataset
        self.graph_def = graph_def
        self.budget = budget
        self.checks = checks
        self.cache_path = cache_path
        self.cache_memory_bytes = cache_memory_bytes
        self._scratch: Optional[str] = None
        self.fill_s: List[float] = []
        # Elements at each cache point in one epoch, where tf.data knows them.
        self._elements: Dict[str, int] = {}

    def close(self) -> None:
        """Removes the cache files the timed passes wrote."""
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)

    def prepare(self, rewrite) -> Optional[str]:
        """Sizes the cache and checks its input repeats; returns why not, or None.

        A cache too large for memory is given `cache_path` as its file
        (`rewrite.filename` and `rewrite.change` say so).
        """
        cut, spec = cut_at(self.graph_def, rewrite.node)
        if spec is None:
            return "the elements at the cache point are not plain tensors"
        limit = self.cache_memory_bytes or _default_cache_memory()
        prefix = rebuild(cut, spec, self.dataset)
        count = int(prefix.cardinality())
        if count > 0:
            self._elements[rewrite.node] = count
        stage_bytes = _static_bytes(spec)
        if count >= 0 and stage_bytes is not None:
            total, complete = count * stage_bytes, True
        else:
            seconds = max(0.0, (self.budget.deadline - time.perf_counter()) * EPOCH_BUDGET_SHARE)
            self.budget.epochs_run += 1
            most = _SAMPLED_ELEMENTS if count > 0 else None
            total, complete, read = _scan_bytes(prefix, limit, seconds, most)
            if not complete and read and count > 0 and total <= limit:
                # A known length: the first elements stand for the rest
                # (a batch's rows, say, whose count only the last changes).
                total, complete = total * count // read, True
            if not complete and total <= limit:
                return (
                    "its size could not be known within the time budget (the number of "
                    "elements is unknown); give the dataset a known cardinality with "
                    "dataset.apply(tf.data.experimental.assert_cardinality(n)) or a larger "
                    "budget_s"
                )
        if total > limit:
            if self.cache_path is None:
                return (
                    f"the cached elements would take {_megabytes(total)} or more, over the "
                    f"{_megabytes(limit)} allowed in memory; pass cache_path=... to cache "
                    "on disk, or cache_memory_bytes=..."
                )
            rewrite.filename = self.cache_path
            rewrite.change = rewrite.change.replace(".cache()", f".cache({self.cache_path!r})")
        if not self.checks.repeatable:
            first = self.checks.first_digests(rebuild(cut, spec, self.dataset))
            second = self.checks.first_digests(rebuild(cut, spec, self.dataset))
            if first != second:
                return (
                    f"{rewrite.stage} gives different elements from one pass to the next: "
                    "a cache would freeze them"
                )
        return None

    def for_pass(self, rewrite, final: bool):
        """The rewrite as a timed pass makes it: a file cache gets a file of its own."""
        if rewrite.kind != CACHE or not rewrite.filename or final:
            return rewrite
        # Every timed pass writes its own file cache, as a new run would.
        if self._scratch is None:
            self._scratch = tempfile.mkdtemp(prefix="kpt-cache-")
        return dataclasses.replace(rewrite, filename=os.path.join(self._scratch, uuid.uuid4().hex))

    def partial(self, rewrite, batches: int):
        """The cache rewrite for passes of `batches` batches: it caches what they read.

        Passes of a few batches read the cache's first elements only, and a
        cache of those is read back at the rate of a whole one: filling it
        then costs those batches, not a whole epoch. The elements the cache
        point gives per batch come from both cardinalities; where either is
        not known, the rewrite is returned as it is (a whole epoch fills it).
        """
        elements = self._elements.get(rewrite.node)
        total = int(self.dataset.cardinality())
        if rewrite.kind != CACHE or elements is None or total <= 0:
            return rewrite
        per_batch = math.ceil(elements / total)
        # One batch more than the pass reads: its iterator never runs out.
        wanted = per_batch * (batches + 1)
        return dataclasses.replace(rewrite, fill_elements=wanted) if wanted < elements else rewrite

    def fill(self, dataset, partial: bool = False) -> None:
        """Runs one whole epoch of `dataset`, so that its cache is complete.

        Args:
            dataset: the dataset whose cache to fill.
            partial: its cache holds the few batches a pass reads (see
                `partial`), which may take what is left of the budget;
                a whole epoch may take `EPOCH_BUDGET_SHARE` of it.

        Raises:
            FillTooLong: if the epoch takes more of the budget than is left for it.
        """
        left_s = max(0.0, self.budget.deadline - time.perf_counter())
        limit_s = left_s if partial else left_s * EPOCH_BUDGET_SHARE
        self.budget.epochs_run += 1
        began = time.perf_counter()
        what = "the elements a timed pass reads" if partial else "a whole epoch"
        for _ in dataset:
            if time.perf_counter() - began > limit_s:
                raise FillTooLong(
                    f"filling the cache takes {what}, longer than the {limit_s:.1f} s "
                    "the budget leaves for it; pass a larger budget_s"
                )
        self.fill_s.append(time.perf_counter() - began)


def _scan_bytes(
    dataset, limit: int, seconds: float, most: Optional[int] = None
) -> Tuple[int, bool, int]:
    """Bytes of a dataset's elements: (total so far, whether the scan ended, elements read).

    The scan stops past `limit` bytes, `seconds`, or `most` elements.
    """
    began = time.perf_counter()
    total = 0
    read = 0
    for element in dataset:
        read += 1
        # Text and CSV pipelines give strings: scalar ones come as `bytes`.
        for array in element_arrays(element):
            if array.dtype == object:
                total += sum(len(item) for item in array.ravel())
            else:
                total += array.nbytes
        if total > limit or time.perf_counter() - began > seconds or read == most:
            return total, False, read
    return total, True, read


def _static_bytes(spec) -> Optional[int]:
    total = 0
    for component in spec:
        if not component.shape.is_fully_defined() or component.dtype.name == "string":
            return None
        total += component.shape.num_elements() * component.dtype.size
    return total


def _default_cache_memory() -> int:
    try:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        available = 4 << 30
    return int(available * _CACHE_MEMORY_SHARE)


def _megabytes(count: int) -> str:
    return f"{count / 1e6:,.0f} MB" if count >= 1e6 else f"{count / 1e3:,.1f} kB"
