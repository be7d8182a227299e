"""The tf.data service in a pipeline: how it reads, and what it changes.

`dataset.apply(tf.data.experimental.service.distribute(...))` registers the
dataset with the service's dispatcher; the service's workers run it, and the
training process reads the elements over gRPC. The training process's graph
then holds only a `DataServiceDataset` op (with the dispatcher's address and the
job's name), followed by a parallel map tf.data adds to uncompress elements,
and whatever comes after: the transformations that run on the workers are not
in it. The graph reader shows that read as the `distribute(...)` stage the user
wrote (`graph.service_folding`); this module says what the inspection can and
cannot see of it.
"""

from typing import List

from keras_pipeline_tuner.pipeline.graph import kinds
from keras_pipeline_tuner.pipeline.graph.model import Pipeline
from keras_pipeline_tuner.pipeline.graph.model import Stage

GUIDE_URL = "https://www.tensorflow.org/api_docs/python/tf/data/experimental/service"


def service_stages(pipeline: Pipeline) -> List[Stage]:
    """The stages of `pipeline` that read from the tf.data service."""
    return [stage for stage in pipeline.stages if stage.kind == kinds.DISTRIBUTE]


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
