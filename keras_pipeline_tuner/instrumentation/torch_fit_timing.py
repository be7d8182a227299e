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

Each step's row is kept in a list and handed to the run with the others when
it asks for them (`flush_rows`, about once a second and at the end of each
epoch); a kind's first call, which the run keeps apart, is handed over at once.
"""

import functools
import logging
import math
import time
from typing import Any
from typing import Callable
from typing import Dict
from typing import List
from typing import Optional

import numpy as np

from keras_pipeline_tuner._util.backend_import import backend_module
from keras_pipeline_tuner._util.running_fit import running_call_local
from keras_pipeline_tuner.instrumentation.timing_source import FitTiming
from keras_pipeline_tuner.instrumentation.timing_source import OnRows
from keras_pipeline_tuner.instrumentation.timing_source import StampedIterator
from keras_pipeline_tuner.instrumentation.timing_source import StandIn
from keras_pipeline_tuner.timing.step_clock import TRAIN
from keras_pipeline_tuner.timing.step_clock import VALIDATION

logger = logging.getLogger("keras_pipeline_tuner")

# The Keras method that runs each kind's loop, and holds its epoch iterator.
_LOOP_METHOD = {TRAIN: "fit", VALIDATION: "evaluate"}
# Stamps are taken on every step: looked up once.
_now = time.time


class _StampedLoader:
    """Stands in for the adapter's `DataLoader`: same batches, stamped fetches."""

    def __init__(self, loader, record: Callable[[tuple], None], on_error):
        self.loader = loader
        self._record = record
        self._on_error = on_error

    def __iter__(self):
        return StampedIterator(iter(self.loader), self._record, self._on_error)

    def __len__(self):
        return len(self.loader)

    def __getattr__(self, name):
        # Anything else is the loader's own (num_workers, batch_size, ...).
        return getattr(self.loader, name)


class _TimedTorchFunction(StandIn):
    """Stands in for `model.train_function` (or `test_function`) during a fit."""

    def timed_call(self, timing: "TorchFitTiming", data):
        return timing.run(self.kind, self.original, data)


class TorchFitTiming(FitTiming):
    """Times `model.fit` / `evaluate` steps on the torch backend.

    One object per fit. Keras may run batch-end hooks on its callback thread on
    this backend, so `after_step` does nothing: the timed train function keeps
    each step's row, on the training thread, for `flush_rows`.

    Args:
        model: the compiled `keras.Model`.
        on_rows: called with (kind, (start, ready, end) rows of seconds, their
            wall time from the first fetch to the last step's end, when the
            first began) in `flush_rows`; a kind's first call comes alone,
            after its step.
        on_error: called with the exception when the user's step raises.
        on_fallback: called with a reason when the steps cannot be split.

    Attributes:
        loader: per kind, the `DataLoader` Keras iterates (read its settings for
            advice), once the fit has asked for it.

    Example:

    ```python
    timing = TorchFitTiming(model, on_rows, on_error, on_fallback)
    timing.begin("train")        # on_train_begin
    timing.before_step("train")  # on_train_batch_begin: the stand-in for one call
    timing.end("train")          # on_train_end
    ```
    """

    def __init__(
        self,
        model,
        on_rows: OnRows,
        on_error: Callable[[Optional[BaseException]], None],
        on_fallback: Callable[[str], None],
    ):
        self._torch = backend_module("torch")
        super().__init__(model, on_rows, on_error, on_fallback)
        self._adapters: Dict[str, Any] = {}
        self._fetch: Dict[str, tuple] = {}
        self.loader: Dict[str, Any] = {}
        # Per kind, the rows of the calls since the last hand-over; `None`
        # until the kind's first call.
        self._held: Dict[str, Optional[list]] = {TRAIN: None, VALIDATION: None}

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
        self._stand_ins[kind] = timed
        self._fetch.pop(kind, None)
        self._wrap_loader(model, kind)

    def after_step(self, kind: str) -> None:
        """Nothing: this hook may run on Keras' callback thread on torch."""

    def logs_ready(self, kind: str, logs) -> None:
        """Nothing: on the CPU the step has ended when its function returns."""


    def step_marker_target(self, kind: str):
        """None: the TF Profiler window is not opened on this backend."""
        return None

    def restore(self, kind: str) -> None:
        """Puts Keras' own function and loader back for `kind` (safe to call twice)."""
        adapter = self._adapters.pop(kind, None)
        if adapter is not None and "get_torch_dataloader" in vars(adapter):
            del adapter.get_torch_dataloader
        super().restore(kind)

    def notes(self) -> List[str]:
        """Sentences for the report (none on torch: the fetch is the wait)."""
        return []

    # Called on the training thread.

    def run(self, kind: str, function: Callable, data):
        """Runs one step with Keras' function and hands its row to the run.

        Args:
            kind: "train" or "validation".
            function: Keras' own train (or test) function.
            data: the batch Keras fetched.

        Returns:
            Keras' logs.
        """
        # The fetch of this step's batch; none when the loader is not stamped.
        fetch = self._fetch.pop(kind, None) or (_now(), math.nan)
        try:
            logs = function(data)
        except BaseException as error:
            self._on_error(error)
            raise
        end = _now()
        held = self._held[kind]
        if held is not None:
            held.append(fetch + (end,))
            return logs
        self._held[kind] = []
        # A call's wall time runs from its fetch, as on the other backends.
        self._on_rows(kind, fetch + (end,), end - fetch[0], fetch[0])
        return logs

    def flush_rows(self, wait: bool = False) -> None:
        """Hands the run the rows kept since the last hand-over, a kind at a time."""
        for kind, held in self._held.items():
            if not held:
                continue
            count = len(held)
            rows = np.array(held[:count], dtype=np.float64)
            del held[:count]
            called_at = float(rows[0, 0])
            self._on_rows(kind, rows, float(rows[-1, 2]) - called_at, called_at)

    def _wrap_loader(self, model, kind: str) -> None:
        epoch_iterator = running_call_local(model, _LOOP_METHOD[kind], "epoch_iterator")
        adapter = getattr(epoch_iterator, "data_adapter", None)
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
