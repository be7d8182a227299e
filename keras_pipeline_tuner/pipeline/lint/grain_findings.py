"""Advice of Grain's own kind for the slow stage of a Grain pipeline.

A Grain pipeline is not a tf.data graph: its knobs are where a transformation
sits (a `MapDataset` stage is read on `ReadOptions.num_threads` threads by
`to_iter_dataset`; an `IterDataset` stage runs on the thread that reads the
batches, one element at a time) and how many threads or worker processes read
it. Which stage is slow comes from Grain's stage timing (`grain_stages`); this
module turns it into a finding with the code to write.
"""

from typing import Optional

from keras_pipeline_tuner.pipeline.graph.model import Pipeline
from keras_pipeline_tuner.pipeline.graph.model import Stage
from keras_pipeline_tuner.pipeline.lint.catalogue import GRAIN_READ_THREADS
from keras_pipeline_tuner.pipeline.lint.catalogue import GRAIN_SEQUENTIAL_STAGE
from keras_pipeline_tuner.pipeline.lint.findings import Finding
from keras_pipeline_tuner.pipeline.lint.findings import Findings
from keras_pipeline_tuner.pipeline.lint.findings import Severity

# Threads advised for a stage read by `to_iter_dataset`: Grain's own default.
READ_THREADS = 16
_GIL_NOTE = (
    " Threads run Python that holds the GIL one at a time: for pure-Python work, "
    ".mp_prefetch(grain.MultiprocessingOptions(num_workers=...)) at the end of the "
    "pipeline runs it in worker processes instead (in Grain 0.2.x under absl.app.run, "
    "or after absl.flags.FLAGS.mark_as_parsed())."
)


def grain_stage_findings(
    stage: str,
    node: str,
    grain_name: str,
    on_read_threads: bool,
    read_threads: Optional[int] = None,
) -> Findings:
    """The finding for the slowest stage of a Grain pipeline.

    Args:
        stage: the stage as code, e.g. "map(slow_parse)".
        node: the stage's node in Grain's timing (`IteratorTime.stage_node`).
        grain_name: Grain's name for it, e.g. "MapDatasetIterator(...)".
        on_read_threads: whether it is a `MapDataset` stage read on
            `ReadOptions.num_threads` threads (else it runs on the reading
            thread, after `to_iter_dataset`).
        read_threads: `ReadOptions.num_threads` of the pipeline, if known.

    Returns:
        `Findings` with one finding about the stage: "grain-sequential-stage"
        when it runs on the reading thread, "grain-read-threads" when it is read
        on threads already.

    Example:

    >>> findings = grain_stage_findings(
    ...     "map(parse)", "grain:1", "MapDatasetIterator(transform=parse)", False, 0)
    >>> findings.ids
    ['grain-sequential-stage']
    """
    kind, _, function = stage.partition("(")
    function = function.rstrip(")") or "fn"
    op = grain_name.split("(", 1)[0]
    pipeline_stage = Stage(node=node, op=op, kind=f"grain {kind}")
    threads = READ_THREADS if not read_threads else max(READ_THREADS, 2 * read_threads)
    if on_read_threads:
        finding_id = GRAIN_READ_THREADS
        reason = (
            f"Grain times {stage} as the slowest stage of the pipeline; it is read on "
            f"{read_threads} thread(s) (ReadOptions.num_threads). More threads read more "
            "elements at once while the model trains."
        )
        fix = (
            f"ds = ds.to_iter_dataset(grain.ReadOptions(num_threads={threads}, "
            "prefetch_buffer_size=64))"
        )
    else:
        finding_id = GRAIN_SEQUENTIAL_STAGE
        reason = (
            f"Grain times {stage} as the slowest stage of the pipeline, and it comes "
            "after to_iter_dataset: an IterDataset transformation runs on the thread "
            "that reads the batches, one element after another, while nothing else "
            "loads. Before to_iter_dataset, on the MapDataset, it is read on "
            "ReadOptions.num_threads threads ahead of the step."
        )
        fix = (
            f"ds = (ds_before_to_iter_dataset.{kind}({function})\n"
            f"      .to_iter_dataset(grain.ReadOptions(num_threads={threads}, "
            "prefetch_buffer_size=64)))  # then the IterDataset stages, e.g. .batch(...)"
        )
    finding = Finding(
        id=finding_id,
        severity=Severity.WARNING,
        stage=stage,
        node=node,
        op=op,
        function=function if kind == "map" else None,
        reason=reason + _GIL_NOTE,
        fix=fix,
    )
    return Findings([finding], Pipeline(stages=[pipeline_stage]))
