"""`tune` tries the costliest stage's rewrites first, from short reads of its prefixes."""

import time

import tensorflow as tf

import keras_pipeline_tuner as kpt
from keras_pipeline_tuner.pipeline.graph.reader import graph_def_of
from keras_pipeline_tuner.pipeline.graph.reader import read_pipeline
from keras_pipeline_tuner.pipeline.tune import stage_order
from keras_pipeline_tuner.pipeline.tune.planning import plan_rewrites

# A sleep dominates the slow map's cost whatever the machine's load.
SLOW_S = 0.01


def _python(name, seconds):
    def wait(value):
        time.sleep(seconds)
        return value

    def stage(x):
        # Python that TensorFlow runs sequentially: each map is a candidate.
        value = tf.py_function(wait, [tf.cast(x, tf.float32)], tf.float32)
        value.set_shape(())
        return value

    stage.__name__ = name
    return stage


def two_maps():
    # The cheap map comes first: by kind and graph order it would be tried first.
    return (
        tf.data.Dataset.range(400)
        .map(_python("cheap", 0.0))
        .map(_python("slow", SLOW_S))
        .batch(4)
    )


def test_the_slow_stage_costs_its_sleep_per_element_times_the_batch():
    dataset = two_maps()
    pipeline = read_pipeline(dataset)
    maps = [stage.node for stage in pipeline.stages if stage.kind == "map"]
    costs = stage_order.stage_costs(pipeline, graph_def_of(dataset), dataset, maps, 10.0)
    by_stage = {cost.stage: cost.ms for cost in costs}
    # Per batch of 4: the slow map about 4 sleeps, the cheap one far less. A
    # stage's cost is its prefix's read less its input's, two reads that a
    # busy machine slows apart: half the sleeps at least.
    assert by_stage["map(slow)"] >= 0.5 * 4 * SLOW_S * 1e3
    assert by_stage["map(cheap)"] < by_stage["map(slow)"] / 4


def test_the_costliest_stage_is_tried_first_and_the_rest_keep_their_places():
    dataset = two_maps()
    pipeline = read_pipeline(dataset)
    candidates, _ = plan_rewrites(pipeline)
    maps = [stage.node for stage in pipeline.stages if stage.kind == "map"]
    costs = stage_order.stage_costs(pipeline, graph_def_of(dataset), dataset, maps, 10.0)
    reordered = stage_order.ordered(candidates, costs)
    stage_places = [
        index for index, rewrite in enumerate(candidates)
        if rewrite.kind in stage_order.STAGE_KINDS
    ]
    assert reordered[stage_places[0]].stage == "map(slow)"
    others = [i for i in range(len(candidates)) if i not in stage_places]
    assert [reordered[i] for i in others] == [candidates[i] for i in others]


def test_tune_says_the_order_it_tried_the_stages_in():
    tuned, result = kpt.tune(
        two_maps(), budget_s=20, num_batches=10, allow_unverified=True, verbose=0
    )
    notes = [note for note in result.notes if note.startswith("Rewrites of single stages")]
    assert notes, result.notes
    assert notes[0].index("map(slow)") < notes[0].index("map(cheap)")
    tried = [outcome.stage for outcome in result.rewrites if outcome.kind == "parallel-map"]
    assert tried and tried[0] == "map(slow)", tried
