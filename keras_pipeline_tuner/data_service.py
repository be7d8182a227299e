"""The tf.data service in a pipeline: how it reads, and what it changes.

`dataset.apply(tf.data.experimental.service.distribute(...))` registers the
dataset with the service's dispatcher; the service's workers run it, and the
training process reads the elements over gRPC. The training process's graph
then holds only a `DataServiceDataset` op (with the dispatcher's address and the
job's name), followed by a parallel map tf.data adds to uncompress elements,
and whatever comes after: the transformations that run on the workers are not
in it. This module shows that read as the `distribute(...)` stage the user
wrote, and says what the inspection can and cannot see.
"""

from typing import List

from keras_pipeline_tuner.pipeline_graph import Pipeline
from keras_pipeline_tuner.pipeline_graph import Stage

SERVICE_OPS = frozenset(
    {"DataServiceDataset", "DataServiceDatasetV2", "DataServiceDatasetV3", "DataServiceDatasetV4"}
)
# The stage kind: the function a user applies to get it.
KIND = "distribute"
FINDING_ID = "data-service"
GUIDE_URL = "https://www.tensorflow.org/api_docs/python/tf/data/experimental/service"
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
    """
    absorbed = {}
    for stage in pipeline.stages:
        if stage.op in SERVICE_OPS:
            stage.kind = KIND
            stage.opaque = False
            stage.params = _service_params(stage.params)
    for stage in pipeline.stages:
        function = stage.function
        if (
            stage.kind == "map"
            and function is not None
            and _UNCOMPRESS in function.graph_name
            and len(stage.inputs) == 1
            and any(s.node == stage.inputs[0] and s.kind == KIND for s in pipeline.stages)
        ):
            absorbed[stage.node] = stage.inputs[0]
    if not absorbed:
        return
    pipeline.stages = [stage for stage in pipeline.stages if stage.node not in absorbed]
    for stage in pipeline.stages:
        stage.inputs = [absorbed.get(node, node) for node in stage.inputs]


def service_stages(pipeline: Pipeline) -> List[Stage]:
    """The stages of `pipeline` that read from the tf.data service."""
    return [stage for stage in pipeline.stages if stage.kind == KIND]


def service_reason(stage: Stage) -> str:
    """Why a read from the tf.data service matters, for the "data-service" finding."""
    return (
        f"{stage.label} reads its elements from the tf.data service: the "
        "transformations before distribute() run on the service's workers, not "
        "in this process, so this inspection sees only what comes after it. The "
        "input wait measured here is the wait for the service's elements; when it "
        "is high, the service needs more workers (or workers with idle CPUs), "
        f"not a change here. Guide: {GUIDE_URL}"
    )


SERVICE_FIX = (
    "Inspect the pipeline the service runs where you build it, before "
    "distributing it:\nprint(kpt.inspect(ds))\n"
    "ds = ds.apply(tf.data.experimental.service.distribute(...))"
)


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
    # `pipeline_graph` (lossless for its few small bytes).
    from tensorflow.core.protobuf import data_service_pb2

    try:
        mode = data_service_pb2.ProcessingModeDef.FromString(serialized.encode("utf-8"))
    except Exception:  # noqa: BLE001 - an unknown encoding only loses the label.
        return "unknown"
    return _MODES.get(mode.sharding_policy, f"sharding_policy={mode.sharding_policy}")
