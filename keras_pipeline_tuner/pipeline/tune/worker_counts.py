"""The worker counts a loader's tuning tries: within the CPU budget, beyond it only for waiting.

Workers that compute share the CPUs the process may use (`timing.cpu_budget`:
the affinity mask and the container's quota, never the host's count): more
of them than the budget only add switching and memory. Workers that wait (a
read from a slow disk or a network, a sleep) use little CPU, and more of them
than CPUs overlap more waits. Which it is, is measured: a probe pass with as
many workers as the budget allows (two at least) and the CPU time it used; a
loader whose workers were busy under `WAITING_SHARE` of the CPUs they could
use is waiting, and gets counts up to `MAX_WAITING_WORKERS`.
"""

from typing import List
from typing import Optional

# A probe whose workers used less than this share of the CPUs they could use
# (the smaller of their count and the budget) counts as waiting.
WAITING_SHARE = 0.5
# The most workers tried for a loader whose workers wait: a multiple of the
# budget, at most a fixed number (each holds a batch or more in memory).
WAITING_MULTIPLE = 8
MAX_WAITING_WORKERS = 16


def probe_workers(cpus: int) -> int:
    """The worker count of the probe pass: the budget's CPUs, two at least.

    Example:

    >>> probe_workers(1), probe_workers(4)
    (2, 4)
    """
    return max(2, cpus)


def waiting(cpu_cores: Optional[float], workers: int, cpus: int) -> bool:
    """Whether a pass with `workers` workers that used `cpu_cores` mostly waited.

    Args:
        cpu_cores: CPU time over wall time of the pass, in cores (`None`
            when not measured: then not waiting, and no count beyond the
            budget is tried).
        workers: the pass's worker count.
        cpus: the CPU budget.

    Example:

    >>> waiting(0.1, 2, 2), waiting(1.0, 2, 2), waiting(0.9, 2, 1), waiting(None, 2, 2)
    (True, False, False, False)
    """
    if cpu_cores is None:
        return False
    return cpu_cores < WAITING_SHARE * min(workers, cpus)


def worker_counts(cpus: int, waits: bool, least: int = 1) -> List[int]:
    """Powers of two from `least` up to the budget, or beyond it for waiting workers.

    Args:
        cpus: the CPU budget, in whole CPUs.
        waits: whether the probe found the workers waiting (`waiting`).
        least: the smallest count (0 for a loader that can read in the
            consumer's own process, as a torch DataLoader with num_workers=0).

    Returns:
        The counts, smallest first; the budget itself is one of them.

    Example:

    >>> worker_counts(2, waits=False), worker_counts(3, waits=False, least=0)
    ([1, 2], [0, 1, 2, 3])
    >>> worker_counts(2, waits=True)
    [1, 2, 4, 8, 16]
    """
    most = min(MAX_WAITING_WORKERS, WAITING_MULTIPLE * cpus) if waits else cpus
    counts = [0] if least == 0 else []
    count = 1
    while count <= most:
        counts.append(count)
        count *= 2
    if cpus <= most and cpus not in counts:
        counts.append(cpus)
    return sorted(counts)
