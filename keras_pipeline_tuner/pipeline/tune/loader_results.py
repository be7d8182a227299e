"""What `tune` measured and chose for a loader (PyDataset, torch or Grain DataLoader)."""

import dataclasses
import math
from typing import Any
from typing import Dict
from typing import List
from typing import Optional

from keras_pipeline_tuner.pipeline.tune.halving import SettingTiming


@dataclasses.dataclass
class LoaderTuneResult:
    """What `tune` measured for a `PyDataset` or a torch `DataLoader`, and chose.

    Times are medians of passes of the loader's own batches; a pass is
    `epochs` epochs of `batches_per_epoch` batches, each followed by a
    simulated training step of `consumer_step_s` seconds.

    Attributes:
        kind: "PyDataset", "DataLoader" (torch) or "Grain DataLoader".
        original: the settings as written, e.g. `{"workers": 1, ...}`.
        chosen: the settings of `dataset`: `original` when no other setting
            was measured faster beyond the noise.
        dataset: the loader with the chosen settings, the same kind of object
            (the original object itself when nothing changed).
        code: the line to write for the chosen settings (empty when nothing changed).
        original_s: seconds per pass with the settings as written (measured).
        tuned_s: seconds per pass with the chosen settings (measured).
        ratio: median over the final comparison's alternated rounds of the
            chosen over the original pass time; 1.0 when nothing changed.
        rounds: rounds of the final comparison.
        table: every setting timed, best first (successive halving: the better
            ones were timed on longer passes).
        elements_check: how the chosen loader's batches were compared with the
            original's: "equal" (same values, same order), "same elements, any
            order", or "structure" (the loader gives other batches each epoch:
            number, types and shapes only).
        cpu_budget: the CPU budget the worker counts were bounded by, in words.
        waiting: whether the probe found the workers waiting (I/O, sleeps),
            which allows more workers than the budget's CPUs.
        epochs: epochs per pass.
        batches_per_epoch: batches per epoch of the final comparison's passes.
        consumer_step_s: the simulated training step, if any.
        elapsed_s: how long tuning took.
        notes: caveats in plain words.

    Example:

    ```python
    tuned_loader, result = kpt.tune(train_loader, budget_s=30)
    print(result.code, f"{result.speedup:.2f}x")
    for row in result.table:
        print(row.setting, f"{row.batch_ms:.1f} ms a batch")
    ```
    """

    kind: str
    original: Dict[str, Any]
    chosen: Dict[str, Any]
    dataset: Any = dataclasses.field(default=None, repr=False, compare=False)
    code: str = ""
    original_s: float = 0.0
    tuned_s: float = 0.0
    ratio: float = 1.0
    rounds: int = 0
    table: List[SettingTiming] = dataclasses.field(default_factory=list)
    elements_check: str = "equal"
    cpu_budget: str = ""
    waiting: bool = False
    epochs: int = 2
    batches_per_epoch: Optional[int] = None
    consumer_step_s: Optional[float] = None
    elapsed_s: float = 0.0
    notes: List[str] = dataclasses.field(default_factory=list)

    @property
    def speedup(self) -> float:
        """How many times faster the chosen settings are (1 / ratio)."""
        return 1.0 / self.ratio if self.ratio > 0 else math.inf

    @property
    def changed(self) -> bool:
        """Whether `dataset` has other settings than the original."""
        return self.chosen != self.original
