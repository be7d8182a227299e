"""Cost of PipelineTuner's TF Profiler window of 20 steps.

For an input-bound job (a slow generator) and a compute-heavy one (a wide model on
cached data), fits with `profile=(10, 30)` several times in one process and
prints, as medians over the rounds: the time to start the profiler, to stop it
and write the capture, the capture's size, xprof's conversion time (in a
process of its own, while training goes on) and how long the end of fit waited
for it, and how much slower a step is while the profiler runs than outside the
window (from the step clock).

    python bench/profile_cost.py [--rounds 3]
"""

import argparse
import gc
import os
import shutil
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from overhead import make_case  # noqa: E402  (bench/ is on the path when run as a script)

import keras_pipeline_tuner as kpt  # noqa: E402

WINDOW = (10, 30)
STEPS = 50


def slow_generator_case():
    def generate():
        while True:
            time.sleep(0.015)
            yield np.ones(64, np.float32), np.float32(1.0)

    dataset = tf.data.Dataset.from_generator(
        generate,
        output_signature=(tf.TensorSpec((64,), tf.float32), tf.TensorSpec((), tf.float32)),
    ).batch(2)
    model, _ = make_case(width=16, batch=2, steps=1)
    return model, dataset


def compute_heavy_case():
    return make_case(width=1024, batch=256, steps=STEPS)


def one_round(model, dataset, log_dir):
    tuner = kpt.PipelineTuner(log_dir=log_dir, verbose=0, profile=WINDOW)
    gc.collect()
    gc.disable()
    try:
        model.fit(
            dataset, epochs=1, steps_per_epoch=STEPS, callbacks=[tuner], verbose=0, shuffle=False
        )
    finally:
        gc.enable()
    # The conversion may still run when fit returns.
    evidence = tuner.wait_for_profile().profile
    steps = tuner.clock.steps("train")
    step_s = steps["wait"] + steps["compute"]
    # The clock keeps the first step apart: retained row i is training step i + 1.
    index = np.arange(step_s.size) + 1
    inside = (index >= evidence.first_step) & (index < evidence.stop_step)
    slowdown = float(np.median(step_s[inside]) / np.median(step_s[~inside]))
    return evidence, slowdown


def measure(name, make_case, rounds):
    model, dataset = make_case()
    rows = []
    for _ in range(rounds):
        log_dir = tempfile.mkdtemp(prefix="profile_cost_")
        try:
            rows.append(one_round(model, dataset, log_dir))
        finally:
            shutil.rmtree(log_dir, ignore_errors=True)
    costs = [evidence.cost for evidence, _ in rows]
    print(
        f"{name:<14} window {costs[0].steps} steps  "
        f"start {statistics.median(c.start_s for c in costs) * 1e3:6.1f} ms  "
        f"stop+write {statistics.median(c.stop_s for c in costs) * 1e3:6.1f} ms  "
        f"file {statistics.median(c.file_bytes for c in costs) / 1024:7.0f} KiB  "
        f"conversion {statistics.median(c.conversion_s for c in costs) * 1e3:6.1f} ms  "
        f"waited {statistics.median(c.conversion_wait_s for c in costs) * 1e3:6.1f} ms  "
        f"step time in window x{statistics.median(s for _, s in rows):.2f}  "
        f"input {statistics.median(e.input_fraction for e, _ in rows) * 100:5.1f} %  "
        f"({rounds} rounds)"
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"PipelineTuner(profile={WINDOW}), {STEPS} steps per fit, medians over rounds")
    measure("slow generator", slow_generator_case, args.rounds)
    measure("compute-heavy", compute_heavy_case, args.rounds)


if __name__ == "__main__":
    main()
