"""The step timeline as a Chrome trace, for Perfetto or chrome://tracing.

One track per kind of step (training, validation); each step is two slices,
"input wait" then "compute", at the wall times the step clock measured, so a
run's pattern (which steps wait, how long epochs take to start) can be zoomed
into step by step. The file uses the Trace Event Format's JSON object form.
"""

import json
from typing import Any
from typing import Dict
from typing import List

import numpy as np

from keras_pipeline_tuner._util.files import write_atomically
from keras_pipeline_tuner.timing.step_clock import TRAIN
from keras_pipeline_tuner.timing.step_clock import VALIDATION
from keras_pipeline_tuner.timing.step_clock import StepClock

TRACE_FILENAME = "step_timeline.trace.json"
_PROCESS_ID = 1
_TRACKS = {TRAIN: (1, "training steps"), VALIDATION: (2, "validation steps")}


def chrome_trace(clock: StepClock) -> Dict[str, Any]:
    """The retained steps of `clock` as a Chrome trace.

    Args:
        clock: the `StepClock`.

    Returns:
        A dict in the Trace Event Format ("traceEvents", times in microseconds
        from the first retained step; "otherData" holds that origin as a Unix
        time).

    Example:

    ```python
    trace = chrome_trace(tuner.clock)
    len(trace["traceEvents"])
    ```
    """
    steps = {kind: clock.steps(kind) for kind in _TRACKS}
    numbers = {kind: clock.step_numbers(kind) for kind in _TRACKS}
    starts = [s["start"][0] for s in steps.values() if s["start"].size]
    origin = float(min(starts)) if starts else 0.0
    events: List[Dict[str, Any]] = [
        _metadata("process_name", 0, "keras-pipeline-tuner step clock"),
    ]
    for kind, (track, name) in _TRACKS.items():
        selected = steps[kind]
        if not selected["start"].size:
            continue
        events.append(_metadata("thread_name", track, name))
        events += _step_events(selected, numbers[kind], origin, track)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"origin_unix_s": origin, "source": "keras-pipeline-tuner"},
    }


def write_trace(clock: StepClock, log_dir: str) -> str:
    """Writes the Chrome trace of `clock` into `log_dir` atomically.

    The file holds `chrome_trace(clock)` as JSON. Its step slices are formatted
    straight into text (a template per slice), which takes a sixth of the time
    `json.dumps` takes over thousands of small dicts, at the end of every fit.

    Args:
        clock: the `StepClock`.
        log_dir: the directory; created if missing.

    Returns:
        The path written (`<log_dir>/step_timeline.trace.json`).
    """
    return write_atomically(log_dir, TRACE_FILENAME, _trace_text(clock))


def _trace_text(clock: StepClock) -> str:
    """`chrome_trace(clock)` as compact JSON text."""
    steps = {kind: clock.steps(kind) for kind in _TRACKS}
    numbers = {kind: clock.step_numbers(kind) for kind in _TRACKS}
    starts = [s["start"][0] for s in steps.values() if s["start"].size]
    origin = float(min(starts)) if starts else 0.0
    parts = [_json(_metadata("process_name", 0, "keras-pipeline-tuner step clock"))]
    for kind, (track, name) in _TRACKS.items():
        selected = steps[kind]
        if not selected["start"].size:
            continue
        parts.append(_json(_metadata("thread_name", track, name)))
        parts += _step_event_texts(selected, numbers[kind], origin, track)
    other = _json({"origin_unix_s": origin, "source": "keras-pipeline-tuner"})
    return (
        '{"traceEvents":[' + ",".join(parts) + '],"displayTimeUnit":"ms","otherData":'
        + other + "}"
    )


def _json(value) -> str:
    return json.dumps(value, separators=(",", ":"))


# One slice as `_slice` makes it, in JSON; "%.3f" reads back as round(x, 3).
_SLICE = (
    '{"name":"%s","cat":"%s","ph":"X","ts":%.3f,"dur":%.3f,"pid":'
    + str(_PROCESS_ID)
    + ',"tid":%d,"args":{"step":%d,"epoch":%d}}'
)


def _step_event_texts(selected, numbers, origin: float, track: int) -> List[str]:
    start_us = (selected["start"] - origin) * 1e6
    wait = selected["wait"]
    measured = ~np.isnan(wait)
    wait_us = np.where(measured, wait, 0.0) * 1e6
    compute_us = selected["compute"] * 1e6
    if not (np.isfinite(start_us).all() and np.isfinite(wait_us).all()
            and np.isfinite(compute_us).all()):
        # JSON's NaN and Infinity as `json.dumps` writes them.
        return [_json(event) for event in _step_events(selected, numbers, origin, track)]
    texts = []
    for start, wait_time, compute, number, epoch, known in zip(
        start_us.tolist(),
        wait_us.tolist(),
        compute_us.tolist(),
        np.asarray(numbers).tolist(),
        np.asarray(selected["epoch"]).tolist(),
        measured.tolist(),
    ):
        if known:
            texts.append(_SLICE % ("input wait", "input", start, wait_time, track, number, epoch))
            texts.append(
                _SLICE % ("compute", "compute", start + wait_time, compute, track, number, epoch)
            )
        else:
            texts.append(_SLICE % ("step", "step", start, compute, track, number, epoch))
    return texts


def _step_events(selected, numbers, origin: float, track: int) -> List[Dict[str, Any]]:
    start_us = (selected["start"] - origin) * 1e6
    wait = selected["wait"]
    measured = ~np.isnan(wait)
    wait_us = np.where(measured, wait, 0.0) * 1e6
    compute_us = selected["compute"] * 1e6
    events = []
    for index in range(start_us.size):
        args = {"step": int(numbers[index]), "epoch": int(selected["epoch"][index])}
        if measured[index]:
            events.append(
                _slice("input wait", "input", start_us[index], wait_us[index], track, args)
            )
            events.append(
                _slice(
                    "compute",
                    "compute",
                    start_us[index] + wait_us[index],
                    compute_us[index],
                    track,
                    args,
                )
            )
        else:
            events.append(_slice("step", "step", start_us[index], compute_us[index], track, args))
    return events


def _slice(name, category, ts, duration, track, args) -> Dict[str, Any]:
    return {
        "name": name,
        "cat": category,
        "ph": "X",
        "ts": round(float(ts), 3),
        "dur": round(float(duration), 3),
        "pid": _PROCESS_ID,
        "tid": track,
        "args": args,
    }


def _metadata(name: str, track: int, value: str) -> Dict[str, Any]:
    return {"name": name, "ph": "M", "pid": _PROCESS_ID, "tid": track, "args": {"name": value}}
