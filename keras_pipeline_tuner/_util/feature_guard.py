"""Keeps a failure inside one of the tuner's features away from the user's training.

A profiling aid that crashes a long training run is worse than none: every
feature runs under a guard that logs its first failure once, with what is lost,
turns that feature off, and lets training go on untouched.
"""

import logging
from typing import Dict

logger = logging.getLogger("keras_pipeline_tuner")


class FeatureGuard:
    """Tracks which features are still on and swallows their failures.

    Example:

    >>> guard = FeatureGuard()
    >>> with guard("timeline"):
    ...     raise RuntimeError("disk full")
    >>> guard.enabled("timeline")
    False
    """

    def __init__(self):
        self.failures: Dict[str, str] = {}
        # One context manager per feature, made once: the guard is entered on
        # every training step, where a generator-based one costs a microsecond.
        self._blocks: Dict[str, _GuardedBlock] = {}

    def enabled(self, feature: str) -> bool:
        """Whether `feature` has not failed yet."""
        return feature not in self.failures

    def disable(self, feature: str, reason: str) -> None:
        """Turns `feature` off, logging `reason` once."""
        if feature in self.failures:
            return
        self.failures[feature] = reason
        logger.warning(
            "keras-pipeline-tuner: %s turned off: %s. Training continues unaffected.",
            feature,
            reason.rstrip("."),
        )

    def __call__(self, feature: str) -> "_GuardedBlock":
        """Runs the block; a failure in it turns `feature` off.

        Callers check `enabled(feature)` first: a context manager cannot skip
        its block.
        """
        block = self._blocks.get(feature)
        if block is None:
            block = self._blocks[feature] = _GuardedBlock(self, feature)
        return block


class _GuardedBlock:
    """The context manager of one feature: swallows an `Exception`, disabling it.

    Reentrant and stateless, so one object serves every block of the feature.
    """

    __slots__ = ("_disable", "_feature")

    def __init__(self, guard: FeatureGuard, feature: str):
        self._disable = guard.disable
        self._feature = feature

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, error, traceback) -> bool:
        if kind is None or not issubclass(kind, Exception):
            # Nothing failed, or an interrupt (KeyboardInterrupt, SystemExit)
            # that must reach the user.
            return False
        # The user's training must go on.
        self._disable(self._feature, f"{kind.__name__}: {error}")
        return True
