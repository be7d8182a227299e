"""Overhead of PipelineTuner: fit with the tuner over plain fit, per step and per fit.

Runs plain fits, fits with an empty callback (Keras' own cost of one more
callback, the floor under the tuner's) and fits with the tuner alternately in
one process on the same model and in-memory data (so only the tuner's cost
differs), with Python's GC off during each fit. A cycle runs one short fit of
each configuration, each between two fits with the empty callback, in a new
order each cycle; a round runs `--cycles` of them. On this shared machine the
steps slow by up to 30 % for seconds at a time, in CPU time as in wall time
(so the cores themselves run slower, and no CPU-time figure escapes it). A
fit's ratio to the mean of the two empty-callback fits around it cancels a
drift over those seconds, and the median over many cycles leaves out the
spells that start or end within them.

A fit's wall time mixes two costs: the tuner's work on every step, and its work
once per fit (reading the pipeline before the first step; the report, the
replay and the files after the last), which a fit of a few seconds would count
as per-step cost. So each fit runs several epochs of about half a second, a
callback stamps when each epoch and its first step begin, and a fit's step is
the mean of its middle epochs' steps, from their first step to the next
epoch's begin (epoch-end work, such as the outputs a `log_dir` gets, is in it,
paced to some epochs' ends: a median of epochs would count it fully or not at
all); the per-step ratio is the median over cycles of each cycle's ratio,
with each round's median for its spread. The epoch's
set-up before its first step, where TensorFlow makes the epoch's iterator and
ends the last one's, is printed apart: per-epoch overhead, not a step's. The
same ratio over the empty callback's is printed too (what the tuner adds beyond
one more callback: a tuner's step quicker than Keras' own would show there as
a difference, not a gain); the per-fit cost is what is left of the whole fit's
difference, in milliseconds, a median over fits (where the tuner's step is
the quicker one, that adds its gain back, so the fit's begin and end hooks are
also timed directly, between two stamps listed around the tuner).

Cases: a model of about 1 ms per step, one of about 10 ms (each case's batch
is fitted to its step time on the machine it runs on, and printed), and a
tiny model (about 0.1 ms a step on an idle machine), where per-step costs show
most, which also prints how much the log dir's event files grew per fit
(scalars of long runs are summarised, so they stay small).

Every Keras backend is measured, each in a process of its own (the backend is
fixed when Keras is imported): TensorFlow on a cached tf.data dataset, JAX and
torch on NumPy arrays (torch on one thread, as the tests run it).

    python bench/overhead.py [--rounds 5] [--cycles 4] [--epochs 3] [--epoch-s 0.5]
                             [--backend tensorflow|jax|torch|all] [--cases small large tiny]
                             [--busy-loops 2]
"""

import argparse
import gc
import os
import statistics
import subprocess
import sys
import tempfile
import time

import busy_loops

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The package of this checkout, not whichever one is installed.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BACKENDS = ("tensorflow", "jax", "torch")


def make_case(width: int, batch: int, steps: int, features: int = 64):
    import keras
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch * steps, features)).astype(np.float32)
    y = rng.normal(size=(batch * steps, 1)).astype(np.float32)
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        dataset = dict(x=tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).cache())
    else:
        dataset = dict(x=x, y=y, batch_size=batch)
    model = keras.Sequential(
        [
            keras.Input((features,)),
            keras.layers.Dense(width, activation="relu"),
            keras.layers.Dense(width, activation="relu"),
            keras.layers.Dense(1),
        ]
    )
    model.compile("adam", "mse")
    return model, dataset


def timed_fit(model, dataset, callbacks, epochs: int = 1):
    """Wall seconds of one fit, with Python's GC off during it."""
    gc.collect()
    gc.disable()
    try:
        began = time.perf_counter()
        model.fit(epochs=epochs, callbacks=callbacks, verbose=0, shuffle=False, **dataset)
        return time.perf_counter() - began
    finally:
        gc.enable()


def epoch_clock():
    """A callback that stamps when each epoch begins and when its first step begins.

    Its batch-begin hook costs Keras' dispatch of one call a step, the same in
    every configuration (plain fit's too), and does nothing past the first step.
    """
    import keras

    class EpochClock(keras.callbacks.Callback):
        async_safe = True

        def __init__(self):
            super().__init__()
            self.begins = []
            self.first_steps = []

        def on_train_begin(self, logs=None):
            self.begins = []
            self.first_steps = []

        def on_epoch_begin(self, epoch, logs=None):
            self.begins.append(time.perf_counter())

        def on_train_batch_begin(self, batch, logs=None):
            if not batch:
                self.first_steps.append(time.perf_counter())

        def middle_epochs_s(self) -> list:
            # Epoch k's steps run from its first step to the next epoch's
            # begin (its end hooks included); the first epoch (tracing) and
            # the last (the fit's end follows it) are left out.
            return [b - a for a, b in zip(self.first_steps[1:], self.begins[2:])]

        def middle_setups_s(self) -> list:
            # From each middle epoch's begin to its first step: TensorFlow makes
            # the epoch's iterator there (and ends the last one's, which with
            # autotune on took 5 ms or 0.1-0.2 s at random here), per-epoch
            # overhead that is not a step's.
            return [a - b for b, a in zip(self.begins[1:-1], self.first_steps[1:-1])]

    return EpochClock()


def hook_stamp():
    """A callback that stamps when Keras reaches it in `on_train_begin` and `on_train_end`.

    Listed just before the tuner and just after it (Keras calls callbacks in
    list order), two of them time the tuner's own once-per-fit hooks: reading
    the pipeline before the first step; the probes, the report and the files
    after the last.
    """
    import keras

    class HookStamp(keras.callbacks.Callback):
        async_safe = True

        def __init__(self):
            super().__init__()
            self.begin = self.end = 0.0

        def on_train_begin(self, logs=None):
            self.begin = time.perf_counter()

        def on_train_end(self, logs=None):
            self.end = time.perf_counter()

    return HookStamp()


def hooks_s(before, after) -> float:
    """Seconds between two stamps' hooks, begin and end together: the tuner's once per fit."""
    return (after.begin - before.begin) + (after.end - before.end)


def empty_callback():
    """A callback that does nothing in the hooks the tuner uses, `async_safe` as it is.

    Its cost over plain fit is Keras' own for one more callback: the floor
    under the tuner's.
    """
    import keras

    class EmptyCallback(keras.callbacks.Callback):
        async_safe = True

        def on_train_batch_begin(self, batch, logs=None):
            pass

        def on_train_batch_end(self, batch, logs=None):
            pass

    return EmptyCallback()


def event_bytes(log_dir: str) -> int:
    return sum(
        os.path.getsize(os.path.join(directory, name))
        for directory, _, names in os.walk(log_dir)
        for name in names
        if "tfevents" in name
    )


def probe_step_s(width: int, batch: int, features: int) -> float:
    """Seconds of one plain step of the case, after a warm-up fit (tracing left out)."""
    model, dataset = make_case(width, batch, 200, features)
    timed_fit(model, dataset, [])
    return timed_fit(model, dataset, []) / 200


def calibrated_batch(width: int, batch: int, features: int, target_ms) -> int:
    """The batch that brings a plain step near `target_ms` on this machine.

    The cases are named for a step time, and a step's cost grows with the batch
    about linearly at these widths: one probe, one proportional correction.
    Without a target the batch is kept.
    """
    if target_ms is None:
        return batch
    probe = probe_step_s(width, batch, features)
    return max(1, round(batch * target_ms / (probe * 1e3)))


def measure(
    name, width, batch, rounds, cycles, log_dir, epoch_s, epochs, features=64, target_ms=None
):
    import keras_pipeline_tuner as kpt

    batch = calibrated_batch(width, batch, features, target_ms)
    # An epoch of about `epoch_s` seconds: probe the plain step first.
    probe = probe_step_s(width, batch, features)
    steps = int(min(max(epoch_s / probe, 100), 50_000))
    model, dataset = make_case(width, batch, steps, features)
    configurations = {
        "plain": [],
        "empty callback": [empty_callback()],
        # The always-on part: the step clock, the lint and the advice.
        "tuner, profile off": [kpt.PipelineTuner(verbose=0, profile="off")],
        # As a user adds it (but the printed summary): the "auto" profiler
        # window, which opens when the clock finds the job input-bound.
        "tuner, defaults": [kpt.PipelineTuner(verbose=0)],
        # Everything on: TensorBoard scalars, text, timeline image, report files.
        "tuner, log_dir": [kpt.PipelineTuner(log_dir=log_dir, verbose=0)],
    }
    clock = epoch_clock()
    # Around every configuration's own callbacks alike (plain fit's too).
    before, after = hook_stamp(), hook_stamp()
    for key, callbacks in configurations.items():
        configurations[key] = [before] + callbacks + [after, clock]
    # Warm up every path: tracing is reported apart, not part of the overhead.
    for callbacks in configurations.values():
        timed_fit(model, dataset, callbacks, epochs=2)
    # Per configuration: each fit's step (the mean of its middle epochs') and
    # every middle epoch's set-up.
    step, setups = ({key: [] for key in configurations} for _ in range(2))
    # Per round: each cycle's ratio of a configuration's fit to the empty
    # callback's and to plain fit's, all of a cycle's fits run back to back.
    cycle_ratios = {key: [] for key in configurations}
    plain_ratios = {key: [] for key in configurations}
    # Per configuration, each cycle's fit against that cycle's plain fit: what
    # the whole fit took beyond it and beyond its per-step share, and the
    # time in the begin and end hooks beyond plain fit's.
    per_fit_ms, hooks_ms = ({key: [] for key in configurations} for _ in range(2))
    grown = []
    order = list(configurations)
    empty = "empty callback"

    def run_fit(key) -> tuple:
        """`(wall s, hooks s, step s)` of one fit of `key`."""
        size = event_bytes(log_dir)
        wall_s = timed_fit(model, dataset, configurations[key], epochs)
        epochs_s = clock.middle_epochs_s()
        setups[key].extend(clock.middle_setups_s())
        if key == "tuner, log_dir":
            grown.append(event_bytes(log_dir) - size)
        # The fit's mean over its middle epochs, not their median: the outputs
        # a `log_dir` gets are paced to some epochs' ends, and a median would
        # count them fully or not at all.
        step[key].append(sum(epochs_s) / (len(epochs_s) * steps))
        return wall_s, hooks_s(before, after), step[key][-1]

    others = [key for key in order if key != empty]
    for round_index in range(rounds):
        floor_round, plain_round = ({key: [] for key in order} for _ in range(2))
        for cycle in range(cycles):
            # Each other configuration between two empty-callback fits, its
            # ratio to their mean (a drift of the machine's speed over the
            # three fits cancels), in a new order each cycle.
            shift = (round_index * cycles + cycle) % len(others)
            ratios, fits = {}, {}
            last_empty = run_fit(empty)
            for key in others[shift:] + others[:shift]:
                fits[key] = run_fit(key)
                next_empty = run_fit(empty)
                if key == "plain":
                    # The empty callback's per-fit figures: the fit just after.
                    fits[empty] = next_empty
                ratios[key] = fits[key][2] / ((last_empty[2] + next_empty[2]) / 2)
                last_empty = next_empty
            for key in others:
                floor_round[key].append(ratios[key])
                plain_round[key].append(ratios[key] / ratios["plain"])
            plain_round[empty].append(1 / ratios["plain"])
            plain_wall, plain_hooks, plain_step = fits["plain"]
            for key in order[1:]:
                wall_s, hooks_of, step_s = fits[key]
                per_fit_ms[key].append(
                    (wall_s - plain_wall - (step_s - plain_step) * steps * epochs) * 1e3
                )
                hooks_ms[key].append((hooks_of - plain_hooks) * 1e3)
        for key in order:
            cycle_ratios[key].append(floor_round[key])
            plain_ratios[key].append(plain_round[key])
    step_ms = statistics.median(step["plain"]) * 1e3
    print(
        f"{name}: {step_ms:.3f} ms/step plain (batch {batch}); fits of {epochs} epochs of "
        f"{steps} steps, {cycles} cycles a round (each configuration between two empty-callback "
        f"fits) x {rounds} rounds",
        flush=True,
    )
    print(
        "  epoch set-up before the first step (median ms, apart from the steps): "
        + ", ".join(f"{key} {statistics.median(setups[key]) * 1e3:.1f}" for key in order),
        flush=True,
    )
    for key in order[1:]:
        print(
            f"  {key:<20} per step / plain: {_ratios(plain_ratios[key])}; per fit "
            f"{statistics.median(per_fit_ms[key]):+.0f} ms (whole fit less the per-step share), "
            f"{statistics.median(hooks_ms[key]):+.0f} ms in its begin and end hooks "
            f"(largest {max(hooks_ms[key]):+.0f})",
            flush=True,
        )
        if key != empty:
            # Against Keras' own floor: what the tuner adds to a step beyond one
            # more callback, so a step quicker than plain fit's shows as a
            # difference from the empty callback, not as a gain.
            print(
                f"  {'':<20} per step / empty callback: {_ratios(cycle_ratios[key])}",
                flush=True,
            )
    print(
        f"  event files grew {statistics.median(grown) / 1e3:.0f} kB per fit of "
        f"{steps * epochs} steps ({statistics.median(grown) / (steps * epochs):.1f} bytes a step)",
        flush=True,
    )


def _ratios(rounds: list) -> str:
    """The median of every cycle's ratio, and each round's median, for their spread."""
    pooled = statistics.median(ratio for cycles in rounds for ratio in cycles)
    medians = [statistics.median(cycles) for cycles in rounds]
    return (
        f"{pooled:.4f} (median of {sum(map(len, rounds))} cycles); per round "
        + ", ".join(f"{median:.4f}" for median in medians)
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--backend", choices=BACKENDS + ("all",), default="all")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument(
        "--cycles", type=int, default=4, help="fits of each configuration a round, interleaved"
    )
    parser.add_argument("--epoch-s", type=float, default=0.5)
    parser.add_argument(
        "--cases", nargs="+", choices=("small", "large", "tiny"), default=["small", "large", "tiny"]
    )
    parser.add_argument("--busy-loops", type=int, default=0, help="run beside N busy loops")
    args = parser.parse_args()
    if not args.busy_loops:
        return run(args)
    # Started once, here: the per-backend processes below pass 0 on.
    with busy_loops.running(args.busy_loops):
        print(f"beside {args.busy_loops} busy loops", flush=True)
        return run(args)


def run(args) -> None:
    """Measures each case of `args.backend` (each backend in a process of its own for "all")."""
    if args.backend == "all":
        for backend in BACKENDS:
            # A process per backend: Keras fixes it at import.
            subprocess.run(
                [
                    sys.executable, __file__, "--rounds", str(args.rounds), "--backend", backend,
                    "--epochs", str(args.epochs), "--epoch-s", str(args.epoch_s),
                    "--cycles", str(args.cycles),
                    "--cases", *args.cases,
                ],
                env=dict(os.environ, KERAS_BACKEND=backend),
                check=True,
            )
        return
    os.environ["KERAS_BACKEND"] = args.backend
    if args.backend == "torch":
        import torch

        torch.set_num_threads(1)
    print(
        f"[{args.backend}] fit with PipelineTuner / plain fit, alternated, GC off during fit",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as log_dir:
        # (name, width, first batch, features, the step time its batch is fitted to).
        cases = {
            "small": ("~1 ms model", 128, 64, 64, 1.0),
            "large": ("~10 ms model", 1024, 256, 64, 10.0),
            # Where per-step costs show most: Keras' own loop is nearly all of the step.
            "tiny": ("tiny model", 4, 1, 8, None),
        }
        for case in args.cases:
            name, width, batch, features, target_ms = cases[case]
            measure(
                name, width, batch, args.rounds, args.cycles, os.path.join(log_dir, case),
                args.epoch_s, max(args.epochs, 3), features=features, target_ms=target_ms,
            )


if __name__ == "__main__":
    main()
