"""The live tf.data model: AUTOTUNE's own statistics of a running pipeline, as a stage table.

tf.data keeps a model of every iterator it autotunes (one node per running
stage, its processing time, elements, buffered bytes and the tunable
parameters with the values AUTOTUNE chose) and hands it out with
`tf.data.experimental.get_model_proto(iterator)` (TensorFlow 2.17+; it raises
`NotFoundError` when autotuning is off). Reading it takes about a millisecond
and touches neither the iterator's elements nor its threads.

The model names nodes by tf.data's kernels ("ParallelMapV2", "MapAndBatch",
"MemoryCacheImpl"), in the pipeline TensorFlow runs after its rewrites. This
module aligns them with that pipeline as the graph reader reads it
(`Pipeline.runtime`), and through it with the stages as the user wrote them
(`map(decode, num_parallel_calls=AUTOTUNE)`), and reduces one read to a frozen
`StageTable`. Nothing here finds an iterator or decides advice.
"""

import dataclasses
import re
from typing import Dict
from typing import List
from typing import Optional
from typing import Tuple

# The source of the stage table, as the outputs name it.
SOURCE = "tf.data's live model (AUTOTUNE's own statistics)"
# A tunable parameter's maximum above this is "no maximum" (tf.data writes int64's).
_UNBOUNDED = 2**40
_VERSION = re.compile(r"V\d+$")
# Model nodes that are the inner half of one dataset op.
_NODE_ALIASES = {
    "MemoryCacheImpl": "Cache",
    "MemoryCache": "Cache",
    "FileCacheImpl": "Cache",
    "FileCache": "Cache",
    "ForeverRepeat": "Repeat",
    "LegacyParallelInterleave": "ParallelInterleave",
}
# Dataset ops whose model node has another name.
_OP_ALIASES = {
    "Tensor": "FromTensor",
    "ShuffleAndRepeat": "Shuffle",
    "LegacyParallelInterleave": "ParallelInterleave",
    "ExperimentalMapAndBatch": "MapAndBatch",
}
_PARALLELISM = "parallelism"
_BUFFER = "buffer_size"
_PREFETCH = "Prefetch"


@dataclasses.dataclass(frozen=True)
class StageRow:
    """One stage of the running pipeline, as tf.data's model measured it.

    Attributes:
        stage: the stage as the user wrote it (e.g. "map(decode,
            num_parallel_calls=AUTOTUNE)"); "prefetch (added by tf.data)" for
            a stage tf.data added itself.
        node: the user's stage's graph node (`Stage.node`), `None` for a stage
            tf.data added.
        runs_as: the tf.data kernel(s) running it, e.g. "MapAndBatch" for a map
            fused with its batch.
        elements: elements it produced since its iterator was made (of a map
            tf.data fused with its batch, the elements the map ran on).
        ms_per_element: its own processing time per such element (measured;
            the time of all its threads, its inputs' excluded).
        ms_per_batch: its own processing time per element of the pipeline's
            output (for `fit`, per batch).
        share: its share of the pipeline's processing time.
        parallelism: the parallelism it ran at (AUTOTUNE's choice where tuned),
            or `None` for a stage with no such parameter (one thread).
        parallelism_max: the most AUTOTUNE may choose, or `None`.
        buffer: a prefetch's buffer size (AUTOTUNE's choice where tuned).
        buffer_max: its maximum, `None` when tf.data sets none.
        buffered_elements: elements it held when read.
        buffered_bytes: bytes it held when read.
        tuned: AUTOTUNE tunes one of its parameters.
        added_by_tf: tf.data added it (an injected prefetch).
    """

    stage: str
    node: Optional[str] = None
    runs_as: str = ""
    elements: int = 0
    ms_per_element: float = 0.0
    ms_per_batch: float = 0.0
    share: float = 0.0
    parallelism: Optional[int] = None
    parallelism_max: Optional[int] = None
    buffer: Optional[int] = None
    buffer_max: Optional[int] = None
    buffered_elements: int = 0
    buffered_bytes: int = 0
    tuned: bool = False
    added_by_tf: bool = False

    @property
    def waits(self) -> bool:
        """Whether its own time is waiting (a prefetch: for room, for its input), not work.

        Example:

        >>> StageRow("prefetch(AUTOTUNE)", runs_as="Prefetch").waits
        True
        """
        return self.runs_as == _PREFETCH

    @property
    def parallel(self) -> bool:
        """Whether it runs its work on several threads (a parallelism parameter)."""
        return self.parallelism is not None

    def chosen(self) -> str:
        """What AUTOTUNE chose, e.g. "parallelism 2 of 2", "buffer 3"; "" for none.

        Example:

        >>> StageRow("map(f)", parallelism=2, parallelism_max=4).chosen()
        'parallelism 2 of 4'
        >>> StageRow("prefetch", buffer=3).chosen()
        'buffer 3'
        """
        if self.parallelism is not None:
            most = f" of {self.parallelism_max}" if self.parallelism_max else ""
            return f"parallelism {self.parallelism}{most}"
        if self.buffer is not None:
            most = f" of {self.buffer_max}" if self.buffer_max else ""
            return f"buffer {self.buffer}{most}"
        return ""


@dataclasses.dataclass(frozen=True)
class StageTable:
    """Every stage of the pipeline a run read, from tf.data's live model (measured).

    Attributes:
        rows: the stages, sources first.
        batches: elements the pipeline's output gave to the read iterator(s).
        cpu_budget: the cores AUTOTUNE works within (its `cpu_budget`).
        ram_budget_bytes: the memory AUTOTUNE's buffers may take.
        prefetch_fullness: how full the final prefetch's buffer was at the
            last read between two steps of a pass (buffered over its size),
            `None` without a final prefetch or such a read.
        prefetch_empty_reads: of those reads, how many found it empty (an
            empty buffer when the step asks means the step waits).
        reads: how many times the model was read.
        read_ms: what all reads took, on the thread that made them.
        at_step: the training step of the last read.
        source: what measured it (`SOURCE`).

    Example:

    >>> table = StageTable(rows=(StageRow("map(f)", ms_per_batch=2.0, share=1.0),), batches=10)
    >>> table.slowest().stage
    'map(f)'
    """

    rows: Tuple[StageRow, ...] = ()
    batches: int = 0
    cpu_budget: Optional[int] = None
    ram_budget_bytes: Optional[int] = None
    prefetch_fullness: Optional[float] = None
    prefetch_empty_reads: int = 0
    reads: int = 0
    read_ms: float = 0.0
    at_step: int = 0
    source: str = SOURCE

    def slowest(self) -> Optional[StageRow]:
        """The stage that can sustain the fewest batches a second at its parallelism."""
        timed = [row for row in self.rows if row.ms_per_batch > 0]
        if not timed:
            return None
        return max(timed, key=lambda row: row.ms_per_batch / (row.parallelism or 1))

    def row(self, stage: str, node: Optional[str] = None) -> Optional[StageRow]:
        """The row of a stage, by its graph node or, failing that, its label."""
        for row in self.rows:
            if node is not None and row.node == node:
                return row
        return next((row for row in self.rows if row.stage == stage), None)

    def line(self, limit: int = 3) -> str:
        """The costliest stages in one line, for the terminal.

        Example:

        >>> StageTable(rows=(StageRow("map(f)", ms_per_element=1.5, share=0.9,
        ...     parallelism=2, parallelism_max=2),)).line()
        'map(f) 1.50 ms/element, 90 %, parallelism 2 of 2'
        """
        ranked = sorted(self.rows, key=lambda row: row.share, reverse=True)[:limit]
        parts = []
        for row in ranked:
            chosen = row.chosen()
            parts.append(
                f"{row.stage} {row.ms_per_element:.2f} ms/element, {row.share * 100:.0f} %"
                + (f", {chosen}" if chosen else "")
            )
        return "; ".join(parts)


def read_model(iterator):
    """tf.data's model of a live iterator, or `None` when autotuning keeps none.

    Args:
        iterator: a tf.data iterator (`iter(dataset)`, `as_numpy_iterator()`).

    Returns:
        The `ModelProto`, or `None` (autotuning off, or no model yet).

    Example:

    ```python
    iterator = iter(dataset)
    next(iterator)
    proto = read_model(iterator)
    ```
    """
    import tensorflow as tf

    try:
        return tf.data.experimental.get_model_proto(iterator)
    except tf.errors.NotFoundError:
        return None


@dataclasses.dataclass
class _Group:
    """Model nodes standing for one stage, as they add up."""

    key: str
    label: str
    node: Optional[str]
    added: bool
    kernels: List[str] = dataclasses.field(default_factory=list)
    processing_ns: float = 0.0
    elements: int = 0
    buffered_elements: int = 0
    buffered_bytes: int = 0
    parameters: Dict[str, tuple] = dataclasses.field(default_factory=dict)
    order: int = 0
    # Elements the stage's function ran on per element the kernel produced.
    per_output: int = 1


def stage_table(proto, pipeline=None, previous: Optional[StageTable] = None, **read) -> StageTable:
    """One read of the live model as a `StageTable`.

    Args:
        proto: a `ModelProto` (`read_model`).
        pipeline: the `Pipeline` the graph reader read of the same dataset
            (with its `runtime`), to name stages as the user wrote them; `None`
            names them by tf.data's kernels.
        previous: the table of the reads before, whose read count and empty
            prefetch reads this one adds to.
        **read: `read_ms` (what this read took), `at_step`, and `mid_pass`:
            whether the read was between two steps of a pass over the data,
            the only reads whose final prefetch fullness counts (at a pass's
            end the buffer drains whatever the step).

    Returns:
        The `StageTable`.
    """
    nodes = dict(proto.nodes)
    root = nodes.get(proto.output)
    groups: Dict[str, _Group] = {}
    if root is not None:
        runtime = getattr(pipeline, "runtime", None) if pipeline is not None else None
        namer = _Namer(pipeline, runtime)
        top = list(root.inputs)
        final = _stage_by_node(runtime, runtime.final.node) if runtime and runtime.stages else None
        for child in top:
            _walk(nodes, child, final, namer, groups, runtime)
    batches = int(root.num_elements) if root is not None else 0
    total_ns = sum(group.processing_ns for group in groups.values()) or 1.0
    rows = []
    for group in sorted(groups.values(), key=lambda item: item.order, reverse=True):
        rows.append(_row(group, batches, total_ns))
    fullness = _final_prefetch_fullness(nodes, root)
    params = proto.optimization_params
    earlier_reads = previous.reads if previous is not None else 0
    earlier_empty = previous.prefetch_empty_reads if previous is not None else 0
    if not read.get("mid_pass", False):
        fullness, empty = (previous.prefetch_fullness if previous is not None else None), 0
    else:
        empty = 1 if fullness == 0.0 else 0
    return StageTable(
        rows=tuple(rows),
        batches=batches,
        cpu_budget=int(params.cpu_budget) or None,
        ram_budget_bytes=int(params.ram_budget) or None,
        prefetch_fullness=fullness,
        prefetch_empty_reads=earlier_empty + empty,
        reads=earlier_reads + 1,
        read_ms=(previous.read_ms if previous is not None else 0.0) + read.get("read_ms", 0.0),
        at_step=int(read.get("at_step", 0)),
    )


def node_kind(name: str) -> str:
    """A model node's kind, comparable with `op_kind`.

    Example:

    >>> node_kind("ParallelMapV2"), node_kind("MemoryCacheImpl")
    ('ParallelMap', 'Cache')
    """
    name = _VERSION.sub("", name)
    return _NODE_ALIASES.get(name, name)


def op_kind(op: str) -> str:
    """A dataset op's kind, comparable with `node_kind`.

    Example:

    >>> op_kind("ParallelMapDatasetV2"), op_kind("CacheDatasetV2"), op_kind("TensorDataset")
    ('ParallelMap', 'Cache', 'FromTensor')
    """
    name = _VERSION.sub("", op)
    name = name[: -len("Dataset")] if name.endswith("Dataset") else name
    name = _VERSION.sub("", name)
    return _OP_ALIASES.get(name, name)


class _Namer:
    """Names each stage of the pipeline TensorFlow runs as the user wrote it.

    A runtime stage is the user's when it keeps the user's graph node or runs
    the user's function (a map fused with its batch); other stages tf.data's
    rewrites renamed (a prefetch after a fusion) pair with the user's stages
    of their kind in order, and one more prefetch than the user wrote, at the
    end, is the one tf.data added.
    """

    def __init__(self, pipeline, runtime):
        stages = list(getattr(pipeline, "stages", None) or [])
        by_node = {stage.node: stage for stage in stages}
        by_function = {
            stage.function.graph_name: stage for stage in stages if stage.function is not None
        }
        self._names: Dict[str, tuple] = {}
        ran = list(getattr(runtime, "stages", None) or [])
        claimed = set()
        left = []
        for stage in ran:
            user = by_node.get(stage.node)
            if user is None and stage.function is not None:
                user = by_function.get(stage.function.graph_name)
            if user is not None:
                claimed.add(user.node)
                self._names[stage.node] = (user.node, user.label, user.node, False)
            else:
                left.append(stage)
        for kind in dict.fromkeys(stage.kind for stage in left):
            theirs = [stage for stage in left if stage.kind == kind]
            users = [s for s in stages if s.kind == kind and s.node not in claimed]
            for index, stage in enumerate(theirs):
                if index < len(users):
                    user = users[index]
                    self._names[stage.node] = (user.node, user.label, user.node, False)
                else:
                    added = bool(stages)
                    label = f"{stage.kind} (added by tf.data)" if added else stage.label
                    self._names[stage.node] = (stage.node, label, None, added)

    def name(self, ran) -> Tuple[str, str, Optional[str], bool]:
        """`(key, label, user node, added by tf.data)` of a runtime stage."""
        return self._names.get(ran.node, (ran.node, ran.label, None, False))


def _stage_by_node(runtime, node: str):
    for stage in runtime.stages:
        if stage.node == node:
            return stage
    return None


def _find(runtime, stage, kind: str, depth: int = 3):
    """`stage`, or the first stage down its main chain, of `kind` (a few steps at most)."""
    while stage is not None and depth > 0:
        if op_kind(stage.op) == kind:
            return stage
        stage = _stage_by_node(runtime, stage.inputs[0]) if stage.inputs else None
        depth -= 1
    return None


def _walk(nodes, node_id: int, stage, namer: _Namer, groups: Dict[str, _Group], runtime) -> None:
    """Adds the model node `node_id` (and its inputs) to the stage it stands for."""
    stack = [(node_id, stage)]
    order = 0
    while stack:
        node_id, candidate = stack.pop()
        node = nodes.get(node_id)
        if node is None:
            continue
        kind = node_kind(node.name)
        matched = _find(runtime, candidate, kind) if runtime is not None else None
        group = _group_for(node, matched, candidate, namer, groups, order)
        order += 1
        group.kernels.append(node.name)
        group.processing_ns += float(node.processing_time)
        if len(group.kernels) == 1:
            group.elements = int(node.num_elements)
        group.buffered_elements += int(node.buffered_elements)
        group.buffered_bytes += int(node.buffered_bytes)
        for parameter in node.parameters:
            group.parameters.setdefault(
                parameter.name, (parameter.state_value, parameter.max, parameter.tunable)
            )
        # Inputs pair with the matched stage's inputs; an input of no stage
        # (a dataset a function makes per element, the inner half of a cache)
        # is the work of the stage that made it.
        here = matched if matched is not None else candidate
        inputs = [_stage_by_node(runtime, name) for name in here.inputs] if here else []
        for index, child in reversed(list(enumerate(node.inputs))):
            child_node = nodes.get(child)
            if child_node is None:
                continue
            if runtime is None:
                stack.append((child, None))
            elif matched is not None and node_kind(child_node.name) == kind:
                stack.append((child, matched))
            elif index < len(inputs) and inputs[index] is not None:
                stack.append((child, inputs[index]))
            else:
                stack.append((child, _Inside(group.key)))


class _Inside:
    """Stands for "the work of the stage `key`": no stage of the runtime pipeline."""

    op = ""
    inputs: List[str] = []

    def __init__(self, key: str):
        self.key = key


def _group_for(node, matched, candidate, namer, groups, order) -> _Group:
    if matched is None and isinstance(candidate, _Inside):
        return groups[candidate.key]
    if matched is None:
        # Not in the pipeline as read (no pipeline, or an op it does not show):
        # named by tf.data's kernel, one row per node.
        key = f"node:{node.id}"
        label = _snake(node_kind(node.name))
        group = groups.setdefault(key, _Group(key, label, None, False, order=order))
        return group
    key, label, user_node, added = namer.name(matched)
    if key not in groups:
        groups[key] = _Group(key, label, user_node, added, order=order)
        batch_size = matched.params.get("batch_size")
        if op_kind(matched.op) == "MapAndBatch" and isinstance(batch_size, int) and batch_size > 0:
            # The map of a map fused with its batch runs once an element of the batch.
            groups[key].per_output = batch_size
    return groups[key]


def _row(group: _Group, batches: int, total_ns: float) -> StageRow:
    parallelism = group.parameters.get(_PARALLELISM)
    buffer = group.parameters.get(_BUFFER)
    elements = group.elements * group.per_output
    per_element = group.processing_ns / elements / 1e6 if elements else 0.0
    return StageRow(
        stage=group.label,
        node=group.node,
        runs_as="+".join(dict.fromkeys(group.kernels)),
        elements=elements,
        ms_per_element=per_element,
        ms_per_batch=group.processing_ns / batches / 1e6 if batches else 0.0,
        share=group.processing_ns / total_ns,
        parallelism=int(parallelism[0]) if parallelism else None,
        parallelism_max=_bounded(parallelism[1]) if parallelism else None,
        buffer=int(buffer[0]) if buffer else None,
        buffer_max=_bounded(buffer[1]) if buffer else None,
        buffered_elements=group.buffered_elements,
        buffered_bytes=group.buffered_bytes,
        tuned=any(tunable for _, _, tunable in group.parameters.values()),
        added_by_tf=group.added,
    )


def _bounded(value: float) -> Optional[int]:
    return int(value) if 0 < value < _UNBOUNDED else None


def _final_prefetch_fullness(nodes, root) -> Optional[float]:
    """Buffered over buffer size of the prefetch nearest the output, if one runs there."""
    node = nodes.get(root.inputs[0]) if root is not None and root.inputs else None
    while node is not None and node_kind(node.name) != _PREFETCH:
        # Only through stages that hand each element on as they get it.
        if node.name not in ("Options", "Model") or not node.inputs:
            return None
        node = nodes.get(node.inputs[0])
    if node is None:
        return None
    size = next((p.state_value for p in node.parameters if p.name == _BUFFER), 0)
    if size <= 0:
        return None
    return min(float(node.buffered_elements) / float(size), 1.0)


def _snake(kind: str) -> str:
    """A kernel's kind as the `tf.data` method, roughly: "ParallelMap" -> "parallel_map"."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", kind).lower()
