"""The tuner's own child processes, kept apart from the job's in its CPU figures.

The CPU meter counts a job's child processes (a DataLoader's or a PyDataset's
workers) as the input's. The tuner starts children of its own (the profile's
conversion); their CPU time is not the job's input: each is registered while
it runs, and `reap` reads its final CPU time from the ended process before
reaping it (Linux keeps an ended process's counters until its parent waits
for it), so that the whole of it, interpreter teardown included, is
subtracted once the kernel adds it to the process's reaped children.
"""

import os
import threading
import time
from typing import Optional
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


def reap(process, timeout: Optional[float] = None) -> bool:
    """Waits up to `timeout` seconds for the tuner's child `process`, then reaps it.

    Its CPU time is read between its end and its reaping (`ended`).

    Args:
        process: the child's `subprocess.Popen`, registered with `started`.
        timeout: seconds to wait; `None` waits until it ends, 0 only looks.

    Returns:
        Whether it has ended (and is reaped).

    Example:

    >>> import subprocess, sys
    >>> child = subprocess.Popen([sys.executable, "-c", "pass"])
    >>> started(child.pid)
    >>> reap(child), child.returncode, is_own(child.pid)
    (True, 0, False)
    """
    if process.returncode is not None:
        return True
    waitid = getattr(os, "waitid", None)
    if waitid is None:
        # No way to look without reaping: the child's CPU time stays the job's.
        try:
            process.wait(timeout)
        except Exception:  # noqa: BLE001 - subprocess.TimeoutExpired
            return False
        ended(process.pid, 0.0)
        return True
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        try:
            flags = os.WEXITED | os.WNOWAIT | (0 if deadline is None else os.WNOHANG)
            if waitid(os.P_PID, process.pid, flags) is not None:
                break
        except ChildProcessError:
            break  # reaped elsewhere
        if deadline is not None and time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    cpu_s = _final_cpu_s(process.pid)
    process.wait()
    ended(process.pid, cpu_s)
    return True


def _final_cpu_s(pid: int) -> float:
    """The CPU seconds of an ended, not yet reaped, process and its reaped children."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as file:
            text = file.read()
        fields = text[text.rindex(")") + 2:].split()
        # utime, stime, cutime, cstime, in clock ticks.
        return sum(int(value) for value in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0
