"""The CPUs this process may really use, and whether the kernel throttles it.

Most training jobs run in containers with a CPU limit, and none of the usual
figures sees it: `os.cpu_count()` (and `psutil.cpu_count()`) count the host's
CPUs, `os.sched_getaffinity()` the CPUs the process may be scheduled on, and
tf.data's AUTOTUNE sizes its thread pools from that affinity mask. The limit
is a cgroup quota: a share of CPU time per scheduling period, enforced by
stopping ("throttling") the whole group for the rest of a period once it has
used its share. Neither `os` nor psutil reads it, so this module reads the
cgroup files itself, and takes the budget the same way loky's `cpu_count()`
does: the smaller of the affinity count and the quota rounded up to whole CPUs.

The files are found from the process's own entries in `/proc/self/cgroup` and
the mount points in `/proc/self/mountinfo`, for either cgroup version:

- v2 (one hierarchy, line `0::/path`): `cpu.max` holds "QUOTA PERIOD" in
  microseconds, or "max PERIOD" when unlimited;
- v1 (one hierarchy per controller set, the line whose controllers include
  `cpu`): `cpu.cfs_quota_us` (-1 when unlimited) and `cpu.cfs_period_us`.

A parent's limit binds its children, so the quota is the tightest one from the
process's cgroup up to the top of the mount. Inside a container the path in
`/proc/self/cgroup` may not exist under the mount (a cgroup namespace shows
"/", a bind mount shows the host's path): then the mount root's files are the
container's. On hybrid hosts (both versions mounted) the v1 `cpu` controller is
preferred, as the v2 hierarchy then has no `cpu` controller. Nothing here
raises: whatever cannot be read leaves the quota `None`.

Throttling is read from the same cgroup's `cpu.stat`: periods that ran,
periods in which the group was throttled, and the time it spent throttled.
The parsers are pure functions of the files' contents.
"""

import dataclasses
import math
import os
from typing import Iterable
from typing import List
from typing import Optional
from typing import Tuple

_PROC_CGROUP = "/proc/self/cgroup"
_MOUNTINFO = "/proc/self/mountinfo"
_CPU_MAX = "cpu.max"
_CFS_QUOTA = "cpu.cfs_quota_us"
_CFS_PERIOD = "cpu.cfs_period_us"
# The kernel's default quota period (Kubernetes' and Docker's too), in seconds,
# and the periods a timed span under a binding quota lasts (`quota_span_s`).
_DEFAULT_PERIOD_S = 0.1
_QUOTA_PERIODS_A_SPAN = 3
_CPU_STAT = "cpu.stat"

QUOTA = "quota"
AFFINITY = "affinity"
HOST = "host"


@dataclasses.dataclass(frozen=True)
class CgroupEntry:
    """One line of `/proc/self/cgroup`: a hierarchy and the process's place in it.

    Attributes:
        hierarchy_id: the hierarchy's number; 0 for cgroup v2.
        controllers: the controllers bound to it (v1), empty for v2.
        path: the process's cgroup, relative to the hierarchy's root.
    """

    hierarchy_id: int
    controllers: Tuple[str, ...]
    path: str


@dataclasses.dataclass(frozen=True)
class Mount:
    """One line of `/proc/self/mountinfo`, the fields a cgroup lookup needs.

    Attributes:
        root: the directory of the filesystem mounted (for cgroups: the
            cgroup shown at the mount point).
        mount_point: where it is mounted.
        fstype: the filesystem type ("cgroup", "cgroup2", ...).
        super_options: the per-filesystem options; for cgroup v1 they name
            the controllers.
    """

    root: str
    mount_point: str
    fstype: str
    super_options: Tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class CpuCgroup:
    """Where the process's CPU controller files are.

    Attributes:
        version: 1 or 2.
        mount_point: the hierarchy's mount point.
        directory: the process's cgroup directory under it (the mount point
            itself when the process sits at the mount's root).
    """

    version: int
    mount_point: str
    directory: str

    def lineage(self) -> List[str]:
        """The process's cgroup directory, then its parents up to the mount point.

        Returns:
            Directories, innermost first.

        Example:

        >>> CpuCgroup(1, "/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu/a/b").lineage()
        ['/sys/fs/cgroup/cpu/a/b', '/sys/fs/cgroup/cpu/a', '/sys/fs/cgroup/cpu']
        """
        top = os.path.normpath(self.mount_point)
        directory = os.path.normpath(self.directory)
        found = [directory]
        while directory != top and directory.startswith(top + os.sep):
            directory = os.path.dirname(directory)
            found.append(directory)
        return found


@dataclasses.dataclass
class CpuBudget:
    """The CPUs this process may use: host, affinity mask and cgroup quota.

    Attributes:
        host_count: the host's CPUs (`os.cpu_count()`).
        affinity_count: the CPUs the process may be scheduled on
            (`os.sched_getaffinity(0)`; the host's count where unknown).
        quota_cpus: the tightest cgroup CPU quota over the process's cgroup
            and its parents, in CPUs (quota over period); `None` when
            unlimited or unreadable.
        cgroup: the cgroup directory read: the one whose quota is the
            tightest, else the process's own; `None` when none was found.
        cgroup_version: 1 or 2, or `None` when no CPU cgroup was found.
        period_s: the period of the tightest quota in seconds (the kernel
            gives the quota's CPU time anew every period: 0.1 by default),
            or `None` without a quota.

    Example:

    >>> budget = CpuBudget(host_count=8, affinity_count=8, quota_cpus=1.5,
    ...                    cgroup="/sys/fs/cgroup/job", cgroup_version=2)
    >>> budget.cpus, budget.binding
    (2, 'quota')
    >>> budget.describe()
    'budget 2 CPUs: cgroup quota 1.50 CPUs (v2) binds; affinity 8 of 8 host CPUs'
    """

    host_count: int
    affinity_count: int
    quota_cpus: Optional[float] = None
    cgroup: Optional[str] = None
    cgroup_version: Optional[int] = None
    period_s: Optional[float] = None

    @property
    def cpus(self) -> int:
        """The budget in whole CPUs: min(affinity, ceil(quota)), at least 1."""
        count = max(self.affinity_count, 1)
        if self.quota_cpus is not None:
            count = min(count, math.ceil(self.quota_cpus))
        return max(count, 1)

    @property
    def limit_cpus(self) -> float:
        """The CPU time the process may use per second of wall time, in CPUs.

        The quota itself where it binds (0.5 for half a CPU), else the
        affinity count: the figure to compare the process's CPU use against.
        """
        if self.binding == QUOTA:
            return float(self.quota_cpus)
        return float(max(self.affinity_count, 1))

    @property
    def hidden_from_tf_data(self) -> bool:
        """Whether a quota cuts the budget below the CPUs tf.data sizes itself by.

        tf.data (its thread pool, AUTOTUNE's CPU budget) counts the CPUs the
        process may be scheduled on, its affinity, and not the quota.

        Example:

        >>> CpuBudget(8, 8, quota_cpus=2.0).hidden_from_tf_data
        True
        >>> CpuBudget(2, 2, quota_cpus=1.5).hidden_from_tf_data  # both round to 2
        False
        """
        return self.binding == QUOTA and self.cpus < self.affinity_count

    def holds(self, threads: object) -> bool:
        """Whether a thread count set in an option (an int above 0) is at most `cpus`.

        Example:

        >>> budget = CpuBudget(8, 8, quota_cpus=2.0)
        >>> budget.holds(2), budget.holds(0), budget.holds(None), budget.holds(4)
        (True, False, False, False)
        """
        counted = isinstance(threads, int) and not isinstance(threads, bool)
        return counted and 0 < threads <= self.cpus

    @property
    def binding(self) -> str:
        """Which limit binds: "quota", "affinity" or "host".

        The quota binds when it is below the affinity count as a float (a
        quota of 1.5 CPUs on 2 allowed CPUs binds, although both round to 2);
        else the affinity mask binds when it allows fewer than the host's
        CPUs; else nothing does: "host".
        """
        if self.quota_cpus is not None and self.quota_cpus < self.affinity_count:
            return QUOTA
        if self.affinity_count < self.host_count:
            return AFFINITY
        return HOST

    def describe(self) -> str:
        """The budget and the figures behind it, in one sentence.

        Returns:
            E.g. "budget 1 CPU: cgroup quota 0.50 CPU (v1) binds; affinity
            2 of 2 host CPUs".
        """
        quota = "no cgroup quota"
        if self.quota_cpus is not None:
            version = f" (v{self.cgroup_version})" if self.cgroup_version else ""
            quota = f"cgroup quota {self.quota_cpus:.2f} {_cpus(self.quota_cpus)}{version}"
        affinity = f"affinity {self.affinity_count} of {self.host_count} host CPUs"
        binding = self.binding
        if binding == QUOTA:
            limits = f"{quota} binds; {affinity}"
        elif binding == AFFINITY:
            limits = f"{affinity} binds; {quota}"
        else:
            limits = f"all {self.host_count} host {_cpus(self.host_count)}; {quota}"
        return f"budget {self.cpus} {_cpus(self.cpus)}: {limits}"


@dataclasses.dataclass
class Throttling:
    """A cgroup's CPU throttling counters, or their change over a span.

    Attributes:
        periods: scheduling periods in which the group ran.
        throttled_periods: periods in which it used its quota up and was
            stopped until the next one.
        throttled_s: the time its threads were stopped, in seconds, summed
            over the CPUs it was stopped on (so it can exceed wall time).

    Example:

    >>> start = Throttling(periods=10, throttled_periods=2, throttled_s=0.1)
    >>> end = Throttling(periods=30, throttled_periods=12, throttled_s=0.6)
    >>> delta = end.since(start)
    >>> delta.throttled_periods, delta.share
    (10, 0.5)
    """

    periods: int
    throttled_periods: int
    throttled_s: float

    @property
    def share(self) -> float:
        """The share of periods that were throttled (0 when none ran)."""
        return self.throttled_periods / self.periods if self.periods > 0 else 0.0

    def since(self, start: "Throttling") -> "Throttling":
        """The change from an earlier reading `start` to this one.

        Args:
            start: the counters at the start of the span.

        Returns:
            A `Throttling` of the span (never negative).
        """
        return Throttling(
            periods=max(self.periods - start.periods, 0),
            throttled_periods=max(self.throttled_periods - start.throttled_periods, 0),
            throttled_s=max(self.throttled_s - start.throttled_s, 0.0),
        )

    def describe(self) -> str:
        """The figures in one phrase, e.g. for `CpuUsage.describe()`."""
        return (
            f"the kernel throttled it in {self.throttled_periods} of {self.periods} "
            f"quota periods ({self.share * 100:.0f} %, {self.throttled_s:.2f} s stopped)"
        )


def affinity_count() -> int:
    """The CPUs this process may be scheduled on; the host's count where unknown.

    Example:

    >>> 1 <= affinity_count() <= (os.cpu_count() or 1)
    True
    """
    host = os.cpu_count() or 1
    try:
        return len(os.sched_getaffinity(0)) or host
    except (AttributeError, OSError):
        return host


def read_cpu_budget() -> CpuBudget:
    """Reads the CPUs this process may use, from the kernel; never raises.

    Returns:
        The `CpuBudget`: host and affinity counts, and the tightest cgroup
        quota over the process's cgroup and its parents (`None` where
        unlimited or unreadable, e.g. not on Linux).

    Example:

    >>> budget = read_cpu_budget()
    >>> 1 <= budget.cpus <= budget.affinity_count
    True
    """
    budget = CpuBudget(host_count=os.cpu_count() or 1, affinity_count=affinity_count())
    proc_cgroup = _read(_PROC_CGROUP)
    mountinfo = _read(_MOUNTINFO)
    if proc_cgroup is None or mountinfo is None:
        return budget
    for candidate in find_cpu_cgroups(proc_cgroup, mountinfo):
        located = _existing(candidate)
        levels = []
        for directory in located.lineage():
            readable, quota = _read_quota(directory, located.version)
            if readable:
                levels.append((directory, quota))
        if not levels:
            continue
        directory, quota = tightest_quota(levels)
        budget.quota_cpus = quota
        budget.cgroup = directory if directory is not None else located.directory
        budget.cgroup_version = located.version
        if directory is not None:
            budget.period_s = _read_period_s(directory, located.version)
        return budget
    return budget


def quota_span_s(budget: Optional[CpuBudget]) -> float:
    """The least a timed span should last under `budget`'s binding quota: three periods, or 0.

    The kernel stops the job for the rest of each period once its quota is
    used: a span of about one period (the cgroup's, 100 ms by default in
    Kubernetes and Docker) holds one stop or two, a third of its time apart.
    The same pipeline timed 1.33x slower and 1.14x faster with AUTOTUNE's
    budget in three fits, with passes of one period. Three periods hold three
    stops or four, a smaller share of the span for one more. The fix timing's
    passes (tf.data's and a PyDataset's) last at least this.

    Example:

    >>> round(quota_span_s(CpuBudget(8, 8, quota_cpus=2.0)), 3), quota_span_s(CpuBudget(8, 8))
    (0.3, 0.0)
    >>> round(quota_span_s(CpuBudget(8, 8, quota_cpus=2.0, period_s=0.25)), 3)
    0.75
    >>> quota_span_s(None)
    0.0
    """
    if budget is None or budget.binding != QUOTA:
        return 0.0
    return _QUOTA_PERIODS_A_SPAN * (budget.period_s or _DEFAULT_PERIOD_S)


def read_throttling(cgroup: Optional[str]) -> Optional[Throttling]:
    """Reads the cumulative throttling counters of a cgroup.

    Args:
        cgroup: the cgroup directory, e.g. `CpuBudget.cgroup`.

    Returns:
        The counters since the cgroup was made, or `None` when `cgroup` is
        `None` or its `cpu.stat` has no throttling figures.

    Example:

    >>> read_throttling(None) is None
    True
    """
    if cgroup is None:
        return None
    text = _read(os.path.join(cgroup, _CPU_STAT))
    return None if text is None else parse_cpu_stat(text)


def parse_proc_cgroup(text: str) -> List[CgroupEntry]:
    """Parses `/proc/self/cgroup`: "ID:CONTROLLERS:PATH" per line.

    Args:
        text: the file's contents.

    Returns:
        One `CgroupEntry` per well-formed line.

    Example:

    >>> parse_proc_cgroup("4:cpu,cpuacct:/job\\n0::/user.slice\\n")
    [CgroupEntry(hierarchy_id=4, controllers=('cpu', 'cpuacct'), path='/job'), \
CgroupEntry(hierarchy_id=0, controllers=(), path='/user.slice')]
    """
    entries = []
    for line in text.splitlines():
        number, sep, rest = line.partition(":")
        controllers, sep2, path = rest.partition(":")
        if not sep or not sep2 or not number.strip().isdigit():
            continue
        names = tuple(name for name in controllers.split(",") if name)
        entries.append(CgroupEntry(int(number), names, path.strip() or "/"))
    return entries


def parse_mountinfo(text: str) -> List[Mount]:
    """Parses `/proc/self/mountinfo` (see proc(5)).

    Args:
        text: the file's contents.

    Returns:
        One `Mount` per well-formed line, octal escapes ("\\040") decoded.

    Example:

    >>> line = "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu"
    >>> parse_mountinfo(line)
    [Mount(root='/', mount_point='/sys/fs/cgroup/cpu', fstype='cgroup', \
super_options=('rw', 'cpu'))]
    """
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        dash = fields.index("-")
        if dash < 6 or len(fields) < dash + 3:
            continue
        mounts.append(
            Mount(
                root=_unescape(fields[3]),
                mount_point=_unescape(fields[4]),
                fstype=fields[dash + 1],
                super_options=tuple(fields[dash + 3].split(",")) if len(fields) > dash + 3 else (),
            )
        )
    return mounts


def cgroup_directory(mount: Mount, path: str) -> str:
    """The directory of cgroup `path` under a mount of its hierarchy.

    The mount shows the hierarchy from `mount.root` down, so `path` is
    taken relative to it. A path outside the mount's root (a container
    that sees the host's path, mounted at its own cgroup) gives the mount
    point itself, as does "/" (a cgroup namespace's root).

    Args:
        mount: the hierarchy's `Mount`.
        path: the process's cgroup, from `/proc/self/cgroup`.

    Returns:
        The directory's path.

    Example:

    >>> cpu = Mount("/", "/sys/fs/cgroup/cpu", "cgroup", ("rw", "cpu"))
    >>> cgroup_directory(cpu, "/kpt/job")
    '/sys/fs/cgroup/cpu/kpt/job'
    >>> cgroup_directory(Mount("/docker/abc", "/sys/fs/cgroup", "cgroup2", ()), "/docker/abc")
    '/sys/fs/cgroup'
    """
    root = os.path.normpath(mount.root)
    path = os.path.normpath(path or "/")
    if root == "/":
        relative = path
    elif path == root:
        relative = "/"
    elif path.startswith(root + "/"):
        relative = path[len(root) :]
    else:
        relative = "/"
    return os.path.normpath(mount.mount_point + "/" + relative.lstrip("/"))


def find_cpu_cgroups(proc_cgroup: str, mountinfo: str) -> List[CpuCgroup]:
    """Where the process's CPU controller may be: v1 first, then v2.

    Args:
        proc_cgroup: the contents of `/proc/self/cgroup`.
        mountinfo: the contents of `/proc/self/mountinfo`.

    Returns:
        The candidates, in the order to try them: the v1 hierarchy whose
        controllers include `cpu` (on hybrid hosts it holds the controller),
        then the v2 hierarchy.

    Example:

    >>> find_cpu_cgroups("0::/job\\n",
    ...     "30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate")
    [CpuCgroup(version=2, mount_point='/sys/fs/cgroup', directory='/sys/fs/cgroup/job')]
    """
    entries = parse_proc_cgroup(proc_cgroup)
    mounts = parse_mountinfo(mountinfo)
    found = []
    for entry in entries:
        if "cpu" not in entry.controllers:
            continue
        for mount in mounts:
            if mount.fstype == "cgroup" and "cpu" in mount.super_options:
                found.append(CpuCgroup(1, mount.mount_point, cgroup_directory(mount, entry.path)))
                break
    for entry in entries:
        if entry.hierarchy_id != 0 or entry.controllers:
            continue
        for mount in mounts:
            if mount.fstype == "cgroup2":
                found.append(CpuCgroup(2, mount.mount_point, cgroup_directory(mount, entry.path)))
                break
    return found


def parse_cpu_max(text: str) -> Optional[float]:
    """Parses cgroup v2's `cpu.max`: "QUOTA PERIOD", or "max PERIOD".

    Args:
        text: the file's contents.

    Returns:
        The quota in CPUs (quota over period), or `None` when unlimited or
        malformed.

    Example:

    >>> parse_cpu_max("50000 100000\\n"), parse_cpu_max("max 100000\\n")
    (0.5, None)
    """
    fields = text.split()
    if not fields or fields[0] == "max":
        return None
    period = fields[1] if len(fields) > 1 else "100000"
    return _quota_cpus(fields[0], period)


def parse_cfs_quota(quota_text: str, period_text: str) -> Optional[float]:
    """Parses cgroup v1's `cpu.cfs_quota_us` and `cpu.cfs_period_us`.

    Args:
        quota_text: the quota file's contents, in microseconds (-1: none).
        period_text: the period file's contents, in microseconds.

    Returns:
        The quota in CPUs, or `None` when unlimited or malformed.

    Example:

    >>> parse_cfs_quota("150000\\n", "100000\\n"), parse_cfs_quota("-1\\n", "100000\\n")
    (1.5, None)
    """
    return _quota_cpus(quota_text.strip(), period_text.strip())


def parse_period_s(text: str) -> Optional[float]:
    """Parses a quota's period, in seconds, from the file that holds it.

    v2's `cpu.max` holds "QUOTA PERIOD" and v1's `cpu.cfs_period_us` the
    period alone, both in microseconds: the period is the last field.

    Example:

    >>> parse_period_s("50000 100000\\n"), parse_period_s("250000\\n"), parse_period_s("")
    (0.1, 0.25, None)
    """
    fields = text.split()
    try:
        period_us = int(fields[-1])
    except (IndexError, ValueError):
        return None
    return period_us / 1e6 if period_us > 0 else None


def parse_cpu_stat(text: str) -> Optional[Throttling]:
    """Parses a cgroup's `cpu.stat` into its throttling counters.

    v2 writes `nr_periods`, `nr_throttled` and `throttled_usec`; v1 writes
    `nr_periods`, `nr_throttled` and `throttled_time` (nanoseconds).

    Args:
        text: the file's contents.

    Returns:
        The cumulative `Throttling`, or `None` when the file has no
        throttling figures (v2 without the `cpu` controller enabled).

    Example:

    >>> parse_cpu_stat("nr_periods 20\\nnr_throttled 5\\nthrottled_time 250000000\\n")
    Throttling(periods=20, throttled_periods=5, throttled_s=0.25)
    >>> parse_cpu_stat("usage_usec 1000\\nuser_usec 800\\nsystem_usec 200\\n") is None
    True
    """
    values = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[1].lstrip("-").isdigit():
            values[fields[0]] = int(fields[1])
    if "nr_periods" not in values or "nr_throttled" not in values:
        return None
    if "throttled_usec" in values:
        throttled_s = values["throttled_usec"] / 1e6
    else:
        throttled_s = values.get("throttled_time", 0) / 1e9
    return Throttling(values["nr_periods"], values["nr_throttled"], throttled_s)


def tightest_quota(
    levels: Iterable[Tuple[str, Optional[float]]],
) -> Tuple[Optional[str], Optional[float]]:
    """The tightest quota over a cgroup and its parents: a parent's binds its children.

    Args:
        levels: `(directory, quota_cpus)` pairs, innermost first; `None`
            where a level has no quota.

    Returns:
        `(directory, quota_cpus)` of the smallest quota (the innermost on a
        tie), or `(None, None)` when no level has one.

    Example:

    >>> tightest_quota([("/cg/job/step", 2.0), ("/cg/job", 0.5), ("/cg", None)])
    ('/cg/job', 0.5)
    """
    best: Tuple[Optional[str], Optional[float]] = (None, None)
    for directory, quota in levels:
        if quota is not None and (best[1] is None or quota < best[1]):
            best = (directory, quota)
    return best


def _existing(candidate: CpuCgroup) -> CpuCgroup:
    """The candidate, at its mount point when its directory is not there."""
    if os.path.isdir(candidate.directory):
        return candidate
    return dataclasses.replace(candidate, directory=candidate.mount_point)


def _read_quota(directory: str, version: int) -> Tuple[bool, Optional[float]]:
    """`(readable, quota_cpus)` of one cgroup directory."""
    if version == 2:
        text = _read(os.path.join(directory, _CPU_MAX))
        return (text is not None, None if text is None else parse_cpu_max(text))
    quota = _read(os.path.join(directory, _CFS_QUOTA))
    period = _read(os.path.join(directory, _CFS_PERIOD))
    if quota is None or period is None:
        return (False, None)
    return (True, parse_cfs_quota(quota, period))


def _read_period_s(directory: str, version: int) -> Optional[float]:
    """The quota period of one cgroup directory, in seconds, or `None`."""
    text = _read(os.path.join(directory, _CPU_MAX if version == 2 else _CFS_PERIOD))
    return None if text is None else parse_period_s(text)


def _quota_cpus(quota: str, period: str) -> Optional[float]:
    try:
        quota_us, period_us = int(quota), int(period)
    except ValueError:
        return None
    if quota_us <= 0 or period_us <= 0:
        return None
    return quota_us / period_us


def _read(path: str) -> Optional[str]:
    try:
        with open(path, encoding="ascii", errors="replace") as file:
            return file.read()
    except (OSError, ValueError):
        return None


def _unescape(field: str) -> str:
    """Decodes mountinfo's octal escapes of space, tab, newline and backslash."""
    if "\\" not in field:
        return field
    out, i = [], 0
    while i < len(field):
        code = field[i + 1 : i + 4]
        if field[i] == "\\" and len(code) == 3 and all(c in "01234567" for c in code):
            out.append(chr(int(code, 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def _cpus(count: float) -> str:
    return "CPU" if count <= 1 else "CPUs"
