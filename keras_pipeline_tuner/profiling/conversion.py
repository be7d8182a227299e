"""xprof's conversion of a capture, in a process of its own while training goes on.

Converting a capture takes from under a second (a 20-step window of a small
model) to several (400 steps: 4 to 9 s on two busy cores), and done on the
training thread between epochs it stretched the epoch by that much. It runs in
a child process instead, started when the window's capture stops; its result
joins the run when it is ready (see `ProfilerWindow`). The process also hands
back the trace of the window's first steps, which the outputs draw
(`evidence.first_steps`), so that nothing converts the capture again on the
training thread.

A process, not a thread, because a thread converting a capture stops the
training thread. Measured with a capture of 400 steps (3.7 MB, 7 to 9 s to
convert on two busy cores) and a pure-Python loop on the main thread that
sleeps 1 ms a turn: beside a conversion thread, the loop went without the GIL
for up to 545 ms at a time and ran 1,709 turns in 7.7 s; beside a conversion
process, for 10 ms at most, and 6,285 turns in 8 s. xprof's tools hold the GIL
for up to 90 ms at a time, and reading what they return (25 MB of trace JSON,
then its events in Python) holds it throughout. A thread would also hide the
whole process's standard error while xprof runs (`native_stderr_silenced`).

Not `multiprocessing` (nor `ProcessPoolExecutor`): its "spawn" start runs the
user's main script again in the child (a training script without an
`if __name__ == "__main__":` guard would train again there), and "fork" copies
a process whose TensorFlow threads may hold locks. The child is
`python -m keras_pipeline_tuner.profiling.conversion <dir> <parent pid>`: it
imports xprof and the tuner's reading of its output, not TensorFlow (about half
a second), reads its request from `<dir>`, writes its result there and exits.
During fit the parent only asks whether it has exited; a conversion still running
at the end of fit is waited for by a thread blocked in `Popen.wait()`, which
holds no GIL (see `run.late_profile`).

The process ends with the one that started it: a training process killed by
SIGTERM or SIGKILL runs none of its clean-up, and the conversion would run on,
orphaned. Not through `preexec_fn` (`PR_SET_PDEATHSIG`): that runs Python in a
forked copy of the user's process between `fork` and `exec`, with its
`os.register_at_fork` hooks, and the tuner never forks the user's process. The
child watches its parent instead (`_exit_with_parent`).
"""

import dataclasses
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from typing import Dict
from typing import List
from typing import Optional

from keras_pipeline_tuner._util import files
from keras_pipeline_tuner._util import own_processes
from keras_pipeline_tuner.profiling import evidence as profile_evidence
from keras_pipeline_tuner.profiling.evidence import ProfileEvidence

_REQUEST = "request.pickle"
_RESULT = "result.pickle"
_STDERR = "stderr.txt"
# The child's scheduling priority, below the training's: on cores the training
# keeps busy, the conversion mostly takes what is left, so that it slows the
# steps (and the pipeline whose wait the step clock measures meanwhile) little.
NICENESS = 10
# How often the child looks whether the process that started it is still its
# parent: it ends within about this long of that process's death.
PARENT_CHECK_S = 0.25
# The child's exit code when it ended because its parent was gone.
PARENT_GONE = 3


class ConversionFailed(RuntimeError):
    """xprof's conversion of a capture failed in its process (the message says how)."""


@dataclasses.dataclass
class ConversionResult:
    """What the conversion's process handed back.

    Attributes:
        evidence: the `ProfileEvidence` that `analyze_capture` read from the
            capture (its analysed fields; the capture fields are the caller's).
        began_at: when the process was started (`time.time()`).
        ended_at: when it had the result (`time.time()`).
        first_steps: the trace of the window's first steps
            (`evidence.first_steps`), for the outputs to draw.
    """

    evidence: ProfileEvidence
    began_at: float
    ended_at: float
    first_steps: List[dict] = dataclasses.field(default_factory=list)


class Conversion:
    """xprof's conversion of one capture (`analyze_capture`), in a process of its own.

    The process starts at once; `done()` asks, without waiting, whether it has
    ended, `result()` waits for it. However the run ends (an exception, Ctrl-C,
    the interpreter exiting), `cancel()` or the object's collection stops the
    process and removes its files; if the training process is killed, the
    process ends by itself (see `_exit_with_parent`).

    Args:
        xplane_path: the `.xplane.pb` capture. One on a remote file system
            (`gs://`, `ram://`) is copied to a local file first, here: the
            process reads local files, without TensorFlow.
        stages: `stage_names.pipeline_stages` of the profiled pipeline (plain
            data, read on the caller's thread), or `None`.
        window_steps: training steps the window covered.

    Attributes:
        began_at: when the process was started (`time.time()`).

    Example:

    ```python
    conversion = Conversion(evidence.xplane_path, stages, window_steps=15)
    ...  # training goes on
    if conversion.done():
        analysed = conversion.result().evidence
    ```
    """

    def __init__(
        self,
        xplane_path: str,
        stages: Optional[Dict[str, object]] = None,
        window_steps: Optional[int] = None,
    ):
        self.began_at = time.time()
        directory = tempfile.mkdtemp(prefix="keras_pipeline_tuner_conversion_")
        try:
            request = {
                "xplane_path": _local_capture(xplane_path, directory),
                "stages": stages or {},
                "window_steps": window_steps,
            }
            with open(os.path.join(directory, _REQUEST), "wb") as file:
                pickle.dump(request, file)
            with open(os.path.join(directory, _STDERR), "wb") as stderr:
                process = subprocess.Popen(
                    [sys.executable, "-m", __name__, directory, str(os.getpid())],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=stderr,
                    env=_child_environment(),
                )
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        self._process = process
        self._directory = directory
        own_processes.started(process.pid)
        # Also run at interpreter exit (after `run.late_profile`'s bounded wait
        # for it): no conversion outlives the process that asked.
        self._stop = weakref.finalize(self, _stop_process, process, directory)

    def done(self) -> bool:
        """Whether the process has ended (without waiting)."""
        return own_processes.reap(self._process, timeout=0.0)

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Waits up to `timeout` seconds (`None`: until it ends) for the process.

        Returns:
            Whether it has ended.
        """
        return own_processes.reap(self._process, timeout)

    def result(self) -> ConversionResult:
        """Waits for the process and returns its result; its files are removed.

        Returns:
            The `ConversionResult`.

        Raises:
            ConversionFailed: the conversion raised (its exception's type and
                message), or its process ended without a result (e.g. killed).
        """
        own_processes.reap(self._process)
        try:
            return self._read_result()
        finally:
            self._stop()

    def cancel(self) -> None:
        """Stops the process if it still runs, and removes its files (idempotent)."""
        self._stop()

    def _read_result(self) -> ConversionResult:
        path = os.path.join(self._directory, _RESULT)
        code = self._process.returncode
        if code != 0 or not os.path.isfile(path):
            said = _last_line(os.path.join(self._directory, _STDERR))
            raise ConversionFailed(
                f"xprof's conversion process ended with exit code {code} and no result"
                + (f" ({said})" if said else "")
            )
        with open(path, "rb") as file:
            answer = pickle.load(file)
        if "error" in answer:
            raise ConversionFailed(answer["error"])
        return ConversionResult(
            answer["evidence"], self.began_at, answer["ended_at"], answer["first_steps"]
        )


def main(argv: Optional[List[str]] = None) -> int:
    """The conversion's process: reads the request in a directory, writes the result there.

    Args:
        argv: `[directory]` or `[directory, parent_pid]`; the command line's
            arguments by default. With `parent_pid`, the process ends as soon
            as that process is no longer its parent (see `_exit_with_parent`).

    Returns:
        The exit code: 0 once the result (or the conversion's error) is written.

    Example:

    ```
    python -m keras_pipeline_tuner.profiling.conversion /tmp/keras_pipeline_tuner_conversion_x 4242
    ```
    """
    arguments = sys.argv[1:] if argv is None else argv
    directory = arguments[0]
    if len(arguments) > 1:
        # First: the parent may be gone already.
        _exit_with_parent(int(arguments[1]), directory)
    if hasattr(os, "nice"):
        os.nice(NICENESS)
    with open(os.path.join(directory, _REQUEST), "rb") as file:
        request = pickle.load(file)
    try:
        evidence, first_steps = profile_evidence.analyze_capture_and_trace(
            request["xplane_path"], request["stages"], request["window_steps"]
        )
        answer = {"evidence": evidence, "first_steps": first_steps}
    except Exception as error:  # noqa: BLE001 - the parent turns the feature off with it.
        answer = {"error": f"{type(error).__name__}: {error}"}
    answer["ended_at"] = time.time()
    with open(os.path.join(directory, _RESULT), "wb") as file:
        pickle.dump(answer, file)
    return 0


def _exit_with_parent(parent: int, directory: str, every_s: float = PARENT_CHECK_S) -> None:
    """Ends this process, from a daemon thread, once `parent` is no longer its parent.

    A process whose parent dies is re-parented (to init, or to a subreaper), so
    `os.getppid()` then differs from the id the parent passed: also when it died
    before this process got here. Nothing would read the result: the request's
    directory is removed, and the process exits at once (`os._exit`), whatever
    its main thread is doing. The check costs microseconds a few times a second.

    Args:
        parent: the id of the process that started this one.
        directory: the request's directory.
        every_s: seconds between checks.
    """

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(every_s)
        shutil.rmtree(directory, ignore_errors=True)
        os._exit(PARENT_GONE)

    threading.Thread(target=watch, name="watch-parent", daemon=True).start()


def _local_capture(xplane_path: str, directory: str) -> str:
    if not files.is_remote(xplane_path):
        return xplane_path
    # A remote log dir: `ram://` lives in this process's memory only, and other
    # file systems need TensorFlow, which the process would take seconds to import.
    local = os.path.join(directory, os.path.basename(xplane_path))
    files.copy_file(xplane_path, local)
    return local


def _child_environment() -> Dict[str, str]:
    environment = dict(os.environ)
    # The child imports the tuner and xprof from where this process found them.
    environment["PYTHONPATH"] = os.pathsep.join(path for path in sys.path if path)
    return environment


def _stop_process(process: subprocess.Popen, directory: str) -> None:
    if process.returncode is None:
        process.kill()
        own_processes.reap(process)
    shutil.rmtree(directory, ignore_errors=True)


def _last_line(path: str) -> str:
    try:
        with open(path, "rb") as file:
            lines = file.read().decode("utf-8", "replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


if __name__ == "__main__":
    sys.exit(main())
