"""The capacity model's "cores for input free" against fits under real CPU quotas.

A pipeline whose parallel map does real TensorFlow work (matrix products)
feeds a model whose step sleeps 25 ms and burns 5 ms of CPU (a Python loop on
its thread's CPU clock), so the job needs cores for its input and for its
step's own work. One child process imports TensorFlow once and, each round:

1. predicts: a fit with `PipelineTuner`, in the machine's own cgroup (beside
   whatever else runs), gives the capacity model's cores for input free
   (`Figures.capacity.cores_for_input_free`, predicted from the job's CPU time a
   step, which the CPU meter measured, over the step with input free);
2. measures: it moves itself into a cgroup of its own with a CPU quota and a
   high `cpu.shares` (so the quota, not the machine's load, limits it), and
   trains one plain fit (no tuner) whose epochs each run under another quota
   (rewritten at each epoch's start, in an order rotated every round): an
   epoch's step is its wall time over its steps after the first few (the
   prefetch buffer filled under the previous quota).

Rounds alternate the two; the figures are medians over the rounds. The
measured cores for input free are where the quota-bound steps cross the step
with input free (the step at no quota): an input-bound step under a quota `q`
takes `C / q` (the job's CPU a step `C`), which equals the free step at
`q = C / free step`. The smallest quota of the grid whose step is within 10 %
of the free step is printed beside it, and so is the step at the predicted
quota and at 0.8x and 1.25x of it (the issue asks the prediction within 25 %).

    python bench/capacity_cores.py [--rounds 3] [--load 0]

`--load 2` runs two busy loops beside it (in the machine's cgroup: they
contend with the predicting fit, not with the quota-bound ones). Root and a
cgroup CPU controller are needed for the quota runs (Linux); elsewhere only
the prediction is printed. The grid's quotas relative to the prediction are
those of the first round's prediction.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import busy_loops  # noqa: E402

from tests.helpers.cgroups import cpu_hierarchy  # noqa: E402
from tests.helpers.cgroups import make_quota_cgroup  # noqa: E402
from tests.helpers.cgroups import remove_cgroup  # noqa: E402

# Quotas of the grid (CPUs) beside those relative to the first prediction; 0: none.
FIXED = (0.3, 0.0)
RELATIVE = (0.5, 0.65, 0.8, 1.0, 1.25, 1.6)
LEAST = 0.2  # the smallest quota run (CPUs)
WITHIN = 1.10  # a step this close to the free step counts as input free
BOUND = 1.25  # a step this far above the free step is input-bound (for the crossing)

CHILD = textwrap.dedent(
    """
    import gc, json, os, sys, time
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import tensorflow as tf
    import keras
    import keras_pipeline_tuner as kpt

    target, top, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
    fixed, relative = json.loads(sys.argv[4]), json.loads(sys.argv[5])
    LEAST = float(sys.argv[6])
    SLEEP_S, SPIN_S, BATCH, STEPS, SKIP = 0.025, 0.005, 16, 36, 6

    def join(directory):
        with open(os.path.join(directory, "cgroup.procs"), "w") as file:
            file.write(str(os.getpid()))

    def set_quota(cpus):
        with open(os.path.join(target, "cpu.cfs_period_us")) as file:
            period = int(file.read())
        with open(os.path.join(target, "cpu.cfs_quota_us"), "w") as file:
            file.write(str(int(cpus * period)) if cpus else "-1")

    def work(i):
        t = tf.random.stateless_uniform([96, 96], seed=tf.stack([i, i]))
        for _ in range(48):
            t = tf.matmul(t, t) / 96.0
        return tf.fill([8], tf.reduce_mean(t)), tf.cast(i % 2, tf.float32)[None]

    def dataset(elements=None):
        ds = tf.data.Dataset.range(elements or 10**9)
        return (ds.map(work, num_parallel_calls=tf.data.AUTOTUNE).batch(BATCH)
                .prefetch(tf.data.AUTOTUNE))

    def step_work(x):
        # The step's compute: a sleep, and CPU work on its own thread's clock.
        time.sleep(SLEEP_S)
        until = time.thread_time() + SPIN_S
        while time.thread_time() < until:
            pass
        return x

    class Step(keras.layers.Layer):
        def call(self, x):
            y = tf.py_function(step_work, [x], tf.float32)
            y.set_shape(x.shape)
            return y

    def model():
        keras.utils.set_random_seed(1)
        m = keras.Sequential([keras.Input((8,)), Step(), keras.layers.Dense(1)])
        m.compile("sgd", "mse")
        return m

    def predict():
        join(top)
        tuner = kpt.PipelineTuner(verbose=0, profile="off", measure_fixes=False)
        model().fit(dataset(BATCH * 60), epochs=2, verbose=0, callbacks=[tuner])
        report = tuner.report
        capacity = report.figures.capacity
        return {
            "cores": capacity.cores_for_input_free if capacity else None,
            "line": capacity.line() if capacity else "no capacity model",
            "stages": report.stage_table.line() if report.stage_table else "",
            "verdict": report.figures.line,
        }

    class QuotaEpochs(keras.callbacks.Callback):
        # Each epoch under its own quota; its step from batch SKIP's end to its end.
        def __init__(self, quotas):
            super().__init__()
            self.quotas, self.steps = quotas, {}

        def on_epoch_begin(self, epoch, logs=None):
            set_quota(self.quotas[epoch])
            self.mark = None

        def on_train_batch_end(self, batch, logs=None):
            if batch == SKIP:
                self.mark = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            ms = (time.perf_counter() - self.mark) * 1e3 / (STEPS - SKIP - 1)
            self.steps[self.quotas[epoch]] = ms

    def measure(quotas):
        join(target)
        clock = QuotaEpochs(quotas)
        model().fit(dataset(), epochs=len(quotas), steps_per_epoch=STEPS, verbose=0,
                    callbacks=[clock])
        set_quota(0)
        return clock.steps

    gc.disable()
    quotas = None
    for index in range(rounds):
        predicted = predict()
        if quotas is None:
            base = predicted["cores"] or 1.0
            quotas = sorted({round(q, 2) for q in fixed} | {round(base * r, 2) for r in relative})
            # Below a fifth of a CPU a fit crawls (a prediction made on a
            # very busy machine can be that low): such quotas are left out.
            quotas = [q for q in quotas if q == 0 or LEAST <= q <= 2.0]
        shift = index % len(quotas)
        order = quotas[shift:] + quotas[:shift]
        began = time.perf_counter()
        steps = measure(order)
        print(json.dumps({"predicted": predicted, "steps": steps,
                          "measure_s": time.perf_counter() - began,
                          "load": os.getloadavg()[0]}), flush=True)
        gc.collect()
    """
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--load", type=int, default=0, help="busy-loop processes beside it")
    args = parser.parse_args()
    version, top = cpu_hierarchy()
    if version != 1:
        # The child rewrites a v1 quota (cpu.cfs_quota_us); v2 would need cpu.max.
        sys.exit(f"no cgroup v1 CPU controller to make a quota in: {top}")
    loads = busy_loops.start(args.load)
    began = time.monotonic()
    print(f"{args.load} busy loops beside; load average {os.getloadavg()[0]:.1f} at the start")
    made, rounds = [], []
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="2")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    try:
        path = make_quota_cgroup(version, top, 2.0, made)
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, path, top, str(args.rounds),
             json.dumps(FIXED), json.dumps(RELATIVE), str(LEAST)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for line in child.stdout:
            if line.startswith("{"):
                rounds.append(json.loads(line))
                print(f"  round {len(rounds)} done ({time.monotonic() - began:.0f} s)", flush=True)
        error = child.stderr.read()
        if child.wait() != 0:
            sys.exit(error[-3000:])
    finally:
        busy_loops.stop(loads)
        for made_path in reversed(made):
            remove_cgroup(made_path, top)
    report(rounds, args.load)
    print(f"load average {os.getloadavg()[0]:.1f} at the end; {time.monotonic() - began:.0f} s")


def report(rounds, load) -> None:
    """Prints predicted against measured, per round and as medians."""
    first = rounds[0]["predicted"]
    print(f"\nthe tuned fit (round 1): {first['stages']}\n  {first['line']}\n  {first['verdict']}")
    quotas = sorted({float(q) for found in rounds for q in found["steps"]}, key=_order)
    print("\nstep (ms) under each quota, per round (0 = no quota); the prediction of that round:")
    print(f"{'quota':>8}" + "".join(f"{f'round {i + 1}':>10}" for i in range(len(rounds)))
          + f"{'median':>10}")
    medians = {}
    for quota in quotas:
        values = [found["steps"].get(_key(quota)) for found in rounds]
        values = [v for v in values if v is not None]
        medians[quota] = statistics.median(values)
        label = "none" if quota == 0 else f"{quota:.2f}"
        print(f"{label:>8}" + "".join(f"{v:10.1f}" for v in values) + f"{medians[quota]:10.1f}")
    predictions = [found["predicted"]["cores"] for found in rounds]
    print(f"{'predicted':>8}" + "".join(
        f"{p:10.2f}" if p is not None else f"{'-':>10}" for p in predictions
    ) + f"{statistics.median([p for p in predictions if p is not None]):10.2f}")
    print(f"{'load':>8}" + "".join(f"{found['load']:10.1f}" for found in rounds))
    free = medians.get(0.0)
    predicted = statistics.median([p for p in predictions if p is not None])
    limited = [q for q in quotas if q > 0]
    products = [q * medians[q] for q in limited if medians[q] > BOUND * free]
    crossing = statistics.median(products) / free if products else None
    smallest = next((q for q in limited if medians[q] <= WITHIN * free), None)
    print(f"\nfree step (no quota, median): {free:.1f} ms")
    if crossing is not None:
        print(f"measured cores for input free (where quota x step of the input-bound quotas, "
              f"{len(products)} of them, meets the free step): {crossing:.2f}")
    if smallest is not None:
        print(f"smallest quota of the grid within {WITHIN - 1:.0%} of the free step: "
              f"{smallest:.2f} CPUs")
    for share in (0.8, 1.0, 1.25):
        near = min(limited, key=lambda q: abs(q - share * predicted))
        state = "input free" if medians[near] <= WITHIN * free else "input-bound"
        print(f"at {share:.2f}x the prediction (quota {near:.2f}): step {medians[near]:.1f} ms, "
              f"{medians[near] / free:.2f}x the free step: {state}")
    print(f"\n{'predicted (capacity model)':>28} {'measured (quota runs)':>22} {'ratio':>7}")
    if crossing is not None:
        ratio = predicted / crossing
        verdict = "within 25 %" if 0.75 <= ratio <= 1.25 else "OUTSIDE 25 %"
        print(f"{predicted:28.2f} {crossing:22.2f} {ratio:7.2f}  {verdict}, {load} busy loops")
    else:
        print(f"{predicted:28.2f} {'-':>22}: no quota of the grid bound the input")


def _order(quota: float) -> float:
    return quota if quota > 0 else float("inf")


def _key(quota: float) -> str:
    """The JSON key of a quota (json writes float keys as their repr)."""
    return repr(quota)


if __name__ == "__main__":
    main()
