"""Runs a function in a forked copy of this process and hands back its result.

Why: the fix timing runs the user's pipeline again after training, and what
the pipeline runs may keep state: a Python function's counter or NumPy
generator, a `tf.random.Generator`, a variable it assigns. Run again in the
training process, that state moves on and the user's next fit reads other
data. In a copy made by `fork()` it moves in the copy only. The copy also
closes every file descriptor it inherited except its standard streams and the
pipe back, since a child shares its parent's open files (their offsets, a
pipe's or socket's unread data): a function reading on from a file or feed
opened before training then fails in the copy, and is not read by it. What
the function opens itself is its own.

`fork()` in a process with threads can leave a lock held in the copy, which
then never answers: the copy is killed at the timeout and the caller told.
Linux only: macOS's system libraries are not safe to use after `fork()`, and
Windows has none.
"""

import os
import pickle
import select
import signal
import sys
import time
import warnings
from typing import Callable
from typing import Optional
from typing import TypeVar

T = TypeVar("T")

# Bytes read from the pipe at a time.
_CHUNK = 1 << 16


class ForkedCallError(RuntimeError):
    """The copy of the process gave no result: it hung, died, or its error could not be sent."""


def fork_unavailable() -> Optional[str]:
    """Why this process cannot run a function in a forked copy of itself, or `None`.

    Example:

    >>> fork_unavailable() is None  # Linux
    True
    """
    if not sys.platform.startswith("linux") or not hasattr(os, "fork"):
        return f"running it in a forked copy of the process needs Linux (this is {sys.platform})"
    return None


def forked_call(function: Callable[[], T], timeout_s: float) -> T:
    """Calls `function()` in a forked copy of this process and returns what it returned.

    Nothing the function changes in memory reaches this process; an exception
    it raises is raised here (as a `ForkedCallError` when it cannot be
    pickled). Blocks the calling thread until the copy answers.

    Args:
        function: takes no arguments; its result must pickle.
        timeout_s: seconds after which the copy is killed.

    Returns:
        The function's result, unpickled.

    Raises:
        ForkedCallError: when the copy did not answer within `timeout_s`,
            died, or raised an error that does not pickle; or when forking
            is not available (`fork_unavailable`).

    Example:

    >>> state = [0]
    >>> def count():
    ...     state[0] += 1
    ...     return state[0]
    >>> forked_call(count, timeout_s=30), state
    (1, [0])
    """
    why_not = fork_unavailable()
    if why_not is not None:
        raise ForkedCallError(why_not)
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():
        # JAX warns at every fork that its threads may deadlock the copy: the
        # copy runs no JAX, and a hung copy is killed at the timeout.
        warnings.simplefilter("ignore", RuntimeWarning)
        pid = os.fork()
    if pid == 0:
        _child(function, read_end, write_end)
    os.close(write_end)
    try:
        payload = _read_until(read_end, time.monotonic() + timeout_s)
    finally:
        os.close(read_end)
    if payload is None:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise ForkedCallError(f"the copy of the process did not answer within {timeout_s:.0f} s")
    _, status = os.waitpid(pid, 0)
    if not payload:
        raise ForkedCallError(f"the copy of the process ended without an answer ({_ended(status)})")
    kind, value = pickle.loads(payload)
    if kind == "raised":
        raise value
    return value


def _child(function, read_end: int, write_end: int) -> None:
    """The copy: closes what it inherited, calls `function`, writes the result, exits."""
    code = 1
    try:
        os.close(read_end)
        # Every inherited descriptor but stdin, stdout, stderr and the pipe.
        os.closerange(3, write_end)
        os.closerange(write_end + 1, os.sysconf("SC_OPEN_MAX"))
        try:
            payload = pickle.dumps(("returned", function()))
        except BaseException as error:  # noqa: BLE001 - sent to the parent as it is.
            try:
                payload = pickle.dumps(("raised", error))
            except Exception:  # noqa: BLE001 - an error that does not pickle.
                text = f"{type(error).__name__}: {error}"
                payload = pickle.dumps(("raised", ForkedCallError(text)))
        view = memoryview(payload)
        while view:
            view = view[os.write(write_end, view):]
        code = 0
    finally:
        # No interpreter shutdown in the copy: no atexit handlers, no flushing
        # of the parent's buffered files, no destructors of its threads' objects.
        os._exit(code)


def _read_until(fd: int, deadline: float) -> Optional[bytes]:
    """Everything written to `fd` until its end, or `None` at `deadline`."""
    chunks = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None
        chunk = os.read(fd, _CHUNK)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _ended(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by signal {os.WTERMSIG(status)}"
    return f"exit status {os.WEXITSTATUS(status)}"
