"""The live tf.data model's stage table as TensorBoard scalars: tags and values of one read."""

import re
from typing import Tuple

# The scalars' tags start with this (one point per stage and quantity a read).
STAGE_TAG_PREFIX = "input_pipeline/stages"


def stage_scalars(table) -> Tuple[tuple, list]:
    """The scalar tags and values of one stage table (see `write_stage_table`).

    Example:

    >>> from keras_pipeline_tuner.profiling.live_model import StageRow, StageTable
    >>> tags, values = stage_scalars(StageTable(rows=(StageRow("map(decode)",
    ...     ms_per_element=0.5, share=1.0, parallelism=2),)))
    >>> tags[0], values[0]
    ('input_pipeline/stages/0_map_decode/ms_per_element', 0.5)
    """
    tags, values = [], []
    for index, row in enumerate(table.rows):
        prefix = f"{STAGE_TAG_PREFIX}/{index}_{stage_tag(row.stage)}"
        tags += [f"{prefix}/ms_per_element", f"{prefix}/share"]
        values += [row.ms_per_element, row.share]
        if row.parallelism is not None:
            tags.append(f"{prefix}/parallelism")
            values.append(float(row.parallelism))
    if table.prefetch_fullness is not None:
        tags.append(f"{STAGE_TAG_PREFIX}/final_prefetch_fullness")
        values.append(table.prefetch_fullness)
    return tuple(tags), values


def stage_tag(label: str) -> str:
    """A stage's label as a summary tag's part: its kind and function name.

    Example:

    >>> stage_tag("map(decode, num_parallel_calls=AUTOTUNE)"), stage_tag("prefetch(AUTOTUNE)")
    ('map_decode', 'prefetch_AUTOTUNE')
    """
    found = re.match(r"\s*([\w.]+)\s*\(\s*([^,()=]*)", label)
    parts = [found.group(1), found.group(2).strip()] if found else [label]
    return re.sub(r"[^A-Za-z0-9_.\-]+", "_", "_".join(part for part in parts if part)).strip("_")
