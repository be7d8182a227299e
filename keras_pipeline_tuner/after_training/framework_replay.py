"""The replay after training on the JAX and torch backends: the fit's own step, state restored.

On TensorFlow the replay runs the tuner's timed compiled function
(`what_if_replay`). On JAX and torch it runs Keras' own train function, the one
the fit called (the `jax.jit`-compiled step, compiled already; the torch step,
`torch.compile`d when the fit's was), on a few cached batches and on the fit's
input again, each step timed from its fetch to its outputs being ready:

- JAX: the step is functional. It is given copies of the model's state
  (weights, optimizer, metrics, seed generators), which it donates; the
  model's variables are never written, and are checked back afterwards all
  the same.
- torch: the step writes the variables in place. Every variable of the model,
  its optimizer and its metrics (seed generators' states included) and
  torch's global random state are copied before and put back after.

The fit's input is read again only where that changes nothing a later fit
reads: Keras' batches of NumPy arrays, or a tf.data dataset that passes the
hazard test (`pipeline.graph.rerun`), read through a copy with seeds of its
own and its variables put back. Inputs that run the user's Python (a
DataLoader, a PyDataset, a generator) are not replayed.

The cached batches of a tf.data dataset are replayed the way fit fetched its
batches: a few of the copy's batches cached in tf.data, repeated and
prefetched, through Keras' own adapter. Fetching a batch already in memory through tf.data and
Keras' conversion is the fetch floor the wait is measured beyond
(`timing.fetch_floor`), and the true input share is defined against that
same in-memory copy. Batches held in a Python list were fetched without
tf.data's threads: on torch beside two busy loops the steps on them ran
27 % faster than on a cached tf.data pipeline (10 % on an idle machine), and
a healthy cached pipeline read as highly input-bound.
"""

import contextlib
import itertools
import time
from typing import Callable
from typing import Iterator
from typing import List
from typing import Optional

import numpy as np

from keras_pipeline_tuner._util.backend_import import backend_module
from keras_pipeline_tuner._util.random_state import preserved_random_state
from keras_pipeline_tuner.after_training import replay_rounds
from keras_pipeline_tuner.after_training import what_if_replay
from keras_pipeline_tuner.after_training.what_if_replay import ReplayUnsupported
from keras_pipeline_tuner.instrumentation import fit_input
from keras_pipeline_tuner.instrumentation.timing_source import StampedIterator
from keras_pipeline_tuner.pipeline.graph import rerun
from keras_pipeline_tuner.pipeline.tune import rebuild as pipeline_rewrite
from keras_pipeline_tuner.timing.step_stats import StepStats

BACKENDS = ("jax", "torch")
# Fit inputs whose batches can be read again without running the user's Python.
REPLAYABLE_INPUTS = (fit_input.TF_DATASET, fit_input.ARRAYS)


def computes_on_cpu(backend: str) -> bool:
    """Whether the model's step runs on the CPU on `backend` ("jax" or "torch")."""
    if backend == "jax":
        return backend_module("jax").devices()[0].platform == "cpu"
    return not backend_module("torch").cuda.is_available()


def can_replay(model, backend: str) -> bool:
    """Whether the fit's input can be read again and its step replayed on `backend`."""
    found = fit_input.find_fit_input(model)
    return (
        found is not None
        and found.kind in REPLAYABLE_INPUTS
        and int(getattr(model, "steps_per_execution", 1) or 1) == 1
        and not model.run_eagerly
    )


def fetches_as_fit(kind: str) -> bool:
    """Whether the replay fetches its cached batches of a fit input of `kind` as fit did.

    So its wait is the fetch floor, measured through the fit's own fetch: a
    tf.data dataset's batches come through tf.data and Keras' adapter (see
    the module docstring); Keras' batches of NumPy arrays come from a list.

    Args:
        kind: the fit's input (`instrumentation.fit_input`).

    Returns:
        `True` for a tf.data dataset.

    Example:

    >>> fetches_as_fit("tf.data"), fetches_as_fit("arrays")
    (True, False)
    """
    return kind == fit_input.TF_DATASET


def input_runs_beside_the_step(model) -> bool:
    """Whether the fit's input may do work while its step computes (JAX, torch).

    On these backends Keras slices NumPy arrays on the training thread, between
    steps (a plain iterator on JAX, a DataLoader without workers on torch):
    nothing of that input runs beside the step, so it cannot slow the compute,
    and its whole cost is the wait at the fetch. A contention check there
    could only find what the wait shows. Other inputs (tf.data's threads, a
    loader's workers) may.

    Args:
        model: the model `fit` trains or trained.

    Returns:
        `False` for Keras' batches of NumPy arrays, else `True`.
    """
    found = fit_input.find_fit_input(model)
    return found is None or found.kind != fit_input.ARRAYS


def replay(
    model,
    backend: str,
    steps: int,
    cached_batches: int,
    pipeline_stats: Optional[StepStats] = None,
    control: Optional[what_if_replay.RoundControl] = None,
) -> what_if_replay.WhatIfResult:
    """Times the fit's own step on cached batches, and on the fit's input unless given.

    Call it from `on_train_end`, once Keras' own train function is back.

    Args:
        model: the model `fit` trained.
        backend: "jax" or "torch".
        steps: replayed steps to time (a side, per round).
        cached_batches: distinct batches to replay.
        pipeline_stats: the real steps' `StepStats` from training, or `None`
            to time real steps here, between parts of the replay.
        control: sizes the rounds by time (`RoundControl`), or `None`.

    Returns:
        The `WhatIfResult`.

    Raises:
        ReplayUnsupported: the input or the step cannot be replayed (says why).
    """
    found = fit_input.find_fit_input(model)
    if found is None or found.kind not in REPLAYABLE_INPUTS:
        kind = "no data it could find" if found is None else f"{found.kind} data"
        raise ReplayUnsupported(
            f"The replay reads fit's input again only where that runs none of your Python "
            f"(a tf.data dataset or NumPy arrays), and fit got {kind}."
        )
    adapter = fit_input.data_adapter(model)
    batches, pipeline_state, replayed_of = _fit_batches(found, adapter, backend)
    step = _JaxStep(model) if backend == "jax" else _TorchStep(model)
    try:
        with preserved_random_state():
            found_batches, replayed = replayed_of(cached_batches)
            if not found_batches:
                raise ValueError("The dataset is empty: there is nothing to replay.")
            if pipeline_stats is None:
                replay_rows, pipeline_rows, rounds = replay_rounds.run_rounds(
                    step, replayed, batches, steps, control
                )
            else:
                replay_rows = replay_rounds.run_replay(step, replayed, steps)
                pipeline_rows, rounds = None, []
    finally:
        step.restore()
        if pipeline_state is not None:
            pipeline_state.restore()
    return what_if_replay.result_of(
        found_batches, cached_batches, replay_rows, pipeline_rows, rounds, pipeline_stats
    )


class _Batches:
    """The fit's batches as its step takes them: each `iter()` is a new pass."""

    def __init__(self, new_pass: Callable[[], Iterator]):
        self._new_pass = new_pass

    def __iter__(self) -> Iterator:
        return iter(self._new_pass())


def _fit_batches(found, adapter, backend: str):
    """The fit's input read again, its variables to put back, and its replayed batches.

    Returns:
        `(batches, pipeline_state, replayed_of)`: `replayed_of(count)` takes
        `count` batches once and returns how many it found and an endless
        iterator of them, fetched as fit fetched its batches where the input
        is a tf.data dataset (see the module docstring).
    """
    pipeline_state = None
    if found.kind != fit_input.TF_DATASET:
        batches = _Batches(_iterator_of(adapter, backend))

        def held(count: int):
            # Keras slices NumPy arrays on the training thread: a list is their fetch.
            cached = list(itertools.islice(iter(batches), count))
            return len(cached), itertools.cycle(cached)

        return batches, pipeline_state, held

    dataset = found.source
    hazard = rerun.dataset_rerun_hazard(dataset, restores_variables=True)
    if hazard is not None:
        raise ReplayUnsupported(f"The pipeline is not run again: {hazard}.")
    pipeline_state = rerun.PipelineVariables(dataset)
    copy = pipeline_rewrite.independent_copy(dataset)
    if copy is None:
        raise ReplayUnsupported(
            "The dataset reshuffles every epoch and holds too many in-memory tensors "
            "to copy with seeds of its own: reading it again would change the order "
            "a later fit on it sees."
        )
    # Keras' own adapter over the copy: batches converted as fit's were.
    kind = type(adapter)

    def cached_in_tf_data(count: int):
        cached = copy.take(count).cache()
        # One full pass completes the cache; the repeats then read only memory.
        found_batches = sum(1 for _ in cached)
        # Prefetched as the floor's batches are (`timing.fetch_floor`).
        replayed = kind(cached.repeat().prefetch(1))
        return found_batches, iter(_iterator_of(replayed, backend)())

    return _Batches(_iterator_of(kind(copy), backend)), pipeline_state, cached_in_tf_data


def _iterator_of(adapter, backend: str) -> Callable[[], Iterator]:
    """What makes a new pass of `adapter`'s batches, as fit gets them on `backend`."""
    if backend == "jax":
        return adapter.get_jax_iterator
    return adapter.get_torch_dataloader


class _Snapshot:
    """The values of every variable of the model, its optimizer and metrics, to put back."""

    def __init__(self, model):
        import keras

        variables = list(model.variables)
        variables += list(getattr(model.optimizer, "variables", []))
        variables += list(getattr(model, "metrics_variables", []))
        unique = {id(variable): variable for variable in variables}
        self._saved = [
            (variable, np.array(keras.ops.convert_to_numpy(variable.value)))
            for variable in unique.values()
        ]

    def restore(self) -> None:
        for variable, value in self._saved:
            variable.assign(value)


class _JaxStep:
    """Keras' own JAX train function, run on copies of the model's state.

    Each call fetches one batch and runs the jitted step; it returns that
    step's `(start, ready, end)` row, the end once its outputs are ready.
    """

    def __init__(self, model):
        self._jax = backend_module("jax")
        if getattr(model, "train_function", None) is None:
            model.make_train_function()
        self._function = model.train_function
        self._snapshot = _Snapshot(model)
        copy = self._jax.numpy.array
        # Copies: the jitted step donates its state, and the model's own
        # buffers must stay valid (and unchanged).
        self._state = tuple(
            [copy(variable.value, copy=True) for variable in variables]
            for variables in (
                model.trainable_variables,
                model.non_trainable_variables,
                model.optimizer.variables,
                model.metrics_variables,
            )
        )

    def __call__(self, iterator) -> np.ndarray:
        stamps: List[tuple] = []
        logs, self._state = self._function(self._state, StampedIterator(iterator, stamps.append))
        self._jax.block_until_ready(logs)
        end = time.time()
        start, ready = stamps[-1]
        return np.array([[start, ready, end]])

    def restore(self) -> None:
        self._state = None
        self._snapshot.restore()


class _TorchStep:
    """Keras' own torch train function, with every variable it writes put back."""

    def __init__(self, model):
        self._torch = backend_module("torch")
        if getattr(model, "train_function", None) is None:
            model.make_train_function()
        self._function = model.train_function
        self._model = model
        self._snapshot = _Snapshot(model)
        self._rng = self._torch.get_rng_state()
        self._was_training = model.training
        # As fit runs its steps: torch layers wrapped in the model in training mode.
        model.train()

    def __call__(self, iterator) -> np.ndarray:
        start = time.time()
        batch = next(iterator)
        ready = time.time()
        self._function([batch])
        if self._torch.cuda.is_available():
            self._torch.cuda.synchronize()
        return np.array([[start, ready, time.time()]])

    def restore(self) -> None:
        with contextlib.suppress(AttributeError):
            self._model.train(self._was_training)
        self._snapshot.restore()
        self._torch.set_rng_state(self._rng)
