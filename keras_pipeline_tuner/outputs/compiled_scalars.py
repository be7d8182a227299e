"""Scalars written from a compiled function: many points a call, no per-call name scoping.

One compiled writer serves every fit of the process for a set of tags: the
summary writer's resource is an argument, so a new fit's writer traces
nothing again. Until a tag set's writer is compiled, its first points are
written one by one (`write_eagerly`): tracing costs more than a few points.
"""

import logging
from typing import Dict
from typing import Tuple

# The compiled scalar writers of this process, by tag set; and how many points
# were written one by one before the tag set's writer was compiled.
_COMPILED_WRITERS: Dict[Tuple[str, ...], object] = {}
_EAGER_WRITTEN: Dict[Tuple[str, ...], int] = {}


def scalar_metadata():
    """The summary metadata of a TensorBoard scalar."""
    # What `tf.summary.scalar` writes, without its per-call name scoping, which
    # costs half its time and, inside a compiled loop, prefixes tags with "while/".
    from tensorboard.plugins.scalar import metadata

    return metadata.create_summary_metadata(display_name=None, description=None)


def write_eagerly(tags, points: int, most: int) -> bool:
    """Whether `points` more points of `tags` are written one by one, and counts them.

    Args:
        tags: the tag set.
        points: the points about to be written.
        most: the process's points of a tag set written one by one, at most.

    Returns:
        True before the tag set's writer is compiled, within `most` points.

    Example:

    >>> write_eagerly(("doc/a",), 200, most=250), write_eagerly(("doc/a",), 100, most=250)
    (True, False)
    """
    eager = _EAGER_WRITTEN.get(tags, 0)
    if tags in _COMPILED_WRITERS or eager + points > most:
        return False
    _EAGER_WRITTEN[tags] = eager + points
    return True


class _OwnRetracing(logging.Filter):
    """Drops TensorFlow's "triggered tf.function retracing" warning about our writer only.

    The compiled writer is traced once per process and tag set; should
    TensorFlow still count its traces as retracing (a new writer's resource
    handle, say), the warning would read as a fault in the user's code.
    Warnings about any other function pass.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not ("retracing" in message and compiled_scalar_writer.__name__ in message)


_RETRACING_FILTER = _OwnRetracing()


def compiled_scalar_writer(tf, tags):
    """The process's compiled function writing points of `tags` to the summary writer it is given.

    `write(writer_resource, numbers, values)` writes `values[row, column]` as
    tag `tags[row]` at step `numbers[column]`: what `tf.summary.write` writes
    (the same op, the scalar plugin's metadata), whatever the user's
    `record_if` (e.g. keras.callbacks.TensorBoard's update_freq), which is no
    reason to drop these rows.
    """
    write = _COMPILED_WRITERS.get(tags)
    if write is not None:
        return write
    # Added once: the logging module keeps one filter object once.
    logging.getLogger("tensorflow").addFilter(_RETRACING_FILTER)
    scalar = scalar_metadata().SerializeToString()

    @tf.function(
        input_signature=[
            tf.TensorSpec([], tf.resource),
            tf.TensorSpec([None], tf.int64),
            tf.TensorSpec([len(tags), None], tf.float32),
        ]
    )
    def write(writer, numbers, values):
        for column in tf.range(tf.shape(numbers)[0]):
            for row, tag in enumerate(tags):
                tf.raw_ops.WriteSummary(
                    writer=writer,
                    step=numbers[column],
                    tensor=values[row, column],
                    tag=tag,
                    summary_metadata=scalar,
                )
        return tf.constant(True)

    _COMPILED_WRITERS[tags] = write
    return write
