"""The custom-loop half of `PipelineTuner`: `instrument`, `iterate`, `end_epoch`, `close`.

A loop that calls a train step itself (TensorFlow's "training loop from
scratch" guide) gets the same run as `model.fit`: its timing source
(`instrumentation.loop_timing.LoopTiming`) speaks fit's sources' verbs, its
driver (`run.loop_driver.LoopDriver`) is the sibling of fit's callback hooks,
and `close()` ends the run with the probes that apply to a loop.
"""

import functools
from typing import Callable
from typing import Iterable
from typing import Optional

from keras_pipeline_tuner.instrumentation.loop_timing import TimedIterator
from keras_pipeline_tuner.instrumentation.loop_timing import checked_kind
from keras_pipeline_tuner.outputs.report import Report
from keras_pipeline_tuner.run.loop_driver import LoopDriver
from keras_pipeline_tuner.timing.step_clock import TRAIN


class CustomLoopMethods:
    """The custom-loop methods of `PipelineTuner`, mixed into it.

    The tuner provides `_custom_loop()`, its `LoopDriver`.
    """

    def _custom_loop(self) -> LoopDriver:
        raise NotImplementedError

    def instrument(self, fn: Optional[Callable] = None, *, kind: str = TRAIN) -> Callable:
        """Decorates a custom loop's train step so that every call is timed.

        Stack it above or below `@tf.function`. Compute ends when the step's
        outputs are ready; input wait is the time since the previous call
        returned, or exactly the batch fetch when the loop uses `iterate()`.

        Args:
            fn: the step function (Python or `tf.function`).
            kind: "train", or "validation" for a validation loop's step.

        Returns:
            The wrapped function: same name, docstring and return values.

        Example:

        ```python
        @tuner.instrument
        @tf.function
        def train_step(x, y):
            ...
        ```
        """
        kind = checked_kind(kind, "instrument")
        if fn is None:
            # `@tuner.instrument(kind="validation")`.
            return functools.partial(self.instrument, kind=kind)
        wrapped = self._custom_loop().instrument(fn, kind)
        # Shown to users: `train_step.tuner.report`.
        wrapped.tuner = self
        return wrapped

    def iterate(self, dataset: Iterable, *, kind: str = TRAIN) -> TimedIterator:
        """Wraps a custom loop's dataset so that each batch fetch is timed exactly.

        Args:
            dataset: a `tf.data.Dataset`, an iterator or any iterable of batches.
            kind: "train" or "validation".

        Returns:
            An iterable of the same batches; each pass over it is one epoch.

        Example:

        ```python
        for x, y in tuner.iterate(train_ds):
            train_step(x, y)
        ```
        """
        return self._custom_loop().iterate(dataset, kind)

    def end_epoch(self) -> None:
        """Marks the end of an epoch in a custom loop that does not use `iterate()`."""
        self._custom_loop().end_epoch()

    def close(self) -> Report:
        """Ends a custom loop's run: the probes that apply, the report, the summary.

        The loop has ended when `close()` is called (or `with tuner:` exits),
        so it waits for a profiler window still converting, as a summary
        writer's `close()` flushes: the report it returns is final, with the
        profile (a wait of over a second is said first, in one line). The end
        of `model.fit` does not wait (see `PipelineTuner.wait_for_profile`).

        Returns:
            The final `Report` (that of the latest run when no loop was going).
        """
        report = self._custom_loop().close()
        return report if report is not None else self.report

    def __enter__(self) -> "CustomLoopMethods":
        self._custom_loop().open()
        return self

    def __exit__(self, exc_type, exc_value, traceback) -> bool:
        self.close()
        return False
