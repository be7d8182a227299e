"""The tuner's own work per training step, timed around it, against the step.

On sub-millisecond steps the wall-time ratio of `bench/overhead.py` moves by
several per cent from run to run on a shared machine, more than the tuner's
cost. This bench times the tuner's code itself instead: its batch-begin and
batch-end hooks, and its timed train function minus the Keras function inside
it, summed with `time.perf_counter` over a fit and divided by the steps; the
plain step time comes from plain fits alternated with those.

The timers read more than the code they time: their own clock calls and
frames, and the empty calls any callback costs (which Keras' dispatch of one
more callback, printed apart, already counts). So a stand-in is timed the same
way in the same rounds: a callback whose hooks do nothing, and which, on torch,
passes Keras' train function through a call of the same shape as the tuner's,
doing nothing else. The tuner's own cost is its readings minus the stand-in's;
what that leaves out on torch is one empty Python call around Keras' function
(some 0.1 us). On JAX (the CPU, one step a call) the tuner runs its stand-in
for each kind's first call only, the data adapter handing Keras the stamping
iterator: its timed call is that first call's own time spread over the steps.

The stamps around each `next()` are timed apart, on a bare iterator (a stamped
`next()` against a plain one), because they run inside Keras' own code. Keras'
own cost of dispatching one more callback is printed apart: `CallbackList`'s
batch hooks timed with and without an empty `async_safe` callback.

On TensorFlow the hooks are timed as above; the timestamps of the timed call
run inside the compiled step, so the call itself is compared with Keras' own
function instead: both called on one iterator of the tiny model's data
(where a difference in the function shows most), alternated in blocks of 40
calls, the median of the paired blocks' ratios. It is the step the tuner
times against the step the user runs without it: 1.00 when they are the same.

    python bench/step_cost.py --backend tensorflow|jax|torch [--rounds 5] [--steps 2000]
"""

import argparse
import itertools
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The package of this checkout, not whichever one is installed.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_PARTS = ("batch-begin hook", "batch-end hook", "timed call, Keras' function excluded")


def _timing_module(backend: str):
    if backend == "tensorflow":
        return None, None
    if backend == "jax":
        from keras_pipeline_tuner.instrumentation import jax_fit_timing as module

        return module, module.JaxFitTiming
    from keras_pipeline_tuner.instrumentation import torch_fit_timing as module

    return module, module.TorchFitTiming


def _wrap(hooks, timing_class, backend: str, totals) -> None:
    """Wraps the batch hooks of `hooks` and `timing_class.run` with timers adding into `totals`."""
    clock = time.perf_counter
    begin, end = hooks.on_train_batch_begin, hooks.on_train_batch_end
    run = getattr(timing_class, "run", None)
    keras_inside = {}

    def timed_begin(self, batch, logs=None):
        began = clock()
        begin(self, batch, logs)
        totals[_PARTS[0]] += clock() - began

    def timed_end(self, batch, logs=None):
        began = clock()
        end(self, batch, logs)
        totals[_PARTS[1]] += clock() - began

    def keras_function(function):
        # Keras' function, timed: the time inside it is not the tuner's.
        if backend == "jax":

            def inner(state, iterator):
                began = clock()
                try:
                    return function(state, iterator)
                finally:
                    totals["keras"] += clock() - began

        else:

            def inner(data):
                began = clock()
                try:
                    return function(data)
                finally:
                    totals["keras"] += clock() - began

        return inner

    def timed_run(self, kind, function, *args):
        began = clock()
        inner = keras_inside.get(function)
        if inner is None:
            inner = keras_inside[function] = keras_function(function)
        try:
            return run(self, kind, inner, *args)
        finally:
            totals[_PARTS[2]] += clock() - began

    hooks.on_train_batch_begin = timed_begin
    hooks.on_train_batch_end = timed_end
    if run is not None:
        timing_class.run = timed_run


def instrument(backend: str, totals) -> None:
    """Wraps the tuner's per-step entry points with timers adding into `totals`."""
    import keras_pipeline_tuner as kpt

    _, timing_class = _timing_module(backend)
    _wrap(kpt.PipelineTuner, timing_class, backend, totals)


def stand_in(backend: str, totals):
    """A callback doing nothing where the tuner works, timed as `instrument` times the tuner."""
    import keras

    class PassOn:
        """Keras' train function, called through a `run` shaped as the tuner's."""

        def __init__(self, function):
            self.function = function

        def __call__(self, *args):
            return self.run("train", self.function, *args)

        def run(self, kind, function, *args):
            return function(*args)

    class StandIn(keras.callbacks.Callback):
        async_safe = backend != "tensorflow"

        def on_train_begin(self, logs=None):
            # As the tuner on torch: its call around Keras' function.
            self.keras = self.model.train_function
            if backend == "torch":
                self.model.train_function = PassOn(self.keras)

        def on_train_end(self, logs=None):
            self.model.train_function = self.keras

        def on_train_batch_begin(self, batch, logs=None):
            pass

        def on_train_batch_end(self, batch, logs=None):
            pass

    _wrap(StandIn, PassOn if backend == "torch" else None, backend, totals)
    return StandIn()


def stamp_us(backend: str, calls: int = 200_000) -> float:
    """The stamps around one `next()`: a stamped iterator against a bare one."""
    from keras_pipeline_tuner.instrumentation.timing_source import StampedIterator

    held = []
    stamped = StampedIterator(itertools.repeat(0), held.append)
    bare = itertools.repeat(0)
    differences = []
    for _ in range(5):
        held.clear()
        began = time.perf_counter()
        for _ in range(calls):
            next(bare)
        plain = time.perf_counter() - began
        began = time.perf_counter()
        for _ in range(calls):
            next(stamped)
        differences.append((time.perf_counter() - began - plain) / calls)
    return statistics.median(differences) * 1e6


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


def timed_call_ratio(blocks: int = 150, calls: int = 40) -> tuple:
    """TensorFlow: the tuner's timed train function against Keras' own, per call.

    Returns:
        `(ratio, keras_us)`: the median of paired blocks' time ratios (timed
        over Keras'), and Keras' own call in microseconds (median).
    """
    import gc

    from overhead import make_case

    from keras_pipeline_tuner.timing.timed_step_function import TimedFunction

    model, dataset = make_case(4, 1, 100, 8)
    iterator = iter(dataset["x"].repeat())
    model.make_train_function()
    keras_function = model.train_function
    held = []
    timed = TimedFunction(
        model, model.train_step, keras_function, lambda rows, *_: held.append(rows), None
    )

    def keras_calls():
        for _ in range(calls):
            keras_function(iterator)

    def timed_calls():
        for _ in range(calls):
            timed.armed = True
            timed(iterator)

    keras_calls()
    timed_calls()
    seconds = {keras_calls: [], timed_calls: []}
    gc.disable()
    try:
        for block in range(blocks):
            order = [keras_calls, timed_calls]
            for calls_of in order[block % 2 :] + order[: block % 2]:
                began = time.perf_counter()
                calls_of()
                seconds[calls_of].append(time.perf_counter() - began)
            held.clear()
    finally:
        gc.enable()
    ratios = [t / k for k, t in zip(seconds[keras_calls], seconds[timed_calls])]
    return statistics.median(ratios), statistics.median(seconds[keras_calls]) / calls * 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("tensorflow", "jax", "torch"), default="jax")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=2000)
    args = parser.parse_args()
    os.environ["KERAS_BACKEND"] = args.backend
    if args.backend == "torch":
        import torch

        torch.set_num_threads(1)
    from overhead import make_case
    from overhead import timed_fit

    import keras_pipeline_tuner as kpt

    totals = dict.fromkeys(_PARTS + ("keras",), 0.0)
    instrument(args.backend, totals)
    baseline_totals = dict.fromkeys(_PARTS + ("keras",), 0.0)
    baseline = stand_in(args.backend, baseline_totals)
    model, dataset = make_case(128, 64, args.steps)
    tuner = kpt.PipelineTuner(verbose=0, profile="off")
    timed_fit(model, dataset, [])
    timed_fit(model, dataset, [tuner])
    timed_fit(model, dataset, [baseline])
    plain = []
    parts = {"tuner": {part: [] for part in _PARTS}, "stand-in": {part: [] for part in _PARTS}}
    for round_index in range(args.rounds):
        plain.append(timed_fit(model, dataset, []) / args.steps)
        order = [("tuner", tuner, totals), ("stand-in", baseline, baseline_totals)]
        for name, callback, found in order[round_index % 2 :] + order[: round_index % 2]:
            for key in found:
                found[key] = 0.0
            timed_fit(model, dataset, [callback])
            for part in _PARTS:
                seconds = found[part]
                if part == _PARTS[2]:
                    seconds -= found["keras"]
                parts[name][part].append(seconds / args.steps)
    step_us = statistics.median(plain) * 1e6
    print(
        f"[{args.backend}] the tuner's own work per step, {args.steps} steps x {args.rounds} "
        f"rounds; plain step {step_us:.1f} us (median)"
    )
    shown = _PARTS if args.backend != "tensorflow" else _PARTS[:2]
    print(f"  {'us per step (medians)':<40} {'tuner':>7} {'stand-in':>9} {'own':>7}")
    own = []
    for part in shown:
        tuner_us = statistics.median(parts["tuner"][part]) * 1e6
        stand_in_us = statistics.median(parts["stand-in"][part]) * 1e6
        own.append(
            [(a - b) * 1e6 for a, b in zip(parts["tuner"][part], parts["stand-in"][part])]
        )
        print(
            f"  {part:<40} {tuner_us:7.2f} {stand_in_us:9.2f} {statistics.median(own[-1]):7.2f}"
        )
    if args.backend == "tensorflow":
        stamps = 0.0
        ratio, keras_call_us = timed_call_ratio()
        print(
            f"  {'timed call / Keras own function':<40} {ratio:7.4f} (tiny model, Keras' call "
            f"{keras_call_us:.0f} us; blocks of calls alternated, median of pairs)"
        )
    else:
        stamps = stamp_us(args.backend)
        print(f"  {'stamps around next() (timed apart)':<40} {'':7} {'':9} {stamps:7.2f}")
    ours_us = statistics.median([sum(values) for values in zip(*own)]) + stamps
    print(f"  {'all of it':<40} {ours_us:6.2f} us = {ours_us / step_us * 100:.2f} % of the step")
    keras_us = callback_dispatch_us()
    print(
        f"  Keras' own dispatch of one more callback {keras_us:6.2f} us = "
        f"{keras_us / step_us * 100:.1f} % of the step (CallbackList, measured apart)"
    )


if __name__ == "__main__":
    main()
