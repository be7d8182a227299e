"""Input wait and compute of `model.fit` steps on the torch backend.

On torch, Keras' epoch iterator fetches each batch *outside*
`model.train_function`, from the `DataLoader` its data adapter makes (tf.data
wrapped in an `IterableDataset`, a user's own `DataLoader` as is, a `PyDataset`
through its queue), and then calls `train_function(data)`, which returns when
the step is done on CPU. So:

- the fetch is timed around each `next()` on the `DataLoader`'s iterator: for
  the fit (or `evaluate`) that is running, the adapter hands out the loader
  wrapped in an iterable that stamps each `next()`;
- compute is the `train_function` call, timed by a stand-in for it.

Validation fetches go to the validation rows (`begin("validation")` wraps the
evaluation's own adapter), never to the next training step. The loader is
kept (`loader`) so its settings (`num_workers`, `pin_memory`, ...) can be read
for advice.
"""

import functools
import logging
import math
import sys
import time
import weakref
from typing import Any, Callable, Dict, List, Optional

from keras_pipeline_tuner.instrumentation.timing_source import ATTRIBUTE
from keras_pipeline_tuner.instrumentation.timing_source import FitTiming
from keras_pipeline_tuner.instrumentation.timing_source import HeldRows
from keras_pipeline_tuner.instrumentation.timing_source import OnRows
from keras_pipeline_tuner._util.backend_import import backend_module
from keras_pipeline_tuner.timing.step_clock import TRAIN
from keras_pipeline_tuner.timing.step_clock import VALIDATION

logger = logging.getLogger("keras_pipeline_tuner")

# The Keras method that runs each kind's loop, and holds its epoch iterator.
_LOOP_METHOD = {TRAIN: "fit", VALIDATION: "evaluate"}
# How far up the stack a callback hook may sit below `fit` / `evaluate`.
_MAX_FRAMES = 30
# Stamps are taken on every step: looked up once.
_now = time.time


def running_data_adapter(model, method: str) -> Any:
    """The data adapter of the running `fit` (or `evaluate`) of `model`.

    Keras keeps the epoch iterator in a local variable of `fit`; a callback
    hook that `fit` calls finds it on the call stack.

    Args:
        model: the model being fitted.
        method: "fit" or "evaluate".

    Returns:
        The Keras data adapter, or `None` when no such call is on the stack.
    """
    frame = sys._getframe(1)  # pylint: disable=protected-access
    for _ in range(_MAX_FRAMES):
        if frame is None:
            return None
        if frame.f_code.co_name == method and frame.f_locals.get("self") is model:
            epoch_iterator = frame.f_locals.get("epoch_iterator")
            return getattr(epoch_iterator, "data_adapter", None)
        frame = frame.f_back
    return None


class _StampedIterator:
    """A `DataLoader` iterator whose every `next()` is stamped."""

    __slots__ = ("_iterator", "_record", "_on_error")

    def __init__(self, iterator, record: Callable[[tuple], None], on_error):
        self._iterator = iterator
        self._record = record
        self._on_error = on_error

    def __iter__(self):
        return self

    def __next__(self):
        start = _now()
        try:
            item = next(self._iterator)
        except StopIteration:
            raise
        except BaseException as error:
            # The user's data raised: fit ends without its end hooks on torch.
            self._on_error(error)
            raise
        self._record((start, _now()))
        return item


class _StampedLoader:
    """Stands in for the adapter's `DataLoader`: same batches, stamped fetches."""

    def __init__(self, loader, record: Callable[[tuple], None], on_error):
        self.loader = loader
        self._record = record
        self._on_error = on_error

    def __iter__(self):
        return _StampedIterator(iter(self.loader), self._record, self._on_error)

    def __len__(self):
        return len(self.loader)

    def __getattr__(self, name):
        # Anything else is the loader's own (num_workers, batch_size, ...).
        return getattr(self.loader, name)


class _TimedTorchFunction:
    """Stands in for `model.train_function` (or `test_function`) during a fit."""

    def __init__(self, model, kind: str, original: Callable):
        self.original = original
        self.kind = kind
        self.timing: Optional["TorchFitTiming"] = None
        self._model = weakref.ref(model)

    def __call__(self, data):
        # On the model from the batch-begin hook to here only: Keras has looked
        # it up for this call, and whatever interrupts fit from now on (Ctrl-C,
        # an error) leaves Keras' own function on the model.
        model = self._model()
        if model is not None and getattr(model, ATTRIBUTE[self.kind], None) is self:
            object.__setattr__(model, ATTRIBUTE[self.kind], self.original)
        timing = self.timing
        if timing is None:
            # Left by a fit that ended without its end hook: Keras' own runs.
            return self.original(data)
        return timing.run(self.kind, self.original, data)


class TorchFitTiming(FitTiming):
    """Times `model.fit` / `evaluate` steps on the torch backend.

    One object per fit. Keras may run batch-end hooks on its callback thread on
    this backend, so `after_step` does nothing: the timed train function keeps
    each step's row, on the training thread, and `flush_rows` (about once a
    second, between steps) and `end` hand them to the run.

    Args:
        model: the compiled `keras.Model`.
        on_rows: called with (kind, rows of (start, ready, end) seconds, wall
            time in seconds, when the first step began) for the steps kept
            back; a kind's first step comes alone, with its call's wall time.
        on_error: called with the exception when the user's step raises.
        on_fallback: called with a reason when the steps cannot be split.

    Attributes:
        loader: per kind, the `DataLoader` Keras iterates (read its settings for
            advice), once the fit has asked for it.

    Example:

    ```python
    timing = TorchFitTiming(model, on_rows, on_error, on_fallback)
    timing.begin("train")  # on_train_begin
    timing.flush_rows()    # about once a second, between steps
    timing.end("train")    # on_train_end
    ```
    """

    measurement = "in-step"

    def __init__(
        self,
        model,
        on_rows: OnRows,
        on_error: Callable[[Optional[BaseException]], None],
        on_fallback: Callable[[str], None],
    ):
        self._torch = backend_module("torch")
        super().__init__(model, on_rows, on_error, on_fallback)
        self._timed: Dict[str, _TimedTorchFunction] = {}
        self._adapters: Dict[str, Any] = {}
        self._fetch: Dict[str, tuple] = {}
        self._held = HeldRows(on_rows)
        self.loader: Dict[str, Any] = {}

    def begin(self, kind: str) -> None:
        """Puts the timed function in place and wraps the running loop's loader."""
        model = self.model
        current = self.keras_function(kind, _TimedTorchFunction)
        if current is None:
            return
        if self._torch.cuda.is_available():
            # A CUDA step returns before the device is done: its end would need
            # CUDA events, which this timing does not take yet.
            self._on_fallback(
                "on CUDA the torch step returns before the device is done, and this "
                "version does not time CUDA steps"
            )
            return
        timed = _TimedTorchFunction(model, kind, current)
        timed.timing = self
        self._timed[kind] = timed
        self._fetch.pop(kind, None)
        self._wrap_loader(model, kind)

    def before_step(self, kind: str) -> None:
        """Puts the timed function on the model for the call about to run.

        Called from the batch-begin hook, on the training thread (the fetch has
        been stamped by the loader); the call puts Keras' own back as it begins.
        """
        timed = self._timed.get(kind)
        if timed is not None:
            object.__setattr__(self.model, ATTRIBUTE[kind], timed)

    def after_step(self, kind: str) -> None:
        """Nothing: this hook may run on Keras' callback thread on torch."""

    def logs_ready(self, kind: str, logs) -> None:
        """Nothing: on the CPU the step has ended when its function returns."""

    def end(self, kind: str) -> None:
        """Hands over the rows kept back, restores Keras' function and loader for `kind`."""
        self.flush_rows()
        self.restore(kind)

    def flush_rows(self, wait: bool = False) -> None:
        """Hands the run the rows kept back (`HeldRows`).

        Args:
            wait: unused: on the CPU a step has ended when its function returns.
        """
        self._held.flush()

    def step_marker_target(self, kind: str):
        """None: the TF Profiler window is not opened on this backend."""
        return None

    def restore(self, kind: str) -> None:
        """Puts Keras' own function back for `kind` (safe to call twice)."""
        adapter = self._adapters.pop(kind, None)
        if adapter is not None and "get_torch_dataloader" in vars(adapter):
            del adapter.get_torch_dataloader
        timed = self._timed.pop(kind, None)
        if timed is None:
            return
        timed.timing = None
        model = self.model
        if model is not None and getattr(model, ATTRIBUTE[kind], None) is timed:
            object.__setattr__(model, ATTRIBUTE[kind], timed.original)

    def notes(self) -> List[str]:
        """Sentences for the report (none on torch: the fetch is the wait)."""
        return []

    # Called on the training thread.

    def run(self, kind: str, function: Callable, data):
        """Runs one step with Keras' function and keeps its row.

        Args:
            kind: "train" or "validation".
            function: Keras' own train (or test) function.
            data: the batch Keras fetched.

        Returns:
            Keras' logs.
        """
        called_at = _now()
        began = time.perf_counter()
        # The fetch of this step's batch; none when the loader is not stamped.
        fetch = self._fetch.pop(kind, None) or (called_at, math.nan)
        try:
            logs = function(data)
        except BaseException as error:
            self._on_error(error)
            raise
        self._held.add(kind, fetch + (_now(),), time.perf_counter() - began, called_at)
        return logs

    def _wrap_loader(self, model, kind: str) -> None:
        adapter = running_data_adapter(model, _LOOP_METHOD[kind])
        if adapter is None or not callable(getattr(adapter, "get_torch_dataloader", None)):
            logger.info(
                "keras-pipeline-tuner: no running %s found; torch fetches are not timed.",
                _LOOP_METHOD[kind],
            )
            return
        keras_loader = adapter.get_torch_dataloader

        def stamped_loader():
            loader = keras_loader()
            self.loader[kind] = loader
            # Called on every fetch: a C-level call, no Python frame.
            record = functools.partial(self._fetch.__setitem__, kind)
            return _StampedLoader(loader, record, self._on_error)

        # An instance attribute: this adapter only, for this fit (see `restore`).
        adapter.get_torch_dataloader = stamped_loader
        self._adapters[kind] = adapter
