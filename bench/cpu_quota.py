"""Following the CPU-quota advice under a real quota: are the steps any slower?

Makes a cgroup with a CPU quota (root, Linux; 1 CPU by default), and in a
child process that joins it after importing TensorFlow fits a small model on a
pipeline whose map does real TensorFlow work on AUTOTUNE threads: once as
written, once with the advised option (`autotune.cpu_budget` set to the
budget), once with a private thread pool of the budget's size as well (which
is not advised), in an order rotated every round, each fit measured by the
tuner itself. Prints, per round, the steady step time of each side, the share
of quota periods the kernel throttled, and the ratios to the fit as written;
then the median ratios and the advice the first fit got. Run it quiet and beside a CPU load
(`python bench/cpu_quota.py --load 2`) before quoting it.

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

from tests.helpers.cgroups import cpu_hierarchy  # noqa: E402
from tests.helpers.cgroups import make_quota_cgroup  # noqa: E402
from tests.helpers.cgroups import remove_cgroup  # noqa: E402

CHILD = textwrap.dedent(
    """
    import json, os, sys
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import tensorflow as tf
    import keras
    import keras_pipeline_tuner as kpt
    from keras_pipeline_tuner.timing.cpu_budget import read_cpu_budget

    target, rounds = sys.argv[1], int(sys.argv[2])
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

    def fit(side, cpus):
        model = keras.Sequential(
            [keras.Input((96,)), keras.layers.Dense(256, "relu"), keras.layers.Dense(1)]
        )
        model.compile("sgd", "mse")
        tuner = kpt.PipelineTuner(verbose=0, profile="off", check_contention=False,
                                  measure_fixes=False)
        model.fit(pipeline(side, cpus), epochs=2, steps_per_epoch=250,
                  callbacks=[tuner], verbose=0)
        report = tuner.report
        return {
            "step_ms": report.train.step.mean_ms,
            "throttled": report.cpu.throttling.share if report.cpu.throttling else None,
            "cpus": report.cpu.budget.cpus,
            "budget": report.cpu.budget.describe(),
            "advice": [f"{r.title} | {r.fix}" for r in report.recommendations],
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
    loads = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.load)
    ]
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
        for process in loads:
            process.kill()
        for path in made:
            remove_cgroup(path, top)
    rounds = [json.loads(line) for line in child.stdout.splitlines() if line.startswith("{")]
    budget = rounds[0]["as_written"]["budget"]
    print(f"quota {args.quota:g} CPU, {args.load} busy loops beside; {budget}")
    print(f"{'round':>5}  {'as written':>16}  {'advised':>16}  {'pool too':>16}  ratios")
    ratios = {"advised": [], "pool": []}
    for index, found in enumerate(rounds, 1):
        plain = found["as_written"]
        line = f"{index:>5}  " + "  ".join(
            f"{found[side]['step_ms']:7.2f} ms {_share(found[side]):>6}"
            for side in ("as_written", "advised", "pool")
        )
        for side in ratios:
            ratios[side].append(found[side]["step_ms"] / plain["step_ms"])
        print(line + f"  {ratios['advised'][-1]:.2f} {ratios['pool'][-1]:.2f}")
    print(
        "median step-time ratio over as written: advised (AUTOTUNE's budget) "
        f"{statistics.median(ratios['advised']):.2f}, with a private pool of the budget's "
        f"size too {statistics.median(ratios['pool']):.2f}"
    )
    print("(beside each step time: the share of quota periods throttled)")
    print("advice of the first fit as written:")
    for line in rounds[0]["as_written"]["advice"]:
        print("  " + line.replace("\n", " / "))


def _share(found) -> str:
    return "-" if found["throttled"] is None else f"{found['throttled'] * 100:.0f} %"


if __name__ == "__main__":
    main()
