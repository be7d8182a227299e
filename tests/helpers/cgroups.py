"""Test cgroups with a CPU quota: made under the cpu controller's hierarchy, removed after.

Root on Linux only; elsewhere the tests that need them skip, saying why.
"""

import os
import time
import uuid

import pytest

from keras_pipeline_tuner.timing.cpu_budget import find_cpu_cgroups


def cpu_hierarchy():
    """`(version, directory)` under which a cgroup with a CPU quota can be made, or
    `(None, why not)`."""
    if os.geteuid() != 0:
        return None, "setting a cgroup CPU quota needs root"
    try:
        with open("/proc/self/cgroup") as proc, open("/proc/self/mountinfo") as mounts:
            candidates = find_cpu_cgroups(proc.read(), mounts.read())
    except OSError:
        return None, "no /proc/self/cgroup or mountinfo (not Linux)"
    for candidate in candidates:
        top = candidate.mount_point
        if candidate.version == 1 and os.path.exists(os.path.join(top, "cpu.cfs_quota_us")):
            return 1, top
        if candidate.version == 2:
            try:
                with open(os.path.join(top, "cgroup.subtree_control")) as file:
                    if "cpu" in file.read().split():
                        return 2, top
            except OSError:
                pass
    return None, "no cgroup hierarchy with the cpu controller to make a test cgroup in"


def make_quota_cgroup(version, top, cpus, made, period=100000):
    """Makes `top/kpt-test-*` with a quota of `cpus` a `period` (in µs); appends it
    to `made`; returns it.

    Raises:
        OSError: if the directory cannot be made.
    """
    path = os.path.join(top, f"kpt-test-{uuid.uuid4().hex[:8]}")
    os.mkdir(path)
    made.append(path)
    # High weights win the scheduler's share from any other load: the
    # quota, not the machine's load, limits what runs in it.
    if version == 1:
        write(path, "cpu.cfs_period_us", str(period))
        write(path, "cpu.cfs_quota_us", str(int(cpus * period)))
        write(path, "cpu.shares", "262144")
    else:
        write(path, "cpu.max", f"{int(cpus * period)} {period}")
        write(path, "cpu.weight", "10000")
    return path


@pytest.fixture
def quota_cgroup():
    """A function making a cgroup with a CPU quota; removes what it made afterwards."""
    version, top = cpu_hierarchy()
    if version is None:
        pytest.skip(top)
    made = []

    def make(cpus, nested=False, period=100000):
        """Makes `top/kpt-test-*` with quota `cpus` a `period` (µs), and under it
        `inner` without one when `nested`; returns `(directory to join, directory
        with the quota)`."""
        try:
            path = make_quota_cgroup(version, top, cpus, made, period)
        except OSError as error:
            pytest.skip(f"cannot make a cgroup under {top}: {error}")
        if not nested:
            return path, path
        inner = os.path.join(path, "inner")
        if version == 2:
            write(path, "cgroup.subtree_control", "+cpu")
        os.mkdir(inner)
        made.append(inner)
        return inner, path

    try:
        yield make
    finally:
        for path in reversed(made):
            remove_cgroup(path, top)


def write(directory, name, value):
    with open(os.path.join(directory, name), "w") as file:
        file.write(value)


def remove_cgroup(path, top):
    """Moves what is left in the cgroup to `top` (its processes have exited), then removes it."""
    for _ in range(50):
        try:
            with open(os.path.join(path, "cgroup.procs")) as file:
                left = [line.strip() for line in file if line.strip()]
            for pid in left:
                write(top, "cgroup.procs", pid)
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)
    os.rmdir(path)


def memory_hierarchy():
    """`(version, directory)` of this process's memory cgroup, under which a child with a
    memory limit can be made, or `(None, why not)`."""
    if os.geteuid() != 0:
        return None, "setting a cgroup memory limit needs root"
    from keras_pipeline_tuner.timing.cpu_budget import cgroup_directory
    from keras_pipeline_tuner.timing.cpu_budget import parse_mountinfo
    from keras_pipeline_tuner.timing.cpu_budget import parse_proc_cgroup

    try:
        with open("/proc/self/cgroup") as proc, open("/proc/self/mountinfo") as mounts:
            entries, found = parse_proc_cgroup(proc.read()), parse_mountinfo(mounts.read())
    except OSError:
        return None, "no /proc/self/cgroup or mountinfo (not Linux)"
    for entry in entries:
        if "memory" in entry.controllers:
            for mount in found:
                if mount.fstype == "cgroup" and "memory" in mount.super_options:
                    directory = cgroup_directory(mount, entry.path)
                    if os.path.exists(os.path.join(directory, "memory.limit_in_bytes")):
                        return 1, directory
    for entry in entries:
        if entry.hierarchy_id == 0 and not entry.controllers:
            for mount in found:
                if mount.fstype == "cgroup2":
                    directory = cgroup_directory(mount, entry.path)
                    try:
                        with open(os.path.join(directory, "cgroup.subtree_control")) as file:
                            if "memory" in file.read().split():
                                return 2, directory
                    except OSError:
                        pass
    return None, "no cgroup hierarchy with the memory controller to make a test cgroup in"


@pytest.fixture
def memory_cgroup():
    """A function making a cgroup with a memory limit (bytes); removes what it made afterwards.

    The cgroup is made under this process's own memory cgroup; a process joins
    it by writing its pid to the returned directory's `cgroup.procs`.
    """
    version, top = memory_hierarchy()
    if version is None:
        pytest.skip(top)
    made = []

    def make(limit_bytes: int) -> str:
        path = os.path.join(top, f"kpt-test-{uuid.uuid4().hex[:8]}")
        try:
            os.mkdir(path)
        except OSError as error:
            pytest.skip(f"cannot make a cgroup under {top}: {error}")
        made.append(path)
        write(path, "memory.limit_in_bytes" if version == 1 else "memory.max", str(limit_bytes))
        return path

    try:
        yield make
    finally:
        for path in reversed(made):
            remove_cgroup(path, top)
