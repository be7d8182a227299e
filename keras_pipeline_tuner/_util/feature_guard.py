"""Keeps a failure inside one of the tuner's features away from the user's training.

A profiling aid that crashes a long training run is worse than none: every
feature runs under a guard that logs its first failure once, with what is lost,
turns that feature off, and lets training go on untouched.
"""

import contextlib
import logging
from typing import Dict, Iterator

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

    @contextlib.contextmanager
    def __call__(self, feature: str) -> Iterator[None]:
        """Runs the block; a failure in it turns `feature` off.

        Callers check `enabled(feature)` first: a context manager cannot skip
        its block.
        """
        try:
            yield
        except Exception as error:  # noqa: BLE001 - the user's training must go on.
            self.disable(feature, f"{type(error).__name__}: {error}")
