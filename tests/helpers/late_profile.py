"""Conversions of the profiler window that last a known time, for the tests of what must not wait.

The conversion's process reads its request (a pickle) first thing after it
starts watching its parent: a stage in the request that sleeps when unpickled
holds the real process, at that point, for a known time. Only the parent's
side is patched (the stages it hands over), so the process under test is the
package's own.
"""

import time

import pytest

from keras_pipeline_tuner.profiling import capture

# Long beside the end of fit's own work (milliseconds to a few tenths of a
# second on a busy machine), short beside a test's time.
CONVERSION_DELAY_S = 3.0
# A stage no op of a trace is named: the analysis never looks it up.
_DELAY_STAGE = "kpt-test-delay"


class SleepWhenUnpickled:
    """Pickles as a call of `time.sleep(seconds)`: the process that reads it sleeps."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def __reduce__(self):
        return (time.sleep, (self.seconds,))


def delayed_stages(seconds: float):
    """A stand-in for `capture._stages_of` whose stages hold `SleepWhenUnpickled(seconds)`."""
    stages_of = capture._stages_of

    def delayed(dataset, keras_input=None):
        stages, note = stages_of(dataset, keras_input)
        stages = stages if stages is not None else {}
        stages[_DELAY_STAGE] = SleepWhenUnpickled(seconds)
        return stages, note

    return delayed


def delay_conversions(seconds: float) -> None:
    """Makes every later conversion of this process last `seconds` more (for scripts)."""
    capture._stages_of = delayed_stages(seconds)


@pytest.fixture
def slow_conversions(monkeypatch):
    """Conversions that last `CONVERSION_DELAY_S` more, for the length of a test."""
    monkeypatch.setattr(capture, "_stages_of", delayed_stages(CONVERSION_DELAY_S))
    return CONVERSION_DELAY_S
