"""Files the tuner writes into and reads from `log_dir`, on any file system TensorFlow knows.

A `log_dir` may be local or on a file system TensorFlow reaches through `tf.io.gfile`
(`gs://...`, `s3://...` with tensorflow-io, `ram://...` in tests). Every file the tuner
writes or reads goes through this module: through `tf.io.gfile` when TensorFlow is
there (already imported, or needed because the path names another file system), and
through the local file system otherwise, so the parts that run without TensorFlow (the
torch backend, the `report` command) keep working. Failures come out as `OSError`
(`FileNotFoundError` for a missing file) whichever way the file was reached.

Writes are atomic where the file system allows: the text goes to a temporary file of
a name no other writer uses, then is renamed over the target, so a reader sees the old
file or the new one, never a torn one, even with two processes writing one log dir.
"""

import contextlib
import os
import shutil
import sys
import tempfile
import uuid
from typing import Iterator
from typing import List

from keras_pipeline_tuner._util.tf_import import tensorflow

# Marks a temporary file; never a name the tuner reads.
PARTIAL_SUFFIX = ".partial"


def is_remote(path: str) -> bool:
    """Whether `path` names a file system other than the local one (`gs://`, `ram://`...).

    Args:
        path: a file or directory path.

    Returns:
        True for a URL-style path with a scheme other than `file://`.

    Example:

    >>> is_remote("gs://bucket/logs"), is_remote("logs/run1")
    (True, False)
    """
    scheme, separator, _ = str(path).partition("://")
    return bool(separator) and scheme.lower() != "file"


def _gfile(path: str):
    # TensorFlow's file layer when it is loaded (or needed), else None (local files).
    if is_remote(path):
        try:
            return tensorflow().io.gfile
        except ImportError as error:
            raise ImportError(
                f"{path!r} is on a remote file system, which the tuner reaches through "
                "TensorFlow's tf.io.gfile, and TensorFlow is not installed. Install "
                "TensorFlow, or give a local log_dir."
            ) from error
    if sys.modules.get("tensorflow") is not None:
        return tensorflow().io.gfile
    return None


@contextlib.contextmanager
def _os_errors(path: str) -> Iterator[None]:
    # tf.io.gfile raises tf.errors.OpError; callers handle OSError, as for local files.
    if sys.modules.get("tensorflow") is None:
        yield
        return
    errors = sys.modules["tensorflow"].errors
    try:
        yield
    except errors.NotFoundError as error:
        raise FileNotFoundError(f"{path}: {error.message}") from error
    except errors.OpError as error:
        raise OSError(f"{path}: {error.message}") from error


def makedirs(path: str) -> None:
    """Creates directory `path` and its parents; nothing if it exists.

    Args:
        path: the directory.
    """
    gfile = _gfile(path)
    with _os_errors(path):
        if gfile is None:
            os.makedirs(path, exist_ok=True)
        else:
            gfile.makedirs(path)


def exists(path: str) -> bool:
    """Whether a file or directory `path` exists.

    Args:
        path: the path.

    Returns:
        True if it exists.
    """
    gfile = _gfile(path)
    with _os_errors(path):
        return os.path.exists(path) if gfile is None else bool(gfile.exists(path))


def is_file(path: str) -> bool:
    """Whether `path` exists and is a file (not a directory).

    Args:
        path: the path.

    Returns:
        True for an existing file.
    """
    gfile = _gfile(path)
    with _os_errors(path):
        if gfile is None:
            return os.path.isfile(path)
        return bool(gfile.exists(path)) and not gfile.isdir(path)


def size(path: str) -> int:
    """The size of file `path` in bytes.

    Args:
        path: the file.

    Returns:
        Its size in bytes.

    Raises:
        FileNotFoundError: if it does not exist.
    """
    gfile = _gfile(path)
    with _os_errors(path):
        return os.path.getsize(path) if gfile is None else int(gfile.stat(path).length)


def list_dir(path: str) -> List[str]:
    """The names of the entries of directory `path`, sorted.

    Args:
        path: the directory.

    Returns:
        Entry names (not paths), without trailing slashes.
    """
    gfile = _gfile(path)
    with _os_errors(path):
        names = os.listdir(path) if gfile is None else gfile.listdir(path)
    return sorted(name.rstrip("/") for name in names)


def modified_time(path: str) -> float:
    """When file `path` was last written, in seconds since the epoch (`time.time()`).

    Args:
        path: the file.

    Raises:
        FileNotFoundError: if it does not exist.
    """
    gfile = _gfile(path)
    with _os_errors(path):
        if gfile is None:
            return os.path.getmtime(path)
        return gfile.stat(path).mtime_nsec / 1e9


def create_exclusively(path: str, text: str) -> bool:
    """Creates file `path` holding `text`, unless it exists: a claim on a name.

    Locally the check and the creation are one operation, so of two processes
    claiming the same name one wins. A remote file system is checked, then
    written: two writers at the same instant may both win there.

    Args:
        path: the file; its directory is created if missing.
        text: the contents.

    Returns:
        True if this call created the file, False if it existed.

    Example:

    >>> import tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "claim")
    >>> create_exclusively(path, "mine"), create_exclusively(path, "theirs"), read_text(path)
    (True, False, 'mine')
    """
    makedirs(os.path.dirname(path))
    gfile = _gfile(path)
    with _os_errors(path):
        if gfile is None:
            try:
                descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                return False
            with os.fdopen(descriptor, "w", encoding="utf-8") as file:
                file.write(text)
            return True
    if exists(path):
        return False
    write_atomically(os.path.dirname(path), os.path.basename(path), text)
    return True


def read_text(path: str) -> str:
    """Reads a UTF-8 text file.

    Args:
        path: the file.

    Returns:
        Its text.

    Raises:
        FileNotFoundError: if it does not exist.
    """
    gfile = _gfile(path)
    with _os_errors(path):
        if gfile is None:
            with open(path, encoding="utf-8") as file:
                return file.read()
        with gfile.GFile(path, "rb") as file:
            return file.read().decode("utf-8")


def remove(path: str) -> None:
    """Removes file `path`; nothing if it is not there.

    Args:
        path: the file.
    """
    with contextlib.suppress(FileNotFoundError):
        gfile = _gfile(path)
        with _os_errors(path):
            if gfile is None:
                os.remove(path)
            else:
                gfile.remove(path)


def copy_file(source: str, target: str) -> None:
    """Copies file `source` to `target` (either may be remote), replacing `target`.

    Args:
        source: the file to copy.
        target: where the copy goes; its directory must exist.
    """
    gfile = _gfile(source) or _gfile(target)
    with _os_errors(f"{source} -> {target}"):
        if gfile is None:
            shutil.copyfile(source, target)
        else:
            gfile.copy(source, target, overwrite=True)


def temporary_name(path: str) -> str:
    """A name next to `path` that no other writer, in any process, uses.

    Args:
        path: the file about to be written.

    Returns:
        `path` with a random part and `PARTIAL_SUFFIX` appended.

    Example:

    >>> name = temporary_name("logs/report.json")
    >>> name.startswith("logs/report.json.") and name.endswith(".partial")
    True
    >>> name != temporary_name("logs/report.json")
    True
    """
    return f"{path}.{uuid.uuid4().hex}{PARTIAL_SUFFIX}"


def write_atomically(directory: str, filename: str, text: str) -> str:
    """Writes `text` to `directory/filename` through a temporary file and a rename.

    A reader (the `report` command, TensorBoard, a person) sees the old file or
    the new one, never a partial one, even if training dies mid-write or another
    process writes the same file at the same time (each writer has a temporary
    name of its own; the last rename wins). On file systems without an atomic
    rename (object stores), the rename is a copy of a whole, closed file.

    Args:
        directory: the directory (local or remote); created if missing.
        filename: the file's name.
        text: the contents.

    Returns:
        The path written.

    Example:

    >>> import tempfile
    >>> path = write_atomically(tempfile.mkdtemp(), "report.json", "{}")
    >>> read_text(path)
    '{}'
    """
    makedirs(directory)
    path = os.path.join(directory, filename)
    partial = temporary_name(path)
    gfile = _gfile(path)
    try:
        with _os_errors(path):
            if gfile is None:
                with open(partial, "w", encoding="utf-8") as file:
                    file.write(text)
                os.replace(partial, path)
            else:
                with gfile.GFile(partial, "wb") as file:
                    file.write(text.encode("utf-8"))
                gfile.rename(partial, path, overwrite=True)
    except BaseException:
        # A full disk must not be filled further by a half-written file.
        with contextlib.suppress(OSError):
            remove(partial)
        raise
    return path


@contextlib.contextmanager
def local_copy(path: str) -> Iterator[str]:
    """A local path holding the file `path`, for tools that read local files only.

    A local `path` is given as it is; a remote one is copied into a temporary
    directory, removed on exit.

    Args:
        path: the file.

    Yields:
        A local path with the file's contents.
    """
    if not is_remote(path):
        yield path
        return
    directory = tempfile.mkdtemp(prefix="keras_pipeline_tuner_copy_")
    try:
        local = os.path.join(directory, os.path.basename(path))
        copy_file(path, local)
        yield local
    finally:
        shutil.rmtree(directory, ignore_errors=True)
