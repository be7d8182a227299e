"""Timing of the user's own Python calls during training, where fit makes them.

The evidence about a stage of Python (a `from_generator` generator, a
`tf.py_function` or `tf.numpy_function` in a map, a `keras.utils.PyDataset`'s
`__getitem__`, a Python generator given to fit) comes from the calls training
already makes, timed on the thread or worker that runs them as the fit reads
them: nothing of the user's is ever called again. From `begin` (the fit's
start) to `end` (its end), and only then:

- TensorFlow's registry of Python callbacks (`script_ops.FuncRegistry`, which
  TensorFlow's C++ calls for every `py_function`, `numpy_function` and
  `from_generator` step) has its `__call__` replaced on the class by one that
  times the calls whose token belongs to the fit's tf.data dataset (see
  `pipeline.graph.py_calls`) and passes every other one straight through.
- Keras' `PyDatasetAdapter` reads the user's `PyDataset` through a stand-in
  that times `__getitem__` (inline, or on Keras' worker threads); the user's
  object is not changed.
- Keras' `GeneratorDataAdapter` reads the user's generator through a stand-in
  that times each `next()`.

`end` puts back exactly what `begin` replaced. When fit raises where the tuner
sees no hook (another callback's), the next timed call, the next `begin` or
interpreter exit notices that the fit is gone and puts it back too.
"""

import atexit
import dataclasses
import logging
import statistics
import sys
import threading
import time
import types
from typing import Callable
from typing import Dict
from typing import List
from typing import Optional

logger = logging.getLogger("keras_pipeline_tuner")

# What was timed (`UserCallTiming.source`).
PY_FUNCTION = "tf.py_function"
NUMPY_FUNCTION = "tf.numpy_function"
GENERATOR_NEXT = "generator next"
GENERATOR_START = "from_generator start"
GENERATOR_END = "from_generator end"
GET_ITEM = "PyDataset.__getitem__"

# Wall times kept per function for the median; beyond it every other one is
# dropped (the mean, CPU time and counts stay exact).
MAX_SAMPLES = 4096
# How often a timed call checks that the fits being timed still run.
_SWEEP_S = 1.0
# The graph is read over stand-ins of in-memory sources above this (the
# tokens are in the functions, not the data) ...
_STAND_IN_BYTES = 2**20
# ... and, where they cannot stand in, copied up to this (as the lint reads
# it, `lint.keras_inputs.MAX_IN_MEMORY_BYTES`; about 10 ms per MB).
_MAX_IN_MEMORY_BYTES = 16 * 2**20

_perf_counter = time.perf_counter
_thread_time = time.thread_time
_get_ident = threading.get_ident


@dataclasses.dataclass(frozen=True)
class UserCallTiming:
    """How long one of the user's Python functions took, timed during training.

    Each call was timed where the fit made it (a tf.data thread, a Keras
    worker thread, the training thread), as the fit read its data.

    Args:
        stage: the stage the function belongs to, as the lint and the advice
            name it: e.g. "map(<lambda>)", "from_generator()",
            "PyDataset(workers=4, use_multiprocessing=False)", "generator()".
        function: the user's function, e.g. "load", "gen",
            "MyDataset.__getitem__".
        source: what was timed: "tf.py_function", "tf.numpy_function",
            "generator next", "from_generator start" / "from_generator end"
            (once per pass over the data) or "PyDataset.__getitem__".
        calls: calls that returned (a call that raised, such as the
            generator's end, is not counted).
        wall_ms: mean wall time per call, in milliseconds.
        wall_ms_median: median wall time per call.
        cpu_ms: mean CPU time of the calling thread per call
            (`time.thread_time`): far below `wall_ms` when the call waits
            (I/O, sleep, a lock) rather than computes.
        threads: how many distinct threads made the calls.
        per_batch_calls: calls per training batch, for per-element calls,
            when the batches are known; `None` otherwise.
        per_element: False for calls made once per pass over the data.

    Attributes:
        per_batch_ms: the function's wall time per training batch, or `None`.

    Example:

    >>> timing = UserCallTiming("map(<lambda>)", "load", "tf.py_function", calls=64,
    ...     wall_ms=10.2, wall_ms_median=10.1, cpu_ms=0.1, threads=1, per_batch_calls=4.0)
    >>> round(timing.per_batch_ms, 1)
    40.8
    """

    stage: str
    function: str
    source: str
    calls: int
    wall_ms: float
    wall_ms_median: float
    cpu_ms: float
    threads: int
    per_batch_calls: Optional[float] = None
    per_element: bool = True

    @property
    def per_batch_ms(self) -> Optional[float]:
        """The function's wall time per training batch (mean per call x calls a batch)."""
        if self.per_batch_calls is None:
            return None
        return self.wall_ms * self.per_batch_calls


def with_batches(timings: List[UserCallTiming], batches: int) -> List[UserCallTiming]:
    """The timings with `per_batch_calls` set from the batches the fit trained on.

    Args:
        timings: the `UserCallTiming`s of a fit.
        batches: training batches the fit ran; 0 leaves `per_batch_calls` unset.

    Returns:
        New records; per-pass calls keep `per_batch_calls=None`.

    Example:

    >>> timing = UserCallTiming("generator()", "batches", "generator next", 10,
    ...     20.0, 20.0, 0.1, 1)
    >>> with_batches([timing], 5)[0].per_batch_calls
    2.0
    """
    if batches <= 0:
        return list(timings)
    return [
        dataclasses.replace(timing, per_batch_calls=timing.calls / batches)
        if timing.per_element
        else timing
        for timing in timings
    ]


def calls_since(now: List[UserCallTiming], then: List[UserCallTiming]) -> List[UserCallTiming]:
    """The calls made between two readings of the same timer (`UserCallTimer.so_far`).

    Counts and means are the difference's; the median is the later
    reading's, over all calls (the samples are not kept per span).

    Args:
        now: the later reading.
        then: the earlier reading.

    Returns:
        One record per function called in between.

    Example:

    >>> then = [UserCallTiming("map(load)", "load", "tf.py_function", 10, 2.0, 2.0, 1.0, 1)]
    >>> now = [UserCallTiming("map(load)", "load", "tf.py_function", 30, 3.0, 2.0, 2.0, 1)]
    >>> later = calls_since(now, then)[0]
    >>> later.calls, later.wall_ms, later.cpu_ms
    (20, 3.5, 2.5)
    """
    before = {(t.stage, t.function, t.source): t for t in then}
    spans = []
    for timing in now:
        earlier = before.get((timing.stage, timing.function, timing.source))
        if earlier is None:
            spans.append(timing)
            continue
        calls = timing.calls - earlier.calls
        if calls <= 0:
            continue
        spans.append(
            dataclasses.replace(
                timing,
                calls=calls,
                wall_ms=(timing.wall_ms * timing.calls - earlier.wall_ms * earlier.calls) / calls,
                cpu_ms=(timing.cpu_ms * timing.calls - earlier.cpu_ms * earlier.calls) / calls,
            )
        )
    return spans


class _Tally:
    """The running figures of one timed function; `add` is safe from any thread."""

    __slots__ = (
        "stage", "function", "source", "per_element", "calls", "wall_s", "cpu_s",
        "threads", "samples", "_stride", "_skipped", "_lock", "open", "_failed",
    )

    def __init__(self, stage, function, source, per_element, failed):
        self.stage, self.function, self.source = stage, function, source
        self.per_element = per_element
        self.calls = 0
        self.wall_s = 0.0
        self.cpu_s = 0.0
        self.threads = set()
        self.samples: List[float] = []
        self._stride = 1
        self._skipped = 0
        self._lock = threading.Lock()
        self.open = True
        self._failed = failed

    def add(self, wall_s: float, cpu_s: float) -> None:
        # Called inside the user's call path: never raises into it.
        try:
            with self._lock:
                if not self.open:
                    return
                self.calls += 1
                self.wall_s += wall_s
                self.cpu_s += cpu_s
                self.threads.add(_get_ident())
                self._skipped += 1
                if self._skipped >= self._stride:
                    self._skipped = 0
                    self.samples.append(wall_s)
                    if len(self.samples) >= MAX_SAMPLES:
                        del self.samples[1::2]
                        self._stride *= 2
        except Exception as error:  # noqa: BLE001 - the user's call must go on.
            self.open = False
            self._failed(f"{type(error).__name__}: {error}")

    def close(self) -> Optional[UserCallTiming]:
        with self._lock:
            self.open = False
        return self.timing()

    def timing(self) -> Optional[UserCallTiming]:
        with self._lock:
            if not self.calls:
                return None
            return UserCallTiming(
                stage=self.stage,
                function=self.function,
                source=self.source,
                calls=self.calls,
                wall_ms=self.wall_s / self.calls * 1e3,
                wall_ms_median=statistics.median(self.samples) * 1e3,
                cpu_ms=self.cpu_s / self.calls * 1e3,
                threads=len(self.threads),
                per_element=self.per_element,
            )


class UserCallTimer:
    """Times the user's Python calls of one fit, from `begin` to `end`.

    Thread-safe: calls are timed on whatever thread makes them. Each timed
    call costs about a microsecond more than it would (measured on two shared
    CPU cores, best of five runs of 100,000 calls: 1.3 µs on a
    `tf.numpy_function` called through TensorFlow's registry, 0.9 µs on a
    generator's `next` or a `PyDataset.__getitem__`: two reads each of the
    wall and thread CPU clocks, and a lock); a `py_function` of a dataset that
    is not timed pays one dictionary look-up (under 0.1 µs).

    A `py_function` is known by its token, that is by the traced function of
    the dataset the fit was given: a validation pass over that same dataset
    object makes calls that are counted with training's.

    Args:
        on_failure: called once with the reason if recording a call fails
            (the tuner's feature guard); the calls go on untimed.

    Attributes:
        notes: what could not be timed, and why (plain sentences).

    Example:

    >>> import time
    >>> def gen():
    ...     for i in range(3):
    ...         time.sleep(0.01)
    ...         yield i
    >>> ds = tf.data.Dataset.from_generator(gen, output_signature=tf.TensorSpec((), tf.int32))
    >>> timer = UserCallTimer()
    >>> timer.begin(dataset=ds)
    >>> elements = list(ds.as_numpy_iterator())
    >>> [(t.stage, t.function, t.source, t.calls) for t in timer.end() if t.per_element]
    [('from_generator()', 'gen', 'generator next', 3)]
    """

    def __init__(self, on_failure: Optional[Callable[[str], None]] = None):
        self.notes: List[str] = []
        self._on_failure = on_failure
        self._failure_said = False
        self._tallies: List[_Tally] = []
        self._tokens: Dict[str, _Tally] = {}
        # What `begin` replaced, put back by `end`: (put_back, what) pairs.
        self._restore: List[Callable[[], None]] = []
        self._fit = None
        self._records: Optional[List[UserCallTiming]] = None
        self._lock = threading.Lock()

    # Lifecycle.

    def begin(self, dataset=None, adapter=None, fit=None, pipeline=None) -> None:
        """Starts timing the Python calls of the fit's data.

        Args:
            dataset: the `tf.data.Dataset` the fit reads (its `py_function`,
                `numpy_function` and `from_generator` calls are timed).
            adapter: Keras' data adapter of the fit: a `PyDatasetAdapter`
                (the `PyDataset`'s `__getitem__` is timed) or a
                `GeneratorDataAdapter` (the generator's `next`); other
                adapters are left alone.
            fit: the fit's `running_fit.RunningCall`, or `None`: when that
                fit has ended without `end` (it raised where no tuner hook
                runs), the timer ends itself.
            pipeline: the lint's `Pipeline` of `dataset`, when it was read: a
                pipeline with no Python calls in it is not read again.
        """
        _sweep_ended_fits()
        self._fit = fit
        with _LIVE_LOCK:
            _LIVE.add(self)
        if dataset is not None and _may_call_python(pipeline):
            self._time_dataset(dataset)
        if adapter is not None:
            self._time_adapter(adapter)

    def end(self) -> List[UserCallTiming]:
        """Stops timing and puts back everything `begin` replaced.

        Safe to call more than once, from any thread, and after a failed or
        partial `begin`.

        Returns:
            One `UserCallTiming` per timed function that was called, stages
            in pipeline order.
        """
        with self._lock:
            if self._records is not None:
                return list(self._records)
            try:
                _REGISTRY.remove(self._tokens)
            except Exception as error:  # noqa: BLE001 - the adapters are still put back.
                self._fail(f"putting back FuncRegistry.__call__: {type(error).__name__}: {error}")
            restore, self._restore = self._restore, []
            for put_back in reversed(restore):
                try:
                    put_back()
                except Exception as error:  # noqa: BLE001 - the others are still put back.
                    self._fail(f"putting back {put_back}: {type(error).__name__}: {error}")
            with _LIVE_LOCK:
                _LIVE.discard(self)
            records = [tally.close() for tally in self._tallies]
            self._records = [record for record in records if record is not None]
            return list(self._records)

    def so_far(self) -> List[UserCallTiming]:
        """The figures of the calls timed so far, while timing goes on (after `end`, its result)."""
        if self._records is not None:
            return list(self._records)
        timings = [tally.timing() for tally in list(self._tallies)]
        return [timing for timing in timings if timing is not None]

    @property
    def timing(self) -> bool:
        """Whether anything is being timed (`begin` found calls to time, `end` not called)."""
        return self._records is None and bool(self._tallies)

    def fit_ended(self) -> bool:
        """Whether the fit given to `begin` no longer runs."""
        return self._fit is not None and not self._fit.running()

    # tf.data.

    def _time_dataset(self, dataset) -> None:
        from keras_pipeline_tuner._util.random_state import preserved_random_state
        from keras_pipeline_tuner.pipeline.graph.in_memory import in_memory_bytes
        from keras_pipeline_tuner.pipeline.graph.in_memory import without_large_sources
        from keras_pipeline_tuner.pipeline.graph.py_calls import GENERATOR_END as END
        from keras_pipeline_tuner.pipeline.graph.py_calls import GENERATOR_NEXT as NEXT
        from keras_pipeline_tuner.pipeline.graph.py_calls import GENERATOR_START as START
        from keras_pipeline_tuner.pipeline.graph.py_calls import PY_FUNCTION_OPS
        from keras_pipeline_tuner.pipeline.graph.py_calls import py_calls_of
        from keras_pipeline_tuner.pipeline.graph.reader import graph_def_of

        tf = sys.modules.get("tensorflow")
        if tf is None:
            return
        original = getattr(dataset, "_original_dataset", None)
        if not isinstance(dataset, tf.data.Dataset) and isinstance(original, tf.data.Dataset):
            dataset = original
        if not isinstance(dataset, tf.data.Dataset):
            return
        # Reading the graph builds datasets of its own: the user's random
        # state stays as it was.
        with preserved_random_state():
            light, held = dataset, in_memory_bytes(dataset)
            if held > _STAND_IN_BYTES:
                light = without_large_sources(dataset, _STAND_IN_BYTES)
                if light is None and held <= _MAX_IN_MEMORY_BYTES:
                    light = dataset
            if light is None:
                self.notes.append(
                    "The pipeline's Python functions were not timed: its graph holds large "
                    "in-memory arrays that reading it would copy."
                )
                return
            calls = py_calls_of(graph_def_of(light))
        roles = {NEXT: GENERATOR_NEXT, START: GENERATOR_START, END: GENERATOR_END}
        tokens = {}
        for call in calls:
            source = roles.get(call.role) or (
                PY_FUNCTION if PY_FUNCTION_OPS[call.op] == PY_FUNCTION else NUMPY_FUNCTION
            )
            name = _registered_name(call.token) or "?"
            tally = self._tally(call.stage, name, source, per_element=call.role not in (START, END))
            tokens[call.token] = tally
        if tokens:
            self._tokens = tokens
            _REGISTRY.add(tokens)

    # Keras' adapters.

    def _time_adapter(self, adapter) -> None:
        kind = type(adapter).__name__
        if kind == "PyDatasetAdapter":
            self._time_py_dataset(adapter)
        elif kind == "GeneratorDataAdapter":
            self._time_generator(adapter)
        elif kind == "TorchDataLoaderAdapter":
            self._note_dataloader(adapter)

    def _time_py_dataset(self, adapter) -> None:
        from keras_pipeline_tuner.pipeline.lint.keras_inputs import lint_py_dataset

        py_dataset = adapter.py_dataset
        name = f"{type(py_dataset).__name__}.__getitem__"
        if getattr(adapter, "enqueuer", None) is not None and py_dataset.use_multiprocessing:
            self.notes.append(
                f"{name} was not timed: with use_multiprocessing=True Keras calls it in "
                "worker processes, where the tuner does not time calls (the step clock's "
                "input wait is what the fit waited for them)."
            )
            return
        stage = lint_py_dataset(py_dataset).pipeline.final.label
        stand_in = _TimedPyDataset(py_dataset, self._tally(stage, name, GET_ITEM))
        holders = [adapter]
        if adapter.enqueuer is not None:
            # Keras' worker threads read the PyDataset the enqueuer holds.
            holders.append(adapter.enqueuer)
        for holder in holders:
            holder.py_dataset = stand_in
            self._restore.append(_PutBack(holder, "py_dataset", py_dataset, stand_in))
        enqueuer = adapter.enqueuer
        if enqueuer is not None:
            self._restore.append(lambda: _unshare(enqueuer, stand_in, py_dataset))

    def _time_generator(self, adapter) -> None:
        from keras_pipeline_tuner.pipeline.lint.keras_inputs import lint_generator

        make = adapter.generator
        code = getattr(make, "__code__", None)
        cells = dict(zip(code.co_freevars, make.__closure__ or ())) if code else {}
        cell = cells.get("generator")
        try:
            generator = cell.cell_contents if cell is not None else None
        except ValueError:  # an empty cell
            generator = None
        if generator is None or iter(generator) is not generator:
            self.notes.append(
                "The Python generator given to fit was not timed: this Keras version holds "
                "it in a way the tuner does not know."
            )
            return
        name = getattr(generator, "__name__", None) or type(generator).__name__
        stage = lint_generator().pipeline.final.label
        timed = _TimedIterator(generator, self._tally(stage, name, GENERATOR_NEXT))
        # Keras' own function, over the timed generator: it reads it as before.
        closure = tuple(
            types.CellType(timed) if each is cell else each for each in make.__closure__
        )
        adapter.generator = types.FunctionType(
            code, make.__globals__, make.__name__, make.__defaults__, closure
        )
        self._restore.append(_PutBack(adapter, "generator", make, adapter.generator))

    def _note_dataloader(self, adapter) -> None:
        loader = adapter.get_torch_dataloader()
        workers = int(getattr(loader, "num_workers", 0) or 0)
        if workers:
            self.notes.append(
                f"The DataLoader's dataset was not timed call by call: its {workers} worker "
                "processes load the batches, where the tuner does not time calls."
            )
        else:
            self.notes.append(
                "The DataLoader's dataset was not timed call by call: with num_workers=0 "
                "it loads each batch on the training thread when the step asks for it, so "
                "its load time is the step clock's input wait."
            )

    # Internals.

    def _tally(self, stage, function, source, per_element=True) -> _Tally:
        tally = _Tally(stage, function, source, per_element, self._fail)
        self._tallies.append(tally)
        return tally

    def _fail(self, reason: str) -> None:
        if self._failure_said:
            return
        self._failure_said = True
        if self._on_failure is not None:
            self._on_failure(reason)
        else:
            logger.warning("keras-pipeline-tuner: timing the user's calls failed: %s", reason)


def _may_call_python(pipeline) -> bool:
    """Whether a stage of the lint's pipeline calls Python (`True` when it was not read)."""
    stages = getattr(pipeline, "stages", None)
    if stages is None:
        return True
    return any(stage.function is not None and stage.function.py_function_ops for stage in stages)


class _PutBack:
    """Puts `original` back as `holder.name`, if the stand-in is still there."""

    __slots__ = ("holder", "name", "original", "stand_in")

    def __init__(self, holder, name, original, stand_in):
        self.holder, self.name, self.original, self.stand_in = holder, name, original, stand_in

    def __call__(self) -> None:
        if getattr(self.holder, self.name, None) is self.stand_in:
            setattr(self.holder, self.name, self.original)

    def __repr__(self) -> str:
        return f"{type(self.holder).__name__}.{self.name}"


def _unshare(enqueuer, stand_in, original) -> None:
    # Keras' worker threads find the PyDataset in a table of its module, where
    # a running enqueuer put it: the user's own goes back there too.
    module = sys.modules.get(type(enqueuer).__module__)
    shared = getattr(module, "_SHARED_SEQUENCES", None)
    uid = getattr(enqueuer, "uid", None)
    if isinstance(shared, dict) and shared.get(uid) is stand_in:
        shared[uid] = original


class _TimedPyDataset:
    """Stands in for a `PyDataset` in Keras' adapter: times `__getitem__`, forwards the rest."""

    __slots__ = ("_kpt_target", "_kpt_tally")

    def __init__(self, target, tally: _Tally):
        object.__setattr__(self, "_kpt_target", target)
        object.__setattr__(self, "_kpt_tally", tally)

    def __getitem__(self, index):
        cpu = _thread_time()
        began = _perf_counter()
        item = self._kpt_target[index]
        ended = _perf_counter()
        self._kpt_tally.add(ended - began, _thread_time() - cpu)
        return item

    def __len__(self):
        return len(self._kpt_target)

    def __getattr__(self, name):
        return getattr(self._kpt_target, name)

    def __setattr__(self, name, value):
        setattr(self._kpt_target, name, value)


class _TimedIterator:
    """Stands in for the user's generator: times each `next()`, yields what it yields."""

    __slots__ = ("_iterator", "_tally")

    def __init__(self, iterator, tally: _Tally):
        self._iterator = iterator
        self._tally = tally

    def __iter__(self):
        return self

    def __next__(self):
        cpu = _thread_time()
        began = _perf_counter()
        item = next(self._iterator)
        ended = _perf_counter()
        self._tally.add(ended - began, _thread_time() - cpu)
        return item


def _registered_name(token: str) -> Optional[str]:
    """The user's name for the function TensorFlow registered under `token`."""
    from keras_pipeline_tuner.pipeline.graph.py_calls import generator_state
    from keras_pipeline_tuner.pipeline.graph.py_calls import registered_function

    function = registered_function(token)
    if function is None:
        return None
    # from_generator's callbacks close over its state, which holds the generator.
    state = generator_state(token)
    if state is not None:
        function = state._generator  # pylint: disable=protected-access
    return getattr(function, "__name__", None) or type(function).__name__


class _RegistryPatch:
    """The registry's `__call__`, replaced while any timer times a token.

    The tokens of every running timer are in one mapping, replaced whole on
    each change, so a call reads it without a lock.
    """

    def __init__(self):
        self.lock = threading.Lock()
        self.tallies: Dict[str, _Tally] = {}
        self.original = None
        self.installed = None
        self.next_sweep = 0.0

    def add(self, tokens: Dict[str, _Tally]) -> None:
        from tensorflow.python.ops import script_ops

        with self.lock:
            self.tallies = {**self.tallies, **tokens}
            if self.installed is None:
                registry = script_ops.FuncRegistry
                self.original = registry.__dict__["__call__"]
                self.installed = _timed_call(self.original, self)
                registry.__call__ = self.installed

    def remove(self, tokens: Dict[str, _Tally]) -> None:
        if not tokens:
            return
        with self.lock:
            self.tallies = {
                token: tally
                for token, tally in self.tallies.items()
                if tokens.get(token) is not tally
            }
            if self.tallies or self.installed is None:
                return
            registry = sys.modules["tensorflow.python.ops.script_ops"].FuncRegistry
            if registry.__dict__.get("__call__") is self.installed:
                registry.__call__ = self.original
            else:
                logger.warning(
                    "keras-pipeline-tuner: FuncRegistry.__call__ was replaced by someone "
                    "else while the tuner timed it; left as it is."
                )
            self.installed = self.original = None


def _timed_call(original, patch: _RegistryPatch):
    def __call__(self, token, device, args):
        tally = patch.tallies.get(token)
        if tally is None:
            return original(self, token, device, args)
        cpu = _thread_time()
        began = _perf_counter()
        result = original(self, token, device, args)
        ended = _perf_counter()
        tally.add(ended - began, _thread_time() - cpu)
        if ended >= patch.next_sweep:
            patch.next_sweep = ended + _SWEEP_S
            _sweep_ended_fits()
        return result

    __call__.__qualname__ = "FuncRegistry.__call__"
    __call__.__doc__ = original.__doc__
    return __call__


_REGISTRY = _RegistryPatch()
# Timers between `begin` and `end`.
_LIVE = set()
_LIVE_LOCK = threading.Lock()


def _sweep_ended_fits() -> None:
    """Ends the timers whose fit has ended without `end` (it raised past the tuner)."""
    with _LIVE_LOCK:
        live = list(_LIVE)
    for timer in live:
        try:
            if timer.fit_ended():
                timer.end()
        except Exception:  # noqa: BLE001 - checked again at the next sweep.
            logger.debug("keras-pipeline-tuner: sweeping a timer failed", exc_info=True)


@atexit.register
def _end_all() -> None:
    with _LIVE_LOCK:
        live = list(_LIVE)
    for timer in live:
        timer.end()
