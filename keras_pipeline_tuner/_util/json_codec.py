"""The JSON form of the tuner's plain dataclasses, both ways, with type checks."""

import dataclasses
import enum
import math
import typing
from typing import Any
from typing import Dict
from typing import List


def reject_constant(name: str):
    """`json.loads`' `parse_constant`: NaN and Infinity are never written, so refused."""
    raise ValueError(f"Not a report: {name} is not a number a report holds.")


def encode_json_value(value):
    """The JSON form of what `json` cannot encode itself in report dataclasses (enums)."""
    if isinstance(value, enum.Enum):
        return value.value
    raise TypeError(f"Cannot serialise {type(value).__name__}")


def from_dict(cls, data: Any, where: str):
    """Builds dataclass `cls` from plain JSON data, checking types on the way.

    Args:
        cls: a dataclass type, or a typing annotation made of dataclasses,
            enums, lists, dicts, optionals and JSON scalars.
        data: the decoded JSON value.
        where: the path of `data` in the document, for error messages.

    Returns:
        The rebuilt value.

    Raises:
        ValueError: naming the field whose value has the wrong type.
    """
    origin = typing.get_origin(cls)
    args = typing.get_args(cls)
    if cls is Any:
        return data
    if origin is typing.Union:
        if data is None and type(None) in args:
            return None
        inner = [arg for arg in args if arg is not type(None)]
        return from_dict(inner[0], data, where)
    if origin in (list, List):
        if not isinstance(data, list):
            raise ValueError(f"Bad report: {where} should be a list.")
        return [from_dict(args[0], item, f"{where}[{i}]") for i, item in enumerate(data)]
    if origin is tuple:
        # A frozen record's rows (`Tuple[Row, ...]`), written as a list.
        if not isinstance(data, list):
            raise ValueError(f"Bad report: {where} should be a list.")
        return tuple(from_dict(args[0], item, f"{where}[{i}]") for i, item in enumerate(data))
    if origin in (dict, Dict):
        if not isinstance(data, dict):
            raise ValueError(f"Bad report: {where} should be an object.")
        return {str(k): from_dict(args[1], v, f"{where}.{k}") for k, v in data.items()}
    if isinstance(cls, type) and issubclass(cls, enum.Enum):
        try:
            return cls(data)
        except ValueError as error:
            raise ValueError(f"Bad report: {where} has unknown value {data!r}.") from error
    if dataclasses.is_dataclass(cls):
        if not isinstance(data, dict):
            raise ValueError(f"Bad report: {where} should be an object.")
        hints = typing.get_type_hints(cls)
        kwargs = {}
        for field in dataclasses.fields(cls):
            required = (
                field.init
                and field.default is dataclasses.MISSING
                and field.default_factory is dataclasses.MISSING
            )
            if required and field.name not in data:
                raise ValueError(f"Bad report: {where}.{field.name} is missing.")
            if field.init and field.name in data:
                kwargs[field.name] = from_dict(
                    hints[field.name], data[field.name], f"{where}.{field.name}"
                )
        return cls(**kwargs)
    if cls is float:
        if isinstance(data, bool) or not isinstance(data, (int, float)):
            raise ValueError(f"Bad report: {where} should be a number.")
        try:
            number = float(data)
        except OverflowError:
            number = math.inf
        if not math.isfinite(number):
            raise ValueError(f"Bad report: {where} should be a finite number.")
        return _possible(number, where)
    if cls in (int, str, bool):
        if not isinstance(data, cls) or (cls is int and isinstance(data, bool)):
            raise ValueError(f"Bad report: {where} should be of type {cls.__name__}.")
        return _possible(data, where) if cls is int else data
    return data


# Values no run writes: a share outside 0-1, a negative duration or count. A
# report holding one was edited or is corrupt, and every figure shown from it
# would be as wrong: it is refused where it is read, naming the field.
# (A profiled iterator's `self_share` is not one: xprof's self times can add up
# to more than the input time it is a share of.)
_SHARES = frozenset({"input_fraction", "wait_fraction", "input_fraction_a", "input_fraction_b"})
_NOT_NEGATIVE_SUFFIXES = ("_ms", "_s", "_bytes")
_COUNTS = frozenset({"steps", "calls", "batches", "rounds", "epochs", "threads"})


def _possible(number, where: str):
    """`number`, or a `ValueError` naming `where` when no run could have written it.

    Example:

    >>> _possible(0.25, "report.input_fraction")
    0.25
    >>> _possible(-0.5, "report.input_fraction")
    Traceback (most recent call last):
    ...
    ValueError: Bad report: report.input_fraction is -0.5, a share must be between 0 and 1.
    """
    name = where.rsplit(".", 1)[-1].split("[", 1)[0]
    if name in _SHARES and not 0.0 <= number <= 1.0:
        raise ValueError(f"Bad report: {where} is {number!r}, a share must be between 0 and 1.")
    if number < 0 and (name.endswith(_NOT_NEGATIVE_SUFFIXES) or name in _COUNTS):
        raise ValueError(
            f"Bad report: {where} is {number!r}, and no run measures a negative "
            f"{'count' if name in _COUNTS else 'duration or size'}."
        )
    return number
