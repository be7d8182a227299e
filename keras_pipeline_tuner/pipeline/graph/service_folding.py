"""A read from the tf.data service, shown as the `distribute(...)` stage the user wrote.

`dataset.apply(tf.data.experimental.service.distribute(...))` leaves in the
training process's graph a read op (with the dispatcher's address and the
job's name) followed by a map tf.data adds to uncompress the elements. The
graph reader folds the two into one stage of kind `distribute`, labelled with
its processing mode, service address and job name.
"""

from keras_pipeline_tuner.pipeline.graph import kinds
from keras_pipeline_tuner.pipeline.graph.model import Pipeline

# The read ops of the tf.data service.
_SERVICE_OPS = frozenset(
    {"DataServiceDataset", "DataServiceDatasetV2", "DataServiceDatasetV3", "DataServiceDatasetV4"}
)
# tf.data names the function of the map it adds after the read.
_UNCOMPRESS = "DataServiceDataset_uncompress"
# `processing_mode` as users write it, by sharding policy.
_MODES = {
    0: "parallel_epochs",
    1: "distributed_epoch",
    2: "ShardingPolicy.FILE",
    3: "ShardingPolicy.DATA",
    4: "ShardingPolicy.FILE_OR_DATA",
    5: "ShardingPolicy.HINT",
}


def fold_service_stages(pipeline: Pipeline) -> None:
    """Shows each tf.data service read as the `distribute(...)` stage written.

    Names the stage by its processing mode, service address and job name, and
    removes the uncompressing map tf.data adds after it (an implementation
    detail, not a stage of the user's).

    Args:
        pipeline: the `Pipeline` to change in place.

    Example:

    >>> from keras_pipeline_tuner.pipeline.graph.model import Stage
    >>> read = Stage("read", "DataServiceDatasetV4", "DataServiceDatasetV4", opaque=True)
    >>> pipeline = Pipeline(stages=[read])
    >>> fold_service_stages(pipeline)
    >>> str(pipeline)
    'distribute()'
    """
    absorbed = {}
    for stage in pipeline.stages:
        if stage.op in _SERVICE_OPS:
            stage.kind = kinds.DISTRIBUTE
            stage.opaque = False
            stage.params = _service_params(stage.params)
    reads = {stage.node for stage in pipeline.stages if stage.kind == kinds.DISTRIBUTE}
    for stage in pipeline.stages:
        function = stage.function
        if (
            stage.kind == kinds.MAP
            and function is not None
            and _UNCOMPRESS in function.graph_name
            and len(stage.inputs) == 1
            and stage.inputs[0] in reads
        ):
            absorbed[stage.node] = stage.inputs[0]
    if not absorbed:
        return
    pipeline.stages = [stage for stage in pipeline.stages if stage.node not in absorbed]
    for stage in pipeline.stages:
        stage.inputs = [absorbed.get(node, node) for node in stage.inputs]


def _service_params(params):
    mode = params.get("processing_mode")
    result = {}
    if isinstance(mode, str):
        result["processing_mode"] = _processing_mode(mode)
    address, protocol = params.get("address"), params.get("protocol")
    if isinstance(address, str) and address:
        result["service"] = f"{protocol}://{address}" if protocol else address
    job_name = params.get("job_name")
    if isinstance(job_name, str) and job_name:
        result["job_name"] = job_name
    return result


def _processing_mode(serialized: str) -> str:
    # The graph holds a serialized ProcessingModeDef, read back as text by
    # this module (lossless for its few small bytes).
    from tensorflow.core.protobuf import data_service_pb2

    try:
        mode = data_service_pb2.ProcessingModeDef.FromString(serialized.encode("utf-8"))
    except Exception:  # noqa: BLE001 - an unknown encoding only loses the label.
        return "unknown"
    return _MODES.get(mode.sharding_policy, f"sharding_policy={mode.sharding_policy}")
