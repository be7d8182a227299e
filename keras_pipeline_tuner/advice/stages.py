"""Stages as the advice names them: labels parsed and matched across the evidence.

The profiler, the inspection and the timing of the user's calls all label a
stage as code ("map(load_image)"); the inspection may add arguments, and graph
nodes tell apart two stages written alike. One place decides when two of them
are the same stage.
"""

import re
from typing import TYPE_CHECKING
from typing import Optional

if TYPE_CHECKING:
    pass


_STAGE = re.compile(r"^\s*([\w.]+)\s*(?:\(\s*([^,)\s]*)[^)]*\))?")


def parse_stage(stage: Optional[str]):
    match = _STAGE.match(stage or "")
    if not match:
        return "", None
    return match.group(1), (match.group(2) or None)


def same_stage(a: Optional[str], b: Optional[str]) -> bool:
    """Whether two stage labels name the same transformation.

    The profiler and the inspection both label stages as code, e.g.
    "map(load_image)"; the inspection may add arguments
    ("map(load_image, num_parallel_calls=4)"), which do not change the stage.
    """
    if not a or not b:
        return False
    if a.strip() == b.strip():
        return True
    kind_a, function_a = parse_stage(a)
    kind_b, function_b = parse_stage(b)
    return bool(kind_a) and kind_a == kind_b and function_a is not None and function_a == function_b


def same_place(stage_a, node_a, stage_b, node_b) -> bool:
    # Graph nodes tell apart two stages written alike (two `map(f)`); labels
    # are all there is when either side did not read the graph.
    if node_a and node_b:
        return node_a == node_b
    return same_stage(stage_a, stage_b)


def finding_node(finding) -> Optional[str]:
    return finding.node or None


def severity_of(item) -> str:
    return str(getattr(item.severity, "value", item.severity))
