"""Keeping TensorFlow's warnings about the tuner's own partial passes out of the user's log.

`kpt.tune` and the fix timing read a few batches of pipelines that hold a
cache, and stop there. TensorFlow's C++ runtime then logs, for every such
iterator, that "the calling iterator did not fully read the dataset being
cached" and advises `take(k).cache()`: a warning about the tuner's own
passes that reads as if the user's pipeline were wrong. It is written by
the C++ logger straight to file descriptor 2, which Python's `warnings` and
`logging` never see, so `dropped_lines` puts a pipe in front of descriptor
2 while the passes run and copies every other line through, unchanged and as
it comes (a thread reads the pipe: no output waits for the passes to end).
"""

import contextlib
import os
import sys
import threading
from typing import Iterator
from typing import Sequence

# What the tuner's partial passes make TensorFlow log, and nothing else.
PARTIAL_CACHE_READ = "did not fully read the dataset being cached"
_STDERR = 2
_CHUNK = 65536


@contextlib.contextmanager
def dropped_lines(patterns: Sequence[str] = (PARTIAL_CACHE_READ,)) -> Iterator[None]:
    """Drops the lines holding any of `patterns` from file descriptor 2, within the block.

    Everything else written to standard error in the block (Python's own
    `sys.stderr` included) comes out as before. Where descriptor 2 cannot be
    redirected (no such descriptor, no pipes), the block runs unfiltered.

    Args:
        patterns: substrings; a line holding one of them is dropped.

    Returns:
        A context manager.

    Example:

    >>> with dropped_lines(["noise"]):
    ...     pass
    """
    try:
        sys.stderr.flush()
        saved = os.dup(_STDERR)
    except (OSError, ValueError, AttributeError):
        yield
        return
    try:
        read_end, write_end = os.pipe()
    except OSError:
        os.close(saved)
        yield
        return
    os.dup2(write_end, _STDERR)
    os.close(write_end)
    pump = threading.Thread(
        target=_copy_lines, args=(read_end, saved, tuple(patterns)), daemon=True
    )
    pump.start()
    try:
        yield
    finally:
        try:
            sys.stderr.flush()
        except (OSError, ValueError, AttributeError):
            pass
        # Putting the saved descriptor back closes the pipe's last write end:
        # the thread reads to its end, copies the rest, and stops.
        os.dup2(saved, _STDERR)
        pump.join(timeout=5.0)
        os.close(saved)


def _copy_lines(read_end: int, target: int, patterns: Sequence[str]) -> None:
    """Copies whole lines from `read_end` to `target`, leaving out those with a pattern."""
    pending = b""
    encoded = [pattern.encode() for pattern in patterns]
    try:
        while True:
            chunk = os.read(read_end, _CHUNK)
            if not chunk:
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            kept = [line for line in lines if not any(p in line for p in encoded)]
            if kept:
                _write_all(target, b"\n".join(kept) + b"\n")
            if pending.endswith(b"\r"):
                # A progress line redrawn in place: shown now, not at the next newline.
                _write_all(target, pending)
                pending = b""
        if pending and not any(p in pending for p in encoded):
            _write_all(target, pending)
    except OSError:
        pass
    finally:
        os.close(read_end)


def _write_all(target: int, data: bytes) -> None:
    while data:
        written = os.write(target, data)
        data = data[written:]
