"""Runs a command in a network namespace of its own, with loopback only.

TensorFlow's servers (the gRPC server of each `MultiWorkerMirroredStrategy`
worker, the tf.data service's dispatcher and workers) listen on every interface,
whatever address they are given. Started inside a network namespace that holds
only the loopback interface, nothing outside it can reach them, and their ports
cannot clash with anything else on the machine. `unshare -rn` makes such a
namespace without privileges where unprivileged user namespaces are allowed;
where they are not, tests that need one are skipped.
"""

import functools
import os
import shutil
import signal
import subprocess
from typing import List
from typing import Optional

import pytest

# Brings the namespace's loopback interface up, then runs the command.
_WRAPPER = 'ip link set lo up && exec "$@"'


@functools.lru_cache(maxsize=1)
def unavailable_reason() -> Optional[str]:
    """Why no private network namespace can be made here, or `None`."""
    for tool in ("unshare", "ip"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed"
    try:
        probe = subprocess.run(
            isolated(["true"]), capture_output=True, text=True, timeout=20
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"`unshare -rn` failed: {error}"
    if probe.returncode != 0:
        return f"`unshare -rn` failed: {probe.stderr.strip()[:200]}"
    return None


def require() -> None:
    """Skips the calling test when no private network namespace can be made."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(
            f"needs a private network namespace ({reason}): TensorFlow's servers listen "
            "on every interface, so they are only started where loopback is all they reach"
        )


def isolated(command: List[str]) -> List[str]:
    """`command` wrapped to run in a new network namespace with loopback up."""
    return ["unshare", "-rn", "sh", "-c", _WRAPPER, "sh", *command]


def run_isolated(
    command: List[str], timeout: float, cwd=None, env=None
) -> subprocess.CompletedProcess:
    """Runs `command` in a private network namespace, killing it all on timeout.

    The command and every process it starts share a new process group, which
    is killed (SIGKILL: TensorFlow's workers catch SIGTERM) if the command
    outlives `timeout` or the test is interrupted.

    Args:
        command: the program and its arguments.
        timeout: seconds before everything is killed.
        cwd: the working directory.
        env: the environment; the current one by default.

    Returns:
        The `subprocess.CompletedProcess`, with text stdout and stderr.

    Raises:
        subprocess.TimeoutExpired: if it did not finish in time.
    """
    process = subprocess.Popen(
        isolated(command),
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
        return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()
