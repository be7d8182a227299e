"""Scalars written from a compiled function: many points a call, no per-call name scoping."""

import logging


def scalar_metadata():
    """The summary metadata of a TensorBoard scalar."""
    # What `tf.summary.scalar` writes, without its per-call name scoping, which
    # costs half its time and, inside a compiled loop, prefixes tags with "while/".
    from tensorboard.plugins.scalar import metadata

    return metadata.create_summary_metadata(display_name=None, description=None)


class _OwnRetracing(logging.Filter):
    """Drops TensorFlow's "triggered tf.function retracing" warning about our writer only.

    Each fit with a `log_dir` has a writer of its own, whose compiled function
    is traced once (it captures that writer); after five fits in one process
    TensorFlow warns of frequent retracing, which reads as a fault in the
    user's code. Warnings about any other function pass.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not ("retracing" in message and compiled_scalar_writer.__name__ in message)


_RETRACING_FILTER = _OwnRetracing()


def compiled_scalar_writer(tf, tags):
    """A compiled function writing `values[row, column]` as tag `tags[row]` at `numbers[column]`."""
    # Added once: the logging module keeps one filter object once.
    logging.getLogger("tensorflow").addFilter(_RETRACING_FILTER)
    scalar = scalar_metadata()

    @tf.function(
        input_signature=[
            tf.TensorSpec([None], tf.int64),
            tf.TensorSpec([len(tags), None], tf.float32),
        ]
    )
    def write(numbers, values):
        # The user's `record_if` (e.g. keras.callbacks.TensorBoard's
        # update_freq) is no reason to drop these rows.
        with tf.summary.record_if(True):
            for column in tf.range(tf.shape(numbers)[0]):
                for row, tag in enumerate(tags):
                    tf.summary.write(
                        tag, values[row, column], step=numbers[column], metadata=scalar
                    )
        return tf.constant(True)

    return write
