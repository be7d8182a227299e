"""Checks of the arguments users pass to the measuring functions.

Each check fails at the call, naming the argument, what it got and what to
pass instead, before any measurement starts.
"""

from typing import Optional

from keras_pipeline_tuner._util.tf_import import tensorflow


def checked_dataset(value, function: str):
    """Returns `value` if it is a `tf.data.Dataset` iterated eagerly.

    Args:
        value: what the user passed.
        function: the public function's name, for the message.

    Returns:
        `value`.

    Raises:
        TypeError: if it is not a `tf.data.Dataset`.
        RuntimeError: if called inside a `tf.function`.

    Example:

    >>> int(checked_dataset(tf.data.Dataset.range(3), "benchmark").cardinality())
    3
    """
    tf = tensorflow()
    if not isinstance(value, tf.data.Dataset):
        raise TypeError(
            f"{function}() takes a tf.data.Dataset, got {type(value).__name__}. Wrap "
            "in-memory data with tf.data.Dataset.from_tensor_slices(...) first."
        )
    if not tf.executing_eagerly():
        raise RuntimeError(f"{function}() runs eagerly: call it outside tf.function.")
    return value


def positive_int(value, name: str, optional: bool = False) -> Optional[int]:
    """Returns `value` if it is an integer >= 1 (or `None` when `optional`).

    Args:
        value: what the user passed.
        name: the argument's name, for the message.
        optional: whether `None` is allowed.

    Returns:
        `value`.

    Raises:
        ValueError: naming the argument otherwise.
    """
    if value is None and optional:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        allowed = " or None" if optional else ""
        raise ValueError(f"`{name}` must be a positive integer{allowed}, got {value!r}.")
    return value


def non_negative_int(value, name: str) -> int:
    """Returns `value` if it is an integer >= 0.

    Raises:
        ValueError: naming the argument otherwise.
    """
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"`{name}` must be an integer >= 0, got {value!r}.")
    return value


def seconds(value, name: str) -> Optional[float]:
    """Returns `value` as float seconds if it is a number >= 0, or `None`.

    Args:
        value: what the user passed.
        name: the argument's name, for the message.

    Returns:
        The number of seconds as a float, or `None`.

    Raises:
        ValueError: naming the argument otherwise.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ValueError(f"`{name}` must be a number of seconds >= 0 (or None), got {value!r}.")
    return float(value)


def verbosity(value) -> int:
    """Returns `value` if it is 0 (silent) or 1 (progress bar).

    Raises:
        ValueError: otherwise.
    """
    if value not in (0, 1) or isinstance(value, bool):
        raise ValueError(f"`verbose` must be 0 or 1, got {value!r}.")
    return value
