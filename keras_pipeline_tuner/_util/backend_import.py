"""Lazy import of the JAX and torch modules, with an install hint.

The package imports neither at module level: the timing of a Keras backend
imports its framework when a fit on that backend starts.
"""

import importlib

_EXTRAS = {"jax": "jax", "torch": "torch"}


def backend_module(name: str):
    """Returns the framework module `name` ("jax" or "torch"), imported on first use.

    Args:
        name: "jax" or "torch".

    Returns:
        The imported module.

    Raises:
        ImportError: naming the install command when the framework is missing.

    Example:

    >>> backend_module("numpy").__name__
    'numpy'
    """
    try:
        return importlib.import_module(name)
    except ImportError as error:
        extra = _EXTRAS.get(name, name)
        raise ImportError(
            f"keras-pipeline-tuner needs {name} to time steps on the Keras {name!r} "
            f"backend, and it is not installed. Install it with "
            f"`pip install keras-pipeline-tuner[{extra}]`, or set KERAS_BACKEND to a "
            "backend that is installed."
        ) from error
