"""`tune` for a loader: its worker settings searched on its own batches, the best proven.

A `keras.utils.PyDataset` or a torch `DataLoader` is tuned through its own
settings (workers, queues, prefetching), never by rewriting it. The steps:

1. the original's first epoch is read twice (its first batches where an epoch
   is long): the reference batches, and whether they repeat;
2. a probe pass with as many workers as the CPU budget allows tells whether
   the workers compute or wait (`worker_counts`);
3. the candidate settings (`LoaderKind.candidates`) are searched by
   successive halving (`halving`) on passes of a few batches;
4. the best is timed against the original in alternating rounds
   (`paired_timing`) and delivered only when faster beyond the noise
   (`results.not_delivered`), and when its batches match the reference.

Each kind of loader is a `loader_kind.LoaderKind` (`py_dataset_loader`,
`torch_loader`, `grain_loader`): what its settings are, how a copy with
other settings is made, how an epoch of it is read, and the code of a
setting. Tuning a loader runs the user's Python (its `__getitem__`, its
worker processes): it runs because the user asked, by calling `tune`.
"""

import logging
import math
import statistics
import sys
import time
import warnings
from typing import Dict
from typing import List
from typing import Optional

from keras_pipeline_tuner._util.tf_import import tensorflow
from keras_pipeline_tuner.pipeline.tune import paired_timing
from keras_pipeline_tuner.pipeline.tune.budget import MIN_ROUNDS
from keras_pipeline_tuner.pipeline.tune.budget import REFERENCE_SHARE
from keras_pipeline_tuner.pipeline.tune.budget import Budget
from keras_pipeline_tuner.pipeline.tune.element_checks import element_digest
from keras_pipeline_tuner.pipeline.tune.grain_loader import GrainLoaderKind
from keras_pipeline_tuner.pipeline.tune.halving import successive_halving
from keras_pipeline_tuner.pipeline.tune.loader_results import LoaderTuneResult
from keras_pipeline_tuner.pipeline.tune.paired_timing import PassPlan
from keras_pipeline_tuner.pipeline.tune.pass_size import MIN_BATCHES
from keras_pipeline_tuner.pipeline.tune.progress import PassProgress
from keras_pipeline_tuner.pipeline.tune.py_dataset_loader import PyDatasetKind
from keras_pipeline_tuner.pipeline.tune.results import not_delivered
from keras_pipeline_tuner.pipeline.tune.torch_loader import TorchLoaderKind
from keras_pipeline_tuner.pipeline.tune.torch_loader import iterable_dataset
from keras_pipeline_tuner.pipeline.tune.worker_counts import probe_workers
from keras_pipeline_tuner.pipeline.tune.worker_counts import waiting
from keras_pipeline_tuner.pipeline.tune.worker_counts import worker_counts
from keras_pipeline_tuner.timing.cpu_budget import read_cpu_budget
from keras_pipeline_tuner.timing.cpu_usage import CpuMeter

logger = logging.getLogger("keras_pipeline_tuner")

# Share of the budget left after the reference reads and the probe that the
# final comparison keeps: the halving gets the rest.
FINAL_SHARE = 0.45
_MAX_FINAL_ROUNDS = 9


class Epochs:
    """A loader read as epochs of at most `batches` batches, each measured for CPU.

    Args:
        kind: the `LoaderKind`.
        loader: the loader with the settings to time.
        batches: the most batches an epoch; `None` for whole epochs.

    Attributes:
        cpu_cores: CPU time over wall time of the last epoch read in full, in
            cores (this process and its worker processes), or `None`.
    """

    def __init__(self, kind, loader, batches: Optional[int]):
        self.kind = kind
        self.loader = loader
        self.batches = batches
        self.cpu_cores: Optional[float] = None

    def __iter__(self):
        meter = CpuMeter()
        for index, batch in enumerate(self.kind.epoch(self.loader)):
            yield batch
            if self.batches is not None and index + 1 >= self.batches:
                break
        usage = meter.usage()
        self.cpu_cores = usage.process_cores if usage is not None else None


class LoaderTuning:
    """One `tune` call on a loader.

    Args:
        kind: the `LoaderKind` of `loader`.
        loader: the `PyDataset` or `DataLoader` to tune.
        consumer_step_s: seconds of a simulated training step after each batch.
        budget_s: about how long tuning may take, in seconds.
        epochs: epochs per timed pass (a worker start-up counts in each).
        min_gain: the least speed-up delivered.
        verbose: 1 shows a progress bar of the timed passes.

    Example:

    ```python
    result = LoaderTuning(PY_DATASET, train_batches, None, 30.0, 2, 0.03, 0).run()
    print(result.code, result.speedup)
    ```
    """

    def __init__(self, kind, loader, consumer_step_s, budget_s, epochs, min_gain, verbose):
        self.kind = kind
        self.loader = loader
        self.consumer_step_s = consumer_step_s
        self.epochs = epochs
        self.min_gain = min_gain
        self.budget = Budget(PassPlan(epochs=epochs), budget_s)
        self.stop_at = self.budget.stop_at
        self.progress = PassProgress(verbose, self.budget)
        self.notes: List[str] = []
        # The last `Epochs` made for each setting, for its CPU use.
        self._epochs: Dict[str, Epochs] = {}

    def run(self) -> LoaderTuneResult:
        """Searches the settings and proves the best; returns the `LoaderTuneResult`."""
        try:
            with warnings.catch_warnings():
                # The loader's own warnings about the settings tried (torch's
                # about more workers than CPUs: tried because they wait).
                for message in self.kind.tried_settings_warnings:
                    warnings.filterwarnings("ignore", message=message)
                return self._run()
        finally:
            self.progress.stop()

    def _run(self) -> LoaderTuneResult:
        kind, loader = self.kind, self.loader
        cpu_budget = read_cpu_budget()
        original = kind.settings(loader)
        reference, repeatable = self._read_reference()
        batches = len(reference)
        if batches < MIN_BATCHES:
            raise ValueError(
                f"The {kind.name} gave {batches} batches in an epoch, too few to time "
                f"(at least {MIN_BATCHES})."
            )
        try:
            return self._search(cpu_budget, original, reference, repeatable)
        except paired_timing.OutOfTime as error:
            used_s = time.perf_counter() - self.budget.started
            self.notes.append(
                f"The settings as written are kept: the budget ran out before any other "
                f"setting was timed ({error}; {used_s:.1f} s of budget_s="
                f"{self.budget.budget_s:g} used): pass a larger budget_s."
            )
            return LoaderTuneResult(
                kind=kind.name,
                original=original,
                chosen=original,
                dataset=loader,
                cpu_budget=cpu_budget.describe(),
                epochs=self.epochs,
                batches_per_epoch=len(reference),
                consumer_step_s=self.consumer_step_s,
                elapsed_s=used_s,
                notes=self.notes,
            )

    def _search(self, cpu_budget, original, reference, repeatable) -> LoaderTuneResult:
        """The probe, the halving and the final comparison (`OutOfTime` past the budget)."""
        kind, loader = self.kind, self.loader
        batches = len(reference)
        probe = kind.with_workers(original, probe_workers(cpu_budget.cpus))
        self.progress.start(40)
        self.progress.timing(kind.describe(probe))
        cores = self._probe(probe)
        waits = waiting(cores, probe_workers(cpu_budget.cpus), cpu_budget.cpus)
        counts = worker_counts(cpu_budget.cpus, waits, least=kind.least_workers)
        candidates = kind.candidates(original, counts, cpu_budget.cpus, waits)
        # The first rung times them in this order after the original, and a
        # budget spent early leaves the last untimed: the likeliest first
        # (the most workers for waiting ones, else the budget's count).
        candidates.sort(
            key=lambda s: -s[kind.worker_knob] if waits
            else abs(s[kind.worker_knob] - cpu_budget.cpus)
        )
        settings = {kind.describe(s): s for s in [original] + candidates}
        # The search may take all but `FINAL_SHARE` of what is left; the final
        # comparison sizes its passes to the rest (`_final`).
        search_s = (1 - FINAL_SHARE) * (self.budget.deadline - time.perf_counter())
        self.progress.timing(f"{len(settings)} settings")
        ranking, table = successive_halving(
            {name: self._factory(s, name) for name, s in settings.items()},
            # One epoch a pass: which settings read faster shows in one; the
            # final comparison times `epochs`, persistent workers warm.
            PassPlan(epochs=1, consumer_step_s=self.consumer_step_s),
            first_batches=max(MIN_BATCHES, 2 * max(counts)),
            most_batches=batches,
            deadline=time.perf_counter() + search_s,
            stop_at=self.stop_at,
            cpu_cores=lambda name: self._epochs[name].cpu_cores,
            on_pass=self.progress.advance,
        )
        best = settings[ranking[0]]
        result = LoaderTuneResult(
            kind=kind.name,
            original=original,
            chosen=original,
            dataset=loader,
            table=[table[name] for name in ranking],
            cpu_budget=cpu_budget.describe(),
            waiting=waits,
            epochs=self.epochs,
            batches_per_epoch=batches,
            consumer_step_s=self.consumer_step_s,
            notes=self.notes,
        )
        self._note_counts(cpu_budget, waits, cores, counts)
        untimed = [row.setting for row in result.table if row.pass_s == math.inf]
        if untimed:
            self.notes.append(
                f"{len(untimed)} of {len(table)} settings were not timed within "
                f"budget_s={self.budget.budget_s:g} (the likeliest were timed first): "
                f"{'; '.join(untimed)}."
            )
        if best == original:
            self.notes.append(
                f"The settings as written ({kind.describe(original)}) were the fastest measured."
            )
        else:
            self._final(result, best, reference, repeatable)
        if result.rounds == 0:
            row = table[kind.describe(original)]
            result.original_s = result.tuned_s = row.pass_s
        result.elapsed_s = time.perf_counter() - self.budget.started
        logger.info(
            "keras-pipeline-tuner: tuned %s: %s -> %s (x%.2f)",
            kind.name,
            kind.describe(original),
            kind.describe(result.chosen),
            result.speedup,
        )
        return result

    def _read_reference(self):
        """The original's first epoch's digests (cut at a share of the budget), twice."""
        limit_s = REFERENCE_SHARE * self.budget.budget_s
        # The digests flatten batches with TensorFlow's `nest`: imported before
        # the clock starts, or its import would count as the first batch's time.
        tensorflow()
        began = time.perf_counter()
        reference = []
        for batch in self.kind.epoch(self.loader):
            reference.append(element_digest(batch))
            if time.perf_counter() - began > limit_s and len(reference) >= 2 * MIN_BATCHES:
                self.notes.append(
                    f"An epoch is longer than {limit_s:.1f} s ({REFERENCE_SHARE:.0%} of the "
                    f"budget): its first {len(reference)} batches were read and compared."
                )
                break
        again = []
        for batch in Epochs(self.kind, self.loader, len(reference)):
            again.append(element_digest(batch))
        repeatable = [v for v, _ in again] == [v for v, _ in reference]
        if not repeatable:
            self.notes.append(
                f"The {self.kind.name} gives other batches from one epoch to the next (it "
                "shuffles), so the chosen settings' batches were checked for number, types "
                "and shapes only."
            )
        return reference, repeatable

    def _probe(self, setting) -> Optional[float]:
        """CPU cores a short pass with `setting` used (whether its workers wait)."""
        epochs = Epochs(self.kind, self.kind.build(self.loader, setting), 2 * MIN_BATCHES)
        for _ in epochs:
            paired_timing.check_time(self.stop_at, "the probe of the workers")
        self.progress.advance()
        return epochs.cpu_cores

    def _note_counts(self, cpu_budget, waits, cores, counts) -> None:
        figure = "not measured" if cores is None else f"{cores:.2f} CPU cores"
        if waits:
            self.notes.append(
                f"With {probe_workers(cpu_budget.cpus)} workers the loader used {figure}: its "
                f"workers mostly wait (I/O, sleeps), so up to {max(counts)} workers were "
                f"tried, beyond the CPU {cpu_budget.describe()}."
            )
        else:
            self.notes.append(
                f"With {probe_workers(cpu_budget.cpus)} workers the loader used {figure}: its "
                f"workers compute, so at most {max(counts)} were tried ({cpu_budget.describe()})."
            )

    def _factory(self, setting, name: str):
        """For a number of batches, a fresh loader with `setting`, read in cut epochs.

        Its workers, where they persist, are warm (`_warm`): the halving then
        ranks the settings as the final comparison and training's later epochs
        read them.
        """

        def make(batches: int) -> Epochs:
            epochs = self._warm(setting, batches)()
            self._epochs[name] = epochs
            return epochs

        return make

    def _final(self, result, best, reference, repeatable) -> None:
        """Times `best` against the original, alternated; keeps it if faster and equal.

        Its passes read as many batches of an epoch as the budget left allows
        (at the rates the halving measured), up to the reference's: worker
        start-ups weigh less in longer passes, as in training's epochs.
        """
        kind = self.kind
        self.progress.timing(f"{kind.describe(best)} against the settings as written")
        rows = {row.setting: row for row in result.table}
        both_batch_s = sum(
            rows[kind.describe(setting)].batch_ms / 1e3 for setting in (result.original, best)
        )
        left_s = self.budget.deadline - time.perf_counter()
        warm = any(kind.persists(setting) for setting in (result.original, best))
        fitting = int(left_s / (MIN_ROUNDS * (self.epochs + warm) * max(both_batch_s, 1e-6)))
        final_batches = max(rows[kind.describe(best)].batches, min(len(reference), fitting))
        result.batches_per_epoch = final_batches
        # Workers that persist are warmed up by an untimed epoch before each pass.
        round_s = both_batch_s * (self.epochs + warm) * final_batches
        rounds = int(max(MIN_ROUNDS, min(_MAX_FINAL_ROUNDS, left_s // max(round_s, 1e-3))))
        factories = {
            "original": self._warm(result.original, final_batches),
            "tuned": self._warm(best, final_batches),
        }
        made = factories["tuned"]
        tuned_epochs: List[Epochs] = []

        def tuned_factory() -> Epochs:
            tuned_epochs.append(made())
            return tuned_epochs[-1]

        factories["tuned"] = tuned_factory
        if kind.persists(best) or kind.persists(result.original):
            self.notes.append(
                "Workers kept across epochs start once a fit: each pass of the final "
                "comparison began after one untimed epoch, as training's epochs after its first."
            )
        try:
            times = paired_timing.side_by_side(
                factories,
                PassPlan(epochs=self.epochs, consumer_step_s=self.consumer_step_s),
                rounds,
                deadline=self.budget.deadline,
                on_pass=self.progress.advance,
                stop_at=self.stop_at,
            )
        except paired_timing.OutOfTime as error:
            self.notes.append(
                f"The final comparison with the settings as written did not run ({error}): "
                "the settings as written are kept."
            )
            return
        result.original_s, result.tuned_s, result.rounds = (
            _median(times["original"]),
            _median(times["tuned"]),
            len(times["tuned"]),
        )
        reason = not_delivered(times["original"], times["tuned"], self.min_gain)
        if reason is not None:
            self.notes.append(f"The settings as written are kept: with {kind.describe(best)}, "
                              f"{reason}.")
            result.tuned_s = result.original_s
            return
        # The last timed pass's loader: workers that persist are checked, and
        # returned, without starting again after the budget's end.
        tuned = tuned_epochs[-1].loader if kind.persists(best) else kind.build(self.loader, best)
        mismatch, check = self._check(tuned, reference, repeatable)
        result.elements_check = check
        if mismatch is not None:
            self.notes.append(
                f"The settings as written are kept: with {kind.describe(best)}, {mismatch}."
            )
            result.tuned_s = result.original_s
            return
        result.ratio = paired_timing.median_ratio(times["tuned"], times["original"])
        result.chosen = best
        result.dataset = tuned
        result.code = kind.code(self.loader, best)

    def _warm(self, setting, batches: int):
        """A factory of the loader with `setting`, past one untimed epoch if its workers persist.

        `paired_timing.side_by_side` calls it before a pass's clock starts.
        """

        def make() -> Epochs:
            epochs = Epochs(self.kind, self.kind.build(self.loader, setting), batches)
            if self.kind.persists(setting):
                for _ in epochs:
                    paired_timing.check_time(self.stop_at, "a warm-up epoch")
            return epochs

        return make

    def _check(self, tuned, reference, repeatable):
        """Why `tuned`'s batches differ from the reference (or `None`), and how compared."""
        digests = [element_digest(batch) for batch in Epochs(self.kind, tuned, len(reference))]
        if len(digests) != len(reference):
            return f"it gave {len(digests)} batches instead of {len(reference)}", "structure"
        if not repeatable:
            same = [s for _, s in digests] == [s for _, s in reference]
            return (None if same else "its batches have other types or shapes"), "structure"
        if self.kind.keeps_order(tuned):
            same = [v for v, _ in digests] == [v for v, _ in reference]
            return (None if same else "its batches have other values"), "equal"
        same = sorted(v for v, _ in digests) == sorted(v for v, _ in reference)
        return (None if same else "its batches have other values"), "same elements, any order"


def _median(values) -> float:
    return statistics.median(values)


def kind_of(loader):
    """The `LoaderKind` of a PyDataset, torch or Grain DataLoader; `None` for anything else.

    Raises:
        ValueError: for a DataLoader over an `IterableDataset` (see `torch_loader`).
    """
    keras = sys.modules.get("keras")
    if keras is not None and isinstance(loader, keras.utils.PyDataset):
        return PyDatasetKind()
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(loader, torch.utils.data.DataLoader):
        if iterable_dataset(loader):
            raise ValueError(
                "kpt.tune tunes a DataLoader over a map-style dataset: this one reads an "
                "IterableDataset, which hands every worker the whole dataset unless it "
                "splits itself (torch.utils.data.get_worker_info()), so other worker counts "
                "could change its batches. Split it by worker, then time num_workers yourself."
            )
        return TorchLoaderKind()
    grain = sys.modules.get("grain")
    if grain is not None and isinstance(loader, grain.DataLoader):
        return GrainLoaderKind()
    return None


def tune_loader(kind, loader, consumer_step_s, budget_s, epochs, min_gain, verbose):
    """`tune` of a loader: `(result.dataset, LoaderTuneResult)` (see `tuning.tune`)."""
    result = LoaderTuning(kind, loader, consumer_step_s, budget_s, epochs, min_gain, verbose).run()
    return result.dataset, result
