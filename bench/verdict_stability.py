"""Verdict stability: the class of repeated fits, quiet and beside a CPU load, and the tuner's cost.

Three pipelines whose input share is known by construction, on a tiny Keras
model (CPU), on the backend `--backend` names (each in a process of its own
with `all`); the model's known compute sleeps inside its step on every backend
(`tests.helpers.backend_fit.SleepingCompute`):

- healthy: in-memory data, batched, cached and prefetched, into a Dense model
  whose step takes well under a millisecond; 2000 steps an epoch, 3 epochs.
- borderline: the model's step sleeps 40 ms (a `tf.numpy_function` fed the
  batch: compute a CPU load cannot stretch) and a `tf.py_function` map sleeps
  3 ms per batch, with no prefetch (tf.data's own injected prefetch turned
  off too), so the step waits about 10 % of its time (the sleep and the
  py_function's own cost), between the 5 % and 20 % thresholds.
- input-bound: the map sleeps 30 ms per batch against a step of about 1 ms.

Each pipeline is fitted `--fits` times (5) with a fresh `PipelineTuner(verbose=0)`,
defaults otherwise (`--log-dir` gives each a temporary `log_dir`: its writes
are part of the cost). Each tuned fit is paired with a plain fit (no tuner) of
the same pipeline and a fresh identical model, which of the two runs first
alternating pair by pair, Python's GC off during each fit.

The tuner's time is timed around each of its hooks on the training thread.
Its work once per fit (`on_train_begin`: reading the pipeline;
`on_train_end`: the probes after training, the report, the files; the epoch
hooks: the outputs), which its budget bounds, is judged against that budget;
medians per group. Its batch hooks (the step clock) are its per-step cost,
printed in microseconds a step. The whole fit's wall time less its plain
pair's is printed beside it, median and range: on a busy machine two fits of
the same pipeline differ by seconds (-15 to +5 s for 26 s fits beside two busy
loops here), which would hide or invent a second of the tuner's. A short pair
of each pipeline runs first and is not counted: tracing and imports paid once
per process would land on whichever fit came first.

The fits run once quiet and once beside a CPU load: `--busy-loops` (2)
processes spinning in pure Python, started and ended by the bench. A 2-core
machine then has a load average of 4 or more, as a shared CI runner often does.

Per condition and pipeline it prints each fit's class, the min / median / max
of the input fraction, whether all fits agree and whether two are two classes
apart, the tuner's time in each fit and the largest, the budget (the larger
of 2 s and 2 % of the plain fit) and whether every fit kept within it, the
whole fits' difference, and the verdict line of each fit whose class left the
majority's; then one summary line per condition.

    python bench/verdict_stability.py [--backend tensorflow|jax|torch|all]
                                      [--condition quiet|loaded|both] [--fits 5]
                                      [--busy-loops 2] [--log-dir] [--quick]
"""

import argparse
import collections
import contextlib
import dataclasses
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable
from typing import Dict
from typing import List
from typing import Optional
from typing import Tuple

BACKENDS = ("tensorflow", "jax", "torch")


def _backend_argument() -> str:
    """`--backend`, read before Keras is imported: the backend is fixed at import."""
    for index, argument in enumerate(sys.argv):
        if argument == "--backend" and index + 1 < len(sys.argv):
            return sys.argv[index + 1]
        if argument.startswith("--backend="):
            return argument.split("=", 1)[1]
    return "tensorflow"


os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The pipelines are tf.data on every backend.
BACKEND = _backend_argument()
os.environ["KERAS_BACKEND"] = BACKEND if BACKEND in BACKENDS else "tensorflow"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import busy_loops as loads  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from overhead import timed_fit  # noqa: E402

import keras_pipeline_tuner as kpt  # noqa: E402
from tests.helpers.backend_fit import SleepingCompute  # noqa: E402

FEATURES = 8
BATCH = 8
AUTOTUNE = tf.data.AUTOTUNE
# The tuner's time per fit keeps within the larger of these.
BUDGET_FLOOR_S = 2.0
BUDGET_SHARE = 0.02
# The automatic fix timing's cap may be passed by one pass's end: allowed this much.
CAP_SLACK_S = 0.25
# Classes in order of severity: two fits two apart jumped a whole class.
CLASSES = {
    kpt.Verdict.NOT_INPUT_BOUND.value: ("not", 0),
    kpt.Verdict.MODERATELY_INPUT_BOUND.value: ("mod", 1),
    kpt.Verdict.HIGHLY_INPUT_BOUND.value: ("high", 2),
}


# The model: a tiny Dense net, with a known sleeping compute where asked.


def tiny_model(compute_s: Optional[float] = None):
    # The same seed each time: the paired fits train identical models.
    keras.utils.set_random_seed(0)
    layers = [keras.Input((FEATURES,)), keras.layers.Dense(4)]
    if compute_s:
        layers.append(SleepingCompute(compute_s))
    net = keras.Sequential(layers + [keras.layers.Dense(1)])
    net.compile("sgd", "mse")
    return net


# The pipelines.


def source(steps: int) -> tf.data.Dataset:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(steps * BATCH, FEATURES)).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((x, x.sum(axis=1, keepdims=True)))


def sleeping_map(seconds: float):
    """A per-batch map of Python that sleeps `seconds` (and releases the GIL meanwhile)."""

    def work(value):
        time.sleep(seconds)
        return value

    def load(x, y):
        x = tf.py_function(work, [x], tf.float32)
        x.set_shape((None, FEATURES))
        return x, y

    return load


def unprefetched(dataset: tf.data.Dataset) -> tf.data.Dataset:
    # tf.data would append a prefetch after the map on its own, which overlaps
    # the input with the step and hides the wait the borderline case is made of.
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False
    return dataset.with_options(options)


@dataclasses.dataclass
class Pipeline:
    name: str
    what: str
    steps: int  # per epoch
    epochs: int
    compute_s: Optional[float]
    build: Callable[[int], tf.data.Dataset]

    def shortened(self) -> "Pipeline":
        # Enough steps in the first epoch for the "auto" profiler window to
        # open and close on an input-bound job (10 steps, then 15).
        steps = 300 if self.compute_s is None else 30
        return dataclasses.replace(self, steps=min(self.steps, steps))


def pipelines(quick: bool) -> List[Pipeline]:
    cases = [
        Pipeline(
            "healthy",
            "cached, prefetched, tiny Dense step",
            2000,
            3,
            None,
            lambda steps: source(steps).batch(BATCH).cache().prefetch(AUTOTUNE),
        ),
        Pipeline(
            "borderline",
            "3 ms py_function map, no prefetch; 40 ms step",
            70,
            3,
            0.04,
            lambda steps: unprefetched(source(steps).batch(BATCH).map(sleeping_map(0.003))),
        ),
        Pipeline(
            "input-bound",
            "30 ms py_function map; 1 ms step",
            100,
            3,
            0.001,
            lambda steps: source(steps).batch(BATCH).map(sleeping_map(0.03)),
        ),
    ]
    if quick:
        return [case.shortened() for case in cases]
    return cases


# One pair of fits.


@dataclasses.dataclass
class Pair:
    verdict: str
    fraction: Optional[float]
    line: str
    step_ms: float
    tuned_s: float
    plain_s: float
    # Seconds inside the tuner's hooks on the training thread, by hook group.
    hooks: Dict[str, float]
    steps: int
    # The fix timing `measure_fixes="auto"` ran on a cap of its own, and that cap.
    capped_s: float = 0.0
    cap_s: Optional[float] = None

    @property
    def added_s(self) -> float:
        return self.tuned_s - self.plain_s

    @property
    def own_s(self) -> float:
        """The tuner's work once per fit: its begin, end and epoch hooks (its budget's scope).

        The fix timing that ran on a cap of its own is left out and checked
        against that cap (`within_cap`).
        """
        hooks = sum(seconds for group, seconds in self.hooks.items() if group != "steps")
        return hooks - self.capped_s

    @property
    def within_cap(self) -> bool:
        return self.cap_s is None or self.capped_s <= self.cap_s + CAP_SLACK_S

    @property
    def step_us(self) -> float:
        """The tuner's batch hooks per step, in microseconds (its per-step cost)."""
        return self.hooks.get("steps", 0.0) / max(self.steps, 1) * 1e6

    @property
    def budget_s(self) -> float:
        return max(BUDGET_FLOOR_S, BUDGET_SHARE * self.plain_s)


HOOK_GROUPS = {
    "on_train_begin": "begin",
    "on_train_end": "end",
    "on_epoch_begin": "epochs",
    "on_epoch_end": "epochs",
    "on_test_begin": "epochs",
    "on_test_end": "epochs",
    "on_train_batch_begin": "steps",
    "on_train_batch_end": "steps",
    "on_test_batch_begin": "steps",
    "on_test_batch_end": "steps",
}


def timed_hooks(callback) -> Dict[str, float]:
    """Times every hook of `callback` (on the instance): seconds per group, filled as fit runs.

    Two `perf_counter` calls a hook, some 0.2 us: what the tuner itself does on
    the training thread, begin to end, without the noise of a whole fit's
    wall time on a busy machine (which varies by seconds from fit to fit).
    """
    spent = collections.defaultdict(float)
    for name, group in HOOK_GROUPS.items():
        hook = getattr(callback, name)

        def timed(*args, _hook=hook, _group=group, **kwargs):
            began = time.perf_counter()
            try:
                return _hook(*args, **kwargs)
            finally:
                spent[_group] += time.perf_counter() - began

        setattr(callback, name, timed)
    return spent


def fit_pair(pipeline: Pipeline, tuned_first: bool, log_dir: Optional[str]) -> Pair:
    """A tuned fit and a plain fit of the same pipeline on fresh identical models."""
    tuner = kpt.PipelineTuner(log_dir=log_dir, verbose=0)
    spent = timed_hooks(tuner)
    seconds = {}
    for tuned in (tuned_first, not tuned_first):
        model = tiny_model(pipeline.compute_s)
        dataset = dict(x=pipeline.build(pipeline.steps))
        seconds[tuned] = timed_fit(model, dataset, [tuner] if tuned else [], epochs=pipeline.epochs)
    report = tuner.report
    cost = report.tuner_cost
    return Pair(
        verdict=report.verdict.value,
        fraction=report.input_fraction,
        line=report.judgement.line if report.judgement is not None else "",
        step_ms=report.train.step.mean_ms,
        tuned_s=seconds[True],
        plain_s=seconds[False],
        hooks=dict(spent),
        steps=report.train.steps + (report.validation.steps if report.validation else 0),
        capped_s=cost.capped_s if cost is not None else 0.0,
        cap_s=cost.fix_timing_cap_s if cost is not None else None,
    )


def cpu_load(processes: int):
    """`processes` busy loops in pure Python for as long as the block runs."""
    return loads.running(processes)


def load_average() -> str:
    return " ".join(f"{value:.1f}" for value in os.getloadavg())


# The table.


def percent(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{value * 100:.1f}"


@dataclasses.dataclass
class Row:
    """One pipeline's fits under one condition, judged."""

    pipeline: Pipeline
    pairs: List[Pair]

    def classes(self) -> List[str]:
        return [CLASSES.get(pair.verdict, (pair.verdict, None))[0] for pair in self.pairs]

    def agree(self) -> bool:
        return len({pair.verdict for pair in self.pairs}) == 1

    def majority(self) -> Tuple[str, int]:
        """The verdict most fits got, and how many got it."""
        return collections.Counter(pair.verdict for pair in self.pairs).most_common(1)[0]

    def two_apart(self) -> bool:
        # An unknown verdict has no place on the scale: counted as a jump.
        severities = [CLASSES.get(pair.verdict, (None, None))[1] for pair in self.pairs]
        if None in severities:
            return True
        return max(severities) - min(severities) >= 2

    def within_budget(self) -> bool:
        return all(pair.own_s <= pair.budget_s and pair.within_cap for pair in self.pairs)

    def largest_own(self) -> Pair:
        return max(self.pairs, key=lambda pair: pair.own_s)

    def fractions(self) -> str:
        known = [pair.fraction for pair in self.pairs if pair.fraction is not None]
        if not known:
            return "n/a"
        figures = (min(known), statistics.median(known), max(known))
        return " / ".join(percent(value) for value in figures)


HEADINGS = (
    f"  {'pipeline':<12} {'plain s':>7} {'step ms':>7}  {'class of each fit':<24} "
    f"{'input % min / med / max':>23}  {'agree':<5} {'2 apart':<7}  "
    f"{'tuner s per fit (once-a-fit hooks)':<34} {'largest':>7} {'budget':>6} {'within':<6} "
    f"{'begin / end / epochs s, medians':>31} {'us/step':>7}  "
    f"{'tuned - plain s: median (min, max)':>34}"
)


def print_row(row: Row) -> None:
    pairs = row.pairs
    largest = row.largest_own()
    plain_s = statistics.median(pair.plain_s for pair in pairs)
    step_ms = statistics.median(pair.step_ms for pair in pairs)
    own = " ".join(f"{pair.own_s:.2f}" for pair in pairs)
    groups = " / ".join(
        f"{statistics.median(pair.hooks.get(group, 0.0) for pair in pairs):.2f}"
        for group in ("begin", "end", "epochs")
    )
    step_us = statistics.median(pair.step_us for pair in pairs)
    added = [pair.added_s for pair in pairs]
    print(
        f"  {row.pipeline.name:<12} {plain_s:7.1f} {step_ms:7.2f}  "
        f"{' '.join(row.classes()):<24} {row.fractions():>23}  "
        f"{'yes' if row.agree() else 'NO':<5} {'YES' if row.two_apart() else 'no':<7}  "
        f"{own:<34} {largest.own_s:7.2f} {largest.budget_s:6.1f} "
        f"{'yes' if row.within_budget() else 'NO':<6} {groups:>31} {step_us:7.1f}  "
        f"{statistics.median(added):+14.2f} ({min(added):+.2f}, {max(added):+.2f})",
        flush=True,
    )
    capped = [pair for pair in pairs if pair.cap_s is not None]
    if capped:
        print(
            "    fix timing on its own cap (measure_fixes=\"auto\"), s of cap: "
            + " ".join(f"{pair.capped_s:.2f}/{pair.cap_s:.1f}" for pair in capped),
            flush=True,
        )
    # What decided each fit that left the majority: why its class moved.
    majority, _ = row.majority()
    for index, pair in enumerate(pairs, 1):
        if pair.verdict != majority:
            print(f"    fit {index}: {pair.line}", flush=True)


def summary(condition: str, rows: List[Row]) -> str:
    by_name = {row.pipeline.name: row for row in rows}
    fits = len(rows[0].pairs)
    steady = [
        f"{name} {by_name[name].majority()[1]}/{fits} alike "
        f"({'ok' if by_name[name].agree() else 'FAIL'})"
        for name in ("healthy", "input-bound")
    ]
    jump = by_name["borderline"].two_apart()
    pairs = [pair for row in rows for pair in row.pairs]
    largest = max(pairs, key=lambda pair: pair.own_s)
    within = all(row.within_budget() for row in rows)
    return (
        f"{condition}: {'; '.join(steady)}; borderline "
        f"{'JUMPED TWO CLASSES (FAIL)' if jump else 'never two classes apart (ok)'}; "
        f"the tuner's time within budget in "
        f"{'every fit (ok)' if within else 'NOT every fit (FAIL)'}"
        f", largest {largest.own_s:.2f} s against {largest.budget_s:.1f} s"
    )


# The runs.


def run_condition(cases: List[Pipeline], fits: int, log_root: Optional[str]) -> List[Row]:
    rows = [Row(case, []) for case in cases]
    for row in rows:
        for index in range(fits):
            log_dir = None
            if log_root is not None:
                log_dir = tempfile.mkdtemp(prefix=f"{row.pipeline.name}-", dir=log_root)
            # Which fit of the pair runs first alternates: neither always
            # finds the machine as the other left it.
            row.pairs.append(fit_pair(row.pipeline, index % 2 == 1, log_dir))
        print_row(row)
    return rows


def warm_up(cases: List[Pipeline], log_root: Optional[str]) -> None:
    """A short pair of each pipeline: tracing and imports once per process, not counted."""
    added = []
    for case in cases:
        log_dir = None if log_root is None else tempfile.mkdtemp(dir=log_root)
        pair = fit_pair(case.shortened(), True, log_dir)
        added.append(f"{case.name} {pair.own_s:.2f}")
    print(f"warm-up pairs (not counted), the tuner's s: {', '.join(added)}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=BACKENDS + ("all",), default="tensorflow")
    parser.add_argument("--condition", choices=("quiet", "loaded", "both"), default="both")
    parser.add_argument("--fits", type=int, default=None, help="fits per pipeline (5; 2 quick)")
    parser.add_argument("--busy-loops", type=int, default=2)
    parser.add_argument(
        "--log-dir", action="store_true", help="give each tuned fit a temporary log_dir"
    )
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    args = parser.parse_args()
    if args.backend == "all":
        for backend in BACKENDS:
            print(f"\n=== backend {backend}", flush=True)
            given = sys.argv[1:]
            others = [
                argument
                for index, argument in enumerate(given)
                if not argument.startswith("--backend")
                and (index == 0 or given[index - 1] != "--backend")
            ]
            command = [sys.executable, __file__, "--backend", backend, *others]
            subprocess.run(command, check=False)
        return
    fits = args.fits or (2 if args.quick else 5)
    cases = pipelines(args.quick)
    conditions = ("quiet", "loaded") if args.condition == "both" else (args.condition,)
    print(
        f"verdict stability ({BACKEND}): {fits} tuned fits per pipeline, each paired with a "
        "plain fit, "
        f"alternated, GC off; log_dir {'temporary' if args.log_dir else 'none'}; "
        f"budget max({BUDGET_FLOOR_S:.0f} s, {BUDGET_SHARE:.0%} of the plain fit)"
    )
    for case in cases:
        print(f"  {case.name}: {case.what}; {case.epochs} epochs of {case.steps} steps")
    print("  classes: not / mod / high = not / moderately / highly input-bound", flush=True)
    summaries = []
    with tempfile.TemporaryDirectory() as directory:
        log_root = directory if args.log_dir else None
        warm_up(cases, log_root)
        for condition in conditions:
            load = cpu_load(args.busy_loops) if condition == "loaded" else contextlib.nullcontext()
            with load:
                # Let the busy loops reach the load average before the first fit.
                time.sleep(5 if condition == "loaded" else 0)
                started = load_average()
                busy = f", {args.busy_loops} busy loops" if condition == "loaded" else ""
                print(f"\n{condition}{busy}: load average {started} at start", flush=True)
                print(HEADINGS, flush=True)
                rows = run_condition(cases, fits, log_root)
                print(f"  load average {load_average()} at end", flush=True)
            summaries.append(summary(condition, rows))
    print()
    for line in summaries:
        print(line)


if __name__ == "__main__":
    main()
