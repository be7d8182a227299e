"""The timing source of `model.fit` steps on the JAX and torch backends.

The Keras backend is fixed when Keras is imported; each backend fetches batches
and runs steps its own way, so each has its own timing source handing the run
the same `(start, ready, end)` rows (see `jax_fit_timing` and
`torch_fit_timing`). Neither framework is imported before a fit on its backend.
"""

import sys
from typing import Callable, Dict, Optional

import numpy as np

BACKENDS = ("jax", "torch")


def fit_timing_for(
    model,
    on_rows: Callable[[str, np.ndarray, float, float], None],
    on_error: Callable[[Optional[BaseException]], None],
    on_fallback: Callable[[str], None],
):
    """The timing source for a fit of `model` on the JAX or torch backend.

    Args:
        model: the compiled `keras.Model`.
        on_rows: receives (kind, rows, wall seconds, called_at) per call.
        on_error: receives the exception when the user's step raises.
        on_fallback: receives the reason when steps cannot be split.

    Returns:
        A `JaxFitTiming` or a `TorchFitTiming`.

    Raises:
        ValueError: for any other backend (the TensorFlow backend swaps in a
            timed compiled function instead).

    Example:

    ```python
    timing = fit_timing_for(model, on_rows, on_error, on_fallback)
    ```
    """
    import keras

    backend = keras.backend.backend()
    if backend == "jax":
        from keras_pipeline_tuner.instrument.jax_fit_timing import JaxFitTiming

        return JaxFitTiming(model, on_rows, on_error, on_fallback)
    if backend == "torch":
        from keras_pipeline_tuner.instrument.torch_fit_timing import TorchFitTiming

        return TorchFitTiming(model, on_rows, on_error, on_fallback)
    raise ValueError(
        f"No JAX/torch timing source for the Keras backend {backend!r}: the backends "
        f"timed this way are {BACKENDS}."
    )


def environment() -> Dict[str, str]:
    """Versions of what the run used, for the report; imports nothing new.

    Returns:
        "python", "keras", "backend", and the version of each of TensorFlow,
        JAX and torch that the process has imported.

    Example:

    >>> sorted(environment())[:3]
    ['backend', 'keras', 'python']
    """
    import keras

    versions = {
        "python": sys.version.split()[0],
        "keras": keras.__version__,
        "backend": keras.backend.backend(),
    }
    for name in ("tensorflow", "jax", "torch"):
        module = sys.modules.get(name)
        version = getattr(module, "__version__", None)
        if version is not None:
            versions[name] = str(version)
    return versions
