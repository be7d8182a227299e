"""What the probes after training need of the tuner's arguments."""

import dataclasses
from typing import Optional


@dataclasses.dataclass
class ProbeSettings:
    """What the probes need of the tuner's arguments.

    Attributes:
        what_if_steps: replayed steps for `what_if`, 0 when it is off.
        check_contention: whether the contention check may run.
        measure_fixes_s: seconds for the fix timing, 0 when it is off, `None`
            for "auto" (`fix_timing.auto_budget` of the fit's time).
        allow_unverified: the pipeline's Python keeps no state (fix timing).
    """

    what_if_steps: int = 0
    check_contention: bool = True
    measure_fixes_s: Optional[float] = None
    allow_unverified: bool = False
