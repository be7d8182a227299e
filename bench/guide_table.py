"""The tf.data performance guide's pipelines: naive, hand-optimised and `kpt.tune(naive)`.

For each lesson of the guide whose naive pipeline has a hand-optimised version,
tunes the naive pipeline with `kpt.tune` (with the guide's simulated 10 ms
training step, or none for the vectorisation case), checks that the tuned
pipeline yields the naive one's elements, then times the naive, the
hand-optimised and the tuned pipelines side by side in one run: alternating
passes, each on a freshly built dataset (empty caches), Python's GC off during
each pass, median of the rounds. Prints one row per lesson, with the ratio
tuned / hand-optimised (below 1: the tuner's rewrite is faster than the
guide's fix). A last row, not from the guide, is a pipeline whose epoch takes
seconds (a sequential Python map of 20 ms per element), tuned with
`budget_s=60` in passes of a few batches.

The guide's Python functions keep no state, so the bench vouches for them:
`allow_unverified=True` lets `kpt.tune` run them from several threads.

    python bench/guide_table.py [--rounds 7] [--budget 40]
"""

import argparse
import dataclasses
import logging
import os
import statistics
import sys
from typing import Callable
from typing import Optional

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

import keras_pipeline_tuner as kpt  # noqa: E402

# The guide's pipelines live with the tests, which share them with the benches.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from keras_pipeline_tuner.pipeline.graph.reader import graph_def_of  # noqa: E402
from keras_pipeline_tuner.pipeline.tune import paired_timing  # noqa: E402
from keras_pipeline_tuner.pipeline.tune.rebuild import rebuild  # noqa: E402
from tests.helpers import guide_pipelines as guide  # noqa: E402
from tests.helpers.slow_pipelines import slow_python_map  # noqa: E402


@dataclasses.dataclass
class Lesson:
    name: str
    naive: Callable[[], tf.data.Dataset]
    hand: Callable[[], tf.data.Dataset]
    epochs: int = 2
    step_s: float = guide.STEP_S
    # kpt.tune's budget_s for this lesson; `None` for the command line's.
    budget_s: Optional[float] = None


LESSONS = (
    Lesson("naive -> prefetch", guide.naive, guide.prefetched),
    Lesson("interleave -> parallel", guide.sequential_interleave, guide.parallel_interleave),
    Lesson("map -> parallel map", guide.sequential_map, guide.parallel_map),
    Lesson("map -> cache (5 epochs)", guide.sequential_map, guide.cache_after_map, epochs=5),
    Lesson(
        "scalar -> vectorised map",
        guide.scalar_map,
        guide.vectorized_map,
        step_s=0.0,
    ),
    # Not a guide lesson: an epoch of about 5 s, timed by kpt.tune in passes
    # of a few batches within a budget of 60 s.
    Lesson(
        "slow epoch: Python map",
        lambda: slow_python_map(0.020, 240),
        lambda: slow_python_map(0.020, 240, parallel=True),
        epochs=1,
        step_s=0.0,
        budget_s=60.0,
    ),
)


# Seconds of side-by-side timing per lesson, at least.
MIN_TIMING_S = 10.0


def elements(dataset):
    """The dataset's elements as nested lists, in order."""
    return [tf.nest.map_structure(lambda t: t.numpy().tolist(), e) for e in dataset]


def fresh(dataset):
    """A factory of fresh copies of a dataset (its caches start empty)."""
    graph_def = graph_def_of(dataset)
    return lambda: rebuild(graph_def, dataset.element_spec, dataset)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="side-by-side rounds per lesson")
    parser.add_argument("--budget", type=float, default=40.0, help="kpt.tune budget_s per lesson")
    args = parser.parse_args()
    logging.getLogger("keras_pipeline_tuner").setLevel(logging.WARNING)

    print(
        "tf.data performance guide, 2-core CPU: seconds per run of the guide's loop "
        f"(median of {args.rounds} or more alternating rounds, GC off; rounds per lesson "
        "in their column)\n"
    )
    header = (
        f"{'lesson':<26} {'naive':>7} {'hand':>7} {'tuned':>7} {'tuned/hand':>10} "
        f"{'tuned/naive':>11} {'elements':>9} {'rounds':>6}  rewrites kept by kpt.tune"
    )
    print(header)
    print("-" * len(header))
    details = []
    for lesson in LESSONS:
        tuned, result = kpt.tune(
            lesson.naive(),
            consumer_step_s=lesson.step_s or None,
            budget_s=lesson.budget_s or args.budget,
            epochs=lesson.epochs,
            allow_unverified=True,
            max_python_epochs=1000,
            verbose=0,
        )
        same = elements(fresh(tuned)()) == elements(lesson.naive())
        plan = paired_timing.PassPlan(epochs=lesson.epochs, consumer_step_s=lesson.step_s or None)
        factories = {"naive": lesson.naive, "hand": lesson.hand, "tuned": fresh(tuned)}
        # A pass of tens of milliseconds is at the mercy of one scheduling
        # slice: fast lessons get more rounds, to about MIN_TIMING_S of timing.
        pass_s = min(paired_timing.time_pass(lesson.hand(), plan) for _ in range(2))
        rounds = max(args.rounds, min(10 * args.rounds, int(MIN_TIMING_S / (3 * pass_s))))
        times = paired_timing.side_by_side(factories, plan, rounds)
        naive_s, hand_s, tuned_s = (statistics.median(times[k]) for k in ("naive", "hand", "tuned"))
        versus_hand = paired_timing.median_ratio(times["tuned"], times["hand"])
        versus_naive = paired_timing.median_ratio(times["tuned"], times["naive"])
        kept = ", ".join(outcome.kind for outcome in result.applied) or "none"
        print(
            f"{lesson.name:<26} {naive_s:7.3f} {hand_s:7.3f} {tuned_s:7.3f} "
            f"{versus_hand:10.2f} {versus_naive:11.2f} {'equal' if same else 'DIFFER':>9} "
            f"{rounds:6d}  {kept}"
        )
        details.append((lesson, result))

    print("\nWhat kpt.tune did (ratio = time with / without the rewrite, side by side):")
    for lesson, result in details:
        print(f"  {lesson.name}: {result.pipeline}  =>  {result.tuned_pipeline}")
        for outcome in result.rewrites:
            ratio = f"{outcome.ratio:.2f}" if outcome.ratio is not None else "-"
            print(f"      {outcome.kind:<20} {outcome.status:<20} {ratio:>5}  {outcome.reason}")
        print(
            f"      tuning took {result.elapsed_s:.1f} s of budget_s="
            f"{lesson.budget_s or args.budget:g}, {result.epochs_run} epochs of the pipeline"
        )
        for note in result.notes:
            print(f"      note: {note}")
        if result.code:
            print("      code:")
            for line in result.code.splitlines():
                print(f"        {line}")


if __name__ == "__main__":
    main()
