"""The step timeline file: what `write_trace` writes is `chrome_trace` as JSON."""

import json
import math

import numpy as np

from keras_pipeline_tuner.outputs import trace
from keras_pipeline_tuner.timing.step_clock import StepClock


def _clock(ends_known: bool = True) -> StepClock:
    clock = StepClock()
    rng = np.random.default_rng(3)
    origin = 1.7e9 + rng.uniform()
    for epoch in range(2):
        clock.begin_epoch(epoch)
        start = origin + epoch * 10 + np.cumsum(rng.uniform(0.0005, 0.003, size=300))
        ready = start + rng.uniform(0, 0.0004, size=300)
        # Whole steps (no observed wait) beside split ones.
        ready[::7] = np.nan
        end = np.maximum(start, np.nan_to_num(ready, nan=0.0)) + rng.uniform(0.0001, 0.001, 300)
        if not ends_known:
            end[5] = np.nan
        clock.record("train", np.stack([start, ready, end], axis=1))
        clock.end_epoch("train", epoch)
        clock.begin_epoch(epoch, "validation")
        start = start[-1] + 1 + np.arange(20) * 0.002
        clock.record("validation", np.stack([start, start + 0.0001, start + 0.001], axis=1))
        clock.end_epoch("validation", epoch)
    return clock


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b and type(a) is type(b)


def test_the_file_holds_the_chrome_trace(tmp_path):
    clock = _clock()
    path = trace.write_trace(clock, str(tmp_path))
    with open(path, encoding="utf-8") as file:
        written = json.load(file)
    expected = trace.chrome_trace(clock)
    assert len(expected["traceEvents"]) > 1000
    assert _same(written, expected)


def test_a_step_whose_end_is_unknown_is_written_as_json_writes_it(tmp_path):
    clock = _clock(ends_known=False)
    path = trace.write_trace(clock, str(tmp_path))
    with open(path, encoding="utf-8") as file:
        written = json.load(file)
    assert _same(written, trace.chrome_trace(clock))
