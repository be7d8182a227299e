"""A Grain DataLoader whose map sleeps a known time an element, tuned in a process of its own.

Grain spawns its worker processes: they import this module by name, so its
operations live at the top level, and the script's work runs under the
`__main__` guard. `python -m tests.helpers.slow_grain` prints one JSON line.
"""

import json
import time

import grain
import numpy as np
from absl import flags

ELEMENTS = 256
ELEMENT_S = 0.005


class SlowMap(grain.transforms.Map):
    """Sleeps `ELEMENT_S` an element (a slow read)."""

    def map(self, element):
        time.sleep(ELEMENT_S)
        return np.full((4,), element, np.float32)


def sleeping_grain_loader(workers=0):
    return grain.DataLoader(
        data_source=grain.sources.RangeDataSource(0, ELEMENTS, 1),
        sampler=grain.samplers.IndexSampler(ELEMENTS, shuffle=False, num_epochs=1, seed=0),
        operations=[SlowMap(), grain.transforms.Batch(8)],
        worker_count=workers,
    )


def _sweep():
    import keras_pipeline_tuner as kpt
    from tests.helpers.slow_loaders import epoch_s

    loader = sleeping_grain_loader()
    tuned, result = kpt.tune(loader, budget_s=30, verbose=0)
    sweep = {}
    for workers in (0, 1, 2, 4):
        swept = sleeping_grain_loader(workers)
        sweep[workers] = epoch_s(lambda: iter(swept), epochs=1)
    return {
        "tuned_s": epoch_s(lambda: iter(tuned), epochs=1),
        "sweep": sweep,
        "chosen": result.chosen,
        "check": result.elements_check,
        "type": type(tuned).__name__,
        "batches": [b.tolist() for b in tuned] == [b.tolist() for b in loader],
        "notes": result.notes,
    }


if __name__ == "__main__":
    # Grain's workers read absl flags; a script that does not parse them marks them parsed.
    flags.FLAGS.mark_as_parsed()
    print(json.dumps(_sweep(), default=str))
