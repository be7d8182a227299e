"""Busy loops: the CPU load the benches run beside, as a busy shared machine has.

Each loop is a process spinning in pure Python. It yields the CPU every 2 ms
(`os.sched_yield`), which changes nothing under the usual scheduler, where the
kernel shares the CPUs among busy processes by itself; but where a bench runs
at real-time priority (`chrt -r 10 python bench/...`, so that other jobs on a
shared host cannot take its CPUs) the loops inherit it, and a real-time loop
that never yields keeps its CPU from every other process of its priority.
Yielding, they share the CPUs with the bench, but round-robin in 2 ms turns,
not as the usual scheduler shares them: loaded figures are taken at normal
priority (see docs/performance.md).

The loops are never the bench's child processes: the tuner counts the CPU of a
process's live children as its own (a loader's worker processes), so loops
started as children of a bench that fits in-process read as busy workers
(beside two of them, a sleeping `PyDataset` read "100 % input" and its workers
were predicted 4.04x against 1.91x delivered). A spawner starts them in a
session of their own and exits, so they are init's children (or the nearest
subreaper's), and they are killed by their process ids.
"""

import contextlib
import os
import signal
import subprocess
import sys

_LOOP = (
    "import os, time\n"
    "while True:\n"
    "    until = time.perf_counter() + 0.002\n"
    "    while time.perf_counter() < until:\n"
    "        pass\n"
    "    os.sched_yield()\n"
)


# Starts the loops in a session of their own and exits: they are then no
# process's children but init's (or the nearest subreaper's).
_SPAWNER = (
    "import subprocess, sys\n"
    "for _ in range(int(sys.argv[1])):\n"
    "    loop = subprocess.Popen([sys.executable, '-c', sys.argv[2]], start_new_session=True,\n"
    "                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
    "    print(loop.pid, flush=True)\n"
)


def start(count: int) -> list:
    """Starts `count` busy loops, none of them this process's children; `stop` them when done."""
    if count <= 0:
        return []
    spawner = subprocess.run(
        [sys.executable, "-c", _SPAWNER, str(count), _LOOP],
        capture_output=True, text=True, check=True, timeout=60,
    )
    return [int(line) for line in spawner.stdout.split()]


def stop(loops: list) -> None:
    """Ends the loops `start` started."""
    for pid in loops:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@contextlib.contextmanager
def running(count: int):
    """`count` busy loops (not this process's children) for as long as the block runs."""
    loops = start(count)
    try:
        yield
    finally:
        stop(loops)
