"""The timing source for the active Keras backend.

Kept apart from `timing_source` (which the sources import): it imports each
backend's source, on that backend only.
"""

from keras_pipeline_tuner.instrumentation.timing_source import FitTiming
from keras_pipeline_tuner.instrumentation.timing_source import OnError
from keras_pipeline_tuner.instrumentation.timing_source import OnFallback
from keras_pipeline_tuner.instrumentation.timing_source import OnRows


def fit_timing_for(
    model,
    on_rows: OnRows,
    on_error: OnError,
    on_fallback: OnFallback,
    first_batch_end_hook: bool = True,
) -> FitTiming:
    """The timing source for `model`'s backend.

    Args:
        model: the `keras.Model` being fit.
        on_rows, on_error, on_fallback: as for `FitTiming`.
        first_batch_end_hook: whether the caller's batch-end hooks run before
            any other callback's (JAX stamps step ends there only then).

    Returns:
        A timing source for the active Keras backend: `TensorFlowFitTiming`,
        `JaxFitTiming`, `TorchFitTiming`, or whole-step `FitTiming` for others.
    """
    import keras

    # Each backend's source is imported on its backend only (jax, torch).
    backend = keras.backend.backend()
    if backend == "tensorflow":
        from keras_pipeline_tuner.instrumentation.tf_fit_timing import TensorFlowFitTiming

        return TensorFlowFitTiming(model, on_rows, on_error, on_fallback)
    if backend == "jax":
        from keras_pipeline_tuner.instrumentation.jax_fit_timing import JaxFitTiming

        return JaxFitTiming(
            model, on_rows, on_error, on_fallback, first_batch_end_hook=first_batch_end_hook
        )
    if backend == "torch":
        from keras_pipeline_tuner.instrumentation.torch_fit_timing import TorchFitTiming

        return TorchFitTiming(model, on_rows, on_error, on_fallback)
    timing = FitTiming(model, on_rows, on_error, on_fallback)
    on_fallback(
        f"the Keras backend is {backend!r}; input wait is measured inside the step on "
        "the TensorFlow, JAX and torch backends only"
    )
    return timing
