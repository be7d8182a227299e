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

`running_apart` starts loops that are not the bench's child processes: the
tuner counts the CPU of a process's children as its own (a loader's worker
processes), so loops started by a bench that tunes a loader in-process read
as busy workers, and a loader whose workers sleep as one whose workers compute.
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


# Starts the loops in a session of their own and exits: they are then no
# process's children but init's (or the nearest subreaper's).
_SPAWNER = (
    "import subprocess, sys\n"
    "for _ in range(int(sys.argv[1])):\n"
    "    loop = subprocess.Popen([sys.executable, '-c', sys.argv[2]], start_new_session=True,\n"
    "                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
    "    print(loop.pid, flush=True)\n"
)


@contextlib.contextmanager
def running_apart(count: int):
    """`count` busy loops outside this process's children, for as long as the block runs."""
    spawner = subprocess.run(
        [sys.executable, "-c", _SPAWNER, str(count), _LOOP],
        capture_output=True, text=True, check=True, timeout=60,
    )
    pids = [int(line) for line in spawner.stdout.split()]
    try:
        yield
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
