"""kpt.tune's loader settings against a sweep of worker counts timed in the same process.

Issue 50's acceptance, measured: the loader `kpt.tune` returns (budget_s=30)
reads an epoch within a tenth of the best of a sweep the bench times itself.

- `pydataset`: a `PyDataset` on one worker whose `__getitem__` sleeps 30 ms,
  80 batches; the sweep: workers 1, 2, 4 and 8 (threads, Keras' defaults).
- `dataloader`: a torch `DataLoader` with `num_workers=0` over samples that
  sleep 1 ms, batches of 32, 24 batches; the sweep: `num_workers` 0 to 8,
  each with and without `persistent_workers`.
- `grain`: a Grain `DataLoader` whose map sleeps 5 ms an element, batches
  of 8, 32 batches (if `import grain` works); the sweep: `worker_count` 0,
  1, 2, 4 and 8.
- `quota`: in a child process joined to a cgroup with a 1-CPU quota (root,
  Linux; removed after), a `PyDataset` whose `__getitem__` computes 20 ms
  in Python: the workers tune chose, against threads at 1, 2 and 4 workers
  and processes at 2 and 4. Holds when no setting with fewer workers than
  tune's is more than a tenth faster, and tune's has no more workers than
  the fewest within a tenth of the best.

Each setting's epoch is read as training reads it (Keras' adapter for a
PyDataset, `iter(loader)` for a DataLoader: persistent workers start in the
first epoch only), `--epochs` (3) times in rounds that rotate the settings'
order, Python's GC off; the median is the setting's epoch. Run it quiet at
real-time priority, and loaded at normal priority beside two busy loops
(`bench/busy_loops.py`: not this process's children, whose CPU the tuner
would count as the loader's workers'):

    PYTHONPATH=. chrt -r 10 python bench/loader_sweep.py [--cases pydataset,dataloader,grain,quota]
    PYTHONPATH=. python bench/loader_sweep.py --busy-loops 2
"""

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import busy_loops  # noqa: E402

from tests.helpers import slow_loaders  # noqa: E402

WITHIN = 1.10


def _sweep(settings, epochs, read):
    """Each setting's median epoch: `read(loader)` gives an epoch's batches."""
    times = {name: [] for name in settings}
    names = list(settings)
    gc.disable()
    try:
        for index in range(epochs):
            shift = index % len(names)
            for name in names[shift:] + names[:shift]:
                began = time.perf_counter()
                for _ in read(settings[name]):
                    pass
                times[name].append(time.perf_counter() - began)
            gc.collect(1)
    finally:
        gc.enable()
    return {name: statistics.median(found) for name, found in times.items()}


def _report(name, result, medians, same=None):
    """Prints the sweep and tune's epoch against its best; `same`: the swept
    setting equal to tune's, whose gap to tune's is the noise of two equal loaders."""
    swept = {k: v for k, v in medians.items() if k != "tuned"}
    best = min(swept, key=swept.get)
    ratio = medians["tuned"] / swept[best]
    verdict = "holds" if ratio <= WITHIN else "DOES NOT HOLD"
    if same in swept:
        verdict += f" (tune's settings are {same}'s: {medians['tuned'] / swept[same]:.2f}x it)"
    table = ", ".join(f"{k} {v:.2f}" for k, v in swept.items())
    print(
        f"  {name}: tune chose {result.chosen} (claims {result.speedup:.2f}x, "
        f"{result.elapsed_s:.1f} s); sweep (s an epoch): {table}; best {best} {swept[best]:.2f} s, "
        f"tuned {medians['tuned']:.2f} s = {ratio:.2f}x the best: {verdict}",
        flush=True,
    )


def py_dataset_case(epochs):
    import keras_pipeline_tuner as kpt
    from keras_pipeline_tuner.pipeline.tune.py_dataset_loader import PyDatasetKind

    tuned, result = kpt.tune(slow_loaders.sleeping_py_dataset(0.03, 80), budget_s=30, verbose=0)
    settings = {f"workers={w}": slow_loaders.sleeping_py_dataset(0.03, 80, workers=w)
                for w in (1, 2, 4, 8)}
    settings["tuned"] = tuned
    _report("PyDataset 30 ms", result, _sweep(settings, epochs, PyDatasetKind().epoch))


def data_loader_case(epochs):
    import keras_pipeline_tuner as kpt

    tuned, result = kpt.tune(slow_loaders.sleeping_data_loader(), budget_s=30, verbose=0)
    settings = {"num_workers=0": slow_loaders.sleeping_data_loader()}
    for workers in range(1, 9):
        for persistent in (False, True):
            settings[f"num_workers={workers}{', persistent' if persistent else ''}"] = (
                slow_loaders.sleeping_data_loader(num_workers=workers,
                                                  persistent_workers=persistent)
            )
    settings["tuned"] = tuned
    _report("DataLoader 1 ms/sample", result, _sweep(settings, epochs, iter))


def grain_case(epochs):
    try:
        from absl import flags

        from tests.helpers import slow_grain
    except ImportError as error:
        print(f"  Grain: not installed ({error})", flush=True)
        return
    import keras_pipeline_tuner as kpt

    flags.FLAGS.mark_as_parsed()
    tuned, result = kpt.tune(slow_grain.sleeping_grain_loader(), budget_s=30, verbose=0)
    settings = {f"worker_count={w}": slow_grain.sleeping_grain_loader(w) for w in (0, 1, 2, 4, 8)}
    settings["tuned"] = tuned
    same = f"worker_count={result.chosen['worker_count']}"
    _report("Grain 5 ms/element", result, _sweep(settings, epochs, iter), same)


# The child leaves real-time priority before it joins the cgroup: cgroup v1
# refuses a real-time process in a group with no real-time runtime (EINVAL).
_QUOTA_CHILD = """
import json, os, sys
os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
with open(os.path.join(sys.argv[1], "cgroup.procs"), "w") as file:
    file.write(str(os.getpid()))
sys.path.insert(0, sys.argv[2])
import loader_sweep
import keras_pipeline_tuner as kpt
from keras_pipeline_tuner.pipeline.tune.py_dataset_loader import PyDatasetKind
from tests.helpers.slow_loaders import busy_py_dataset

kind = PyDatasetKind()
original = busy_py_dataset()
_, result = kpt.tune(original, budget_s=15, verbose=0)
settings = {}
for workers, processes in ((1, False), (2, False), (4, False), (2, True), (4, True)):
    setting = kind.with_workers(dict(kind.settings(original), use_multiprocessing=processes),
                                workers)
    settings[kind.describe(setting)] = kind.build(original, setting)
medians = loader_sweep._sweep(settings, int(sys.argv[3]), kind.epoch)
print(json.dumps({"chosen": result.chosen, "budget": result.cpu_budget,
                  "waiting": result.waiting, "medians": medians}))
"""


def quota_case(epochs):
    from tests.helpers.cgroups import cpu_hierarchy
    from tests.helpers.cgroups import make_quota_cgroup
    from tests.helpers.cgroups import remove_cgroup

    version, top = cpu_hierarchy()
    if version is None:
        print(f"  1-CPU quota: not run ({top})", flush=True)
        return
    made = []
    path = make_quota_cgroup(version, top, 1.0, made)
    try:
        child = subprocess.run(
            [sys.executable, "-c", _QUOTA_CHILD, path, os.path.dirname(__file__), str(epochs)],
            capture_output=True, text=True, timeout=600,
        )
    finally:
        for made_path in reversed(made):
            remove_cgroup(made_path, top)
    if child.returncode != 0:
        print(f"  1-CPU quota: the child failed: {child.stderr[-2000:]}", flush=True)
        return
    outcome = json.loads(child.stdout.strip().splitlines()[-1])
    medians, chosen = outcome["medians"], outcome["chosen"]
    best = min(medians.values())
    enough = min(int(k.split(",")[0].split("=")[1]) for k, v in medians.items()
                 if v <= WITHIN * best)
    fewer = [k for k, v in medians.items()
             if int(k.split(",")[0].split("=")[1]) < chosen["workers"] and v * WITHIN < best]
    verdict = "holds" if chosen["workers"] <= enough and not fewer else "DOES NOT HOLD"
    table = "; ".join(f"{k}: {v:.2f}" for k, v in medians.items())
    print(
        f"  computing PyDataset, 1-CPU quota ({outcome['budget']}, waiting "
        f"{outcome['waiting']}): tune chose workers={chosen['workers']}, processes="
        f"{chosen['use_multiprocessing']}; sweep (s an epoch): {table}; fewest workers "
        f"within a tenth of the best: {enough}: {verdict}",
        flush=True,
    )


CASES = {"pydataset": py_dataset_case, "dataloader": data_loader_case, "grain": grain_case,
         "quota": quota_case}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--busy-loops", type=int, default=0)
    args = parser.parse_args()
    with busy_loops.running(args.busy_loops):
        print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {args.busy_loops} busy "
              f"loops, scheduler policy {os.sched_getscheduler(0)}, load average "
              f"{' '.join(f'{v:.1f}' for v in os.getloadavg())}:", flush=True)
        for case in args.cases.split(","):
            CASES[case](args.epochs)
        print(f"  load average at the end: {' '.join(f'{v:.1f}' for v in os.getloadavg())}",
              flush=True)


if __name__ == "__main__":
    main()
