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
        allow_unverified: the user vouches that the pipeline's Python can
            run again (it keeps no state, reads no queue or feed).

    Example:

    >>> ProbeSettings(measure_fixes_s=5.0, allow_unverified=True).reruns_python
    True
    >>> ProbeSettings(allow_unverified=True).reruns_python  # measure_fixes="auto"
    False
    """

    what_if_steps: int = 0
    check_contention: bool = True
    measure_fixes_s: Optional[float] = None
    allow_unverified: bool = False

    @property
    def reruns_python(self) -> bool:
        """Whether the user asked for their Python to run again after training.

        Only `measure_fixes` (True or seconds) with `allow_unverified=True`:
        then the fixes of a pipeline that runs Python, a PyDataset's workers
        and Grain's stages (where training's own Grain iterators could not be
        timed) are timed in this process. By default nothing calls the
        user's Python after training.
        """
        return self.allow_unverified and bool(self.measure_fixes_s)
