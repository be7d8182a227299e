"""A run's place among the workers of a multi-worker fit.

The chief writes into `log_dir`; another worker into its own folder under
`log_dir/workers/`, and TensorBoard summaries only if
`tensorboard_workers="all"`. Each worker publishes its summary at every epoch
and at the end; the chief reads the others' (see `workers.exchange`).
"""

from typing import Callable
from typing import List
from typing import Optional

from keras_pipeline_tuner._util import features
from keras_pipeline_tuner._util.feature_guard import FeatureGuard
from keras_pipeline_tuner.timing.step_clock import TRAIN
from keras_pipeline_tuner.timing.step_clock import StepClock
from keras_pipeline_tuner.workers import exchange as worker_reports


class RunWorkers:
    """The exchange of one run's summaries with the other workers, if any.

    Args:
        identity: this process's place in a multi-worker cluster, or `None`
            (a single worker: nothing is exchanged).
        log_dir: the tuner's log dir.
        timeout_s: how long the chief waits for the other workers at the end.
        tensorboard_workers: "chief" or "all": which workers write TensorBoard
            summaries.
        guard: the tuner's `FeatureGuard`.

    Example:

    >>> workers = RunWorkers(None, "logs/run1", 60.0, "chief", FeatureGuard())
    >>> workers.active, workers.output_dir, workers.writes_summaries
    (False, 'logs/run1', True)
    """

    def __init__(
        self,
        identity: Optional[worker_reports.WorkerIdentity],
        log_dir: Optional[str],
        timeout_s: float,
        tensorboard_workers: str,
        guard: FeatureGuard,
    ):
        self._guard = guard
        self._exchange: Optional[worker_reports.WorkerExchange] = None
        self._log_dir = log_dir
        self._all_write = tensorboard_workers == "all"
        # What the chief read of the others' summaries, when it has.
        self.view: Optional[worker_reports.MultiWorkerSummary] = None
        if identity is not None:
            self._exchange = worker_reports.WorkerExchange(identity, log_dir, timeout_s)
            if guard.enabled(features.WORKER_SUMMARY):
                with guard(features.WORKER_SUMMARY):
                    self._exchange.begin_fit()

    @property
    def active(self) -> bool:
        """Whether summaries are exchanged with other workers."""
        return self._exchange is not None

    @property
    def output_dir(self) -> Optional[str]:
        """Where this worker writes: the log dir, or its own folder under it."""
        if self._exchange is None:
            return self._log_dir
        return self._exchange.output_dir()

    @property
    def writes_summaries(self) -> bool:
        """Whether this worker writes TensorBoard summaries."""
        return self._exchange is None or self._exchange.identity.is_chief or self._all_write

    def exchange(
        self,
        final: bool,
        clock: StepClock,
        cpu: Callable[[], object],
        notes: List[str],
    ) -> None:
        """Writes this worker's summary; the chief also reads the others' (`view`).

        At the end the chief waits at most `timeout_s` for them. Nothing here
        talks to the other workers directly, so a worker whose tuner fails makes
        the chief wait that long at most.

        Args:
            final: the run has ended.
            clock: the run's step clock.
            cpu: returns the run's CPU figures (or `None`).
            notes: this worker's notes (its failed features).
        """
        workers = self._exchange
        if workers is None:
            return
        own = None
        if self._guard.enabled(features.WORKER_SUMMARY):
            with self._guard(features.WORKER_SUMMARY):
                own = worker_reports.WorkerSummary(
                    task=workers.identity.task,
                    host=worker_reports.this_host(),
                    chief=workers.identity.is_chief,
                    final=final,
                    epochs=clock.ended_epochs(),
                    train=clock.stats(TRAIN),
                    cpu=cpu(),
                    notes=notes,
                )
                workers.publish(own)
        if own is not None and self._guard.enabled(features.WORKER_COMPARISON):
            with self._guard(features.WORKER_COMPARISON):
                self.view = workers.collect(own, final=final)
