"""A tuned pipeline as the Python a user writes, to paste in place of their own lines.

`kpt.tune` changes a pipeline's graph; the user keeps their script. This module
writes the tuned stages as `ds = ds.map(load_image, num_parallel_calls=
tf.data.AUTOTUNE)` lines, with the user's own function names, from the first
stage the tuning changed to the end: the lines before it stay as they are.
"""

import re
from typing import Any
from typing import Dict
from typing import List
from typing import Optional

from keras_pipeline_tuner.pipeline.graph import kinds
from keras_pipeline_tuner.pipeline.graph.model import Pipeline

# Stages users write as `tf.data.Dataset` methods, so as `ds = ds.<label>`.
_METHODS = frozenset(
    {
        kinds.MAP, kinds.FILTER, kinds.FLAT_MAP, kinds.INTERLEAVE, kinds.BATCH,
        kinds.PADDED_BATCH, kinds.UNBATCH, kinds.REBATCH, kinds.PREFETCH, kinds.CACHE,
        kinds.SHUFFLE, kinds.REPEAT, kinds.TAKE, kinds.SKIP, kinds.SHARD, kinds.IGNORE_ERRORS,
        kinds.SNAPSHOT, kinds.SCAN, kinds.WINDOW, kinds.GROUP_BY_WINDOW,
    }
)
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def tuned_code(
    original: Pipeline,
    tuned: Pipeline,
    options: Dict[str, Any],
) -> str:
    """The tuned pipeline's changed lines, as Python code.

    Args:
        original: the pipeline before tuning.
        tuned: the tuned pipeline, read from the tuned dataset.
        options: the `tf.data.Options` fields the tuning set, by dotted path.

    Returns:
        Lines of Python starting with a comment naming the last unchanged
        stage (the `ds` they continue from), or "" when nothing changed.

    Example:

    >>> from keras_pipeline_tuner.pipeline.graph.reader import read_pipeline
    >>> before = read_pipeline(tf.data.Dataset.range(4).batch(2))
    >>> after = read_pipeline(
    ...     tf.data.Dataset.range(4).batch(2).prefetch(tf.data.AUTOTUNE))
    >>> print(tuned_code(before, after, {}))
    # ds: your pipeline up to and including batch(2)
    ds = ds.prefetch(tf.data.AUTOTUNE)
    """
    old = _chain(original)
    new = _chain(tuned)
    common = 0
    # Node names change when the tuned dataset is serialised again: stages
    # are matched by what they do.
    while common < min(len(old), len(new)) and old[common].label == new[common].label:
        common += 1
    changed = new[common:]
    if not changed:
        return ""
    lines: List[str] = []
    if common:
        lines.append(f"# ds: your pipeline up to and including {new[common - 1].label}")
    # The tuning's options datasets come after the user's own: the first
    # ones in the changed stages are the user's, the rest the tuning's.
    users = sum(1 for stage in old[common:] if stage.kind == kinds.WITH_OPTIONS)
    seen = 0
    for stage in changed:
        if stage.kind == kinds.WITH_OPTIONS:
            seen += 1
            if seen > users:
                if options and seen == users + 1:
                    lines.extend(_lines(stage, options))
                continue
        lines.extend(_lines(stage, None))
    return "\n".join(lines)


def _chain(pipeline) -> list:
    final = pipeline.final
    if final is None:
        return []
    return [*reversed(list(pipeline.main_chain(final))), final]


def _lines(stage, options: Optional[Dict[str, Any]]) -> List[str]:
    if stage.kind == kinds.WITH_OPTIONS:
        # The tuning's options come last, after any of the user's own.
        if options is None:
            return ["ds = ds.with_options(options)  # your own options, as before"]
        lines = ["options = tf.data.Options()"]
        lines += [f"options.{path} = {value!r}" for path, value in options.items()]
        lines.append("ds = ds.with_options(options)")
        return lines
    if stage.kind not in _METHODS:
        return [f"# {stage.label}: as in your pipeline"]
    code = re.sub(r"\bAUTOTUNE\b", "tf.data.AUTOTUNE", stage.label)
    line = f"ds = ds.{code}"
    name = stage.function_name
    if name is not None and not _IDENTIFIER.match(name):
        line += f"  # {name}: your function"
    return [line]
