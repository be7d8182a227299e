"""Checks a tf.data pipeline against the tf.data performance guide: the rules.

`lint(pipeline)` runs each rule of the catalogue over a pipeline's stages (as
`graph.reader` reads them; `keras_inputs.inspect` reads and lints a dataset).
Rules judge the pipeline as TensorFlow will run it: what TensorFlow's default
rewrites already do (a stateless map run in parallel, a prefetch injected at
the end) is reported as "info", never asked of the user.
"""

import re
from typing import Callable
from typing import Iterable
from typing import List
from typing import Optional

from keras_pipeline_tuner.pipeline.graph import keras_made
from keras_pipeline_tuner.pipeline.graph import kinds
from keras_pipeline_tuner.pipeline.graph.model import Pipeline
from keras_pipeline_tuner.pipeline.graph.model import Stage
from keras_pipeline_tuner.pipeline.graph.model import StageFunction
from keras_pipeline_tuner.pipeline.lint import data_service
from keras_pipeline_tuner.pipeline.lint.catalogue import AUTOTUNE_DISABLED
from keras_pipeline_tuner.pipeline.lint.catalogue import CACHE_AFTER_RANDOM
from keras_pipeline_tuner.pipeline.lint.catalogue import CACHE_AFTER_SHUFFLE
from keras_pipeline_tuner.pipeline.lint.catalogue import CACHE_MISSING
from keras_pipeline_tuner.pipeline.lint.catalogue import DATA_SERVICE
from keras_pipeline_tuner.pipeline.lint.catalogue import FIXED_PARALLELISM
from keras_pipeline_tuner.pipeline.lint.catalogue import MEMORY_ORDER
from keras_pipeline_tuner.pipeline.lint.catalogue import MISSING_PREFETCH
from keras_pipeline_tuner.pipeline.lint.catalogue import PY_FUNCTION_IN_MAP
from keras_pipeline_tuner.pipeline.lint.catalogue import SEQUENTIAL_FILE_READ
from keras_pipeline_tuner.pipeline.lint.catalogue import SEQUENTIAL_INTERLEAVE
from keras_pipeline_tuner.pipeline.lint.catalogue import SEQUENTIAL_MAP
from keras_pipeline_tuner.pipeline.lint.catalogue import SHUFFLE_AFTER_BATCH
from keras_pipeline_tuner.pipeline.lint.catalogue import VECTORIZE_MAP
from keras_pipeline_tuner.pipeline.lint.findings import Finding
from keras_pipeline_tuner.pipeline.lint.findings import Findings
from keras_pipeline_tuner.pipeline.lint.findings import Severity
from keras_pipeline_tuner.pipeline.lint.findings import stage_finding

_MAP_KINDS = (kinds.MAP, kinds.MAP_AND_BATCH)
_PASS_THROUGH_KINDS = (kinds.WITH_OPTIONS, kinds.ASSERT_CARDINALITY)
_BATCH_KINDS = (kinds.BATCH, kinds.PADDED_BATCH, kinds.MAP_AND_BATCH)
# Where the walk from a shuffle back to a map that grows its elements stops (memory-order).
_BUFFER_BARRIER_KINDS = (kinds.CACHE, kinds.UNBATCH, kinds.INTERLEAVE)
# Options whose value False turns off something the guide relies on.
_OPTION_SWITCHES = {
    "autotune_options.enabled": "autotune (tf.data.Options().autotune.enabled)",
    "optimization_options.apply_default_optimizations": (
        "the default static optimisations "
        "(experimental_optimization.apply_default_optimizations)"
    ),
    "optimization_options.map_parallelization": (
        "automatic map parallelisation (experimental_optimization.map_parallelization)"
    ),
    "optimization_options.inject_prefetch": (
        "automatic prefetch injection (experimental_optimization.inject_prefetch)"
    ),
    "optimization_options.map_and_batch_fusion": (
        "map and batch fusion (experimental_optimization.map_and_batch_fusion)"
    ),
    "optimization_options.parallel_batch": (
        "parallel batching (experimental_optimization.parallel_batch)"
    ),
}
# Element growth from which a map's output is called larger than its input.
_GROWTH = 2.0


def lint(pipeline: Pipeline) -> Findings:
    """Runs every rule of the catalogue over a pipeline.

    Args:
        pipeline: a `Pipeline` from `graph.reader.read_pipeline`.

    Returns:
        `Findings`, errors first, in pipeline order within a severity.

    Example:

    >>> from keras_pipeline_tuner.pipeline.graph.reader import read_pipeline
    >>> lint(read_pipeline(tf.data.Dataset.range(8).batch(2))).ids
    ['missing-prefetch']
    """
    findings = Findings(pipeline=pipeline)
    for rule in _RULES:
        findings.extend(rule(pipeline))
    findings[:] = _about_keras_made(pipeline, findings)
    position = {stage.node: index for index, stage in enumerate(pipeline.stages)}
    findings.sort(key=lambda finding: position.get(finding.node, 0))
    return findings.sorted()


# The rules. Each takes the pipeline and yields findings.


def _missing_prefetch(pipeline: Pipeline) -> Iterable[Finding]:
    final = _last_transformation(pipeline)
    if final is None or final.kind == kinds.PREFETCH:
        return
    runtime_final = (
        _last_transformation(pipeline.runtime) if pipeline.runtime is not None else None
    )
    fix = f"ds = ds.prefetch(tf.data.AUTOTUNE)  # after: {final.label}; the last transformation"
    if runtime_final is not None and runtime_final.kind == kinds.PREFETCH:
        yield stage_finding(
            MISSING_PREFETCH,
            Severity.INFO,
            final,
            f"The pipeline ends with {final.label}, not prefetch. TensorFlow injects "
            "prefetch(AUTOTUNE) at run time here (autotune is on and the last "
            "transformation is synchronous), so producing the next batch already "
            "overlaps training. Writing it makes that explicit and keeps it if options "
            "change.",
            fix,
        )
        return
    last = runtime_final if runtime_final is not None else final
    if last.asynchronous:
        runs_as = f" (TensorFlow runs it as {last.label})" if last.label != final.label else ""
        yield stage_finding(
            MISSING_PREFETCH,
            Severity.INFO,
            final,
            f"The pipeline ends with {final.label}, not prefetch{runs_as}. That stage "
            "runs on its own threads and buffers its output, so production already "
            "overlaps training, and TensorFlow adds no prefetch after it; a final "
            "prefetch adds a buffer that absorbs uneven batch times.",
            fix,
        )
    else:
        yield stage_finding(
            MISSING_PREFETCH,
            Severity.WARNING,
            final,
            f"The pipeline ends with {final.label}, not prefetch, and TensorFlow does "
            "not add one here (autotune or prefetch injection is off): every batch is "
            "produced only when the model asks for it, so input and training never "
            "overlap.",
            fix,
        )


def _sequential_map(pipeline: Pipeline) -> Iterable[Finding]:
    for stage in pipeline.stages:
        function = stage.function
        if stage.kind not in _MAP_KINDS or stage.parallel or function is None:
            continue
        if function.trivial:
            continue
        name = _code_name(stage)
        fix = f"ds = ds.map({name}, num_parallel_calls=tf.data.AUTOTUNE)"
        if _runs_parallel(pipeline, stage):
            if function.expensive:
                yield stage_finding(
                    SEQUENTIAL_MAP,
                    Severity.INFO,
                    stage,
                    f"{stage.label} is written sequential, but {name} is stateless, so "
                    "TensorFlow's map_parallelization rewrite already runs it in parallel"
                    f"{_runs_as(stage)}. Passing num_parallel_calls states it and keeps "
                    "it parallel if options turn the rewrite off.",
                    fix,
                )
        elif function.expensive or function.random or function.stateful_ops:
            yield stage_finding(
                SEQUENTIAL_MAP,
                Severity.WARNING,
                stage,
                f"{stage.label} runs {name} on one element at a time, on one thread"
                f"{_cost(function)}. TensorFlow parallelises a sequential map by itself "
                f"only when its function is stateless, and {name} {_why_stateful(function)}, "
                "so it stays sequential.",
                fix,
            )


def _fixed_parallelism(pipeline: Pipeline) -> Iterable[Finding]:
    for stage in pipeline.stages:
        for name in ("num_parallel_calls", "num_parallel_reads"):
            value = stage.params.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and value > 1:
                yield stage_finding(
                    FIXED_PARALLELISM,
                    Severity.WARNING,
                    stage,
                    f"{stage.label} hard-codes {name}={value}. A fixed number is tuned "
                    "for one machine and one load; with AUTOTUNE, tf.data sizes the "
                    "parallelism (and the buffers) from what it measures while running.",
                    _autotuned(stage, name),
                )
        if stage.kind == kinds.PREFETCH:
            value = stage.params.get("buffer_size")
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                yield stage_finding(
                    FIXED_PARALLELISM,
                    Severity.WARNING,
                    stage,
                    f"{stage.label} hard-codes its buffer at {value} element"
                    f"{'s' if value != 1 else ''}. With AUTOTUNE, tf.data grows the "
                    "buffer when the consumer's demand is uneven and keeps it small "
                    "otherwise.",
                    "ds = ds.prefetch(tf.data.AUTOTUNE)",
                )


def _sequential_interleave(pipeline: Pipeline) -> Iterable[Finding]:
    for stage in pipeline.stages:
        # Reading files or generators, or datasets the function captured: what
        # interleave's parallelism is for. Interleaving in-memory slices is not.
        reads = stage.function is not None and bool(stage.function.io_ops)
        reads = reads or len(stage.inputs) > 1
        if stage.kind == kinds.INTERLEAVE and not stage.parallel and reads:
            if stage.parallel_at_runtime:
                continue
            name = _code_name(stage)
            cycle = stage.params.get("cycle_length")
            yield stage_finding(
                SEQUENTIAL_INTERLEAVE,
                Severity.WARNING,
                stage,
                f"{stage.label} opens {cycle if isinstance(cycle, int) else 'several'} "
                "inputs but reads them one after another on one thread: every wait of "
                "one input (opening a file, a slow read) stalls the pipeline. TensorFlow "
                "does not parallelise interleave by itself.",
                f"ds = ds.interleave({name}, num_parallel_calls=tf.data.AUTOTUNE)",
            )
        elif stage.kind == kinds.FLAT_MAP and reads:
            name = _code_name(stage)
            yield stage_finding(
                SEQUENTIAL_INTERLEAVE,
                Severity.WARNING,
                stage,
                f"{stage.label} reads its inputs ({', '.join(stage.function.io_ops)}) "
                "completely one after another, on one thread: every wait of one input "
                "stalls the pipeline.",
                f"ds = ds.interleave({name}, cycle_length=4, "
                "num_parallel_calls=tf.data.AUTOTUNE)",
            )


def _autotuned(stage: Stage, parameter: str) -> str:
    if stage.kind in _MAP_KINDS + (kinds.INTERLEAVE, kinds.FILTER) and stage.function is not None:
        return (
            f"ds = ds.{kinds.MAP if stage.kind in _MAP_KINDS else stage.kind}("
            f"{_code_name(stage)}, {parameter}=tf.data.AUTOTUNE)"
        )
    if stage.kind in kinds.READER_KINDS:
        return f"ds = tf.data.{stage.kind}(files, {parameter}=tf.data.AUTOTUNE)"
    return f"{parameter}=tf.data.AUTOTUNE"


def _sequential_file_read(pipeline: Pipeline) -> Iterable[Finding]:
    for stage in pipeline.stages:
        if stage.kind not in kinds.READER_KINDS or stage.parallel:
            continue
        if stage.files is None or stage.files < 2:
            continue
        yield stage_finding(
            SEQUENTIAL_FILE_READ,
            Severity.WARNING,
            stage,
            f"{stage.label} reads its {stage.files} files one after another: opening "
            "and reading each file waits on storage while nothing else is read. With "
            "num_parallel_reads the files are read concurrently (interleaved).",
            f"ds = tf.data.{stage.kind}(files, num_parallel_reads=tf.data.AUTOTUNE)",
        )


def _py_function_in_map(pipeline: Pipeline) -> Iterable[Finding]:
    for stage in pipeline.stages:
        function = stage.function
        if stage.kind not in _MAP_KINDS + (kinds.FILTER,) or function is None:
            continue
        if not function.py_function_ops:
            continue
        name = _code_name(stage)
        parallel = _runs_parallel(pipeline, stage)
        yield stage_finding(
            PY_FUNCTION_IN_MAP,
            Severity.INFO if parallel else Severity.WARNING,
            stage,
            f"{name} calls Python ({', '.join(function.py_function_ops)}). Python runs "
            "under the GIL, one call at a time unless it releases the GIL (I/O, sleep, "
            "NumPy); TensorFlow cannot optimise it, and it keeps the map from being "
            "parallelised automatically."
            + (" The map already runs with num_parallel_calls." if parallel else ""),
            f"Write {name} with TensorFlow ops (tf.io, tf.image, tf.strings)"
            + (
                ""  # The map already has what the second half would ask for.
                if parallel
                else f"; if the Python is unavoidable, ds.map({name}, "
                "num_parallel_calls=tf.data.AUTOTUNE)"
            ),
        )


def _cache_after_random(pipeline: Pipeline) -> Iterable[Finding]:
    for stage in pipeline.stages:
        if not _is_random(stage):
            continue
        cache = next((s for s in pipeline.downstream(stage) if s.kind == kinds.CACHE), None)
        if cache is None:
            continue
        ops = ", ".join(stage.function.random_ops) if stage.function else "random values"
        fix = f"Move .cache() above {stage.label}"
        if stage.kind in _MAP_KINDS and _direct_input(pipeline, cache) is stage:
            fix = (
                f"ds = ds.cache().map({_code_name(stage)}, "
                "num_parallel_calls=tf.data.AUTOTUNE)" + _in_place_of(stage, cache)
            )
        elif stage.kind in _MAP_KINDS:
            fix += (
                f": ds = ds.cache().map({_code_name(stage)}, "
                "num_parallel_calls=tf.data.AUTOTUNE)"
            )
        yield stage_finding(
            CACHE_AFTER_RANDOM,
            Severity.ERROR,
            stage,
            f"{stage.label} is random ({ops}), and {cache.label} after it stores the "
            "first epoch's results: every later epoch replays the same augmentations, "
            "so the model trains on a fixed set instead of fresh random variants.",
            fix,
        )


def _cache_after_shuffle(pipeline: Pipeline) -> Iterable[Finding]:
    for cache in pipeline.stages:
        if cache.kind != kinds.CACHE:
            continue
        if any(s.kind == kinds.SHUFFLE for s in pipeline.downstream(cache)):
            continue
        shuffle = next(
            (
                s
                for s in pipeline.upstream(cache)
                if s.kind == kinds.SHUFFLE and s.params.get("reshuffle_each_iteration") is not False
            ),
            None,
        )
        if shuffle is None:
            continue
        yield stage_finding(
            CACHE_AFTER_SHUFFLE,
            Severity.WARNING,
            shuffle,
            f"{shuffle.label} comes before {cache.label}, and nothing shuffles after the "
            "cache: the cache stores the first epoch's order and replays it, so every "
            "epoch sees the elements in the same order.",
            f"ds = ds.cache().shuffle({_size(shuffle, 'buffer_size', 'buffer_size')})"
            + (
                _in_place_of(shuffle, cache)
                if _direct_input(pipeline, cache) is shuffle
                else "  # cache first, then shuffle"
            ),
        )


def _cache_missing(pipeline: Pipeline) -> Iterable[Finding]:
    for stage in pipeline.stages:
        function = stage.function
        if stage.kind not in _MAP_KINDS or function is None:
            continue
        if not function.expensive or function.random:
            continue
        if any(s.kind == kinds.CACHE for s in pipeline.downstream(stage)):
            continue
        upstream = list(pipeline.upstream(stage))
        if any(_is_random(s) for s in upstream):
            # Its input changes every epoch: there is nothing to reuse.
            continue
        if any(s.kind == kinds.REPEAT and s.params.get("count") == -1 for s in upstream):
            # An endless input: a cache after it would never be complete.
            continue
        name = _code_name(stage)
        before = next((s for s in upstream if s.kind == kinds.CACHE), None)
        where = (
            f" The {before.label} before it stores its input, not its output."
            if before is not None
            else ""
        )
        python = bool(function.py_function_ops)
        # One change: the stage as written, then the cache (a parallel map
        # is a finding, and a gain, of its own).
        written = _as_written(stage, name)
        fix = f"ds = ds.{written}.cache()  # or .cache('/path/to/cache_file')"
        shuffle = _direct_input(pipeline, stage)
        reshuffled = (
            shuffle is not None
            and shuffle.kind == kinds.SHUFFLE
            and shuffle.params.get("reshuffle_each_iteration") is not False
        )
        if reshuffled:
            # A cache after this shuffle would replay the first epoch's order
            # (cache-after-shuffle): cache the map's output, then shuffle.
            where += (
                f" The cache goes before {shuffle.label}, which moves after it, so that "
                "every epoch still gets a new order."
            )
            fix = (
                f"ds = ds.{written}.cache()"
                f".shuffle({_size(shuffle, 'buffer_size', 'buffer_size')})"
                + _in_place_of(shuffle, stage)
            )
        elif any(
            s.kind == kinds.SHUFFLE and s.params.get("reshuffle_each_iteration") is not False
            for s in upstream
        ):
            fix += "\n# and move the shuffle after the cache, or every epoch has one order"
        yield stage_finding(
            CACHE_MISSING,
            Severity.INFO if python else Severity.WARNING,
            stage,
            f"{name} does the same expensive work{_cost(function)} on the same "
            f"elements every epoch.{where} A cache right after it computes each result "
            "once, in the first epoch (in memory, or in a file for data that does not "
            "fit)."
            + (
                f" {name} runs Python the lint cannot see into: cache only if it is "
                "deterministic."
                if python
                else ""
            ),
            fix,
        )


def _about_keras_made(pipeline: Pipeline, findings: Iterable[Finding]) -> List[Finding]:
    """Findings about Keras' own stages, as advice the user can follow.

    The loader map of `image_dataset_from_directory(...)` and its kin is
    Keras' code: what the user can change is the call's arguments and what
    comes after it. A missing cache becomes the utility's own way to cache;
    a shuffle of the batches the utility made becomes its `batch_size=None`;
    other findings about its internals (code to write in Keras' place) are
    left out.
    """
    kept = []
    for finding in findings:
        stage = next((item for item in pipeline.stages if item.node == finding.node), None)
        if finding.id == SHUFFLE_AFTER_BATCH and stage is not None:
            # The batch before the user's shuffle may be the utility's own.
            batch = next(
                (item for item in pipeline.main_chain(stage) if item.kind in _BATCH_KINDS), None
            )
            loader = keras_made.batching_loader(pipeline, batch) if batch is not None else None
            if loader is not None:
                finding.fix = keras_made.unbatched_shuffle_fix(pipeline, loader, batch, stage)
                finding.reason += (
                    f" {batch.label} is {loader.label}'s own: ask it for single elements "
                    "(batch_size=None) and batch after the shuffle."
                )
        if stage is None or stage.made_by is None:
            kept.append(finding)
        elif finding.id == CACHE_MISSING and stage.made_by != keras_made.TIMESERIES:
            reason, fix = keras_made.cache_advice(pipeline, stage)
            finding.reason, finding.fix = reason, fix
            kept.append(finding)
    return kept


def _vectorize_map(pipeline: Pipeline) -> Iterable[Finding]:
    by_node = {stage.node: stage for stage in pipeline.stages}
    for stage in pipeline.stages:
        if stage.kind == kinds.MAP_AND_BATCH:
            candidate, batch = stage, stage
        elif stage.kind == kinds.BATCH and stage.inputs:
            candidate, batch = by_node.get(stage.inputs[0]), stage
        else:
            continue
        if candidate is None or candidate.kind not in _MAP_KINDS or candidate.function is None:
            continue
        if not candidate.function.cheap:
            continue
        if candidate is not batch and len(list(_readers_of(pipeline, candidate))) > 1:
            continue
        if not _runs_on_batches(candidate, by_node):
            continue
        name = _code_name(candidate)
        size = batch.params.get("batch_size")
        size = size if isinstance(size, int) else "batch_size"
        yield stage_finding(
            VECTORIZE_MAP,
            Severity.WARNING,
            candidate,
            f"{candidate.label} calls {name}, a few cheap ops, once per element right "
            "before batching: the per-call overhead (scheduling, copying) outweighs the "
            "work, even when TensorFlow fuses it into map_and_batch. Batch first and "
            f"apply {name} to whole batches (most TensorFlow ops work on a batch "
            "unchanged).",
            f"ds = ds.batch({size}).map({name}, num_parallel_calls=tf.data.AUTOTUNE)"
            + (_in_place_of(candidate, batch) if candidate is not batch else ""),
        )


# Ops that apply element by element to tensors of any shape: a function made of
# them gives the same values on a batch as on each of its elements.
_ELEMENTWISE_OPS = frozenset(
    """Abs Add AddV2 BiasAdd Cast Ceil ClipByValue Cos Div DivNoNan Equal Erf Exp Floor
    FloorDiv FloorMod Greater GreaterEqual Identity IdentityN IsFinite IsNan Less LessEqual
    Log Log1p LogicalAnd LogicalNot LogicalOr Maximum Minimum Mod Mul Neg NoOp NotEqual Pow
    RealDiv Reciprocal Relu Relu6 Round Rsqrt Select SelectV2 Sigmoid Sign Sin Softplus Sqrt
    Square SquaredDifference StopGradient Sub Tanh TruncateDiv TruncateMod""".split()
)
# Ops that only pass values around or hold constants.
_NEUTRAL_OPS = frozenset(["Const", "Placeholder", "_Arg", "_Retval", "NoOp"])


def _runs_on_batches(map_stage, by_node) -> bool:
    """Whether `ds.batch(n).map(fn)` runs and equals `ds.map(fn).batch(n)`.

    Batching before the map needs elements of one static shape (a map making
    elements of varying shape, as before `ragged_batch`, cannot be batched
    first), and `fn` must work element-wise (`tf.range`, `tf.fill`, reshapes
    and reductions see a batch as one bigger element). Constants in `fn`
    broadcast against the batch dimension only when they are scalars, which
    the op names cannot tell: a constant that is not a scalar is rare in a
    function this cheap, and the advice names the function to check.
    """
    source = by_node.get(map_stage.inputs[0]) if map_stage.inputs else None
    if source is None or source.element_bytes is None:
        return False
    return all(
        op in _ELEMENTWISE_OPS or op in _NEUTRAL_OPS for op in map_stage.function.ops
    )


def _shuffle_after_batch(pipeline: Pipeline) -> Iterable[Finding]:
    for stage in pipeline.stages:
        if stage.kind != kinds.SHUFFLE:
            continue
        batch = None
        for upstream in pipeline.main_chain(stage):
            if upstream.kind == kinds.UNBATCH:
                break
            if upstream.kind in _BATCH_KINDS:
                batch = upstream
                break
        if batch is None:
            continue
        yield stage_finding(
            SHUFFLE_AFTER_BATCH,
            Severity.WARNING,
            stage,
            f"{stage.label} comes after {batch.label}: it shuffles whole batches, so "
            "every epoch the same examples are grouped together, only in another "
            "order.",
            f"ds = ds.shuffle({_examples_buffer(stage, batch)})"
            f".batch({_size(batch, 'batch_size', 'batch_size')})"
            + (
                _in_place_of(batch, stage)
                if batch.kind == kinds.BATCH and _direct_input(pipeline, stage) is batch
                else "  # shuffle examples, then batch"
            ),
        )


def _memory_order(pipeline: Pipeline) -> Iterable[Finding]:
    for stage in pipeline.stages:
        if stage.kind != kinds.SHUFFLE:
            continue
        buffer = stage.params.get("buffer_size")
        if isinstance(buffer, int) and buffer <= 1:
            continue
        for upstream in pipeline.main_chain(stage):
            if upstream.kind in _BUFFER_BARRIER_KINDS or upstream.kind in _BATCH_KINDS:
                break
            growth = _growth(pipeline, upstream)
            if growth is None:
                continue
            name = _code_name(upstream)
            size = ""
            if isinstance(buffer, int) and upstream.element_bytes:
                size = (
                    f" (about {_bytes(buffer * upstream.element_bytes)}: {buffer} "
                    f"elements of {_bytes(upstream.element_bytes)})"
                )
            yield stage_finding(
                MEMORY_ORDER,
                Severity.WARNING,
                stage,
                f"{stage.label} buffers the output of {upstream.label}, which {growth}: "
                f"the shuffle buffer holds the large elements{size}. Shuffling the "
                "small elements before the map costs the same randomness for far less "
                "memory.",
                f"ds = ds.shuffle({_size(stage, 'buffer_size', 'buffer_size')}).map({name}, "
                "num_parallel_calls=tf.data.AUTOTUNE)"
                + (
                    _in_place_of(upstream, stage)
                    if _direct_input(pipeline, stage) is upstream
                    else ""
                ),
            )
            break


def _autotune_disabled(pipeline: Pipeline) -> Iterable[Finding]:
    turned_off = [
        description
        for key, description in _OPTION_SWITCHES.items()
        if pipeline.options.get(key) is False
    ]
    if pipeline.options.get("threading_options.private_threadpool_size") == 1:
        turned_off.append("all but one thread (threading.private_threadpool_size=1)")
    if not turned_off:
        return
    stage = next(
        (s for s in reversed(pipeline.stages) if s.kind == kinds.WITH_OPTIONS), pipeline.final
    )
    if stage is None:
        return
    yield stage_finding(
        AUTOTUNE_DISABLED,
        Severity.WARNING,
        stage,
        f"The dataset's options turn off {'; '.join(turned_off)}. Without them tf.data "
        "neither sizes parallelism and buffers from measurements nor applies the "
        "rewrites that parallelise stateless maps and overlap input with training.",
        "Remove these settings from tf.data.Options (their defaults are on), or set "
        "every num_parallel_calls and prefetch by hand.",
    )


def _data_service(pipeline: Pipeline) -> Iterable[Finding]:
    for stage in data_service.service_stages(pipeline):
        yield stage_finding(
            DATA_SERVICE,
            Severity.INFO,
            stage,
            data_service.service_reason(stage),
            data_service.SERVICE_FIX,
        )


_RULES: List[Callable[[Pipeline], Iterable[Finding]]] = [
    _cache_after_random,
    _cache_after_shuffle,
    _shuffle_after_batch,
    _sequential_file_read,
    _sequential_interleave,
    _sequential_map,
    _py_function_in_map,
    _vectorize_map,
    _cache_missing,
    _memory_order,
    _fixed_parallelism,
    _autotune_disabled,
    _missing_prefetch,
    _data_service,
]


# Helpers.


def _in_place_of(*stages: Stage) -> str:
    """A comment on a fix that replaces several stages, e.g. a reordering.

    Fixes are written as code to put in place of the finding's stage; one that
    moves a stage too says which stages, in order, it replaces, so that it can
    be applied as written.
    """
    return "  # in place of: " + " -> ".join(stage.label for stage in stages)


def _as_written(stage: Stage, name: str) -> str:
    """The map stage as code, with the parallelism it was written with."""
    calls = stage.params.get("num_parallel_calls")
    if calls == "AUTOTUNE":
        calls = "tf.data.AUTOTUNE"
    if stage.parallel and calls:
        return f"map({name}, num_parallel_calls={calls})"
    return f"map({name})"


def _size(stage: Stage, name: str, placeholder: str) -> str:
    value = stage.params.get(name)
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else placeholder


def _examples_buffer(shuffle: Stage, batch: Stage) -> str:
    """A shuffle buffer of examples as large as the one of batches it replaces."""
    buffer, size = shuffle.params.get("buffer_size"), batch.params.get("batch_size")
    if all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (buffer, size)):
        return str(buffer * size)
    return _size(shuffle, "buffer_size", "buffer_size") + " * batch_size"


def _direct_input(pipeline: Pipeline, stage: Stage) -> Optional[Stage]:
    return next(iter(pipeline.main_chain(stage)), None)


def _last_transformation(pipeline: Pipeline) -> Optional[Stage]:
    # These change no element: the transformation before them is the last.
    by_node = {stage.node: stage for stage in pipeline.stages}
    stage = pipeline.final
    while stage is not None and stage.kind in _PASS_THROUGH_KINDS and stage.inputs:
        stage = by_node.get(stage.inputs[0])
    return stage


def _readers_of(pipeline: Pipeline, stage: Stage) -> Iterable[Stage]:
    return (item for item in pipeline.stages if stage.node in item.inputs)


def _runs_parallel(pipeline: Pipeline, stage: Stage) -> bool:
    if stage.parallel:
        return True
    if stage.parallel_at_runtime is not None:
        return stage.parallel_at_runtime
    # The rewritten pipeline could not be read: predict TensorFlow's rewrite.
    options = pipeline.options
    return (
        stage.function is not None
        and not stage.function.stateful_ops
        and options.get("optimization_options.apply_default_optimizations") is not False
        and options.get("optimization_options.map_parallelization") is not False
    )


def _is_random(stage: Stage) -> bool:
    # Shuffling changes the order, not the elements: work after it can be cached.
    return (stage.function is not None and stage.function.random) or stage.kind == kinds.RANDOM


def _growth(pipeline: Pipeline, stage: Stage) -> Optional[str]:
    if stage.kind not in _MAP_KINDS or stage.function is None:
        return None
    decodes = [op for op in stage.function.heavy_ops if op.startswith("Decode")]
    before = next(iter(pipeline.main_chain(stage)), None)
    if stage.element_bytes and before is not None and before.element_bytes:
        ratio = stage.element_bytes / before.element_bytes
        if ratio >= _GROWTH:
            return f"makes each element {ratio:.0f}x larger"
    if decodes:
        return f"decodes compressed data ({', '.join(decodes)})"
    return None


def _cost(function: StageFunction) -> str:
    parts = []
    if function.py_function_ops:
        parts.append("Python code")
    if function.heavy_ops:
        parts.append(", ".join(function.heavy_ops))
    if function.io_ops:
        parts.append("file reads")
    return f" ({'; '.join(parts)})" if parts else ""


def _why_stateful(function: StageFunction) -> str:
    if function.py_function_ops:
        return "calls Python"
    if function.random_ops:
        return f"draws random numbers ({', '.join(function.random_ops)})"
    return f"holds stateful ops ({', '.join(function.stateful_ops[:3])})"


def _runs_as(stage: Stage) -> str:
    return f" (as {stage.runs_as})" if stage.runs_as else ""


def _code_name(stage: Stage) -> str:
    """The function's name as it would appear in the user's code."""
    name = stage.function_name
    if not name or name == "<lambda>" or not re.fullmatch(r"[A-Za-z_][\w.]*", name):
        return "fn"
    if name[0].isupper() and "." not in name:
        # A Keras layer or other callable object: name an instance of it.
        return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()
    return name


def _bytes(count: int) -> str:
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} B"
