"""What the TensorBoard outputs cost a fit: no tracing after the process's first, no image
after a short epoch."""

import os
import time

import numpy as np
import tensorflow as tf
from tensorboard.backend.event_processing import event_accumulator

import keras_pipeline_tuner as kpt
from keras_pipeline_tuner._util.feature_guard import FeatureGuard
from keras_pipeline_tuner.outputs import compiled_scalars
from keras_pipeline_tuner.outputs import tensorboard as tensorboard_sink
from keras_pipeline_tuner.timing.step_clock import StepClock


def _clock(steps: int, began_s_ago: float) -> StepClock:
    clock = StepClock()
    clock.begin_epoch(0)
    start = time.time() - began_s_ago + np.linspace(0, began_s_ago * 0.9, steps)
    clock.record("train", np.stack([start, start + 0.001, start + 0.003], axis=1))
    return clock


def _tensors(run_dir, tag):
    events = event_accumulator.EventAccumulator(
        os.path.join(run_dir, tensorboard_sink.RUN),
        size_guidance={event_accumulator.TENSORS: 0, event_accumulator.IMAGES: 0},
    )
    events.Reload()
    return events.Tensors(tag) if tag in events.Tags()["tensors"] else []


def test_one_compiled_scalar_writer_serves_every_fit_of_the_process(tmp_path):
    clock = _clock(600, 10.0)
    for fit in range(3):
        sink = tensorboard_sink.TensorBoardSink(str(tmp_path / str(fit)), FeatureGuard())
        assert sink.write_scalars(clock) == 600
        sink.flush()
        points = _tensors(str(tmp_path / str(fit)), "input_pipeline/step_ms")
        assert [point.step for point in points] == list(range(1, 601))
    # Traced once, whatever fit came first: each fit's writer is an argument.
    write = compiled_scalars.compiled_scalar_writer(tf, tensorboard_sink.SCALAR_TAGS)
    assert write.experimental_get_tracing_count() == 1


def test_the_epoch_image_is_drawn_only_where_it_stays_within_its_share(tmp_path):
    report = kpt.Report()
    # Half a second of training: an image (about 0.1 s) would take 20 % of it.
    short = tensorboard_sink.TensorBoardSink(str(tmp_path / "short"), FeatureGuard())
    short.epoch_ended(_clock(50, 0.5), report)
    assert not _tensors(str(tmp_path / "short"), tensorboard_sink.TIMELINE_TAG)
    # A minute of it: the image fits in 2 %.
    long = tensorboard_sink.TensorBoardSink(str(tmp_path / "long"), FeatureGuard())
    long.epoch_ended(_clock(50, 60.0), report)
    assert len(_tensors(str(tmp_path / "long"), tensorboard_sink.TIMELINE_TAG)) == 1
    # The end of the fit always draws it.
    short.finish(_clock(50, 0.5), report)
    assert len(_tensors(str(tmp_path / "short"), tensorboard_sink.TIMELINE_TAG)) == 1
