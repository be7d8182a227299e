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
"""

import contextlib
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


def start(count: int) -> list:
    """Starts `count` busy loops; `stop` them when done."""
    return [subprocess.Popen([sys.executable, "-c", _LOOP]) for _ in range(count)]


def stop(loops: list) -> None:
    """Ends the loops `start` started."""
    for loop in loops:
        loop.kill()
        loop.wait()


@contextlib.contextmanager
def running(count: int):
    """`count` busy loops for as long as the block runs."""
    loops = start(count)
    try:
        yield
    finally:
        stop(loops)
