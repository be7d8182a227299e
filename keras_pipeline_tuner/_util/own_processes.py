"""The tuner's own child processes, kept apart from the job's in its CPU figures.

The CPU meter counts a job's child processes (a DataLoader's or a PyDataset's
workers) as the input's. The tuner starts children of its own (the profile's
conversion); their CPU time is not the job's input: each is registered while
it runs, and once it has ended (and the kernel has added its CPU time to the
process's reaped children) the CPU time it reported is subtracted.
"""

import threading
from typing import Set

_lock = threading.Lock()
_running: Set[int] = set()
_ended_cpu_s = [0.0]


def started(pid: int) -> None:
    """Registers a child process the tuner started.

    Example:

    >>> started(999999); is_own(999999)
    True
    >>> ended(999999, 0.0); is_own(999999)
    False
    """
    with _lock:
        _running.add(pid)


def ended(pid: int, cpu_s: float) -> None:
    """Marks the tuner's child `pid` as reaped, having used `cpu_s` CPU seconds."""
    with _lock:
        if pid in _running:
            _running.discard(pid)
            _ended_cpu_s[0] += max(cpu_s, 0.0)


def is_own(pid: int) -> bool:
    """Whether `pid` is a running child process of the tuner's."""
    with _lock:
        return pid in _running


def ended_cpu_s() -> float:
    """The CPU seconds the tuner's ended children used, in all, since the process started."""
    with _lock:
        return _ended_cpu_s[0]
