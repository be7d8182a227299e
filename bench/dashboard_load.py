"""How fast the "Input pipeline" tab opens on a long run: 100 000 training steps.

Writes a run of `--steps` synthetic training steps the way a fit writes it (the
step clock fed 500 steps at a time, the TensorBoard sink writing as it does
between steps, every epoch's report), then times the tab's data requests on it:

- in process, TensorBoard's WSGI app (its Python data provider), a fresh app
  per round so that every first request is cold: `runs`, `run`, the first
  `steps` (all steps, downsampled on the server) and a zoomed `steps`;
- over HTTP, the `tensorboard` command as users start it (which may read the
  log dir through its Rust data server), the first `steps` request once loaded.

Rounds alternate and medians are printed (GC off while timing). Target: the
first data request under a second.

    python bench/dashboard_load.py [--steps 100000] [--rounds 5]
"""

import argparse
import contextlib
import gc
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time
import urllib.request

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import keras_pipeline_tuner as kpt  # noqa: E402
from keras_pipeline_tuner._util.feature_guard import FeatureGuard  # noqa: E402
from keras_pipeline_tuner.outputs.dashboard import summaries  # noqa: E402
from keras_pipeline_tuner.outputs.tensorboard import TensorBoardSink  # noqa: E402
from keras_pipeline_tuner.timing.step_clock import StepClock  # noqa: E402
from tests.helpers.browser import tensorboard_server  # noqa: E402
from tests.helpers.tensorboard_app import wsgi_client  # noqa: E402

ROUTE = f"/data/plugin/{summaries.PLUGIN_NAME}"
CHUNK = 500
EPOCHS = 10


def write_run(log_dir: str, steps: int) -> float:
    """Writes `steps` training steps through the sink; returns the seconds it took."""
    rng = np.random.default_rng(0)
    clock = StepClock()
    sink = TensorBoardSink(log_dir, FeatureGuard())
    report = kpt.Report()
    per_epoch = steps // EPOCHS
    now = time.time() - steps * 0.02
    began = time.perf_counter()
    for epoch in range(EPOCHS):
        clock.begin_epoch(epoch)
        for _ in range(per_epoch // CHUNK):
            wait = rng.uniform(0.001, 0.015, CHUNK)
            compute = rng.uniform(0.002, 0.004, CHUNK)
            start = now + np.cumsum(wait + compute + 0.0002) - (wait + compute + 0.0002)
            now = float(start[-1] + wait[-1] + compute[-1] + 0.0002)
            clock.record("train", np.stack([start, start + wait, start + wait + compute], 1))
            sink.step_ended(clock, CHUNK)
        clock.end_epoch("train", epoch)
        report.train = clock.stats("train")
        report.input_fraction, report.verdict = report.train.input_fraction, report.train.verdict
        report.epochs = list(clock.epochs)
        sink.epoch_ended(clock, report)
    sink.finish(clock, report)
    return time.perf_counter() - began


def block_write_cost(rounds: int) -> list:
    """Seconds of the sink's dashboard write of 1000 new steps (one block), per round."""
    costs = []
    with tempfile.TemporaryDirectory() as log_dir:
        sink = TensorBoardSink(log_dir, FeatureGuard())
        clock = StepClock()
        clock.begin_epoch(0)
        for round_ in range(rounds + 1):
            start = np.arange(round_ * 1000, (round_ + 1) * 1000) * 0.01
            clock.record("train", np.stack([start, start + 0.004, start + 0.006], 1))
            began = time.perf_counter()
            sink.write_step_rows(clock)
            costs.append(time.perf_counter() - began)
    return costs[1:]  # the first round also makes the event file


def timed_get(get, path):
    began = time.perf_counter()
    body = get(path)
    return time.perf_counter() - began, body


def in_process_round(log_dir: str):
    client = wsgi_client(log_dir)

    def get(path):
        response = client.get(path)
        assert response.status_code == 200, response.get_data(as_text=True)
        return json.loads(response.get_data())

    runs_s, listed = timed_get(get, f"{ROUTE}/runs")
    run = listed["runs"][0]["run"]
    run_s, _ = timed_get(get, f"{ROUTE}/run?run={run}")
    steps_s, series = timed_get(get, f"{ROUTE}/steps?run={run}")
    again_s, _ = timed_get(get, f"{ROUTE}/steps?run={run}")
    middle = series["step"][len(series["step"]) // 2]
    zoom_s, zoomed = timed_get(get, f"{ROUTE}/steps?run={run}&first={middle}&last={middle + 999}")
    return {
        "runs": runs_s,
        "run": run_s,
        "first steps": steps_s,
        "steps again (cached rows)": again_s,
        "zoomed steps (1000 steps)": zoom_s,
    }, series, zoomed


def http_first_steps(log_dir: str, scratch: pathlib.Path):
    command = [sys.executable, "-m", "tests.helpers.tensorboard_app"]
    run = summaries.RUN
    with tensorboard_server(log_dir, scratch, command=command, run=run) as url:

        def get(path):
            with urllib.request.urlopen(url + path, timeout=60) as response:
                return json.loads(response.read())

        # The server lists the run before it has read all of the file: wait for all rows.
        deadline = time.monotonic() + 120
        listed = get(f"{ROUTE}/runs")["runs"]
        while time.monotonic() < deadline and not (listed and listed[0]["verdict"]):
            time.sleep(1)
            listed = get(f"{ROUTE}/runs")["runs"]
        seconds, series = timed_get(get, f"{ROUTE}/steps?run={run}")
        return seconds, series


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as log_dir:
        write_s = write_run(log_dir, args.steps)
        event_bytes = sum(
            path.stat().st_size for path in pathlib.Path(log_dir).rglob("*tfevents*")
        )
        print(f"Wrote {args.steps} steps in {write_s:.2f} s "
              f"({write_s / args.steps * 1e6:.1f} us a step, scalars and text included); "
              f"event files {event_bytes / 1e6:.1f} MB")
        gc.disable()
        try:
            costs = block_write_cost(args.rounds)
        finally:
            gc.enable()
        print(f"Dashboard rows of 1000 new steps, written between steps: median "
              f"{statistics.median(costs) * 1e3:.2f} ms ({statistics.median(costs) * 1e3:.2f} us "
              "a step)")
        times = {}
        gc.disable()
        try:
            for _ in range(args.rounds):
                measured, series, zoomed = in_process_round(log_dir)
                for name, seconds in measured.items():
                    times.setdefault(name, []).append(seconds)
        finally:
            gc.enable()
        assert series["total_steps"] == args.steps, series["total_steps"]
        print(f"In-process TensorBoard app, {args.rounds} fresh apps, median (min-max):")
        for name, values in times.items():
            print(f"  {name:28s} {statistics.median(values) * 1e3:8.1f} ms "
                  f"({min(values) * 1e3:.1f}-{max(values) * 1e3:.1f})")
        print(f"  first steps answer: {len(series['step'])} marks of "
              f"{series['bucket_steps']} steps for {series['total_steps']} steps; "
              f"zoomed: {len(zoomed['step'])} marks of {zoomed['bucket_steps']} step(s)")
        with tempfile.TemporaryDirectory() as scratch:
            seconds, series = http_first_steps(log_dir, pathlib.Path(scratch))
        print(f"`tensorboard` over HTTP: first steps request {seconds * 1e3:.1f} ms, "
              f"{series['total_steps']} steps, {len(series['step'])} marks")
        verdict = "under" if statistics.median(times["first steps"]) < 1.0 else "OVER"
        print(f"Target: first data request under 1 s: {verdict}")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
