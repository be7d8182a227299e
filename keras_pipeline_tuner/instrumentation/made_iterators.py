"""A stand-in for what Keras iterates that tells the tuner of each iterator made from it.

Keras makes the iterator of a fit's data itself (`iter()` in its epoch
iterator or its data adapter) and keeps no reference the tuner can reach on
some backends. Where it calls `iter()`, the tuner puts this stand-in for the
same object: `iter()` makes the very same iterator and hands it to a callable
first, and every other attribute is the object's own.
"""

from typing import Callable


class IteratorsMade:
    """Stands in for an iterable: `iter()` makes the same iterator and hands it to `made`.

    Args:
        iterable: what Keras iterates (a dataset, a Grain dataset, ...).
        made: called with each new iterator, before it gives an element; what
            it returns, if not `None`, is what `iter()` returns in its place
            (an iterator over the same elements).

    Attributes:
        iterable: the object it stands for.

    Example:

    >>> seen = []
    >>> stand_in = IteratorsMade([1, 2], seen.append)
    >>> list(stand_in), len(seen), stand_in.count(1)
    ([1, 2], 1, 1)
    """

    __slots__ = ("iterable", "_made")

    def __init__(self, iterable, made: Callable[[object], None]):
        self.iterable = iterable
        self._made = made

    def __iter__(self):
        iterator = iter(self.iterable)
        given = self._made(iterator)
        return iterator if given is None else given

    def __getattr__(self, name):
        return getattr(self.iterable, name)
