"""Whether a fit reads an element of its dataset twice: when a cache would be read back.

A cache computes each element once, in the first pass, and replays it on the
next ones. A fit that never starts a second pass over its dataset never reads
a cache back: `fit(steps_per_epoch=30, epochs=2)` on a dataset of 12 500
batches reads 60 of them (Keras 3 goes on with the same iterator from one
epoch to the next), and a cache would only cost its memory. The dataset's own
cardinality, read with its graph, against the batches the fit took, decides;
a dataset of infinite or unknown length (a `repeat()`, a `filter`, a
generator) leaves it open, and the advice keeps its bound with a line saying
so.
"""

import dataclasses
from typing import Optional

# `tf.data`'s cardinality constants, so that no TensorFlow import is needed.
INFINITE = -1
UNKNOWN = -2
# A pipeline with a `repeat(n)`: its cardinality counts every repetition, not
# one pass over the elements a cache would hold.
REPEATED = -3


@dataclasses.dataclass
class DataReuse:
    """How much of its dataset a fit read, and whether that reads an element twice.

    Attributes:
        batches_read: the training batches the fit took.
        batches_per_pass: the dataset's batches in one pass (its
            cardinality), `INFINITE`, `UNKNOWN` or `REPEATED`.

    Example:

    >>> reuse = DataReuse(batches_read=60, batches_per_pass=12500)
    >>> reuse.repeats, reuse.passes
    (False, 0.0048)
    >>> print(reuse.line)
    this fit read 60 of the dataset's 12500 batches: a cache is never read back
    """

    batches_read: int
    batches_per_pass: int

    @property
    def passes(self) -> Optional[float]:
        """Passes over the dataset the fit made; `None` when its length is not known."""
        if self.batches_per_pass <= 0:
            return None
        return self.batches_read / self.batches_per_pass

    @property
    def repeats(self) -> Optional[bool]:
        """Whether the fit read an element twice; `None` when that cannot be told."""
        passes = self.passes
        return None if passes is None else passes > 1.0

    @property
    def line(self) -> str:
        """What was read, in words, and what it means for a cache."""
        if self.batches_per_pass == INFINITE:
            return (
                f"this fit read {self.batches_read} batches of a dataset without end (a "
                "repeat()): whether it read an element twice is not known"
            )
        if self.batches_per_pass == REPEATED:
            return (
                f"this fit read {self.batches_read} batches of a dataset that repeats its "
                "elements (a repeat(n)): whether it read an element twice is not known"
            )
        if self.passes is None:
            return (
                f"this fit read {self.batches_read} batches of a dataset of unknown length: "
                "whether it read an element twice is not known"
            )
        if not self.repeats:
            return (
                f"this fit read {self.batches_read} of the dataset's "
                f"{self.batches_per_pass} batches: a cache is never read back"
            )
        return (
            f"this fit read the dataset's {self.batches_per_pass} batches "
            f"{self.passes:.1f} times: a cache is filled in the first pass and read back "
            "after it"
        )

    def fit_speedup(self, steady_speedup: float) -> float:
        """A cache's gain over the whole fit, its first pass (the fill) at today's speed.

        Args:
            steady_speedup: the gain on the passes that read the cache back.

        Returns:
            The whole fit's time now over its time with the cache; the steady
            figure when the number of passes is not known.

        Example:

        >>> round(DataReuse(200, 100).fit_speedup(4.0), 2)
        1.6
        """
        passes = self.passes
        if passes is None or passes <= 1.0 or steady_speedup <= 0:
            return steady_speedup if passes is None else 1.0
        filled = 1.0 / passes
        return 1.0 / (filled + (1.0 - filled) / steady_speedup)


def reuse_of(
    batches_per_pass: Optional[int], batches_read: int, repeated: bool = False
) -> Optional[DataReuse]:
    """The fit's `DataReuse`, or `None` when the dataset's length was not read.

    Args:
        batches_per_pass: the dataset's cardinality as `tf.data` gives it
            (`INFINITE`, `UNKNOWN` or a count), or `None` when not read.
        batches_read: the training batches the fit took.
        repeated: whether the pipeline has a `repeat()`: a finite count then
            holds every repetition, and one pass is not known.

    Returns:
        The `DataReuse`, or `None`.

    Example:

    >>> reuse_of(10, 30).repeats, reuse_of(None, 30)
    (True, None)
    """
    if batches_per_pass is None or batches_read <= 0:
        return None
    if repeated and batches_per_pass >= 0:
        batches_per_pass = REPEATED
    return DataReuse(int(batches_read), int(batches_per_pass))
