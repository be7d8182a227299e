"""Lazy import of TensorFlow with an install hint.

TensorFlow is not a hard dependency of the package (like tensorflow-datasets): the
pure-Python parts (reports, the `report` command) work without it, and the parts that
need it import it on first use through `tensorflow()`.
"""

import importlib
import os
import sys

INSTALL_HINT = (
    "keras-pipeline-tuner needs TensorFlow for this feature, and it is not installed. "
    "Install it with `pip install keras-pipeline-tuner[cpu]` (tensorflow-cpu) or "
    "`pip install tensorflow` (GPU builds)."
)


def tensorflow():
    """Returns the `tensorflow` module, importing it on first use.

    Returns:
        The imported `tensorflow` module.

    Raises:
        ImportError: with the install command when TensorFlow is missing.

    Example:

    >>> tf = tensorflow()
    >>> int(tf.constant(1))
    1
    """
    # Keep TF's C++ start-up chatter out of users' terminals unless they asked for it.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        return importlib.import_module("tensorflow")
    except ImportError as error:
        raise ImportError(INSTALL_HINT) from error


def is_tf_dataset(value) -> bool:
    """Whether `value` is a `tf.data.Dataset`, without importing TensorFlow.

    Example:

    >>> is_tf_dataset(None), is_tf_dataset([1, 2])
    (False, False)
    """
    return (
        value is not None
        and "tensorflow" in sys.modules
        and isinstance(value, tensorflow().data.Dataset)
    )
