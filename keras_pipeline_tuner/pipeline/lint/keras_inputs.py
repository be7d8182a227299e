"""The inputs `model.fit` is given, linted by what they are: `inspect` and its kin.

`inspect(dataset)` reads a tf.data dataset's graph (see `graph.reader`) and
runs the tf.data rules over it (`tf_data_rules`). Keras reads other inputs
without tf.data transformations, so tf.data knobs do not apply to them: a
`keras.utils.PyDataset`, a torch `DataLoader`, a Python generator and
in-memory arrays each get advice of their own, about the one stage that
stands for them.
"""

import importlib.util
from typing import Optional

from keras_pipeline_tuner._util.tf_import import tensorflow
from keras_pipeline_tuner.pipeline.graph import kinds
from keras_pipeline_tuner.pipeline.graph.model import Pipeline
from keras_pipeline_tuner.pipeline.graph.model import Stage
from keras_pipeline_tuner.pipeline.graph.model import StageFunction
from keras_pipeline_tuner.pipeline.graph.reader import read_pipeline
from keras_pipeline_tuner.pipeline.lint import memory_forecast
from keras_pipeline_tuner.pipeline.lint.catalogue import KERAS_ARRAY_INPUT
from keras_pipeline_tuner.pipeline.lint.catalogue import PY_DATASET_THREADS
from keras_pipeline_tuner.pipeline.lint.catalogue import PY_DATASET_WORKERS
from keras_pipeline_tuner.pipeline.lint.catalogue import PYTHON_GENERATOR
from keras_pipeline_tuner.pipeline.lint.catalogue import TORCH_DATALOADER_RESPAWN
from keras_pipeline_tuner.pipeline.lint.catalogue import TORCH_DATALOADER_WORKERS
from keras_pipeline_tuner.pipeline.lint.findings import Findings
from keras_pipeline_tuner.pipeline.lint.findings import Severity
from keras_pipeline_tuner.pipeline.lint.findings import stage_finding
from keras_pipeline_tuner.pipeline.lint.tf_data_rules import lint
from keras_pipeline_tuner.timing.memory_budget import read_memory_budget

# In-memory sources above this are replaced by stand-ins when the graph is read:
# copying them costs about 10 ms per MB here.
MAX_IN_MEMORY_BYTES = 16 * 2**20
# The workers advised to a PyDataset read by one (the fix timing times this).
ADVISED_WORKERS = 4


def inspect(dataset, max_in_memory_bytes: Optional[int] = MAX_IN_MEMORY_BYTES) -> Findings:
    """Lints a tf.data pipeline against the tf.data performance guide.

    Reads the dataset's graph from the final dataset back to its sources, and
    the pipeline TensorFlow actually runs after its default rewrites, then
    reports every place where it departs from the guide: the op, the user's
    function, why it matters and the code to write instead. Runs in
    milliseconds and iterates nothing.

    Args:
        dataset: a `tf.data.Dataset` (also one distributed with
            `strategy.experimental_distribute_dataset`), or a
            `keras.utils.PyDataset` (then the advice is about `workers` and
            `use_multiprocessing`).
        max_in_memory_bytes: in-memory sources (`from_tensor_slices` of
            arrays) larger than this are not copied into the graph that is
            read: the pipeline is read over one-element stand-ins of them, in
            milliseconds at any size. Only a pipeline with a transformation
            that cannot be rebuilt that way is refused. `None` reads (and
            copies) everything.

    Returns:
        `Findings`: a list of `Finding`s, errors first, that prints as a table;
        its `pipeline` attribute holds the `Pipeline` that was read.

    Raises:
        TypeError: if `dataset` is neither of the above (names what to pass).
        ValueError: if it holds more than `max_in_memory_bytes` in a pipeline
            that cannot be read without them (says what to do).

    Example:

    ```python
    findings = kpt.inspect(train_ds)
    print(findings)
    assert "cache-after-random" not in findings.ids
    ```
    """
    tf = tensorflow()
    original = getattr(dataset, "_original_dataset", None)
    if not isinstance(dataset, tf.data.Dataset) and isinstance(original, tf.data.Dataset):
        dataset = original
    if isinstance(dataset, tf.data.Dataset):
        findings = lint(read_pipeline(dataset, max_in_memory_bytes))
        return with_memory_forecast(findings, dataset)
    import keras

    if isinstance(dataset, keras.utils.PyDataset):
        return lint_py_dataset(dataset)
    raise TypeError(
        f"inspect() takes a tf.data.Dataset or a keras.utils.PyDataset, got "
        f"{type(dataset).__name__}. For NumPy arrays or Python generators, Keras builds "
        "the pipeline itself; to inspect your own, build it with tf.data, e.g. "
        "`tf.data.Dataset.from_tensor_slices((x, y)).batch(32)`."
    )

def with_memory_forecast(findings: Findings, dataset) -> Findings:
    """`findings` with the caches and buffers that will not fit the job's memory, errors first.

    The forecast itself is `findings.memory` (a `memory_forecast.MemoryForecast`).
    """
    found = memory_forecast.forecast(dataset, findings.pipeline, read_memory_budget())
    # A cache the job cannot hold is no advice.
    kept = [finding for finding in findings if memory_forecast.fits(found, finding)]
    combined = Findings(
        [*memory_forecast.memory_findings(found), *kept], findings.pipeline
    ).sorted()
    combined.memory = found
    return combined


def lint_py_dataset(py_dataset) -> Findings:
    """Advice for a `keras.utils.PyDataset`: its `workers` and `use_multiprocessing`.

    Keras reads a PyDataset through its own enqueuer, not through tf.data
    transformations, so tf.data knobs do not apply.

    Args:
        py_dataset: the `keras.utils.PyDataset`.

    Returns:
        `Findings` about the one stage that stands for the PyDataset.
    """
    name = type(py_dataset).__name__
    workers = int(py_dataset.workers or 0)
    multiprocessing = bool(py_dataset.use_multiprocessing)
    stage = Stage(
        node=name,
        op="PyDataset",
        kind=kinds.PY_DATASET,
        params={
            "workers": workers,
            "use_multiprocessing": multiprocessing,
            "max_queue_size": int(py_dataset.max_queue_size),
        },
        function=StageFunction(name=f"{name}.__getitem__", graph_name=""),
    )
    findings = Findings(pipeline=Pipeline(stages=[stage]))
    if workers <= 1 and not multiprocessing:
        findings.append(
            stage_finding(
                PY_DATASET_WORKERS,
                Severity.WARNING,
                stage,
                f"Keras calls {name}.__getitem__ for one batch at a time, on the training "
                "thread: while a batch loads nothing trains, and while the model trains "
                "no batch loads. With workers > 1 Keras loads batches ahead in a pool "
                "and queues them (max_queue_size).",
                f"class {name}(keras.utils.PyDataset):\n"
                "    def __init__(self, ..., **kwargs):\n"
                f"        super().__init__(workers={ADVISED_WORKERS}, use_multiprocessing=False, "
                "**kwargs)",
            )
        )
    elif not multiprocessing:
        findings.append(
            stage_finding(
                PY_DATASET_THREADS,
                Severity.INFO,
                stage,
                f"{name} loads batches on {workers} threads. Threads overlap I/O and "
                "NumPy work, but pure-Python code in __getitem__ holds the GIL and runs "
                "one thread at a time.",
                "If __getitem__ is CPU-bound Python: "
                "super().__init__(workers=4, use_multiprocessing=True, **kwargs)",
            )
        )
    return findings


def lint_torch_dataloader(loader) -> Findings:
    """Advice for a torch `DataLoader` given to `model.fit` (torch backend).

    Reads the loader's own settings (`num_workers`, `pin_memory`,
    `persistent_workers`, `prefetch_factor`); tf.data knobs do not apply.

    Args:
        loader: the `torch.utils.data.DataLoader`.

    Returns:
        `Findings` about the one stage that stands for the loader.

    Example:

    ```python
    loader = torch.utils.data.DataLoader(dataset, batch_size=32)
    lint_torch_dataloader(loader).ids  # ['torch-dataloader-workers']
    ```
    """
    dataset = getattr(loader, "dataset", None)
    name = f"DataLoader({type(dataset).__name__})" if dataset is not None else "DataLoader"
    workers = int(getattr(loader, "num_workers", 0) or 0)
    persistent = bool(getattr(loader, "persistent_workers", False))
    params = {
        "num_workers": workers,
        "pin_memory": bool(getattr(loader, "pin_memory", False)),
        "persistent_workers": persistent,
    }
    prefetch_factor = getattr(loader, "prefetch_factor", None)
    if prefetch_factor is not None:
        # torch leaves it None without workers.
        params["prefetch_factor"] = int(prefetch_factor)
    stage = Stage(
        node=name,
        op="DataLoader",
        kind=kinds.DATA_LOADER,
        params=params,
        function=StageFunction(name=f"{type(dataset).__name__}.__getitem__", graph_name="")
        if dataset is not None
        else None,
    )
    findings = Findings(pipeline=Pipeline(stages=[stage]))
    if workers == 0:
        findings.append(
            stage_finding(
                TORCH_DATALOADER_WORKERS,
                Severity.WARNING,
                stage,
                f"{name} has num_workers=0: each batch is loaded on the training thread, "
                "so while a batch loads nothing trains. With num_workers > 0, worker "
                "processes load prefetch_factor batches each ahead of the step.",
                "torch.utils.data.DataLoader(dataset, ..., num_workers=4, "
                "persistent_workers=True)",
            )
        )
    elif not persistent:
        findings.append(
            stage_finding(
                TORCH_DATALOADER_RESPAWN,
                Severity.INFO,
                stage,
                f"{name} starts {workers} worker processes at the start of every epoch "
                "and stops them at its end; the first batches of each epoch wait for them.",
                "torch.utils.data.DataLoader(dataset, ..., "
                f"num_workers={workers}, persistent_workers=True)",
            )
        )
    return findings


def lint_generator(name: str = "generator") -> Findings:
    """Advice for a Python generator given to `model.fit`.

    Args:
        name: how to call the generator in the finding.

    Returns:
        `Findings` about the one stage that stands for the generator.
    """
    stage = Stage(node=name, op="PythonGenerator", kind=kinds.GENERATOR)
    finding = stage_finding(
        PYTHON_GENERATOR,
        Severity.WARNING,
        stage,
        "Keras pulls batches from a Python generator one at a time, on one thread, "
        "under the GIL: loading does not overlap training and cannot be parallelised.",
        "Write a keras.utils.PyDataset with __len__ / __getitem__ and "
        "super().__init__(workers=4), or build the pipeline with tf.data "
        "(map(..., num_parallel_calls=tf.data.AUTOTUNE) and prefetch).",
    )
    return Findings([finding], Pipeline(stages=[stage]))


def lint_keras_arrays() -> Findings:
    """The note for in-memory arrays given to `model.fit`.

    Returns:
        `Findings` with one "info" finding on the stage that stands for the arrays.
    """
    stage = Stage(node="arrays", op="ArrayDataAdapter", kind=kinds.ARRAYS)
    finding = stage_finding(
        KERAS_ARRAY_INPUT,
        Severity.INFO,
        stage,
        "fit was given in-memory arrays: Keras builds the tf.data pipeline itself "
        "(shuffled index batches, parallel slicing, prefetch), so tf.data advice does "
        "not apply.",
        "Nothing to change."
        + (
            " To add augmentation or caching, build the pipeline yourself: "
            "tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x))"
            ".batch(32).prefetch(tf.data.AUTOTUNE)"
            # tf.data advice only where tf.data can be used.
            if importlib.util.find_spec("tensorflow") is not None
            else ""
        ),
    )
    return Findings([finding], Pipeline(stages=[stage]))
