"""The CPU budget: parsers on saved cgroup files, then real limits set by the kernel."""

import dataclasses
import json
import os
import subprocess
import sys
import textwrap

import pytest

from keras_pipeline_tuner._util.json_codec import from_dict
from keras_pipeline_tuner.timing import cpu_budget
from keras_pipeline_tuner.timing.cpu_budget import CpuBudget
from keras_pipeline_tuner.timing.cpu_budget import CpuCgroup
from keras_pipeline_tuner.timing.cpu_budget import Mount
from keras_pipeline_tuner.timing.cpu_budget import Throttling
from keras_pipeline_tuner.timing.cpu_budget import cgroup_directory
from keras_pipeline_tuner.timing.cpu_budget import find_cpu_cgroups
from keras_pipeline_tuner.timing.cpu_budget import parse_cfs_quota
from keras_pipeline_tuner.timing.cpu_budget import parse_cpu_max
from keras_pipeline_tuner.timing.cpu_budget import parse_cpu_stat
from keras_pipeline_tuner.timing.cpu_budget import parse_mountinfo
from keras_pipeline_tuner.timing.cpu_budget import parse_proc_cgroup
from keras_pipeline_tuner.timing.cpu_budget import read_cpu_budget
from keras_pipeline_tuner.timing.cpu_budget import read_throttling
from keras_pipeline_tuner.timing.cpu_budget import tightest_quota
from keras_pipeline_tuner.timing.cpu_usage import CpuMeter
from keras_pipeline_tuner.timing.cpu_usage import CpuUsage

# --- Saved contents -----------------------------------------------------------

# A cgroup v1 host (the cpu controller mounted on its own, the process at the root).
V1_PROC_CGROUP = """\
9:name=systemd:/
8:pids:/
4:memory:/process_api/ecefd16d
3:cpuset:/
2:cpuacct:/
1:cpu:/
0::/
"""
V1_MOUNTINFO = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
# Docker on a v1 host without a cgroup namespace: the host's path, the container's
# own cgroup mounted (root field) at /sys/fs/cgroup/cpu,cpuacct.
V1_DOCKER_PROC_CGROUP = "5:cpu,cpuacct:/docker/0123abcd\n4:cpuset:/docker/0123abcd\n"
V1_DOCKER_MOUNTINFO = (
    "612 611 0:27 /docker/0123abcd /sys/fs/cgroup/cpu,cpuacct ro,nosuid shared:9 - "
    "cgroup cgroup rw,cpu,cpuacct\n"
    "613 611 0:28 /docker/0123abcd /sys/fs/cgroup/cpuset ro,nosuid - cgroup cgroup rw,cpuset\n"
)
# A systemd v2 host, a nested service cgroup.
V2_PROC_CGROUP = "0::/system.slice/train.service/job\n"
V2_MOUNTINFO = (
    "24 1 259:1 / / rw,relatime shared:1 - ext4 /dev/root rw\n"
    "35 24 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 "
    "cgroup2 rw,nsdelegate,memory_recursiveprot\n"
)
# A container with a cgroup namespace on a v2 host: it sees itself at "/".
V2_CONTAINER_PROC_CGROUP = "0::/\n"
V2_CONTAINER_MOUNTINFO = (
    "1021 1013 0:31 / /sys/fs/cgroup ro,nosuid,nodev,noexec,relatime - cgroup2 cgroup rw\n"
)
V1_CPU_STAT = (
    "nr_periods 15\nnr_throttled 14\nthrottled_time 1405577443\nnr_bursts 0\nburst_time 0\n"
)
V2_CPU_STAT = (
    "usage_usec 501234\nuser_usec 500000\nsystem_usec 1234\nnr_periods 16\n"
    "nr_throttled 15\nthrottled_usec 1012345\nnr_bursts 0\nburst_usec 0\n"
)
# v2 with the cpu controller not enabled: usage only.
V2_CPU_STAT_NO_CONTROLLER = "usage_usec 85709969841\nuser_usec 81073609235\nsystem_usec 4636\n"


def test_proc_cgroup_of_v1_and_v2():
    entries = parse_proc_cgroup(V1_PROC_CGROUP)
    assert len(entries) == 7
    assert entries[5] == cpu_budget.CgroupEntry(1, ("cpu",), "/")
    assert entries[2].path == "/process_api/ecefd16d"
    assert entries[-1] == cpu_budget.CgroupEntry(0, (), "/")
    assert parse_proc_cgroup(V1_DOCKER_PROC_CGROUP)[0].controllers == ("cpu", "cpuacct")
    assert parse_proc_cgroup(V2_PROC_CGROUP) == [
        cpu_budget.CgroupEntry(0, (), "/system.slice/train.service/job")
    ]
    assert parse_proc_cgroup("garbage\n\n") == []


def test_mountinfo_fields_and_escapes():
    mounts = parse_mountinfo(V1_MOUNTINFO)
    assert [mount.fstype for mount in mounts] == ["tmpfs", "cgroup", "cgroup", "cgroup", "cgroup2"]
    assert mounts[1] == Mount("/", "/sys/fs/cgroup/cpu", "cgroup", ("rw", "cpu"))
    docker = parse_mountinfo(V1_DOCKER_MOUNTINFO)[0]
    assert docker.root == "/docker/0123abcd" and docker.mount_point == "/sys/fs/cgroup/cpu,cpuacct"
    assert "cpu" in docker.super_options
    spaced = parse_mountinfo("40 31 0:37 / /mnt/my\\040cgroups rw - cgroup2 none rw\n")[0]
    assert spaced.mount_point == "/mnt/my cgroups"


def test_v1_cpu_controller_is_found_not_cpuacct_or_cpuset():
    # The hybrid host: v1 holds the cpu controller, v2 comes second.
    found = find_cpu_cgroups(V1_PROC_CGROUP, V1_MOUNTINFO)
    assert found == [
        CpuCgroup(1, "/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu"),
        CpuCgroup(2, "/sys/fs/cgroup/unified", "/sys/fs/cgroup/unified"),
    ]


def test_docker_host_path_maps_to_the_mount_root():
    found = find_cpu_cgroups(V1_DOCKER_PROC_CGROUP, V1_DOCKER_MOUNTINFO)
    assert found == [CpuCgroup(1, "/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup/cpu,cpuacct")]
    assert found[0].lineage() == ["/sys/fs/cgroup/cpu,cpuacct"]


def test_v2_nested_path_and_its_parents():
    (found,) = find_cpu_cgroups(V2_PROC_CGROUP, V2_MOUNTINFO)
    assert found.directory == "/sys/fs/cgroup/system.slice/train.service/job"
    assert found.lineage() == [
        "/sys/fs/cgroup/system.slice/train.service/job",
        "/sys/fs/cgroup/system.slice/train.service",
        "/sys/fs/cgroup/system.slice",
        "/sys/fs/cgroup",
    ]


def test_container_root_path_reads_the_mount_root():
    (found,) = find_cpu_cgroups(V2_CONTAINER_PROC_CGROUP, V2_CONTAINER_MOUNTINFO)
    assert found == CpuCgroup(2, "/sys/fs/cgroup", "/sys/fs/cgroup")
    assert found.lineage() == ["/sys/fs/cgroup"]


def test_cgroup_directory_relative_to_the_mount_root():
    nested = Mount("/kubepods/pod1", "/sys/fs/cgroup", "cgroup2", ())
    assert cgroup_directory(nested, "/kubepods/pod1/ctr") == "/sys/fs/cgroup/ctr"
    assert cgroup_directory(nested, "/kubepods/pod1") == "/sys/fs/cgroup"
    # A path outside the mount's root: the files of the mount root are the process's.
    assert cgroup_directory(nested, "/elsewhere") == "/sys/fs/cgroup"
    assert cgroup_directory(Mount("/", "/cg", "cgroup2", ()), "/") == "/cg"


def test_quota_files_limited_and_unlimited():
    assert parse_cpu_max("50000 100000\n") == 0.5
    assert parse_cpu_max("200000 100000\n") == 2.0
    assert parse_cpu_max("max 100000\n") is None
    assert parse_cpu_max("") is None
    assert parse_cfs_quota("50000\n", "100000\n") == 0.5
    assert parse_cfs_quota("100000\n", "100000\n") == 1.0
    assert parse_cfs_quota("-1\n", "100000\n") is None
    assert parse_cfs_quota("junk", "100000") is None


def test_the_tightest_of_parent_and_child_binds():
    child = parse_cfs_quota("200000\n", "100000\n")
    parent = parse_cfs_quota("50000\n", "100000\n")
    top = parse_cfs_quota("-1\n", "100000\n")
    assert tightest_quota([("/cg/a/b", child), ("/cg/a", parent), ("/cg", top)]) == (
        "/cg/a",
        0.5,
    )
    # A child tighter than its parent binds itself; unlimited everywhere: none.
    assert tightest_quota([("/cg/a/b", 0.25), ("/cg/a", 0.5)]) == ("/cg/a/b", 0.25)
    assert tightest_quota([("/cg/a", None), ("/cg", None)]) == (None, None)


def test_cpu_stat_v1_and_v2():
    assert parse_cpu_stat(V1_CPU_STAT) == Throttling(15, 14, 1.405577443)
    assert parse_cpu_stat(V2_CPU_STAT) == Throttling(16, 15, 1.012345)
    assert parse_cpu_stat(V2_CPU_STAT_NO_CONTROLLER) is None
    delta = parse_cpu_stat(V2_CPU_STAT).since(Throttling(6, 5, 0.012345))
    assert (delta.periods, delta.throttled_periods) == (10, 10)
    assert delta.share == 1.0 and delta.throttled_s == pytest.approx(1.0)
    assert Throttling(0, 0, 0.0).share == 0.0


@pytest.mark.parametrize(
    "budget, cpus, binding, sentence",
    [
        (
            CpuBudget(2, 2, 0.5, "/cg/kpt", 1),
            1,
            "quota",
            "budget 1 CPU: cgroup quota 0.50 CPU (v1) binds; affinity 2 of 2 host CPUs",
        ),
        (
            CpuBudget(2, 2, 1.0, "/cg/kpt", 1),
            1,
            "quota",
            "budget 1 CPU: cgroup quota 1.00 CPU (v1) binds; affinity 2 of 2 host CPUs",
        ),
        (
            CpuBudget(8, 1, None, "/cg", 2),
            1,
            "affinity",
            "budget 1 CPU: affinity 1 of 8 host CPUs binds; no cgroup quota",
        ),
        (
            CpuBudget(4, 2, 3.0, "/cg", 2),
            2,
            "affinity",
            "budget 2 CPUs: affinity 2 of 4 host CPUs binds; cgroup quota 3.00 CPUs (v2)",
        ),
        (CpuBudget(2, 2), 2, "host", "budget 2 CPUs: all 2 host CPUs; no cgroup quota"),
    ],
)
def test_budget_figures(budget, cpus, binding, sentence):
    assert (budget.cpus, budget.binding, budget.describe()) == (cpus, binding, sentence)


def test_usage_judged_against_a_binding_quota_and_kept_in_json():
    quota = CpuBudget(8, 8, 0.5, "/cg/kpt", 2)
    usage = CpuUsage(
        wall_s=2.0,
        cpu_count=8,
        process_cores=0.45,
        host_busy=0.1,
        budget=quota,
        throttling=Throttling(20, 19, 0.9),
    )
    # 0.45 of 8 idle host cores, but 90 % of a 0.5 CPU quota: saturated.
    assert usage.busy == pytest.approx(0.9) and usage.saturated
    assert "cgroup quota 0.50 CPU (v2) binds" in usage.describe()
    assert "throttled it in 19 of 20" in usage.describe()
    again = from_dict(CpuUsage, json.loads(json.dumps(dataclasses.asdict(usage))), "cpu")
    assert again == usage
    # A report written before the budget existed still reads.
    old = from_dict(CpuUsage, {"wall_s": 1.0, "cpu_count": 2, "process_cores": 1.0}, "cpu")
    assert old.budget is None and old.throttling is None


# --- The kernel's limits ----------------------------------------------------------

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The child loads the module alone (no package import: it must not spend its
# quota importing TensorFlow), joins the cgroup if given one, then measures.
CHILD = textwrap.dedent(
    """
    import dataclasses, importlib.util, json, os, sys, time
    spec = importlib.util.spec_from_file_location("cpu_budget", sys.argv[1])
    cpu_budget = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cpu_budget)
    mode, target = sys.argv[2], sys.argv[3]
    if mode == "cgroup":
        with open(os.path.join(target, "cgroup.procs"), "w") as file:
            file.write(str(os.getpid()))
    elif mode == "affinity":
        os.sched_setaffinity(0, {int(target)})
    budget = cpu_budget.read_cpu_budget()
    started = cpu_budget.read_throttling(budget.cgroup)
    began = time.monotonic()
    child = os.fork()  # two busy loops: this process and its child
    while time.monotonic() - began < float(sys.argv[4]):
        pass
    if child == 0:
        os._exit(0)
    os.waitpid(child, 0)
    ended = cpu_budget.read_throttling(budget.cgroup)
    throttling = None if started is None or ended is None else ended.since(started)
    print(json.dumps({
        "budget": dataclasses.asdict(budget),
        "cpus": budget.cpus,
        "binding": budget.binding,
        "throttle_cgroup": budget.cgroup,
        "throttling": None if throttling is None else dataclasses.asdict(throttling),
    }))
    """
)


def run_child(mode, target, busy_s=1.5):
    """Runs the measuring child; returns its JSON."""
    process = subprocess.run(
        [sys.executable, "-c", CHILD, cpu_budget.__file__, mode, str(target), str(busy_s)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert process.returncode == 0, process.stderr
    return json.loads(process.stdout)


def assert_throttled_by_quota(result, quota, quota_dir, period_s=0.1):
    assert result["budget"]["quota_cpus"] == quota
    assert result["budget"]["cgroup"] == quota_dir
    assert result["budget"]["period_s"] == period_s
    assert (result["cpus"], result["binding"]) == (1, "quota")
    assert result["throttle_cgroup"] == quota_dir
    # Two busy loops against at most one CPU of quota: throttled, whatever else runs.
    throttling = result["throttling"]
    assert throttling is not None
    assert throttling["throttled_periods"] > 0 and throttling["throttled_s"] > 0


@pytest.mark.multiprocess
@pytest.mark.parametrize("quota", [0.5, 1.0])
def test_a_cgroup_quota_binds_and_throttles(quota_cgroup, quota):
    if quota >= len(os.sched_getaffinity(0)):
        pytest.skip("the quota would not be below the CPUs this process may use")
    join, quota_dir = quota_cgroup(quota)
    assert_throttled_by_quota(run_child("cgroup", join), quota, quota_dir)


@pytest.mark.multiprocess
def test_a_parent_quota_binds_its_child_cgroup(quota_cgroup):
    # A period of its own, read from the cgroup whose quota binds.
    join, quota_dir = quota_cgroup(0.5, nested=True, period=50000)
    assert join != quota_dir
    assert_throttled_by_quota(run_child("cgroup", join), 0.5, quota_dir, period_s=0.05)


@pytest.mark.multiprocess
def test_an_affinity_mask_binds_without_throttling():
    if read_cpu_budget().quota_cpus is not None:
        pytest.skip("this process runs under a cgroup quota")
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2 or (os.cpu_count() or 1) < 2:
        pytest.skip("one CPU: a mask of one cannot bind")
    result = run_child("affinity", cpus[0], busy_s=0.3)
    assert result["budget"]["affinity_count"] == 1
    assert result["budget"]["quota_cpus"] is None
    assert (result["cpus"], result["binding"]) == (1, "affinity")
    throttling = result["throttling"]
    assert throttling is None or throttling["throttled_periods"] == 0


def test_unlimited_budget_is_the_affinity_count():
    budget = read_cpu_budget()
    if budget.quota_cpus is not None:
        pytest.skip("this process runs under a cgroup quota")
    assert budget.cpus == len(os.sched_getaffinity(0))
    assert budget.binding in ("affinity", "host")
    started = read_throttling(budget.cgroup)
    ended = read_throttling(budget.cgroup)
    throttling = None if started is None or ended is None else ended.since(started)
    assert throttling is None or throttling.throttled_periods == 0


def test_cpu_meter_counts_child_processes_and_reads_the_budget():
    # The child spins until it has used half a second of CPU time of its own,
    # then says how much CPU time it used in all. Load on the machine stretches
    # the wall time this takes, never the CPU time the child consumed, which the
    # meter must count in full (this process only waits for it).
    meter = CpuMeter()
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            "import time\n"
            "while time.process_time() < 0.5: pass\n"
            "print(time.process_time())",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    meter.stop()
    usage = meter.usage()
    child_cpu_s = float(child.stdout)
    assert child_cpu_s >= 0.5
    assert usage.process_cores * usage.wall_s >= 0.95 * child_cpu_s
    assert usage.budget == read_cpu_budget()
    assert "budget" in usage.describe()
