"""The order `tune` tries its candidates in: the stage that costs the most first.

Whether a rewrite pays off is decided by timing it; which one to time first is
decided by evidence that costs far less: each stage's own time, from short
reads of the pipeline cut after it (`graph_editing.cut_at`, rebuilt with seeds
and caches of its own). A map or a filter reads one input element per element
it gives (a filter may read more: its cost is then overstated, which only moves
it earlier), so its own cost is the time of the prefix ending at it less that
of the prefix ending at its input; a stage that makes elements of its own (a
source, an interleave) costs what its prefix costs. Each cost is put per
element of the whole pipeline: times the elements that the batches after the
stage gather into one.

Only the rewrites that change one stage's parallelism or vectorise it are
reordered, among themselves and in the places they held; a cache, the final
prefetch and the options keep theirs (`rewrites.KINDS`). Without a cost for
every stage concerned (a read that failed, an element that is not plain
tensors, a stage after an unbatch), the order stays by kind.
"""

import dataclasses
import time
from typing import Dict
from typing import List
from typing import Optional

from keras_pipeline_tuner.pipeline.graph import kinds
from keras_pipeline_tuner.pipeline.tune.graph_editing import cut_at
from keras_pipeline_tuner.pipeline.tune.rebuild import rebuild
from keras_pipeline_tuner.pipeline.tune.rewrites import AUTOTUNE_PARALLELISM
from keras_pipeline_tuner.pipeline.tune.rewrites import PARALLEL_INTERLEAVE
from keras_pipeline_tuner.pipeline.tune.rewrites import PARALLEL_MAP
from keras_pipeline_tuner.pipeline.tune.rewrites import VECTORIZE

# Rewrites of one stage's own work: the ones ordered by that stage's cost.
STAGE_KINDS = frozenset({VECTORIZE, PARALLEL_INTERLEAVE, PARALLEL_MAP, AUTOTUNE_PARALLELISM})
# Elements read from each prefix, at most, after one untimed (its start-up).
READ_ELEMENTS = 16
# Share of the budget all the reads may take together.
READ_SHARE = 0.05
# Stages that give one element per input element, or fewer (a filter).
_ONE_TO_ONE = frozenset({kinds.MAP, kinds.FILTER})
# Stages after which elements per output element are not known.
_REGROUPING = frozenset({kinds.UNBATCH, kinds.REBATCH, kinds.FLAT_MAP, kinds.INTERLEAVE})


@dataclasses.dataclass
class StageCost:
    """One stage's own time, per element of the whole pipeline.

    Attributes:
        stage: the stage as the user wrote it, e.g. "map(load)".
        node: its graph node.
        ms: milliseconds of its own work per element the pipeline gives.

    Example:

    >>> StageCost("map(load)", "MapDataset/_3", 12.5).describe()
    'map(load) 12.50 ms'
    """

    stage: str
    node: str
    ms: float

    def describe(self) -> str:
        """The stage and its cost, as the tuning notes say it."""
        return f"{self.stage} {self.ms:.2f} ms"


def stage_costs(pipeline, graph_def, keep_alive, nodes, limit_s: float) -> List[StageCost]:
    """Each given stage's own time per element of the pipeline, by reading its prefixes.

    Args:
        pipeline: the pipeline, from `graph.reader.read_pipeline`.
        graph_def: the dataset's `GraphDef` (the session's).
        keep_alive: the dataset the graph came from (see `rebuild.rebuild`).
        nodes: the graph nodes of the stages to cost.
        limit_s: the most all the reads may take, in seconds.

    Returns:
        One `StageCost` per node, in `nodes`' order; empty when any one
        cannot be costed (the order then stays by kind).
    """
    deadline = time.perf_counter() + limit_s
    per_read_s = limit_s / max(1, 2 * len(nodes))
    prefix_s: Dict[str, Optional[float]] = {}

    def seconds_per_element(node: str) -> Optional[float]:
        if node not in prefix_s:
            prefix_s[node] = _read_seconds(graph_def, keep_alive, node, per_read_s, deadline)
        return prefix_s[node]

    costs = []
    for node in nodes:
        stage = pipeline.stage(node)
        factor = _elements_per_output(pipeline, stage)
        own = seconds_per_element(node)
        if factor is None or own is None:
            return []
        if stage.kind in _ONE_TO_ONE and stage.inputs:
            upstream = seconds_per_element(stage.inputs[0])
            if upstream is None:
                return []
            own = max(0.0, own - upstream)
        costs.append(StageCost(stage.label, node, own * factor * 1e3))
    return costs


def order_note(costs: List[StageCost]) -> str:
    """The tuning note that says the order and its figures, costliest stage first.

    Example:

    >>> order_note([StageCost("map(scale)", "Map/_1", 0.1), StageCost("map(load)", "Map/_2", 20.0)])
    "Rewrites of single stages were tried costliest stage first, by each stage's own time \
per element of the pipeline from short reads of its prefix: map(load) 20.00 ms, map(scale) 0.10 ms."
    """
    ranked = sorted(costs, key=lambda cost: -cost.ms)
    return (
        "Rewrites of single stages were tried costliest stage first, by each stage's own "
        "time per element of the pipeline from short reads of its prefix: "
        + ", ".join(cost.describe() for cost in ranked)
        + "."
    )


def ordered(candidates, costs: List[StageCost]):
    """The candidates with the stage rewrites in order of their stage's cost, largest first.

    Args:
        candidates: rewrites in `rewrites.KINDS` order (`planning.plan_rewrites`).
        costs: from `stage_costs`; empty leaves the order as it is.

    Returns:
        A new list: the `STAGE_KINDS` rewrites fill the places they held,
        costliest stage first (by kind within a stage); the rest stay put.

    Example:

    >>> from keras_pipeline_tuner.pipeline.tune.rewrites import Rewrite
    >>> cheap = Rewrite("parallel-map", "Map/_1", "map(scale)", "")
    >>> dear = Rewrite("parallel-map", "Map/_2", "map(load)", "")
    >>> prefetch = Rewrite("prefetch", "Batch/_3", "batch(8)", "")
    >>> costs = [StageCost("map(scale)", "Map/_1", 0.1), StageCost("map(load)", "Map/_2", 20.0)]
    >>> [r.stage for r in ordered([cheap, dear, prefetch], costs)]
    ['map(load)', 'map(scale)', 'batch(8)']
    """
    by_node = {cost.node: cost.ms for cost in costs}
    places = [index for index, rewrite in enumerate(candidates) if rewrite.kind in STAGE_KINDS]
    if not by_node or any(candidates[index].node not in by_node for index in places):
        return list(candidates)
    stage_rewrites = sorted(
        (candidates[index] for index in places), key=lambda rewrite: -by_node[rewrite.node]
    )
    result = list(candidates)
    for index, rewrite in zip(places, stage_rewrites):
        result[index] = rewrite
    return result


def _elements_per_output(pipeline, stage) -> Optional[int]:
    """Elements of `stage` per element of the whole pipeline (its batches' sizes), or None."""
    factor = 1
    current = stage
    while current.node != pipeline.final.node:
        readers = [later for later in pipeline.stages if current.node in later.inputs]
        if len(readers) != 1:
            return None
        current = readers[0]
        if current.kind in _REGROUPING:
            return None
        if current.kind in (kinds.BATCH, kinds.PADDED_BATCH):
            size = current.params.get("batch_size")
            if not isinstance(size, int) or size < 1:
                return None
            factor *= size
    return factor


def _read_seconds(graph_def, keep_alive, node, limit_s: float, deadline: float):
    """Seconds per element of the prefix ending at `node`, after its first; None if unknown."""
    cut, spec = cut_at(graph_def, node)
    if spec is None:
        return None
    count = 0
    try:
        iterator = iter(rebuild(cut, spec, keep_alive))
        next(iterator)
        began = time.perf_counter()
        stop = min(deadline, began + limit_s)
        while count < READ_ELEMENTS and time.perf_counter() < stop:
            next(iterator)
            count += 1
    except StopIteration:
        pass
    except Exception:  # noqa: BLE001 - an uncosted stage keeps the kind order.
        return None
    if count == 0:
        return None
    return (time.perf_counter() - began) / count
