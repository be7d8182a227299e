"""What `model.fit` was given as training data, found from inside a callback.

Keras 3 (TensorFlow backend) wraps fit's `x` in a data adapter (tf.data
dataset, arrays, `PyDataset`, Python generator, ...) held by an epoch
iterator that is a local variable of `fit`. Callbacks get no reference to it,
so this module finds `fit`'s frame on the call stack of a callback hook and
reads the adapter there: it tells apart a user's own tf.data pipeline (to be
linted) from what Keras built itself (where the advice differs).
"""

import dataclasses
import logging
import sys
from typing import Any
from typing import Optional

from keras_pipeline_tuner._util.running_fit import running_call_local
from keras_pipeline_tuner.pipeline.lint import keras_inputs as pipeline_lint
from keras_pipeline_tuner.pipeline.lint.findings import Findings

logger = logging.getLogger("keras_pipeline_tuner")

TF_DATASET = "tf.data"
PY_DATASET = "PyDataset"
GENERATOR = "generator"
ARRAYS = "arrays"
TORCH_DATALOADER = "DataLoader"
GRAIN = "grain"
OTHER = "other"

# Kinds of the stage standing for input Keras wraps in a pipeline of its own.
_KERAS_BUILT = frozenset({"PyDataset", "generator", "arrays"})

_ADAPTER_KINDS = {
    "TFDatasetAdapter": TF_DATASET,
    "PyDatasetAdapter": PY_DATASET,
    "GeneratorDataAdapter": GENERATOR,
    "ArrayDataAdapter": ARRAYS,
    "TorchDataLoaderAdapter": TORCH_DATALOADER,
    "GrainDatasetAdapter": GRAIN,
}


@dataclasses.dataclass
class FitInput:
    """The training data of a running `fit`, as Keras adapted it.

    Attributes:
        kind: "tf.data", "PyDataset", "generator", "arrays", "DataLoader",
            "grain" or "other".
        source: what the user passed, when Keras keeps it: the
            `tf.data.Dataset` (or distributed dataset), the `PyDataset`, the
            torch `DataLoader`, or the Grain `MapDataset` / `IterDataset`.
        adapter: the Keras data adapter's class name.
        replay_dataset: the `tf.data.Dataset` the fit iterates, which a replay
            can time (TensorFlow backend): the user's own, or the one Keras
            built from NumPy arrays; `None` for other inputs, other backends
            and datasets distributed by a strategy.
        new_iterator_each_epoch: fit was given no `steps_per_epoch`, so
            Keras 3 starts each epoch on a new iterator of the data (read to
            its end), rather than going on with one.
    """

    kind: str
    source: Any = None
    adapter: str = ""
    replay_dataset: Any = None
    new_iterator_each_epoch: bool = False


def find_fit_input(model) -> Optional[FitInput]:
    """Finds the training data of the `fit` call that is running `model`.

    Call it from a callback hook that `fit` calls (e.g. `on_train_begin`).

    Args:
        model: the model being fitted.

    Returns:
        The `FitInput`, or `None` when no running `fit` of `model` is on the
        stack (a custom loop, or a Keras version that keeps it elsewhere).
    """
    epoch_iterator = running_call_local(model, "fit", "epoch_iterator")
    adapter = getattr(epoch_iterator, "data_adapter", None)
    if adapter is None:
        return None
    found = _classify(adapter)
    found.replay_dataset = _replay_dataset(found, epoch_iterator)
    # Keras' `EpochIterator._enumerate_iterator`: without `steps_per_epoch`
    # every epoch calls `iter()` on the data again.
    found.new_iterator_each_epoch = getattr(epoch_iterator, "steps_per_epoch", 0) is None
    return found


def data_adapter(model) -> Any:
    """Keras' data adapter of the running `fit` of `model`, or `None` outside one.

    Call it from a callback hook that `fit` calls (e.g. `on_train_begin`).

    Example:

    >>> data_adapter(object()) is None
    True
    """
    epoch_iterator = running_call_local(model, "fit", "epoch_iterator")
    return getattr(epoch_iterator, "data_adapter", None)


def inspect_fit_input(model) -> Findings:
    """Lints the training data of the running `fit` of `model`.

    A user's tf.data pipeline gets the full lint; a `PyDataset` gets advice on
    `workers` / `use_multiprocessing`; a Python generator or in-memory arrays
    get one finding each about what Keras does with them.

    Args:
        model: the model being fitted.

    Returns:
        The `Findings`.

    Raises:
        RuntimeError: if the training data cannot be found (says why).
    """
    fit_input = find_fit_input(model)
    if fit_input is None:
        raise RuntimeError(
            "could not find the data model.fit iterates (no running fit of this model "
            "on the call stack); inspect the dataset directly with kpt.inspect(dataset)"
        )
    if fit_input.kind == PY_DATASET and fit_input.source is not None:
        # Not through `inspect`: a PyDataset's advice needs no TensorFlow.
        return pipeline_lint.lint_py_dataset(fit_input.source)
    if fit_input.kind == TF_DATASET and fit_input.source is not None:
        return pipeline_lint.inspect(fit_input.source)
    if fit_input.kind == TORCH_DATALOADER and fit_input.source is not None:
        return pipeline_lint.lint_torch_dataloader(fit_input.source)
    if fit_input.kind == GRAIN:
        # Grain's stages are timed by Grain itself during training (see
        # `instrumentation.grain_stage_timing`): no static lint.
        return Findings()
    if fit_input.kind == GENERATOR:
        return pipeline_lint.lint_generator()
    if fit_input.kind == ARRAYS:
        return pipeline_lint.lint_keras_arrays()
    logger.info(
        "keras-pipeline-tuner: no pipeline inspection for %s input.", fit_input.adapter
    )
    return Findings()


def keras_built_input(findings) -> Optional[Any]:
    """The stage standing for input Keras turns into a tf.data pipeline itself.

    Args:
        findings: the `Findings` of `inspect_fit_input`, or `None`.

    Returns:
        The `Stage` of a `PyDataset`, a Python generator or NumPy arrays (the
        one stage their findings are about), or `None` for a user's own
        tf.data pipeline.
    """
    stages = getattr(getattr(findings, "pipeline", None), "stages", None) or []
    if len(stages) == 1 and stages[0].kind in _KERAS_BUILT:
        return stages[0]
    return None


def _classify(adapter) -> FitInput:
    name = type(adapter).__name__
    kind = _ADAPTER_KINDS.get(name, OTHER)
    source = None
    if kind == TF_DATASET:
        source = getattr(adapter, "_dataset", None)
    elif kind == PY_DATASET:
        source = getattr(adapter, "py_dataset", None)
    elif kind == TORCH_DATALOADER:
        # The user's own DataLoader: this adapter hands it out as it is.
        source = adapter.get_torch_dataloader()
    elif kind == GRAIN:
        source = _grain_source(adapter)
    return FitInput(kind=kind, source=source, adapter=name)


def _replay_dataset(found: FitInput, epoch_iterator):
    tf = sys.modules.get("tensorflow")
    if tf is None:
        return None
    dataset = found.source
    if found.kind == ARRAYS:
        # Keras' TensorFlow epoch iterator keeps the dataset it built from the
        # arrays (a gather of each batch's rows, prefetched): the fit's own
        # input, so the replay times what training iterated.
        dataset = getattr(epoch_iterator, "_distributed_dataset", None)
    elif found.kind != TF_DATASET:
        return None
    return dataset if isinstance(dataset, tf.data.Dataset) else None


def _grain_source(adapter):
    # Keras' adapter keeps what the user passed; read as it is, since asking
    # the adapter for its iterable makes a dataset on top of the user's,
    # which marks theirs as having a child (a grain.DataLoader is not timed).
    from keras_pipeline_tuner.profiling.grain_stages import is_grain_dataset

    dataset = getattr(adapter, "_dataset", None)
    return dataset if is_grain_dataset(dataset) else None
