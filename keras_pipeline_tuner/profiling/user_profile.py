"""A profile the user asked for with `keras.callbacks.TensorBoard(profile_batch=...)`.

The TF Profiler is process-wide: one session at a time. When the user's own TensorBoard
callback is set to profile some batches of the fit, a window the tuner opened first would
make Keras log "Another profiler is running" and lose the user's capture. So before any
window opens, the tuner looks for such a request among the fit's callbacks; the user's
window wins, and its capture becomes the tuner's evidence.
"""

import dataclasses
import os
from typing import List
from typing import Optional
from typing import Tuple
from typing import Union

from keras_pipeline_tuner._util import files


@dataclasses.dataclass
class ProfileRequest:
    """The batches another callback will profile in this fit, and where its capture goes.

    Attributes:
        start_batch: the first profiled batch, counted from 1 over the fit, as
            Keras' TensorBoard callback counts (one per `train_function` call).
        stop_batch: the last profiled batch (included).
        profile_dir: the `plugins/profile` folder its capture lands in.
        description: the request as the user wrote it, for notes.
    """

    start_batch: int
    stop_batch: int
    profile_dir: str
    description: str

    def covers(self, call: int) -> bool:
        """Whether call number `call` (from 1) of the fit is inside the window."""
        return self.start_batch <= call <= self.stop_batch


def requested_profile(callbacks: List[object]) -> Optional[ProfileRequest]:
    """The profile window a `keras.callbacks.TensorBoard` among `callbacks` will capture.

    Args:
        callbacks: the fit's callbacks (see `_util.running_fit`).

    Returns:
        The first TensorBoard callback's request, or `None` when none profiles.

    Example:

    >>> import keras
    >>> board = keras.callbacks.TensorBoard(log_dir="logs", profile_batch=(13, 16))
    >>> request = requested_profile([board])
    >>> request.start_batch, request.stop_batch, request.description
    (13, 16, 'keras.callbacks.TensorBoard(profile_batch=(13, 16))')
    >>> requested_profile([keras.callbacks.TensorBoard(log_dir="logs")]) is None
    True
    """
    import keras

    for callback in callbacks:
        if not isinstance(callback, keras.callbacks.TensorBoard):
            continue
        # Keras keeps the request only in these attributes (read, never called);
        # a Keras without them gives no request, and a clash is then reported
        # as the profiler being busy.
        start = getattr(callback, "_start_batch", None)
        stop = getattr(callback, "_stop_batch", None)
        if not isinstance(start, int) or not isinstance(stop, int) or start <= 0:
            continue
        train_dir = getattr(callback, "_train_dir", None) or os.path.join(
            callback.log_dir, "train"
        )
        batches = f"({start}, {stop})" if stop != start else str(start)
        return ProfileRequest(
            start_batch=start,
            stop_batch=max(stop, start),
            profile_dir=os.path.join(train_dir, "plugins", "profile"),
            description=f"keras.callbacks.TensorBoard(profile_batch={batches})",
        )
    return None


def followed_request(
    profile: Union[str, Tuple[int, int]], request: Optional[ProfileRequest]
) -> Tuple[Optional[ProfileRequest], Optional[str]]:
    """Whether the tuner follows the user's request instead of opening its own window.

    The user's window wins over an automatic one, and over a requested one it
    overlaps (two profiler sessions cannot run at once). Windows apart both
    run: the request is then not followed.

    Args:
        profile: the tuner's `profile` argument.
        request: the user's `ProfileRequest`, or `None`.

    Returns:
        The request to follow (or `None`), and a note when it replaces a
        window the user asked the tuner for.

    Example:

    >>> request = ProfileRequest(13, 16, "logs/train/plugins/profile", "TensorBoard")
    >>> followed_request("auto", request) == (request, None)
    True
    >>> followed_request((1, 5), request)
    (None, None)
    """
    if request is None:
        return None, None
    if not isinstance(profile, tuple):
        return request, None
    start, stop = profile
    # Our steps [start, stop) from 0; theirs calls [first, last] from 1.
    if stop <= request.start_batch - 1 or start >= request.stop_batch:
        return None, None
    return request, (
        f"The tuner's profiler window (profile={profile}) was not opened: "
        f"{request.description} profiles the same steps, and one profiler "
        "session runs at a time. The tuner analysed that capture instead."
    )


def find_capture(request: ProfileRequest, known: List[str], capture) -> Optional[str]:
    """Points the tuner's `capture` of the user's window at the file their callback wrote.

    Args:
        request: the user's `ProfileRequest`.
        known: run folder names that were there before the fit.
        capture: the `Capture` that marked the user's window: its `run_dir`,
            `xplane_path` and notes are set.

    Returns:
        `None` when found, else the note saying why there is no analysis.
    """
    path = new_capture(request.profile_dir, known)
    if path is None:
        return (
            f"No profile analysis: the capture {request.description} was to write "
            f"into {request.profile_dir} is not there (it is written when that "
            "callback stops its window)."
        )
    capture.run_dir, capture.xplane_path = os.path.dirname(path), path
    capture.notes.append(
        f"This is the capture the user asked for with {request.description}; "
        "the tuner opened no window of its own (one profiler session runs at a "
        "time) and marked the steps for xprof's analyzer. The window's start and "
        "stop costs are the callback's, not measured here."
    )
    return None


def run_folders(profile_dir: str) -> List[str]:
    """The capture run folders in `profile_dir` (names), empty if there is none.

    Args:
        profile_dir: a `plugins/profile` folder.

    Returns:
        Folder names, sorted.

    Example:

    >>> import os, tempfile
    >>> profile_dir = tempfile.mkdtemp()
    >>> os.mkdir(os.path.join(profile_dir, "2026_01_01_00_00_00"))
    >>> run_folders(profile_dir), run_folders(os.path.join(profile_dir, "missing"))
    (['2026_01_01_00_00_00'], [])
    """
    try:
        return files.list_dir(profile_dir) if files.exists(profile_dir) else []
    except OSError:
        return []


def new_capture(profile_dir: str, known: List[str]) -> Optional[str]:
    """The `.xplane.pb` of the newest run folder of `profile_dir` not in `known`.

    Args:
        profile_dir: the request's `plugins/profile` folder.
        known: run folder names that were there before the fit.

    Returns:
        The capture's path, or `None` if no new capture is there.

    Example:

    >>> import os, tempfile
    >>> profile_dir = tempfile.mkdtemp()
    >>> known = run_folders(profile_dir)
    >>> os.mkdir(os.path.join(profile_dir, "2026_01_01_00_00_00"))
    >>> open(os.path.join(profile_dir, "2026_01_01_00_00_00", "host.xplane.pb"), "wb").close()
    >>> os.path.basename(new_capture(profile_dir, known))
    'host.xplane.pb'
    >>> new_capture(profile_dir, run_folders(profile_dir)) is None
    True
    """
    for name in reversed(run_folders(profile_dir)):
        if name in known:
            continue
        run_dir = os.path.join(profile_dir, name)
        try:
            captures = [entry for entry in files.list_dir(run_dir) if entry.endswith(".xplane.pb")]
        except OSError:
            continue
        if captures:
            return os.path.join(run_dir, captures[0])
    return None
