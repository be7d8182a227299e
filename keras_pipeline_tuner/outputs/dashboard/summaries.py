"""The plugin-tagged summaries the "Input pipeline" dashboard reads.

All of them go to the tuner's run (`<log_dir>/pipeline_tuner`) and carry the
plugin name `PLUGIN_NAME`, which is what makes TensorBoard list the tab.

Tags (under `input_pipeline/dashboard/`):

- `steps/<block>`: the training steps whose numbers fall in one block of
  `BLOCK_STEPS`, as a float64 tensor of rows `STEP_COLUMNS`: one a step for a
  fit's first steps, then one a block of 10, 100, ... steps (see
  `outputs.downsampling`), whose `first` step, largest wait, compute and step
  time the row keeps beside the means, so that a stall stays visible. The block being
  filled is written again, whole, as steps come in; TensorBoard keeps the latest
  write of every tag, so each step row is kept once, however long the run, while
  TensorBoard keeps only a few samples of each tag of a third-party plugin.
- `report`: the `Report` as JSON.
- `profile_stages`: the profiler window's timeline rows (step markers, batch
  fetches, one row per tf.data stage), as JSON.
- `tune`: a `kpt.tune` result, as JSON (`write_tune_result`).
"""

import dataclasses
import json
import os
from typing import TYPE_CHECKING
from typing import Any
from typing import Iterator
from typing import Tuple
from typing import Union

import numpy as np

from keras_pipeline_tuner._util.json_codec import encode_json_value
from keras_pipeline_tuner._util.tf_import import tensorflow
from keras_pipeline_tuner.profiling.capture import PROFILE_RUN

if TYPE_CHECKING:
    from tensorboard.compat.proto import summary_pb2

PLUGIN_NAME = "keras_pipeline_tuner"
RUN = PROFILE_RUN  # the run of the profiler window and the other TensorBoard outputs
# Under the tuner's tag namespace, beside its scalars, text and image.
TAG_PREFIX = "input_pipeline/dashboard/"
STEPS_TAG_PREFIX = f"{TAG_PREFIX}steps/"
REPORT_TAG = f"{TAG_PREFIX}report"
PROFILE_STAGES_TAG = f"{TAG_PREFIX}profile_stages"
TUNE_TAG = f"{TAG_PREFIX}tune"
# A row: its last step, the epoch and start of its first, mean wait and compute
# (seconds), its first step, and the largest wait, compute and step time.
STEP_COLUMNS = (
    "step", "epoch", "start", "wait", "compute", "first", "wait_max", "compute_max", "step_max"
)
# The first five, all version 1 wrote (one row a step, or a block's means).
V1_COLUMNS = 5
BLOCK_STEPS = 1000
# Version of the content layout, in the summary metadata, so later readers can tell.
CONTENT_VERSION = b"2"


def widened(rows: np.ndarray) -> np.ndarray:
    """Rows of version 1's five columns as `STEP_COLUMNS` (each row its own extremes).

    Example:

    >>> widened(np.array([[3.0, 0.0, 10.0, 0.5, 0.25]])).tolist()
    [[3.0, 0.0, 10.0, 0.5, 0.25, 3.0, 0.5, 0.25, 0.75]]
    """
    rows = np.asarray(rows, dtype=np.float64).reshape(-1, V1_COLUMNS)
    wait, compute = rows[:, 3], rows[:, 4]
    step = np.nan_to_num(wait) + compute
    return np.concatenate([rows, np.stack([rows[:, 0], wait, compute, step], axis=1)], axis=1)


def summary_metadata() -> "summary_pb2.SummaryMetadata":
    """The `SummaryMetadata` that tags a summary as this plugin's.

    Returns:
        A `tensorboard.compat.proto.summary_pb2.SummaryMetadata`.

    Example:

    >>> summary_metadata().plugin_data.plugin_name
    'keras_pipeline_tuner'
    """
    from tensorboard.compat.proto import summary_pb2

    return summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(
            plugin_name=PLUGIN_NAME, content=CONTENT_VERSION
        ),
        # Without a data class, TensorBoard's data provider lists nothing.
        data_class=summary_pb2.DATA_CLASS_TENSOR,
    )


def steps_tag(block: int) -> str:
    """The tag of the step rows of block `block` (steps `block * BLOCK_STEPS + 1` on).

    Example:

    >>> steps_tag(3)
    'input_pipeline/dashboard/steps/000003'
    """
    return f"{STEPS_TAG_PREFIX}{block:06d}"


def block_of(step: int) -> int:
    """The block that holds step number `step` (steps are numbered from 1).

    Example:

    >>> block_of(1), block_of(1000), block_of(1001)
    (0, 0, 1)
    """
    return (int(step) - 1) // BLOCK_STEPS


def json_text(value: Any) -> str:
    """A dataclass (or plain data) as compact JSON, enums as their values.

    Example:

    >>> json_text({"ratio": 1.5})
    '{"ratio": 1.5}'
    """
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    return json.dumps(value, default=encode_json_value, allow_nan=False)


class StepBlocks:
    """Groups training step rows into the blocks that are written as `steps/<block>`.

    Holds the rows of the block being filled only, so its memory is bounded by
    `BLOCK_STEPS` rows whatever the run's length.

    Example:

    >>> blocks = StepBlocks()
    >>> rows = np.zeros((3, len(STEP_COLUMNS)))
    >>> rows[:, 0] = [999, 1000, 1001]
    >>> [(block, len(block_rows)) for block, block_rows in blocks.add(rows)]
    [(0, 2), (1, 1)]
    """

    def __init__(self):
        self._block = None
        self._rows = np.zeros((0, len(STEP_COLUMNS)))

    def reset(self) -> None:
        """Forgets the block being filled (a new run counts steps from 1 again)."""
        self._block = None
        self._rows = np.zeros((0, len(STEP_COLUMNS)))

    def add(self, rows: np.ndarray) -> Iterator[Tuple[int, np.ndarray]]:
        """Adds new rows, in step order; yields each touched block with all its rows.

        Args:
            rows: float64 array of shape `(n, len(STEP_COLUMNS))`.

        Yields:
            `(block, rows of that block so far)`.
        """
        blocks = (rows[:, 0].astype(np.int64) - 1) // BLOCK_STEPS
        for block in np.unique(blocks):
            new = rows[blocks == block]
            if block != self._block:
                self._block, self._rows = int(block), new
            else:
                self._rows = np.concatenate([self._rows, new])
            yield int(block), self._rows


def write_step_block(block: int, rows: np.ndarray, events=None) -> None:
    """Writes one block of step rows to the default summary writer.

    Args:
        block: the block number.
        rows: float64 array of shape `(n, len(STEP_COLUMNS))`.
        events: an `EventWriter` to write through instead, where TensorFlow is
            not loaded (the JAX and torch backends).
    """
    if events is not None:
        rows = np.asarray(rows, dtype=np.float64)
        events.tensor(steps_tag(block), rows, int(rows[-1, 0]), summary_metadata())
        return
    tf = tensorflow()
    tf.summary.write(
        steps_tag(block),
        tf.constant(rows, dtype=tf.float64),
        step=int(rows[-1, 0]),
        metadata=summary_metadata(),
    )


def write_json(tag: str, text: str, step: int, events=None) -> None:
    """Writes JSON text (see `json_text`) as a string summary to the default writer.

    Args:
        tag: `REPORT_TAG`, `PROFILE_STAGES_TAG` or `TUNE_TAG`.
        text: the JSON text.
        step: the training step it belongs to.
        events: an `EventWriter` to write through instead (no TensorFlow).
    """
    if events is not None:
        events.tensor(tag, text, step, summary_metadata())
        return
    tf = tensorflow()
    tf.summary.write(tag, tf.constant(text), step=step, metadata=summary_metadata())


def write_tune_result(log_dir: Union[str, os.PathLike], result: Any) -> str:
    """Writes a `kpt.tune` result where the dashboard shows it beside the run.

    Pass the `log_dir` of the `PipelineTuner` that trained on the tuned
    pipeline (or any log dir): the "Input pipeline" tab then lists each
    rewrite, kept or not, with its measured ratio.

    Args:
        log_dir: the run's log dir; the result goes to its `pipeline_tuner` run.
        result: the `TuneResult` that `kpt.tune` returned.

    Returns:
        The run directory written to.

    Example:

    ```python
    tuned_ds, result = kpt.tune(train_ds)
    tuner = kpt.PipelineTuner(log_dir="logs/tuned")
    model.fit(tuned_ds, callbacks=[tuner])
    kpt.write_tune_result("logs/tuned", result)
    ```
    """
    if not dataclasses.is_dataclass(result) or not hasattr(result, "rewrites"):
        raise TypeError(
            f"`result` must be the TuneResult that kpt.tune returned, got "
            f"{type(result).__name__}. Call `tuned_ds, result = kpt.tune(ds)` and pass `result`."
        )
    tf = tensorflow()
    run_dir = os.path.join(os.fspath(log_dir), RUN)
    writer = tf.summary.create_file_writer(run_dir)
    with writer.as_default(), tf.summary.record_if(True):
        write_json(TUNE_TAG, json_text(result), step=0)
    writer.flush()
    writer.close()
    return run_dir
