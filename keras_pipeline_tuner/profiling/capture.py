"""One capture of the profiler window, from the TF Profiler's start to its evidence.

A capture is started into a private staging directory, its steps are marked
(`_r=1` step markers, without which xprof's input-pipeline analyzer finds no
steps), and at its stop it is moved to a run folder of its own where
TensorBoard's Profile tab finds it (`publish`). Its conversion with xprof
runs in a process of its own while training goes on (`ConvertingCapture`, see
`conversion`), and its result fills in the evidence when the window joins it.
"""

import glob
import itertools
import os
import shutil
import tempfile
import time
from typing import List
from typing import Optional
from typing import Tuple

from keras_pipeline_tuner._util import files
from keras_pipeline_tuner._util.tf_import import tensorflow
from keras_pipeline_tuner.profiling import evidence as profile_evidence
from keras_pipeline_tuner.profiling import stage_names
from keras_pipeline_tuner.profiling.conversion import Conversion
from keras_pipeline_tuner.profiling.evidence import ProfileEvidence

# The TensorBoard run, under log_dir, that holds the captures:
# <log_dir>/pipeline_tuner/plugins/profile/<run>/<host>.xplane.pb.
PROFILE_RUN = "pipeline_tuner"
# What the analysis fills in of the evidence.
_ANALYSED = (
    "source",
    "steps",
    "input_fraction",
    "conclusion",
    "iterators",
    "bottleneck",
    "bottleneck_iterator",
    "bottleneck_node",
)


class ProfilerBusy(Exception):
    """Another TF Profiler session is running: this capture was not started."""


class Capture:
    """One running or closed capture, from start to conversion.

    Made by `Capture.start` (the tuner's own window) or `Capture.adopt` (a
    window the user's TensorBoard callback runs, which the tuner only marks and
    reads).

    Args:
        trigger: why the window opened, for the evidence.
        first_step: the training step the window starts at (from 0).
        stop_step: the step it is to stop before.
        timed: the function standing in for Keras' train function that takes
            a `trace_step` to mark the steps, or `None` (markers are entered
            around each step instead).
        staging: the private directory the TF Profiler writes into, or `None`
            for the user's capture.
        start_s: what starting the TF Profiler cost.

    Example:

    ```python
    capture = Capture.start("requested", first_step=10, stop_step=20, timed=None)
    ...  # the steps, each in capture.enter_marker(step) / exit_marker()
    capture.stop(steps_done=20, reason=None, log_dir="logs/run1")
    converting = ConvertingCapture(capture, capture.evidence())  # xprof, in a process
    ...  # training goes on
    evidence = converting.join()
    ```
    """

    def __init__(self, trigger, first_step, stop_step, timed, staging=None, start_s=0.0):
        self.staging = staging
        self.trigger = trigger
        self.first_step = first_step
        self.stop_step = stop_step
        self.timed = timed
        self.started_at = time.perf_counter() - start_s
        self.start_s = start_s
        self.stop_s = 0.0
        self.window_s = 0.0
        self.steps = 0
        self.dataset = None
        self.keras_input = None
        self.marker = None
        self.notes: List[str] = []
        self.run_dir = ""
        self.xplane_path = ""
        self.temporary = False
        # True for the user's own capture, which the tuner only marks and reads.
        self.adopted = staging is None

    @classmethod
    def start(cls, trigger: str, first_step: int, stop_step: int, timed) -> "Capture":
        """Starts the TF Profiler into a staging directory of its own.

        Raises:
            ProfilerBusy: another profiler session is running (it is left alone).
        """
        tf = tensorflow()
        staging = tempfile.mkdtemp(prefix="keras_pipeline_tuner_capture_")
        began = time.perf_counter()
        try:
            with profile_evidence.native_stderr_silenced():
                tf.profiler.experimental.start(staging)
        except tf.errors.AlreadyExistsError as error:
            shutil.rmtree(staging, ignore_errors=True)
            raise ProfilerBusy() from error
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return cls(trigger, first_step, stop_step, timed, staging, time.perf_counter() - began)

    def enter_marker(self, step: int) -> None:
        """Marks the start of a step (when no `timed` function marks it inside)."""
        self.exit_marker()
        self.marker = tensorflow().profiler.experimental.Trace(
            profile_evidence.STEP_MARKER, step_num=step, _r=1
        )
        self.marker.__enter__()

    def exit_marker(self) -> None:
        """Marks the end of the step `enter_marker` began, if any."""
        marker, self.marker = self.marker, None
        if marker is not None:
            marker.__exit__(None, None, None)

    def release(self) -> None:
        """Stops marking steps."""
        self.exit_marker()
        if self.timed is not None:
            self.timed.trace_step = None
            self.timed = None

    def end_steps(self, steps_done: int) -> None:
        """The window's steps are over: counts them and its wall time."""
        self.release()
        self.steps = steps_done - self.first_step
        self.window_s = time.perf_counter() - self.started_at

    def stop(self, steps_done: int, reason: Optional[str], log_dir: Optional[str]) -> None:
        """Stops the TF Profiler and moves the capture to its run folder.

        Args:
            steps_done: training steps done so far.
            reason: why the window closed early (e.g. the epoch ended), or `None`.
            log_dir: the tuner's log dir (`None`: a temporary directory).
        """
        self.release()
        began = time.perf_counter()
        try:
            with profile_evidence.native_stderr_silenced():
                tensorflow().profiler.experimental.stop()
        except BaseException:
            shutil.rmtree(self.staging, ignore_errors=True)
            raise
        self.stop_s = time.perf_counter() - began
        self.steps = steps_done - self.first_step
        if reason is not None:
            self.notes.append(
                f"The window closed after {self.steps} of "
                f"{self.stop_step - self.first_step} steps because {reason}: a "
                "window does not span an epoch end (the iterator is rebuilt there "
                "and validation runs)."
            )
        self.run_dir, self.xplane_path, self.temporary = publish(self.staging, log_dir)
        self.window_s = time.perf_counter() - self.started_at

    def abandon(self) -> None:
        """Best effort, after a failure or an interrupted fit: stops without saving.

        The TF Profiler is process-wide, and a session left running would block
        the user's own. The user's session is theirs to stop.
        """
        self.release()
        if self.adopted:
            return
        try:
            tensorflow().profiler.experimental.stop(save=False)
        except Exception:  # noqa: BLE001 - nothing more can be done.
            pass
        shutil.rmtree(self.staging, ignore_errors=True)

    def evidence(self) -> ProfileEvidence:
        """The evidence of a stopped capture, before its analysis: where, why, its cost."""
        evidence = ProfileEvidence(
            run_dir=self.run_dir,
            xplane_path=self.xplane_path,
            temporary=self.temporary,
            trigger=self.trigger,
            first_step=self.first_step,
            stop_step=self.first_step + self.steps,
            notes=list(self.notes),
        )
        evidence.cost = profile_evidence.CaptureCost(
            steps=self.steps,
            window_s=self.window_s,
            start_s=self.start_s,
            stop_s=self.stop_s,
            file_bytes=_file_bytes(self.xplane_path),
        )
        if self.temporary:
            evidence.notes.append(
                "The tuner has no log_dir, so the capture was written to the temporary "
                f"directory {_log_dir_of(self.run_dir)}; pass log_dir to keep it with "
                "the run."
            )
        return evidence


class ConvertingCapture:
    """A stopped capture's evidence while xprof converts the capture in a process of its own.

    The pipeline's stages are read here, on the calling thread: that needs the
    dataset and TensorFlow, and takes milliseconds. Only the conversion,
    seconds of work, runs in the process (see `conversion`).

    Args:
        capture: the stopped `Capture`.
        evidence: its `evidence()`, which `join` fills in: not to be shown
            before. If the conversion cannot start, it is left as it is.

    Attributes:
        evidence: that evidence.
        conversion: the running `Conversion`.

    Example:

    ```python
    converting = ConvertingCapture(capture, capture.evidence())
    ...  # training goes on
    if converting.done():
        evidence = converting.join()
    ```
    """

    def __init__(self, capture: Capture, evidence: ProfileEvidence):
        self.evidence = evidence
        stages, naming_note = _stages_of(capture.dataset, capture.keras_input)
        if naming_note:
            evidence.notes.append(naming_note)
        self.conversion = Conversion(capture.xplane_path, stages, window_steps=capture.steps)

    def done(self) -> bool:
        """Whether the conversion has ended (without waiting)."""
        return self.conversion.done()

    def join(self, waited_s: float = 0.0) -> ProfileEvidence:
        """Fills in the evidence from the conversion's result (waiting for it if it runs).

        Called once the conversion has ended (`done()`), or by a caller that
        waited for it and said so (see `fit_profile.FitProfile.wait`). The
        conversion's process is gone when this returns or raises (Ctrl-C too).

        Args:
            waited_s: how long the training thread waited for the conversion
                (`cost.conversion_wait_s`).

        Returns:
            The evidence, its cost with the conversion's times and that wait.

        Raises:
            ConversionFailed: xprof could not convert the capture.
        """
        conversion = self.conversion
        try:
            result = conversion.result()
        finally:
            conversion.cancel()
        analysed, evidence = result.evidence, self.evidence
        for field in _ANALYSED:
            setattr(evidence, field, getattr(analysed, field))
        cost = evidence.cost
        cost.conversion_began_at, cost.conversion_ended_at = result.began_at, result.ended_at
        cost.conversion_s = result.ended_at - result.began_at
        cost.conversion_wait_s = waited_s
        evidence.notes += analysed.notes
        profile_evidence.keep_first_steps(evidence.xplane_path, result.first_steps)
        return evidence

    def cancel(self) -> None:
        """Stops the conversion if it still runs (the fit ended another way)."""
        self.conversion.cancel()


def publish(staging: str, log_dir: Optional[str]) -> Tuple[str, str, bool]:
    """Moves a capture from its staging directory to a run folder of its own.

    The TF Profiler names run folders to the second, so two captures in one
    second would land in one folder; capturing into a private, local directory
    and claiming a final folder no other capture has keeps every capture. The
    final folder may be on any file system `tf.io.gfile` reaches (a `gs://`
    log dir): the files are copied there.

    Returns:
        The run folder, the `.xplane.pb` path in it, and whether it is in a
        temporary directory.
    """
    try:
        staged = sorted(glob.glob(os.path.join(staging, "plugins", "profile", "*")))
        if not staged:
            raise RuntimeError("the TF Profiler wrote no capture")
        temporary = log_dir is None
        root = (
            tempfile.mkdtemp(prefix="keras_pipeline_tuner_profile_")
            if temporary
            else os.path.join(log_dir, PROFILE_RUN)
        )
        profile_dir = os.path.join(root, "plugins", "profile")
        files.makedirs(profile_dir)
        run_dir = _claim_run_dir(profile_dir, os.path.basename(staged[0]))
        for name in os.listdir(staged[0]):
            if files.is_remote(run_dir):
                files.copy_file(os.path.join(staged[0], name), os.path.join(run_dir, name))
            else:
                shutil.move(os.path.join(staged[0], name), os.path.join(run_dir, name))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    captures = [name for name in files.list_dir(run_dir) if name.endswith(".xplane.pb")]
    if not captures:
        raise RuntimeError(f"the TF Profiler wrote no .xplane.pb into {run_dir}")
    return run_dir, os.path.join(run_dir, captures[0]), temporary


def _claim_run_dir(profile_dir: str, base: str) -> str:
    for index in itertools.count(1):
        run_dir = os.path.join(profile_dir, base if index == 1 else f"{base}_{index}")
        if files.is_remote(run_dir):
            # Object stores have no atomic mkdir: a folder of a name no capture
            # has yet. Captures of one log dir come from one process at a time
            # (the TF Profiler is process-wide), to the second apart.
            if not files.exists(run_dir):
                files.makedirs(run_dir)
                return run_dir
            continue
        try:
            os.mkdir(run_dir)
            return run_dir
        except FileExistsError:
            continue
    raise AssertionError("unreachable")


def _file_bytes(path: str) -> int:
    # Outside the guard: a capture deleted with its log dir is reported by the
    # conversion, inside the guard, not here.
    try:
        return files.size(path)
    except OSError:
        return 0


def _log_dir_of(run_dir: str) -> str:
    # <log_dir>/plugins/profile/<run>: the directory to give TensorBoard.
    return os.path.dirname(os.path.dirname(os.path.dirname(run_dir)))


def _stages_of(dataset, keras_input=None):
    if dataset is None:
        return {}, (
            "Stages are named by kind only: the profiled steps showed no tf.data "
            "iterator to read the pipeline from (distributed input, or only whole "
            "steps measured)."
        )
    try:
        stages = stage_names.pipeline_stages(dataset)
    except Exception as error:  # noqa: BLE001 - names are a nicety, not the evidence.
        return {}, (
            f"Stages are named by kind only: the pipeline's graph could not be read "
            f"({type(error).__name__}: {error})."
        )
    if keras_input is not None:
        stages = stage_names.as_keras_input(stages, keras_input)
    return stages, None
