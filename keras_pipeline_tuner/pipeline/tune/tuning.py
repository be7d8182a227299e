"""`tune`: rewrite a tf.data pipeline, measure each rewrite, keep what is faster.

The candidates come from `planning.plan_rewrites` (parallel map and
interleave, AUTOTUNE for fixed parallelism, a cache at a safe point, a final
prefetch, ...). Each one is tried on top of the rewrites kept so far: the
rewritten graph is rebuilt in this process, its elements are checked against
the original's, and it is timed side by side with the pipeline without it
(`paired_timing`); it is kept only when it is measurably faster (`search`). The
pipeline with every kept rewrite is finally timed against the original, and
that ratio is the one reported. `time_rewrites` times given rewrites each on
its own, with the same machinery (`session`).
"""

import os
from typing import List
from typing import Optional
from typing import Union

from keras_pipeline_tuner._util.argument_checks import checked_dataset
from keras_pipeline_tuner._util.argument_checks import non_negative_int
from keras_pipeline_tuner._util.argument_checks import positive_int
from keras_pipeline_tuner._util.argument_checks import seconds
from keras_pipeline_tuner._util.argument_checks import verbosity
from keras_pipeline_tuner._util.stderr_lines import dropped_lines
from keras_pipeline_tuner._util.tf_import import tensorflow
from keras_pipeline_tuner.pipeline.tune.loader_tuning import kind_of
from keras_pipeline_tuner.pipeline.tune.loader_tuning import tune_loader
from keras_pipeline_tuner.pipeline.tune.paired_timing import PassPlan
from keras_pipeline_tuner.pipeline.tune.pass_size import WARMUP_BATCHES
from keras_pipeline_tuner.pipeline.tune.results import DEFAULT_MIN_GAIN
from keras_pipeline_tuner.pipeline.tune.results import TimedRewrite
from keras_pipeline_tuner.pipeline.tune.search import Search
from keras_pipeline_tuner.pipeline.tune.session import TuningSession

DEFAULT_BUDGET_S = 60.0
# Epochs tuning may run of a pipeline that calls Python (its side effects run
# on every one), unless the caller allows more.
DEFAULT_PYTHON_EPOCHS = 60


def tune(
    dataset,
    consumer_step_s: Optional[float] = None,
    budget_s: float = DEFAULT_BUDGET_S,
    *,
    epochs: int = 2,
    num_batches: Optional[int] = None,
    cache_path: Optional[Union[str, os.PathLike]] = None,
    cache_memory_bytes: Optional[int] = None,
    allow_nondeterministic: bool = False,
    allow_reordering: bool = False,
    allow_unverified: bool = False,
    max_python_epochs: int = DEFAULT_PYTHON_EPOCHS,
    min_gain: float = DEFAULT_MIN_GAIN,
    verbose: int = 1,
):
    """Rewrites a dataset's pipeline and keeps the rewrites that make it faster.

    The rewrites are made on the dataset's graph and rebuilt in this process, so the user's
    functions run unchanged: a sequential `map` or `interleave` becomes parallel (order kept),
    fixed parallelism and buffer sizes become AUTOTUNE, a cache goes after the last expensive
    stage that gives the same elements every epoch (never after a shuffle or a random
    augmentation; only if it fits in memory, or on `cache_path`), and a prefetch ends the
    pipeline. Each rewrite is timed side by side with the pipeline without it, on this machine,
    and kept only if it is at least `min_gain` faster. No rewrite changes what the model sees:
    the tuned dataset's elements are checked against the original's.

    A `keras.utils.PyDataset`, a torch `DataLoader` or a `grain.DataLoader` is tuned through
    its own settings instead (`loader_tuning`): workers, queues and prefetching, searched by
    successive halving on its own batches within the CPU budget (beyond it only for workers
    that wait), the best timed against the settings as written; only `consumer_step_s`,
    `budget_s`, `epochs`, `min_gain` and `verbose` apply to it.

    Args:
        dataset: the `tf.data.Dataset` to tune, as passed to `model.fit`; or a
            `keras.utils.PyDataset`, a torch `DataLoader` or a `grain.DataLoader`.
        consumer_step_s: seconds of a simulated training step after each batch (e.g. the step
            time the `PipelineTuner` measured); `None` times the dataset alone.
        budget_s: about how long tuning may take, in seconds.
        epochs: epochs per timed pass; a cache pays off from the second.
        num_batches: batches per epoch; `None` for whole epochs. Required for infinite datasets
            (pass your `steps_per_epoch`). Such passes time the steady state: a cache is filled
            before them, untimed, with the elements they read (a whole epoch where the
            dataset's length is not known), as training's first epoch fills it.
        cache_path: a file path prefix where a cache too big for memory may be written; `None`
            caches only in memory.
        cache_memory_bytes: the most memory a cache may take; defaults to a quarter of the
            memory available now.
        allow_nondeterministic: also parallelise maps that draw random numbers (the numbers then
            fall on other elements from run to run).
        allow_reordering: also try `deterministic=False` on maps and interleaves: elements then
            come out as they are ready, in an order that can change from run to run.
        allow_unverified: also measure and keep rewrites whose elements cannot be proven equal
            to the original's, e.g. parallel calls of a `tf.py_function` (right only if the
            Python function keeps no state between calls).
        max_python_epochs: the most epochs of the pipeline tuning runs when the pipeline calls
            Python (`tf.py_function`, `from_generator`), checks included: their side effects run
            on every epoch.
        min_gain: the least speed-up a rewrite must bring to be kept (0.03 = 3 % less time per
            pass).
        verbose: 1 shows a progress bar of the timed passes (plain text when the output is not a
            terminal), 0 is silent.

    Returns:
        `(tuned_dataset, result)`: the tuned `tf.data.Dataset` (the original object itself when
        nothing was kept) and a `TuneResult`; for a loader, the loader with the chosen settings
        (`result.dataset`: the original when none was faster) and a `LoaderTuneResult`.

    Raises:
        TypeError: if `dataset` is not a `tf.data.Dataset` or a loader named above.
        ValueError: for arguments out of range, an infinite dataset without `num_batches`, or an
            epoch too long for the budget (batches so slow that the first few take a third of
            it), said as soon as the first read shows it.

    Example:

    ```python
    tuned_ds, result = kpt.tune(train_ds, consumer_step_s=0.01, budget_s=60)
    for outcome in result.rewrites:
        print(outcome.change, outcome.status, outcome.ratio)
    model.fit(tuned_ds, epochs=10)
    ```
    """
    # Every argument, checked in the order of the signature, goes to the session
    # (or, for a PyDataset or a DataLoader, to the search of its settings).
    arguments = dict(locals())
    loader_kind = kind_of(dataset)
    if loader_kind is not None:
        return _tune_loader(loader_kind, **arguments)
    session = _checked_session(**arguments)
    return _quietly(session, Search(session).run)


def _tune_loader(kind, dataset, consumer_step_s, budget_s, epochs, min_gain, verbose, **rest):
    """`tune` of a PyDataset or DataLoader: the arguments for tf.data only must be left out."""
    defaults = {
        "num_batches": None,
        "cache_path": None,
        "cache_memory_bytes": None,
        "allow_nondeterministic": False,
        "allow_reordering": False,
        "allow_unverified": False,
        "max_python_epochs": DEFAULT_PYTHON_EPOCHS,
    }
    given = [name for name, default in defaults.items() if rest.get(name) != default]
    if given:
        raise ValueError(
            f"{', '.join(given)} apply to a tf.data.Dataset only; a {kind.name} is tuned "
            "through its own settings: leave them out."
        )
    consumer_step_s = seconds(consumer_step_s, "consumer_step_s")
    if not seconds(budget_s, "budget_s"):
        raise ValueError(f"`budget_s` must be a positive number of seconds, got {budget_s!r}.")
    numeric = isinstance(min_gain, (int, float)) and not isinstance(min_gain, bool)
    if not numeric or not 0 <= min_gain < 1:
        raise ValueError(f"`min_gain` must be in [0, 1), e.g. 0.03 for 3 %, got {min_gain!r}.")
    return tune_loader(
        kind,
        dataset,
        consumer_step_s,
        float(budget_s),
        positive_int(epochs, "epochs"),
        float(min_gain),
        verbosity(verbose),
    )


def _quietly(session, work):
    """Runs `work()`, then closes the session.

    TensorFlow's warnings about the passes' partial reads of caches are about
    the tuner's passes, not the user's pipeline: kept out of standard error
    meanwhile (see `stderr_lines`).
    """
    try:
        with dropped_lines():
            return work()
    finally:
        session.close()


def _checked_session(
    dataset,
    consumer_step_s,
    budget_s,
    epochs,
    num_batches,
    cache_path,
    cache_memory_bytes,
    allow_nondeterministic,
    allow_reordering,
    allow_unverified,
    max_python_epochs,
    min_gain,
    verbose,
) -> TuningSession:
    """`tune`'s arguments checked (raising as `tune` says), as a `TuningSession`."""
    tf = tensorflow()
    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError(
            "tune() takes a tf.data.Dataset, a keras.utils.PyDataset, a torch DataLoader or a "
            f"grain.DataLoader, got {type(dataset).__name__}. Wrap in-memory data with "
            "tf.data.Dataset.from_tensor_slices(...) first."
        )
    checked_dataset(dataset, "tune")
    plan = PassPlan(
        epochs=positive_int(epochs, "epochs"),
        num_batches=positive_int(num_batches, "num_batches", optional=True),
        consumer_step_s=seconds(consumer_step_s, "consumer_step_s"),
    )
    if not seconds(budget_s, "budget_s"):
        raise ValueError(f"`budget_s` must be a positive number of seconds, got {budget_s!r}.")
    numeric = isinstance(min_gain, (int, float)) and not isinstance(min_gain, bool)
    if not numeric or not 0 <= min_gain < 1:
        raise ValueError(f"`min_gain` must be in [0, 1), e.g. 0.03 for 3 %, got {min_gain!r}.")
    verbosity(verbose)
    positive_int(max_python_epochs, "max_python_epochs")
    if max_python_epochs < 5 + plan.epochs:
        raise ValueError(
            f"`max_python_epochs` must allow the 5 epochs that check the pipeline and "
            f"one timed pass of {plan.epochs} epochs: at least {5 + plan.epochs}, got "
            f"{max_python_epochs}."
        )
    for name, flag in (
        ("allow_nondeterministic", allow_nondeterministic),
        ("allow_reordering", allow_reordering),
        ("allow_unverified", allow_unverified),
    ):
        if not isinstance(flag, bool):
            raise TypeError(f"`{name}` must be True or False, got {flag!r}.")
    if cache_path is not None:
        if not isinstance(cache_path, (str, os.PathLike)):
            raise TypeError(f"`cache_path` must be a path, got {type(cache_path).__name__}.")
        cache_path = os.fspath(cache_path)
        if os.path.isdir(cache_path):
            raise ValueError(
                f"`cache_path` {cache_path!r} is a directory; pass a file prefix inside "
                f"it, e.g. {os.path.join(cache_path, 'train_cache')!r}."
            )
    if cache_memory_bytes is not None:
        positive_int(cache_memory_bytes, "cache_memory_bytes")
    if plan.num_batches is None and int(dataset.cardinality()) == tf.data.INFINITE_CARDINALITY:
        raise ValueError(
            "The dataset is infinite (it repeats forever), so an epoch never ends: "
            "pass num_batches=<batches per epoch>, e.g. your steps_per_epoch."
        )
    return TuningSession(
        dataset,
        plan,
        budget_s=float(budget_s),
        cache_path=cache_path,
        cache_memory_bytes=cache_memory_bytes,
        allow_nondeterministic=allow_nondeterministic,
        allow_reordering=allow_reordering,
        allow_unverified=allow_unverified,
        max_python_epochs=max_python_epochs,
        min_gain=float(min_gain),
        verbose=verbose,
    )


def time_rewrites(
    dataset,
    rewrites,
    budget_s: float,
    *,
    epochs: int = 1,
    num_batches: Optional[int] = None,
    warmup_batches: int = WARMUP_BATCHES,
    allow_unverified: bool = False,
    max_python_epochs: int = DEFAULT_PYTHON_EPOCHS,
) -> List[TimedRewrite]:
    """Times each given rewrite on its own against the pipeline as written.

    The same machinery as `tune` (rebuild from the graph, element checks,
    side-by-side rounds with GC off, the time budget and the limit of epochs
    over Python code), but every rewrite is compared with the original and
    none is kept: what each change alone would bring.

    Args:
        dataset: the `tf.data.Dataset`.
        rewrites: `rewrites.Rewrite`s planned for it
            (`planning.plan_rewrites`).
        budget_s: about how long it may take, in seconds; a rewrite that does
            not fit is "not measured".
        epochs: epochs per timed pass (a cache pays off from the second).
        num_batches: batches per epoch; `None` for whole epochs.
        warmup_batches: with `num_batches`, batches each pass reads before
            its clock starts, so that a parallel stage's threads and
            AUTOTUNE's first choices are not what a pass of a few batches
            mostly times; 0 to time from the first batch.
        allow_unverified: also time rewrites whose elements cannot be proven
            equal to the original's (parallel calls of a Python function);
            they are "not proven" otherwise.
        max_python_epochs: the most epochs of a pipeline that calls Python.

    Returns:
        One `TimedRewrite` per rewrite, in order.

    Example:

    ```python
    candidates, _ = plan_rewrites(read_pipeline(ds))
    for timed in time_rewrites(ds, candidates, budget_s=5.0, num_batches=20):
        print(timed.outcome.change, timed.outcome.status, timed.outcome.ratio)
    ```
    """
    checked_dataset(dataset, "time_rewrites")
    plan = PassPlan(
        epochs=positive_int(epochs, "epochs"),
        num_batches=positive_int(num_batches, "num_batches", optional=True),
        warmup_batches=non_negative_int(warmup_batches, "warmup_batches"),
    )
    if not seconds(budget_s, "budget_s"):
        raise ValueError(f"`budget_s` must be a positive number of seconds, got {budget_s!r}.")
    session = TuningSession(
        dataset,
        plan,
        budget_s,
        cache_path=None,
        cache_memory_bytes=None,
        allow_nondeterministic=False,
        allow_reordering=False,
        allow_unverified=allow_unverified,
        max_python_epochs=positive_int(max_python_epochs, "max_python_epochs"),
        min_gain=0.0,
        verbose=0,
    )
    return _quietly(session, lambda: session.measure(list(rewrites)))
