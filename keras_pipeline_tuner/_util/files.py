"""Files the tuner writes into `log_dir`, written so a reader never sees half of one."""

import contextlib
import os


def write_atomically(directory: str, filename: str, text: str) -> str:
    """Writes `text` to `directory/filename` through a temporary file and a rename.

    A reader (the `report` command, TensorBoard, a person) sees the old file or
    the new one, never a partial one, even if training dies mid-write.

    Args:
        directory: the directory; created if missing.
        filename: the file's name.
        text: the contents.

    Returns:
        The path written.

    Example:

    >>> import tempfile
    >>> path = write_atomically(tempfile.mkdtemp(), "report.json", "{}")
    >>> open(path).read()
    '{}'
    """
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, filename)
    partial = path + ".partial"
    try:
        with open(partial, "w", encoding="utf-8") as file:
            file.write(text)
        os.replace(partial, path)
    except BaseException:
        # A full disk must not be filled further by a half-written file.
        with contextlib.suppress(OSError):
            os.remove(partial)
        raise
    return path
