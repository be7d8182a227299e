"""How busy the CPUs were while training ran.

A pipeline that waits for input although its stages already run in parallel
needs more CPUs, not more threads: whether the CPUs were saturated decides
between the two. Two figures are measured over the run, at the cost of reading
a few counters at its start and end:

- the process: its user and system CPU time over the wall time, in cores:
  all its threads (tf.data's included) and its child processes (the workers
  of a `PyDataset` or a DataLoader), live or already waited for (psutil;
  without it `os.times()`, which sees children only once waited for). Live
  children are listed only where the input may start them: the listing reads
  every process of the host (1-3 ms on a busy one), twice an epoch;
- the host: the share of time the CPUs this process may run on were busy, from
  the kernel's counters in `/proc/stat` (Linux; every process counts, so other
  jobs on the host show too). Elsewhere only the process figure exists.

The meter also reads how long the thread that marks a span (the training
thread) waited for a core over it: the kernel's run-queue delay
(`/proc/thread-self/schedstat`, Linux), which other work on the cores and a
quota's throttling add to a step's wall time.

Beside them the meter reads the process's CPU budget (`cpu_budget`: affinity
mask and the container's cgroup quota) and how often the kernel throttled the
cgroup over the span. Where a quota binds, the host's CPUs can be idle while
the job has no CPU time left, so the process's use is judged against the quota.
"""

import dataclasses
import os
import threading
import time
from typing import Callable
from typing import Dict
from typing import Optional
from typing import Tuple

from keras_pipeline_tuner._util import own_processes
from keras_pipeline_tuner.timing.cpu_budget import HOST
from keras_pipeline_tuner.timing.cpu_budget import QUOTA
from keras_pipeline_tuner.timing.cpu_budget import CpuBudget
from keras_pipeline_tuner.timing.cpu_budget import Throttling
from keras_pipeline_tuner.timing.cpu_budget import read_cpu_budget
from keras_pipeline_tuner.timing.cpu_budget import read_throttling

_PROC_STAT = "/proc/stat"
# The calling thread's time on a core and waiting for one, in ns (Linux).
_THREAD_SCHEDSTAT = "/proc/thread-self/schedstat"
# Fields of a /proc/stat cpu line that are idle time: idle and iowait.
_IDLE_FIELDS = (3, 4)
# Busy share from which the CPUs count as saturated.
BUSY_FRACTION = 0.8
# Share of the quota periods throttled from which the job counts as slowed by
# the kernel: a tenth of its periods cut short.
THROTTLED_SHARE = 0.1


def budget_cpus(usage: Optional["CpuUsage"]) -> int:
    """The CPUs a parallel stage may use: the budget read for a run's span, else read now.

    Example:

    >>> budget_cpus(CpuUsage(wall_s=1.0, cpu_count=8, process_cores=1.0,
    ...                      budget=CpuBudget(8, 8, quota_cpus=2.0)))
    2
    """
    budget = usage.budget if usage is not None else None
    return (budget or read_cpu_budget()).cpus


def throttled(usage: Optional["CpuUsage"]) -> bool:
    """Whether a run's CPU figures, if any, say a quota throttled it (`CpuUsage.throttled`).

    Example:

    >>> throttled(None)
    False
    """
    return usage is not None and usage.throttled


@dataclasses.dataclass
class CpuUsage:
    """CPU use over a span of training.

    Attributes:
        wall_s: the span's wall time in seconds.
        cpu_count: the CPUs this process may run on.
        process_cores: CPU time this process used over the wall time: the
            average number of cores it kept busy (all its threads and its
            child processes).
        host_busy: share of the time those CPUs were busy, counting every
            process on the host; `None` where the kernel's counters cannot be
            read (not Linux).
        budget: the CPUs the process may use (affinity and cgroup quota),
            read when the span began; `None` where not read.
        throttling: how often the kernel throttled the process's cgroup for
            exceeding its quota over the span; `None` where the cgroup has no
            throttling counters (no cgroup, or not Linux).
        children_cores: the part of `process_cores` its child processes used
            (a DataLoader's or a PyDataset's worker processes), or `None`
            where it was not read apart (no psutil).
        thread_delay_s: how long the thread that marked the span's start and
            end (the training thread) waited for a core over it (the
            kernel's run-queue delay), or `None` where not read (another
            thread marked one end, or not Linux).

    Example:

    >>> CpuUsage(wall_s=10.0, cpu_count=2, process_cores=1.9).busy
    0.95
    """

    wall_s: float
    cpu_count: int
    process_cores: float
    host_busy: Optional[float] = None
    budget: Optional[CpuBudget] = None
    throttling: Optional[Throttling] = None
    children_cores: Optional[float] = None
    thread_delay_s: Optional[float] = None

    @property
    def busy(self) -> float:
        """The share of the CPUs that was busy: the host's, else this process's.

        Where a cgroup quota binds, the process's share of the quota when
        that is higher: a job that used its quota up is out of CPU however
        idle the host's CPUs are.
        """
        own = min(self.process_cores / max(self.cpu_count, 1), 1.0)
        quota_share = self._quota_share()
        if quota_share is not None:
            own = quota_share
            if self.host_busy is not None:
                return max(own, self.host_busy)
        if self.host_busy is not None:
            return self.host_busy
        return own

    def describe_busy(self) -> str:
        """`busy` in words, naming what was busy: the job's quota, or the CPUs.

        Example:

        >>> CpuUsage(wall_s=10.0, cpu_count=2, process_cores=1.9).describe_busy()
        'the CPUs were 95 % busy'
        >>> quota = CpuBudget(host_count=2, affinity_count=2, quota_cpus=1.0)
        >>> CpuUsage(wall_s=10.0, cpu_count=2, process_cores=0.96, host_busy=0.5,
        ...          budget=quota).describe_busy()
        'the job used 96 % of its 1.00-CPU quota'
        """
        quota_share = self._quota_share()
        if quota_share is not None and quota_share >= self.busy:
            limit = self.budget.limit_cpus
            return f"the job used {quota_share * 100:.0f} % of its {limit:.2f}-CPU quota"
        return f"the CPUs were {self.busy * 100:.0f} % busy"

    @property
    def others_cores(self) -> float:
        """The cores other processes kept busy on the CPUs this one may run on.

        The host's busy cores less this process's, where the host's counters
        were read and no cgroup quota binds (under a quota, the job's CPU is
        its quota's, whatever others use). Zero where unknown.

        Example:

        >>> round(CpuUsage(wall_s=10.0, cpu_count=2, process_cores=0.8,
        ...                host_busy=1.0).others_cores, 2)
        1.2
        """
        if self.host_busy is None or self._quota_share() is not None:
            return 0.0
        return max(self.host_busy * self.cpu_count - self.process_cores, 0.0)

    def _quota_share(self) -> Optional[float]:
        """The share of its quota the process used, where a quota binds."""
        if self.budget is None or self.budget.binding != QUOTA:
            return None
        return min(self.process_cores / self.budget.limit_cpus, 1.0)

    @property
    def throttled(self) -> bool:
        """Whether the kernel stopped the job in at least `THROTTLED_SHARE` of its periods.

        Then the stops fall wherever the threads are, between steps too, and
        measures that time the steps alone miss them.
        """
        return self.throttling is not None and self.throttling.share >= THROTTLED_SHARE

    @property
    def saturated(self) -> bool:
        """Whether the CPUs were busy at least `BUSY_FRACTION` of the time."""
        return self.busy >= BUSY_FRACTION

    def limits(self) -> Optional[str]:
        """The CPU budget and throttling in one line, when either limits the job.

        Returns:
            E.g. "CPU budget 1 CPU: cgroup quota 1.00 CPU (v1) binds; affinity
            2 of 2 host CPUs; the kernel throttled it in 15 of 16 quota
            periods (94 %, 1.45 s stopped)."; `None` when every host CPU is
            the process's and it was never throttled (the JSON report holds
            the figures all the same).

        Example:

        >>> CpuUsage(wall_s=1.0, cpu_count=2, process_cores=1.0,
        ...          budget=CpuBudget(2, 2)).limits() is None
        True
        """
        throttled = self.throttling is not None and self.throttling.throttled_periods > 0
        if self.budget is None or (self.budget.binding == HOST and not throttled):
            return None
        text = f"CPU {self.budget.describe()}"
        if throttled:
            text += f"; {self.throttling.describe()}"
        return text + "."

    def describe(self) -> str:
        """The figures in one sentence, e.g. for a recommendation's evidence."""
        text = (
            f"this process kept {self.process_cores:.1f} of the {self.cpu_count} CPU "
            f"cores busy on average over {self.wall_s:.1f} s"
        )
        if self.host_busy is not None:
            text += f"; those cores were {self.host_busy * 100:.0f} % busy (all processes)"
        if self.budget is not None:
            text += f"; {self.budget.describe()}"
        if self.throttling is not None and self.throttling.periods > 0:
            text += f"; {self.throttling.describe()}"
        return text


@dataclasses.dataclass(frozen=True)
class CpuMark:
    """The CPU counters at one moment of a run: where a span of `CpuMeter.usage` begins.

    Attributes:
        at: `time.monotonic()` when read.
        process_s: CPU seconds of the process with the children it waited for.
        waited_s: CPU seconds of the children it waited for alone.
        live_s: CPU seconds of its live children, or `None` where they were
            not listed (see `CpuMeter`).
        host: busy and total clock ticks of the allowed CPUs, or `None`.
        throttling: the cgroup's throttling counters, or `None`.
        thread: the native id of the thread that took it.
        thread_delay_s: that thread's run-queue delay so far, or `None`.
    """

    at: float
    process_s: float
    waited_s: float
    live_s: Optional[float]
    host: Optional[Tuple[int, int]]
    throttling: Optional[Throttling]
    thread: Optional[int] = None
    thread_delay_s: Optional[float] = None


class CpuMeter:
    """Measures `CpuUsage` from a starting point, or from a mark taken on the way, to now.

    Reading the counters costs a few hundred microseconds (`/proc/stat` is
    read once), and listing the live children 1-3 ms more (psutil reads every
    process of the host): a run reads them at its start, at each training
    epoch's start and at its end, never per step, and lists the children only
    while `count_children()` says the input may start some.

    Args:
        count_children: whether to list the live child processes, asked at
            each reading; a span counts them only where both its ends did.

    Example:

    ```python
    meter = CpuMeter()
    ...                           # epoch 1
    mark = meter.mark()
    ...                           # later epochs
    meter.stop()
    usage = meter.usage()         # from the start (or restart) to the stop
    later = meter.usage(mark)     # from the mark to the stop
    ```
    """

    def __init__(self, count_children: Callable[[], bool] = lambda: True):
        self._cpus = _allowed_cpus()
        self._count_children = count_children
        self.restart()

    def restart(self) -> None:
        """Starts measuring from now."""
        self._budget = read_cpu_budget()
        self._start = self.mark()
        self._stopped: Optional[CpuMark] = None

    def mark(self) -> CpuMark:
        """The counters now: pass it to `usage` to measure from here."""
        process_s, waited_s, live_s = _process_cpu_s(self._count_children())
        return CpuMark(
            at=time.monotonic(),
            process_s=process_s,
            waited_s=waited_s,
            live_s=live_s,
            host=_host_counters(self._cpus),
            throttling=read_throttling(self._budget.cgroup),
            thread=threading.get_native_id(),
            thread_delay_s=_thread_delay_s(),
        )

    def stop(self) -> None:
        """Ends the span: `usage()` returns the usage up to now from then on (once)."""
        if self._stopped is None:
            self._stopped = self.mark()

    def usage(self, since: Optional[CpuMark] = None) -> Optional[CpuUsage]:
        """The usage from the start (or `since`) to now, or to the stop.

        Args:
            since: a `mark()` to measure from instead of the start.

        Returns:
            The `CpuUsage`, or `None` before any time has passed.
        """
        begin = since if since is not None else self._start
        end = self._stopped if self._stopped is not None else self.mark()
        wall = end.at - begin.at
        if wall <= 0:
            return None
        host_busy = None
        if end.host is not None and begin.host is not None:
            busy = end.host[0] - begin.host[0]
            total = end.host[1] - begin.host[1]
            if total > 0:
                host_busy = min(max(busy / total, 0.0), 1.0)
        process_s = end.process_s - begin.process_s
        children_cores = None
        if end.live_s is not None and begin.live_s is not None:
            live_s = end.live_s - begin.live_s
            process_s += live_s
            children_cores = max(end.waited_s - begin.waited_s + live_s, 0.0) / wall
        throttling = None
        if end.throttling is not None and begin.throttling is not None:
            throttling = end.throttling.since(begin.throttling)
        delay = None
        if begin.thread == end.thread and None not in (begin.thread_delay_s, end.thread_delay_s):
            delay = max(end.thread_delay_s - begin.thread_delay_s, 0.0)
        return CpuUsage(
            wall_s=wall,
            cpu_count=len(self._cpus) or (os.cpu_count() or 1),
            process_cores=max(process_s, 0.0) / wall,
            host_busy=host_busy,
            budget=self._budget,
            throttling=throttling,
            children_cores=children_cores,
            thread_delay_s=delay,
        )


def _thread_delay_s() -> Optional[float]:
    """The calling thread's run-queue delay so far (seconds), or `None` where unreadable."""
    try:
        with open(_THREAD_SCHEDSTAT, encoding="ascii") as file:
            return int(file.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def _allowed_cpus() -> Tuple[int, ...]:
    try:
        return tuple(sorted(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return tuple(range(os.cpu_count() or 1))


def _process_cpu_s(list_children: bool) -> Tuple[float, float, Optional[float]]:
    """CPU seconds of this process with the children it waited for, of those alone, of the live.

    The tuner's own children (`_util.own_processes`) do not count. The live
    children's part is `None` when not listed, or where psutil is missing.
    """
    # os.times(): the kernel's counters of the whole process in one call
    # (psutil's reading of /proc/self/stat took 1-2 ms for a busy process).
    times = os.times()
    waited = times.children_user + times.children_system - own_processes.ended_cpu_s()
    live = _live_children_s() if list_children else None
    return times.user + times.system + waited, waited, live


def _live_children_s() -> Optional[float]:
    """CPU seconds of this process's live children and theirs, or `None` where unreadable."""
    try:
        import psutil
    except ImportError:
        return None
    try:
        children = psutil.Process().children(recursive=True)
    except psutil.Error:
        return None
    live = 0.0
    for child in children:
        if own_processes.is_own(child.pid):
            continue
        try:
            times = child.cpu_times()
        except psutil.Error:
            # Ended since listed: counted in children_* once waited for.
            continue
        live += times.user + times.system
    return live


def _host_counters(cpus: Tuple[int, ...]) -> Optional[Tuple[int, int]]:
    """Busy and total clock ticks of `cpus` since boot, from /proc/stat."""
    try:
        with open(_PROC_STAT, encoding="ascii") as file:
            lines = file.readlines()
    except OSError:
        return None
    per_cpu: Dict[int, Tuple[int, int]] = {}
    for line in lines:
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu":
            continue
        try:
            ticks = [int(value) for value in rest.split()]
            index = int(name[3:])
        except ValueError:
            continue
        # guest time is already counted in user time.
        total = sum(ticks[:8])
        idle = sum(ticks[field] for field in _IDLE_FIELDS if field < len(ticks))
        per_cpu[index] = (total - idle, total)
    chosen = [per_cpu[cpu] for cpu in cpus if cpu in per_cpu]
    if not chosen:
        return None
    return sum(busy for busy, _ in chosen), sum(total for _, total in chosen)
