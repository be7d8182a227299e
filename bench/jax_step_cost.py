"""The tuner's own work per training step on JAX, timed around it, against the step.

On sub-millisecond steps the wall-time ratio of `bench/overhead.py` moves by
several per cent from run to run on a shared machine, more than the tuner's
cost. This bench times the tuner's code itself instead: its batch-begin and
batch-end hooks, and its timed train function minus the Keras function inside
it, summed with `time.perf_counter` over a fit and divided by the steps; the
plain step time comes from plain fits alternated with those. The timers add a
few tenths of a microsecond per hook of their own. Not counted: the stamps
around `next()` inside Keras' function (two `time.time()` calls). Keras' own
cost of dispatching one more callback is printed apart: `CallbackList`'s
batch hooks timed with and without an empty `async_safe` callback.

    KERAS_BACKEND=jax python bench/jax_step_cost.py [--rounds 5] [--steps 2000]
"""

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ["KERAS_BACKEND"] = "jax"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from overhead import make_case  # noqa: E402
from overhead import timed_fit  # noqa: E402

_PARTS = ("batch-begin hook", "batch-end hook", "timed call, Keras' function excluded")


def instrument(totals):
    """Wraps the tuner's per-step entry points with timers adding into `totals`."""
    import keras_pipeline_tuner as kpt
    from keras_pipeline_tuner.instrumentation.jax_fit_timing import JaxFitTiming

    clock = time.perf_counter
    begin, end, run = (
        kpt.PipelineTuner.on_train_batch_begin,
        kpt.PipelineTuner.on_train_batch_end,
        JaxFitTiming.run,
    )
    keras_inside = {}

    def timed_begin(self, batch, logs=None):
        began = clock()
        begin(self, batch, logs)
        totals[_PARTS[0]] += clock() - began

    def timed_end(self, batch, logs=None):
        began = clock()
        end(self, batch, logs)
        totals[_PARTS[1]] += clock() - began

    def timed_run(self, kind, function, state, iterator, trace_step=None):
        inner = keras_inside.get(id(function))
        if inner is None:

            def inner(state, stamped, function=function):
                began = clock()
                try:
                    return function(state, stamped)
                finally:
                    totals["keras"] += clock() - began

            keras_inside[id(function)] = inner
        began = clock()
        try:
            return run(self, kind, inner, state, iterator, trace_step)
        finally:
            totals[_PARTS[2]] += clock() - began

    kpt.PipelineTuner.on_train_batch_begin = timed_begin
    kpt.PipelineTuner.on_train_batch_end = timed_end
    JaxFitTiming.run = timed_run


def callback_dispatch_us(calls: int = 20000) -> float:
    """Keras' own cost, on the training thread, of one more `async_safe` callback.

    Times `CallbackList.on_train_batch_begin` and `on_train_batch_end` (which
    hands the end hooks to Keras' callback thread) with and without an empty
    callback, alternated; the difference per step, median of rounds.
    """
    import keras

    from overhead import empty_callback

    def per_step(callbacks) -> float:
        callback_list = keras.callbacks.CallbackList(callbacks, add_history=True)
        callback_list.on_train_begin()
        logs = {"loss": 0.5}
        began = time.perf_counter()
        for batch in range(calls):
            callback_list.on_train_batch_begin(batch)
            callback_list.on_train_batch_end(batch, logs)
        seconds = time.perf_counter() - began
        callback_list.on_train_end()
        return seconds / calls

    differences = []
    for _ in range(5):
        differences.append(per_step([empty_callback()]) - per_step([]))
    return statistics.median(differences) * 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=2000)
    args = parser.parse_args()
    import keras_pipeline_tuner as kpt

    totals = dict.fromkeys(_PARTS + ("keras",), 0.0)
    instrument(totals)
    model, dataset = make_case(128, 64, args.steps)
    tuner = kpt.PipelineTuner(verbose=0, profile="off")
    timed_fit(model, dataset, [])
    timed_fit(model, dataset, [tuner])
    plain, parts = [], {part: [] for part in _PARTS}
    for _ in range(args.rounds):
        plain.append(timed_fit(model, dataset, []) / args.steps)
        for key in totals:
            totals[key] = 0.0
        timed_fit(model, dataset, [tuner])
        for part in _PARTS:
            seconds = totals[part]
            if part == _PARTS[2]:
                seconds -= totals["keras"]
            parts[part].append(seconds / args.steps)
    step_us = statistics.median(plain) * 1e6
    print(
        f"[jax] the tuner's own work per step, {args.steps} steps x {args.rounds} rounds; "
        f"plain step {step_us:.1f} us (median)"
    )
    ours = [sum(values) for values in zip(*parts.values())]
    for part, values in parts.items():
        print(f"  {part:<40} {statistics.median(values) * 1e6:6.2f} us")
    ours_us = statistics.median(ours) * 1e6
    print(f"  {'all of it':<40} {ours_us:6.2f} us = {ours_us / step_us * 100:.1f} % of the step")
    keras_us = callback_dispatch_us()
    print(
        f"  Keras' own dispatch of one more callback {keras_us:6.2f} us = "
        f"{keras_us / step_us * 100:.1f} % of the step (CallbackList, measured apart)"
    )


if __name__ == "__main__":
    main()
