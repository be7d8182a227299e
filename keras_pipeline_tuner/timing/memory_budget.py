"""The memory budget: the bytes a job may hold, from its cgroup's limit or the host.

A container's memory limit is the cgroup's `memory.max` (v2) or
`memory.limit_in_bytes` (v1), the smallest set on the process's cgroup and
its ancestors; past it the kernel kills the job. Without one the budget is the
host's available memory (`MemAvailable` in `/proc/meminfo`). tf.data's own
RAM budget (half of the host's free memory) sees neither limit, which is why
a `cache()` larger than a container's memory kills the job hours in.
"""

import dataclasses
import os
from typing import Optional

from keras_pipeline_tuner.timing.cpu_budget import cgroup_directory
from keras_pipeline_tuner.timing.cpu_budget import parse_mountinfo
from keras_pipeline_tuner.timing.cpu_budget import parse_proc_cgroup

# A v1 limit this large is "no limit" (the kernel writes a page-rounded int64 max).
_NO_LIMIT = 2**60
CGROUP_V1 = "cgroup memory.limit_in_bytes"
CGROUP_V2 = "cgroup memory.max"
HOST = "host's available memory"


@dataclasses.dataclass(frozen=True)
class MemoryBudget:
    """The memory a job may hold (read, not measured).

    Attributes:
        limit_bytes: the bytes the job may hold.
        source: what set it: `CGROUP_V1`, `CGROUP_V2` or `HOST`.
        cgroup: the cgroup directory whose limit it is, "" for the host.

    Example:

    >>> MemoryBudget(2**30, CGROUP_V2, "/sys/fs/cgroup/job").describe()
    '1.0 GiB (cgroup memory.max of /sys/fs/cgroup/job)'
    """

    limit_bytes: int
    source: str
    cgroup: str = ""

    def describe(self) -> str:
        """The budget and where it comes from, in words."""
        where = f" of {self.cgroup}" if self.cgroup else ""
        return f"{gib(self.limit_bytes)} ({self.source}{where})"


def gib(count: int) -> str:
    """Bytes as people read them.

    Example:

    >>> gib(3 * 2**30), gib(512 * 2**20)
    ('3.0 GiB', '512 MiB')
    """
    if count >= 2**30:
        return f"{count / 2**30:.1f} GiB"
    return f"{count / 2**20:.0f} MiB"


def read_memory_budget(proc_root: str = "/proc") -> Optional[MemoryBudget]:
    """The memory budget of this process: its cgroup's limit where set, else the host's.

    Args:
        proc_root: where procfs is mounted.

    Returns:
        The `MemoryBudget`, or `None` where nothing could be read.

    Example:

    >>> budget = read_memory_budget()
    >>> budget is None or budget.limit_bytes > 0
    True
    """
    try:
        with open(os.path.join(proc_root, "self", "cgroup")) as proc:
            entries = parse_proc_cgroup(proc.read())
        with open(os.path.join(proc_root, "self", "mountinfo")) as mounts_file:
            mounts = parse_mountinfo(mounts_file.read())
    except OSError:
        entries, mounts = [], []
    found = _cgroup_limit(entries, mounts)
    if found is not None:
        return found
    available = _host_available(proc_root)
    return MemoryBudget(available, HOST) if available else None


def _cgroup_limit(entries, mounts) -> Optional[MemoryBudget]:
    for entry in entries:
        if "memory" in entry.controllers:
            for mount in mounts:
                if mount.fstype == "cgroup" and "memory" in mount.super_options:
                    directory = cgroup_directory(mount, entry.path)
                    return _smallest(directory, mount.mount_point, "memory.limit_in_bytes",
                                     CGROUP_V1)
    for entry in entries:
        if entry.hierarchy_id == 0 and not entry.controllers:
            for mount in mounts:
                if mount.fstype == "cgroup2":
                    directory = cgroup_directory(mount, entry.path)
                    return _smallest(directory, mount.mount_point, "memory.max", CGROUP_V2)
    return None


def _smallest(directory: str, top: str, name: str, source: str) -> Optional[MemoryBudget]:
    """The smallest limit set on `directory` and its ancestors up to `top`."""
    best = None
    current = os.path.normpath(directory)
    top = os.path.normpath(top)
    while True:
        limit = _limit(os.path.join(current, name))
        if limit is not None and (best is None or limit < best.limit_bytes):
            best = MemoryBudget(limit, source, current)
        if current == top or len(current) <= len(top):
            return best
        current = os.path.dirname(current)


def _limit(path: str) -> Optional[int]:
    try:
        with open(path) as file:
            text = file.read().strip()
    except OSError:
        return None
    if not text or text == "max" or not text.isdigit():
        return None
    value = int(text)
    return value if 0 < value < _NO_LIMIT else None


def _host_available(proc_root: str) -> Optional[int]:
    try:
        with open(os.path.join(proc_root, "meminfo")) as file:
            for line in file:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
