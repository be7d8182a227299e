"""Editing a dataset's GraphDef: the rewrites made, a pipeline cut at a stage.

Each `Rewrite` becomes a change of the graph's nodes: an op turned into its
parallel form with the inputs that form takes, a stage inserted after a node
(a prefetch, a cache, options), a batch moved before a map. Memory caches and
seed generators are resources named in the graph; giving them new names makes
a rebuilt dataset's own (see `rebuild`).
"""

import dataclasses
import itertools
import re
import uuid
from typing import Any
from typing import Dict
from typing import Iterable
from typing import List
from typing import Tuple

from keras_pipeline_tuner._util.tf_import import tensorflow
from keras_pipeline_tuner.pipeline.graph.reader import graph_def_of
from keras_pipeline_tuner.pipeline.tune.rewrites import AUTOTUNE_PARALLELISM
from keras_pipeline_tuner.pipeline.tune.rewrites import CACHE
from keras_pipeline_tuner.pipeline.tune.rewrites import GENERATOR_COPIES
from keras_pipeline_tuner.pipeline.tune.rewrites import KINDS
from keras_pipeline_tuner.pipeline.tune.rewrites import OPTION_KINDS
from keras_pipeline_tuner.pipeline.tune.rewrites import PARALLEL_BATCH
from keras_pipeline_tuner.pipeline.tune.rewrites import PARALLEL_INTERLEAVE
from keras_pipeline_tuner.pipeline.tune.rewrites import PARALLEL_MAP
from keras_pipeline_tuner.pipeline.tune.rewrites import PREFETCH
from keras_pipeline_tuner.pipeline.tune.rewrites import REORDER
from keras_pipeline_tuner.pipeline.tune.rewrites import TUNABLE_INPUT
from keras_pipeline_tuner.pipeline.tune.rewrites import VECTORIZE
from keras_pipeline_tuner.pipeline.tune.rewrites import Rewrite

_AUTOTUNE = -1


def apply_rewrites(graph_def, rewrites: Iterable[Rewrite]):
    """Makes rewrites on a copy of a dataset's GraphDef.

    Args:
        graph_def: the `tf.compat.v1.GraphDef` from `graph_def_of`.
        rewrites: `Rewrite`s from `plan_rewrites` for this graph.

    Returns:
        The rewritten `tf.compat.v1.GraphDef`; `graph_def` is left unchanged.

    Raises:
        ValueError: if a rewrite names a node the graph does not have, or a
            node of another op than the rewrite applies to.
    """
    tf = tensorflow()
    rewritten = tf.compat.v1.GraphDef()
    rewritten.CopyFrom(graph_def)
    editor = GraphEditor(rewritten)
    for rewrite in rewrites:
        editor.apply(rewrite)
    return rewritten


def cut_at(graph_def, node: str):
    """A copy of a dataset's GraphDef whose output is `node` (a prefix of the pipeline).

    Args:
        graph_def: the `tf.compat.v1.GraphDef`.
        node: the dataset node that becomes the output.

    Returns:
        `(graph_def, element_spec)`: the cut graph and the flat tuple of
        `tf.TensorSpec`s of the node's elements, or `None` as the spec when an
        element holds something other than plain tensors (ragged, nested
        datasets).
    """
    tf = tensorflow()
    cut = tf.compat.v1.GraphDef()
    cut.CopyFrom(graph_def)
    editor = GraphEditor(cut)
    editor.retval.input[0] = node
    target = editor.node(node)
    types, shapes = _output_signature(target)
    if any(tf.dtypes.as_dtype(dtype) in (tf.variant, tf.resource) for dtype in types):
        return cut, None
    spec = tuple(
        tf.TensorSpec(tf.TensorShape(shape), tf.dtypes.as_dtype(dtype))
        for dtype, shape in zip(types, shapes)
    )
    return cut, spec


def serialized_options(options: Dict[str, Any]) -> bytes:
    """`tf.data.Options` with the given fields set, serialised as in a dataset graph.

    Args:
        options: field values by dotted path, e.g.
            `{"threading.private_threadpool_size": 2}`.

    Returns:
        The bytes of the `serialized_options` attribute of an `OptionsDataset`.
    """
    tf = tensorflow()
    value = tf.data.Options()
    for path, setting in options.items():
        *parents, field = path.split(".")
        target = value
        for parent in parents:
            target = getattr(target, parent)
        setattr(target, field, setting)
    template = graph_def_of(tf.data.Dataset.range(0).with_options(value))
    return next(node for node in template.node if node.op == "OptionsDataset").attr[
        "serialized_options"
    ].s


def _batched(shape, rows: int):
    tf = tensorflow()
    batched = tf.TensorShape([None if rows < 0 else rows]).concatenate(tf.TensorShape(shape))
    return batched.as_proto()


def _set_shapes(node, shapes) -> None:
    listed = node.attr["output_shapes"].list.shape
    del listed[:]
    listed.extend(shapes)


def _output_signature(node) -> Tuple[List[int], List[Any]]:
    for types_attr in ("output_types", "Toutput_types"):
        if types_attr in node.attr:
            types = list(node.attr[types_attr].list.type)
            shapes = list(node.attr["output_shapes"].list.shape)
            return types, shapes
    raise ValueError(f"Dataset node {node.name!r} ({node.op}) has no output types.")


class GraphEditor:
    """Edits one dataset GraphDef in place.

    Args:
        graph_def: a dataset's `tf.compat.v1.GraphDef` (see `graph_def_of`).

    Raises:
        ValueError: if it is not a dataset graph (it has no `_Retval` node).

    Example:

    >>> graph_def = graph_def_of(tf.data.Dataset.range(4).shuffle(4))
    >>> len(GraphEditor(graph_def).seed_generator_inputs())
    1
    """

    def __init__(self, graph_def):
        self.graph_def = graph_def
        self._by_name = {node.name: node for node in graph_def.node}
        self.retval = next((node for node in graph_def.node if node.op == "_Retval"), None)
        if self.retval is None or not self.retval.input:
            raise ValueError(
                "Not a dataset graph: it has no `_Retval` node. Pass the GraphDef from "
                "`graph_def_of(dataset)`."
            )
        self._names = itertools.count()

    def node(self, name: str):
        """The graph's node `name`; raises `ValueError` when there is none."""
        node = self._by_name.get(name)
        if node is None:
            raise ValueError(f"The dataset graph has no node {name!r}.")
        return node

    def apply(self, rewrite: Rewrite) -> None:
        """Makes one rewrite on the graph; raises `ValueError` where it does not apply."""
        node = self.node(rewrite.node)
        if rewrite.kind in (PREFETCH, *OPTION_KINDS):
            # The end of the pipeline as it is now: an earlier rewrite (a
            # vectorised map) may have moved another stage last.
            node = self.node(self.retval.input[0])
        if rewrite.kind == PARALLEL_MAP:
            self._expect(node, rewrite, "MapDataset")
            node.op = "ParallelMapDatasetV2"
            self._add_inputs(node, [self._int64(_AUTOTUNE)])
            if "force_synchronous" in node.attr:
                del node.attr["force_synchronous"]
            node.attr["deterministic"].s = b"true"
        elif rewrite.kind == PARALLEL_INTERLEAVE:
            self._expect(node, rewrite, "InterleaveDataset")
            node.op = "ParallelInterleaveDatasetV4"
            # buffer_output_elements, prefetch_input_elements, num_parallel_calls:
            # what `interleave(num_parallel_calls=...)` passes.
            self._add_inputs(node, [self._int64(_AUTOTUNE) for _ in range(3)])
            node.attr["deterministic"].s = b"true"
        elif rewrite.kind == AUTOTUNE_PARALLELISM:
            self._expect(node, rewrite, *TUNABLE_INPUT)
            position, _ = TUNABLE_INPUT[node.op]
            data = [index for index, name in enumerate(node.input) if not name.startswith("^")]
            node.input[data[position]] = self._int64(_AUTOTUNE)
        elif rewrite.kind == PREFETCH:
            self._insert_after(node, "PrefetchDataset", [self._int64(_AUTOTUNE)], {
                "slack_period": ("i", 0),
                "legacy_autotune": ("b", True),
                "buffer_size_min": ("i", 0),
            })
        elif rewrite.kind == CACHE:
            if rewrite.fill_elements is not None:
                # A timed pass's cache of the first elements: read back at
                # the rate of a whole one, filled in a few batches.
                node = self._insert_after(
                    node, "TakeDataset", [self._int64(rewrite.fill_elements)], {}
                )
            filename = self._string(rewrite.filename or "")
            self._insert_after(node, "CacheDatasetV2", [filename, self._memory_cache()], {})
        elif rewrite.kind == VECTORIZE:
            self._expect(node, rewrite, "MapDataset", "ParallelMapDatasetV2")
            self._vectorize(node, self.node(rewrite.batch_node or ""))
        elif rewrite.kind == PARALLEL_BATCH:
            self._expect(node, rewrite, "BatchDatasetV2")
            # BatchDatasetV2(input, batch_size, drop_remainder) becomes
            # ParallelBatchDataset(input, batch_size, num_parallel_calls, drop_remainder).
            data = [name for name in node.input if not name.startswith("^")]
            control = [name for name in node.input if name.startswith("^")]
            node.op = "ParallelBatchDataset"
            del node.input[:]
            node.input.extend([data[0], data[1], self._int64(_AUTOTUNE), data[2], *control])
            node.attr["deterministic"].s = b"default"
        elif rewrite.kind == REORDER:
            if node.op == "MapDataset":
                self.apply(dataclasses.replace(rewrite, kind=PARALLEL_MAP))
            elif node.op == "InterleaveDataset":
                self.apply(dataclasses.replace(rewrite, kind=PARALLEL_INTERLEAVE))
            self._expect(node, rewrite, "ParallelMapDatasetV2", "ParallelInterleaveDatasetV4")
            node.attr["deterministic"].s = b"false"
        elif rewrite.kind in OPTION_KINDS:
            self._insert_after(node, "OptionsDataset", [], {
                "serialized_options": ("s", serialized_options(rewrite.options)),
            })
        elif rewrite.kind == GENERATOR_COPIES:
            self._expect(node, rewrite, "FlatMapDataset")
            self._generator_copies(node, rewrite.copies or 1)
        else:
            raise ValueError(f"Unknown rewrite kind {rewrite.kind!r}; expected one of {KINDS}.")

    def _generator_copies(self, flat_map, copies: int) -> None:
        """Reads `copies` generators at once where `from_generator` reads one.

        `from_generator` is a flat map over one dummy element whose function
        starts a generator. Repeating that element and interleaving the flat
        map's function over the copies, `copies` at a time on as many
        threads, runs as many generators side by side, each from its first
        element.
        """
        self._insert_after(self.node(flat_map.input[0]), "RepeatDataset", [self._int64(copies)], {})
        flat_map.op = "ParallelInterleaveDatasetV4"
        # cycle_length, block_length, buffer_output_elements,
        # prefetch_input_elements, num_parallel_calls.
        self._add_inputs(flat_map, [
            self._int64(copies), self._int64(1), self._int64(_AUTOTUNE),
            self._int64(_AUTOTUNE), self._int64(copies),
        ])
        flat_map.attr["deterministic"].s = b"false"

    def _vectorize(self, map_node, batch_node) -> None:
        """Moves `batch_node` before `map_node`, which then maps whole batches."""
        if batch_node.op not in ("BatchDatasetV2", "ParallelBatchDataset"):
            raise ValueError(f"{batch_node.name!r} is a {batch_node.op}, not a batch.")
        if batch_node.input[0] != map_node.name:
            raise ValueError(f"{batch_node.name!r} does not read from {map_node.name!r}.")
        data = [name for name in batch_node.input if not name.startswith("^")]
        size = self._const_value(data[1])
        drop = self._const_value(data[-1])
        rows = int(size) if drop else -1
        source = self.node(map_node.input[0])
        types, shapes = _output_signature(source)
        del batch_node.attr["output_types"].list.type[:]
        batch_node.attr["output_types"].list.type.extend(types)
        _set_shapes(batch_node, [_batched(shape, rows) for shape in shapes])
        _set_shapes(
            map_node,
            [_batched(shape, rows) for shape in map_node.attr["output_shapes"].list.shape],
        )
        for consumer in self.graph_def.node:
            if consumer is not map_node and consumer.input and consumer.input[0] == batch_node.name:
                consumer.input[0] = map_node.name
        batch_node.input[0] = source.name
        map_node.input[0] = batch_node.name
        # A copy of the function whose argument shapes are the batched ones,
        # as tracing it on batches would record.
        library = {f.signature.name: f for f in self.graph_def.library.function}
        original = library.get(map_node.attr["f"].func.name)
        if original is not None:
            copy = type(original)()
            copy.CopyFrom(original)
            copy.signature.name = self._function_name(original.signature.name, library)
            for index in range(len(types)):
                attrs = copy.arg_attr[index].attr if index in copy.arg_attr else None
                if attrs is not None and "_output_shapes" in attrs:
                    listed = attrs["_output_shapes"].list.shape
                    batched = [_batched(shape, rows) for shape in listed]
                    del listed[:]
                    listed.extend(batched)
            self.graph_def.library.function.append(copy)
            map_node.attr["f"].func.name = copy.signature.name

    def _function_name(self, name: str, library) -> str:
        # Digits added to the trailing number keep the name tf.data gave the
        # function readable as the user's (`__inference_..._<n>`).
        stem = name if re.search(r"_\d+$", name) else f"{name}_"
        while True:
            candidate = f"{stem}0{next(self._names)}"
            if candidate not in library:
                return candidate

    def _const_value(self, name: str):
        tf = tensorflow()
        node = self.node(name.split(":")[0])
        if node.op != "Const":
            raise ValueError(f"{name!r} is not a constant.")
        return tf.make_ndarray(node.attr["value"].tensor).item()

    def renew_caches(self) -> None:
        """Gives every memory cache a new, unshared buffer: it starts empty."""
        tf = tensorflow()
        for node in list(self.graph_def.node):
            if node.op != "CacheDatasetV2":
                continue
            resource = self._by_name.get(node.input[2].split(":")[0])
            if resource is None or resource.op != "Const":
                continue
            handle = tf.compat.v1.NodeDef()
            handle.CopyFrom(resource)
            handle.name = self._unique("cache_buffer")
            handle.attr["value"].tensor.resource_handle_val[0].name = (
                f"kpt_memory_cache_{uuid.uuid4().hex}"
            )
            self._add(handle)
            node.input[2] = handle.name

    def seed_generator_inputs(self) -> List[Tuple[Any, int]]:
        """(node, input index) of every input that is a dataset's seed generator."""
        found = []
        for node in self.graph_def.node:
            for index, name in enumerate(node.input):
                source = self._by_name.get(name.split(":")[0])
                if source is not None and source.op == "Const" and _is_seed_generator(source):
                    found.append((node, index))
        return found

    def renew_seed_generators(self) -> None:
        """Gives every seed generator a new one, seeded as the dataset's own was."""
        tf = tensorflow()
        for node, index in self.seed_generator_inputs():
            handle = tf.compat.v1.NodeDef()
            handle.CopyFrom(self._by_name[node.input[index].split(":")[0]])
            handle.name = self._unique("seed_generator")
            # A name no resource has yet: a fresh generator, seeded as the
            # dataset's own was when it was made.
            handle.attr["value"].tensor.resource_handle_val[0].name = (
                f"kpt_seed_generator_{uuid.uuid4().hex}"
            )
            self._add(handle)
            node.input[index] = handle.name

    # Internals.

    @staticmethod
    def _expect(node, rewrite: Rewrite, *ops: str) -> None:
        if node.op not in ops:
            raise ValueError(
                f"Rewrite {rewrite.kind!r} applies to {' / '.join(ops)} nodes, but "
                f"{node.name!r} is a {node.op}."
            )

    @staticmethod
    def _add_inputs(node, names: List[str]) -> None:
        data = [name for name in node.input if not name.startswith("^")]
        control = [name for name in node.input if name.startswith("^")]
        del node.input[:]
        node.input.extend(data + names + control)

    def _insert_after(self, upstream, op: str, extra_inputs: List[str], attrs):
        """Puts a new node `op` between `upstream` and the stage it fed; returns it."""
        tf = tensorflow()
        types, shapes = _output_signature(upstream)
        node = tf.compat.v1.NodeDef(name=self._unique(op), op=op)
        node.input.extend([upstream.name, *extra_inputs])
        node.attr["output_types"].list.type.extend(types)
        node.attr["output_shapes"].list.shape.extend(shapes)
        node.attr["metadata"].s = b""
        for name, (field, value) in attrs.items():
            setattr(node.attr[name], field, value)
        # Only the next stage along the pipeline reads from the new one; a
        # dataset captured by a function elsewhere keeps reading the original.
        for consumer in self.graph_def.node:
            if consumer.input and consumer.input[0] == upstream.name:
                consumer.input[0] = node.name
        return self._add(node)

    def _memory_cache(self) -> str:
        tf = tensorflow()
        template = graph_def_of(tf.data.Dataset.range(0).cache())
        resource = next(
            node
            for node in template.node
            if node.op == "Const" and node.attr["dtype"].type == tf.resource.as_datatype_enum
        )
        handle = tf.compat.v1.NodeDef()
        handle.CopyFrom(resource)
        handle.name = self._unique("cache_buffer")
        self._add(handle)
        return handle.name

    def _int64(self, value: int) -> str:
        tf = tensorflow()
        return self._const(tf.make_tensor_proto(value, tf.int64), tf.int64)

    def _string(self, value: str) -> str:
        tf = tensorflow()
        return self._const(tf.make_tensor_proto(value, tf.string), tf.string)

    def _const(self, tensor, dtype) -> str:
        tf = tensorflow()
        node = tf.compat.v1.NodeDef(name=self._unique("Const"), op="Const")
        node.attr["dtype"].type = dtype.as_datatype_enum
        node.attr["value"].tensor.CopyFrom(tensor)
        self._add(node)
        return node.name

    def _unique(self, stem: str) -> str:
        while True:
            name = f"kpt/{stem}_{next(self._names)}"
            if name not in self._by_name:
                return name

    def _add(self, node):
        self.graph_def.node.append(node)
        # The proto copies the node on append; index the copy, which later edits change.
        self._by_name[node.name] = self.graph_def.node[-1]
        return self.graph_def.node[-1]


def _is_seed_generator(const) -> bool:
    handles = const.attr["value"].tensor.resource_handle_val
    return bool(handles) and "SeedGenerator" in handles[0].maybe_type_name
