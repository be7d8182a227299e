"""Following the CPU-quota advice under a real quota: are the steps any slower?

Makes a cgroup with a CPU quota (root, Linux; 1 CPU by default), and in a
child process that joins it after importing TensorFlow fits a small model on a
pipeline whose map does real TensorFlow work on AUTOTUNE threads: once as
written, once with the advised option (`autotune.cpu_budget` set to the
budget), once with a private thread pool of the budget's size as well (advised
only where the fit's own timing after training finds it faster), in an order
rotated every round, each fit measured by its last epoch's clock and by the
tuner. Prints, per round, each side's wall time a step (its last epoch's, over
its steps: the rate training goes at), beside the tuner's step time (input
wait + compute) and the time between steps, which under a quota holds many of
the kernel's stops, and the share of quota periods throttled; the ratios to
the fit as written are of the wall times; then the median ratios, the advice
the first fit got, and each fit as written's verdict and its timing of the
private pool after training, and the ratio of following each round's own
advice (the pool too where that round's fit set it). Run it quiet and beside
a CPU load (`python bench/cpu_quota.py --load 2`) before quoting it.

    python bench/cpu_quota.py [--quota 1.0] [--rounds 3] [--load 0]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import busy_loops  # noqa: E402

from tests.helpers.cgroups import cpu_hierarchy  # noqa: E402
from tests.helpers.cgroups import make_quota_cgroup  # noqa: E402
from tests.helpers.cgroups import remove_cgroup  # noqa: E402

CHILD = textwrap.dedent(
    """
    import json, os, sys, time
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import tensorflow as tf
    import keras
    import keras_pipeline_tuner as kpt
    from keras_pipeline_tuner.timing.cpu_budget import read_cpu_budget

    target, rounds = sys.argv[1], int(sys.argv[2])
    STEPS = 250
    with open(os.path.join(target, "cgroup.procs"), "w") as file:
        file.write(str(os.getpid()))

    def work(i):
        x = tf.random.stateless_normal((96, 96), seed=tf.stack([i, i]))
        for _ in range(6):
            x = tf.tanh(tf.matmul(x, x) / 96.0)
        return tf.reduce_mean(x, axis=0), tf.cast(i % 2, tf.float32)

    def pipeline(side, cpus):
        ds = (tf.data.Dataset.range(100_000).map(work, num_parallel_calls=tf.data.AUTOTUNE)
              .batch(8).prefetch(tf.data.AUTOTUNE))
        if side != "as_written":
            options = tf.data.Options()
            options.autotune.cpu_budget = cpus
            if side == "pool":
                options.threading.private_threadpool_size = cpus
            ds = ds.with_options(options)
        return ds

    class EpochClock(keras.callbacks.Callback):
        # The steps' real rate: the last epoch's wall time over its steps. The
        # tuner's step (input wait + compute) leaves out the time between
        # steps, where many of the kernel's stops fall under a quota.
        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            self.wall_ms = (time.perf_counter() - self.start) / STEPS * 1e3

    def fit(side, cpus):
        model = keras.Sequential(
            [keras.Input((96,)), keras.layers.Dense(256, "relu"), keras.layers.Dense(1)]
        )
        model.compile("sgd", "mse")
        # The fit as written runs the contention check and times the advised
        # fixes after training, as a user's would (its last epoch's clock has
        # stopped by then).
        as_written = side == "as_written"
        tuner = kpt.PipelineTuner(verbose=0, profile="off", check_contention=as_written,
                                  measure_fixes=as_written)
        clock = EpochClock()
        model.fit(pipeline(side, cpus), epochs=2, steps_per_epoch=STEPS,
                  callbacks=[tuner, clock], verbose=0)
        report = tuner.report
        return {
            "wall_ms": clock.wall_ms,
            "step_ms": report.train.step.mean_ms,
            "gap_ms": report.train.host_gap.mean_ms,
            "throttled": report.cpu.throttling.share if report.cpu.throttling else None,
            "cpus": report.cpu.budget.cpus,
            "budget": report.cpu.budget.describe(),
            "advice": [f"{r.title} | {r.fix}" for r in report.recommendations],
            "verdict": report.judgement.line if report.judgement else report.verdict.value,
            "timed": [e.detail for r in report.recommendations if r.id == "cpu-quota-threads"
                      for e in r.evidence if e.source == "fix timing"],
        }

    cpus = read_cpu_budget().cpus
    sides = ["as_written", "advised", "pool"]
    for index in range(rounds):
        shift = index % len(sides)
        found = {}
        for side in sides[shift:] + sides[:shift]:
            found[side] = fit(side, cpus)
        print(json.dumps(found), flush=True)
    """
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quota", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--load", type=int, default=0, help="busy-loop processes beside it")
    args = parser.parse_args()
    version, top = cpu_hierarchy()
    if version is None:
        sys.exit(f"cannot make a cgroup: {top}")
    loads = busy_loops.start(args.load)
    made = []
    try:
        path = make_quota_cgroup(version, top, args.quota, made)
        child = subprocess.run(
            [sys.executable, "-c", CHILD, path, str(args.rounds)],
            capture_output=True,
            text=True,
            check=True,
        )
    finally:
        busy_loops.stop(loads)
        for path in made:
            remove_cgroup(path, top)
    rounds = [json.loads(line) for line in child.stdout.splitlines() if line.startswith("{")]
    budget = rounds[0]["as_written"]["budget"]
    print(f"quota {args.quota:g} CPU, {args.load} busy loops beside; {budget}")
    print("per fit: wall ms a step (last epoch), the tuner's step | time between steps, "
          "share of quota periods throttled")
    print(f"{'round':>5}  {'as written':>27}  {'advised':>27}  {'pool too':>27}  ratios")
    ratios = {"advised": [], "pool": []}
    for index, found in enumerate(rounds, 1):
        plain = found["as_written"]
        line = f"{index:>5}  " + "  ".join(
            _cell(found[side]) for side in ("as_written", "advised", "pool")
        )
        for side in ratios:
            ratios[side].append(found[side]["wall_ms"] / plain["wall_ms"])
        print(line + f"  {ratios['advised'][-1]:.2f} {ratios['pool'][-1]:.2f}")
    print(
        "median wall-time ratio a step over as written: advised (AUTOTUNE's budget) "
        f"{statistics.median(ratios['advised']):.2f}, with a private pool of the budget's "
        f"size too {statistics.median(ratios['pool']):.2f}"
    )
    # Each round's own advice: the pool too where that round's fit as written
    # timed it faster (and so set it), else AUTOTUNE's budget alone.
    followed = [
        ratios["pool" if _sets_pool(found["as_written"]) else "advised"][index]
        for index, found in enumerate(rounds)
    ]
    print(
        "following each round's own advice (the pool set in "
        f"{sum(_sets_pool(found['as_written']) for found in rounds)} of {len(rounds)}): "
        f"{' '.join(f'{ratio:.2f}' for ratio in followed)}, median "
        f"{statistics.median(followed):.2f}"
    )
    print("advice of the first fit as written:")
    for line in rounds[0]["as_written"]["advice"]:
        print("  " + line.replace("\n", " / "))
    print("each fit as written: its verdict, and the private pool timed after training:")
    for found in rounds:
        print("  verdict: " + found["as_written"]["verdict"])
        for line in found["as_written"]["timed"]:
            print("  " + line)


def _sets_pool(found) -> bool:
    """Whether a fit's AUTOTUNE-budget advice sets a private thread pool."""
    return any(
        "options.threading.private_threadpool_size =" in advice
        for advice in found["advice"]
        if advice.startswith("Give tf.data's AUTOTUNE")
    )


def _cell(found) -> str:
    share = "-" if found["throttled"] is None else f"{found['throttled'] * 100:.0f} %"
    return f"{found['wall_ms']:5.2f}: {found['step_ms']:4.2f} | {found['gap_ms']:4.2f} {share:>5}"


if __name__ == "__main__":
    main()
