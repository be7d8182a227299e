"""TensorBoard event files written with TensorBoard's own writer: no TensorFlow needed.

On the JAX and torch backends TensorFlow may not be installed (or not imported:
importing it only to write summaries costs seconds and memory). TensorBoard
ships a writer of event files (`EventFileWriter`) and each plugin the protos of
its summaries, which is all the Scalars, Text and Images tabs read; the files
are the same as `tf.summary` writes.
"""

import struct
import time
from typing import Sequence

import numpy as np


class EventWriter:
    """Writes scalars, text and PNG images to one TensorBoard run directory.

    Args:
        run_dir: the run's directory; created if missing.

    Example:

    >>> import tempfile
    >>> writer = EventWriter(tempfile.mkdtemp())
    >>> writer.scalars(("loss",), np.array([1, 2]), np.array([[0.5, 0.25]]))
    >>> writer.text("notes", "**bold**", step=2)
    >>> writer.close()
    """

    def __init__(self, run_dir: str):
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._writer = EventFileWriter(run_dir)

    def scalars(self, tags: Sequence[str], numbers: np.ndarray, values: np.ndarray) -> None:
        """Writes one event per step with a scalar per tag.

        Args:
            tags: the tags, one per row of `values`.
            numbers: the steps, shape (n,).
            values: shape (len(tags), n).
        """
        from tensorboard.plugins.scalar.summary import scalar_pb

        for column, number in enumerate(np.asarray(numbers)):
            values_pb = []
            for row, tag in enumerate(tags):
                values_pb.extend(scalar_pb(tag, float(values[row, column])).value)
            self._add(values_pb, int(number))

    def text(self, tag: str, text: str, step: int) -> None:
        """Writes `text` (markdown) to the Text tab."""
        from tensorboard.plugins.text.summary import text_pb

        self._add(text_pb(tag, text).value, step)

    def image(self, tag: str, png: bytes, step: int, description: str = "") -> None:
        """Writes one PNG image, as it is, to the Images tab."""
        from tensorboard.compat.proto import summary_pb2
        from tensorboard.plugins.image import metadata
        from tensorboard.util import tensor_util

        # The image plugin's tensor: width, height, then the encoded images.
        width, height = struct.unpack(">II", png[16:24])
        tensor = tensor_util.make_tensor_proto(
            [str(width).encode(), str(height).encode(), png], dtype="string"
        )
        value = summary_pb2.Summary.Value(
            tag=tag,
            metadata=metadata.create_summary_metadata(
                display_name=None, description=description
            ),
            tensor=tensor,
        )
        self._add([value], step)

    def tensor(self, tag: str, value, step: int, metadata) -> None:
        """Writes a tensor summary (an array or a string) with a plugin's metadata."""
        from tensorboard.compat.proto import summary_pb2
        from tensorboard.util import tensor_util

        proto = tensor_util.make_tensor_proto(
            np.asarray(value) if not isinstance(value, str) else value.encode("utf-8")
        )
        self._add([summary_pb2.Summary.Value(tag=tag, metadata=metadata, tensor=proto)], step)

    def flush(self) -> None:
        """Writes what is queued to disk."""
        self._writer.flush()

    def close(self) -> None:
        """Flushes and closes the event file."""
        self._writer.close()

    def _add(self, values, step: int) -> None:
        from tensorboard.compat.proto import event_pb2
        from tensorboard.compat.proto import summary_pb2

        event = event_pb2.Event(
            wall_time=time.time(), step=step, summary=summary_pb2.Summary(value=list(values))
        )
        self._writer.add_event(event)
