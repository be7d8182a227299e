"""The original pipeline's elements, and the checks of a rewritten pipeline's against them.

No rewrite may change what the model sees. The original's first epoch is read
twice: when both reads agree, a rewritten pipeline must give the same values
in the same order (any order for a rewrite that may reorder them, within a
tolerance for a vectorised map's floating-point values); when they do not, the
pipeline is random, and only the number, types and shapes of its elements are
compared. Elements are compared by digests of their bytes.
"""

import hashlib
import itertools
import time
from typing import Callable
from typing import List
from typing import Optional
from typing import Tuple

import numpy as np

from keras_pipeline_tuner._util.tf_import import tensorflow
from keras_pipeline_tuner.pipeline.tune.budget import MIN_ROUNDS
from keras_pipeline_tuner.pipeline.tune.budget import REFERENCE_GIVE_UP_SHARE
from keras_pipeline_tuner.pipeline.tune.paired_timing import check_time
from keras_pipeline_tuner.pipeline.tune.pass_size import LEAST_CUT_BATCHES
from keras_pipeline_tuner.pipeline.tune.pass_size import MIN_BATCHES
from keras_pipeline_tuner.pipeline.tune.pass_size import WARMUP_BATCHES
from keras_pipeline_tuner.pipeline.tune.rewrites import VECTORIZE

# Relative tolerance for floating-point elements of a vectorised map: the same
# element-wise ops on a batch may take other (vectorised) code paths.
VECTORIZE_RTOL = 1e-6
# Elements compared between two passes at a cache point in a random pipeline.
_REPEAT_CHECK_ELEMENTS = 256


class TooSlowForBudget(ValueError):
    """A first read too slow for the budget: its first `batches` took `elapsed_s`.

    Its message is `tune`'s, naming `tune`'s arguments; the figures let other
    callers (the fix timing after fit) say it in their own terms.
    """

    def __init__(self, message: str, batches: int, elapsed_s: float):
        super().__init__(message, batches, elapsed_s)
        self.batches = batches
        self.elapsed_s = elapsed_s

    def __str__(self) -> str:
        return self.args[0]


class ElementChecks:
    """The reference elements of one tuning session, and the checks against them.

    Args:
        plan: the `PassPlan` of the session (its `num_batches` bound an epoch).
        budget: the session's `Budget`: every epoch read counts against it.
        build: makes the dataset with given rewrites applied (the session's).

    Attributes:
        reference: `(values, structure)` digests of the original's first
            epoch's elements (see `read_reference`).
        repeatable: whether the original gives the same elements every pass.
        ordered: False once a kept rewrite may reorder elements: later checks
            then compare the elements as a multiset.
        tolerance: "equal within rtol=..." once a kept rewrite's values were
            equal only within that tolerance (a vectorised map), else `None`.
        cut: the batches of the reference when its epoch was cut at the
            time limit (the epoch is longer), else `None`.

    Example:

    >>> from keras_pipeline_tuner.pipeline.tune.budget import Budget
    >>> from keras_pipeline_tuner.pipeline.tune.paired_timing import PassPlan
    >>> plan = PassPlan(epochs=1)
    >>> checks = ElementChecks(plan, Budget(plan, 10.0), build=None)
    >>> _ = checks.read_reference(tf.data.Dataset.range(4), None)
    >>> checks.repeatable, checks.description
    (True, 'equal')
    >>> digests, _ = checks.epoch_digests(tf.data.Dataset.range(5), None)
    >>> checks.mismatch(digests)
    'it gave 5 batches in an epoch instead of 4'
    """

    def __init__(self, plan, budget, build: Callable[[list], object]):
        self.plan = plan
        self.budget = budget
        self._build = build
        self.reference: List[Tuple[str, str]] = []
        self.repeatable = True
        self.ordered = True
        self._reference_rows: Optional[List[str]] = None
        # How a kept rewrite's values were compared when not exactly ("equal
        # within rtol=..."): the tuned pipeline is then equal only within it.
        self.tolerance: Optional[str] = None
        self.cut: Optional[int] = None
        # Whether the last read stopped at its time limit before the epoch's end.
        self._cut_short = False

    @property
    def description(self) -> str:
        """How the elements were checked, as `TuneResult.elements_check` says it."""
        if not self.ordered:
            return "same elements, any order"
        if not self.repeatable:
            return "structure"
        return self.tolerance or "equal"

    def read_reference(self, dataset, time_limit_s: Optional[float]) -> float:
        """Reads the original's first epoch twice: the reference, and whether it repeats.

        An epoch longer than `time_limit_s` is cut where the limit is reached
        (when the plan reads whole epochs), after `LEAST_CUT_BATCHES` at least:
        the reference is then its first batches (`cut`), and every later
        read stops there too.

        Args:
            dataset: the original dataset (or a copy with seeds of its own).
            time_limit_s: the longest the first read may take; `None` for no limit.

        Returns:
            The seconds of the first read.

        Raises:
            ValueError: if the first read takes longer than `time_limit_s`
                although the plan reads `num_batches` batches, or, reading
                whole epochs, longer than `REFERENCE_GIVE_UP_SHARE` of the
                budget before it has the batches an epoch is cut to.
        """
        give_up_s = None if time_limit_s is None else REFERENCE_GIVE_UP_SHARE * self.budget.budget_s
        reference, epoch_s = self.epoch_digests(dataset, time_limit_s, give_up_s=give_up_s)
        if self._cut_short:
            self.cut = len(reference)
        again, _ = self.epoch_digests(dataset, None)
        self.repeatable = [value for value, _ in reference] == [value for value, _ in again]
        self.reference = reference
        return epoch_s

    def epoch_digests(
        self,
        dataset,
        time_limit_s: Optional[float],
        stop_at: Optional[float] = None,
        give_up_s: Optional[float] = None,
    ):
        """Digests of an epoch's elements (`num_batches` or `cut` of them at most), and its seconds.

        Args:
            dataset: the dataset to read.
            time_limit_s: see `read_reference`; `None` for no limit.
            stop_at: a `time.perf_counter()` value past which a candidate's
                check stops (`Budget.stop_at`); `None` for the reads that
                come before any candidate, which their own limits bound.
            give_up_s: past this, a read that has not reached
                `LEAST_CUT_BATCHES` gives up; `None` reads on.

        Raises:
            ValueError: if the plan reads `num_batches` batches and they take
                longer than `time_limit_s` (without it the read stops there),
                or if `give_up_s` passed first (a `TooSlowForBudget`).
            OutOfTime: if the read was still running at `stop_at`.
        """
        self.budget.epochs_run += 1
        self._cut_short = False
        began = time.perf_counter()
        found = []
        iterator = iter(dataset)
        most = self._most()
        while most is None or len(found) < most:
            try:
                element = next(iterator)
            except StopIteration:
                break
            found.append(element_digest(element))
            check_time(stop_at, "a check of the elements")
            elapsed_s = time.perf_counter() - began
            if time_limit_s is not None and elapsed_s > time_limit_s:
                if self.plan.num_batches is None:
                    if len(found) >= LEAST_CUT_BATCHES:
                        self._cut_short = True
                        break
                    if give_up_s is not None and elapsed_s > give_up_s:
                        message = self._too_slow(len(found), elapsed_s)
                        raise TooSlowForBudget(message, len(found), elapsed_s)
                    continue
                raise TooSlowForBudget(
                    f"{self.plan.num_batches} batches of the dataset take longer than "
                    f"{time_limit_s:.2f} s, too long for budget_s={self.budget.budget_s:.2f}: "
                    "pass a smaller num_batches=..., or a larger budget_s.",
                    len(found),
                    elapsed_s,
                )
        return found, time.perf_counter() - began

    def _too_slow(self, batches: int, elapsed_s: float) -> str:
        """Why a first read that gave `batches` in `elapsed_s` leaves nothing to time."""
        batch_s = elapsed_s / max(batches, 1)
        # The reference read twice, then one rewrite's passes of one epoch each
        # (more with `epochs`) and its check: a floor, not an estimate.
        needed = 2 * LEAST_CUT_BATCHES + MIN_ROUNDS * 2 * (WARMUP_BATCHES + MIN_BATCHES)
        return (
            f"The first {batches} batches of the dataset took {elapsed_s:.2f} s ({batch_s:.2f} s "
            f"a batch), over {REFERENCE_GIVE_UP_SHARE:.0%} of budget_s={self.budget.budget_s:g}: "
            "the checks compare "
            f"{LEAST_CUT_BATCHES} batches, read twice, and timing one rewrite takes "
            f"{MIN_ROUNDS * 2} passes of {WARMUP_BATCHES + MIN_BATCHES}, at least "
            f"{needed * batch_s:.0f} s at this speed. Pass budget_s={needed * batch_s:.0f} or "
            "more, or make a batch cheaper to read (a smaller batch size)."
        )

    def _most(self) -> Optional[int]:
        """The most batches an epoch read for a check takes: the plan's, or the cut's."""
        return self.plan.num_batches if self.plan.num_batches is not None else self.cut

    def first_digests(self, dataset) -> List[str]:
        """Value digests of the first elements of a pass, to compare two passes."""
        self.budget.epochs_run += 1
        iterator = iter(dataset)
        found = []
        for _ in range(_REPEAT_CHECK_ELEMENTS):
            try:
                found.append(element_digest(next(iterator))[0])
            except StopIteration:
                break
        return found

    def mismatch(self, digests, values: Optional[bool] = None) -> Optional[str]:
        """How an epoch's digests differ from the reference's, or `None`.

        `values`: compare values (else types and shapes); by default when the
        pipeline repeats itself.
        """
        if len(digests) != len(self.reference):
            return (
                f"it gave {len(digests)} batches in an epoch instead of {len(self.reference)}"
            )
        values = self.repeatable if values is None else values
        # Digests are (values, structure).
        index = 0 if values else 1
        for position, (got, want) in enumerate(zip(digests, self.reference)):
            if got[index] != want[index]:
                what = "values" if values else "types or shapes"
                return f"batch {position} has other {what} than the original's"
        return None

    def check(self, rewrite, kept, trial) -> Tuple[Optional[str], str]:
        """Compares the elements with the rewrite to those without: (mismatch, how).

        Args:
            rewrite: the `Rewrite` tried.
            kept: the rewrites kept before it.
            trial: `kept` and `rewrite`.

        Returns:
            Why the elements differ (`None` when they do not), and how they
            were compared (`RewriteOutcome.elements_check`).
        """
        dataset = self._build(trial)
        if not self.repeatable or rewrite.changes_determinism:
            # A random map run in parallel hands its draws to other elements
            # (`allow_nondeterministic`): only their number, types and shapes
            # can match, even where the original repeats (a global seed).
            digests, _ = self.epoch_digests(dataset, None, self.budget.stop_at)
            return self.mismatch(digests, values=False), "structure"
        if rewrite.changes_order or not self.ordered:
            rows = self._rows(dataset)
            if self._reference_rows is None:
                self._reference_rows = self._rows(self._build([]))
            if rows != self._reference_rows:
                return "it gave other elements than the original's (in any order)", (
                    "same elements, any order"
                )
            return None, "same elements, any order"
        digests, _ = self.epoch_digests(dataset, None, self.budget.stop_at)
        mismatch = self.mismatch(digests)
        if mismatch is None or rewrite.kind != VECTORIZE:
            return mismatch, "equal"
        close = self._close(self._build(kept), self._build(trial))
        if close is not None:
            return f"{mismatch}: {close}", "equal"
        return None, f"equal within rtol={VECTORIZE_RTOL:g}"

    def _close(self, without, with_) -> Optional[str]:
        """Why two datasets' elements differ beyond the vectorisation tolerance, or None."""
        tf = tensorflow()
        self.budget.epochs_run += 2
        for position, (one, other) in enumerate(itertools.zip_longest(
            _take(without, self._most(), self.budget.stop_at),
            _take(with_, self._most(), self.budget.stop_at),
        )):
            if one is None or other is None:
                return "the number of batches differs"
            for a, b in zip(
                tf.nest.flatten(one, expand_composites=True),
                tf.nest.flatten(other, expand_composites=True),
            ):
                a, b = as_array(a), as_array(b)
                if a.dtype != b.dtype or a.shape != b.shape:
                    return f"batch {position} has other types or shapes"
                if a.dtype.kind in "fc":
                    if not np.allclose(a, b, rtol=VECTORIZE_RTOL, atol=0.0, equal_nan=True):
                        return f"batch {position} differs by more than rtol={VECTORIZE_RTOL:g}"
                elif not np.array_equal(a, b):
                    return f"batch {position} has other values"
        return None

    def _rows(self, dataset) -> List[str]:
        """Sorted digests of an epoch's elements, batches split into rows."""
        self.budget.epochs_run += 1
        rows = []
        for element in _take(dataset, self._most(), self.budget.stop_at):
            rows.extend(_row_digests(element))
        return sorted(rows)


def _take(dataset, count: Optional[int], stop_at: Optional[float]):
    iterator = iter(dataset)
    taken = 0
    while count is None or taken < count:
        try:
            yield next(iterator)
        except StopIteration:
            return
        taken += 1
        check_time(stop_at, "a check of the elements")


def _row_digests(element) -> List[str]:
    """Digests of an element's rows (a batch's examples), or of the element itself."""
    arrays = element_arrays(element)
    rows = {array.shape[0] if array.ndim else None for array in arrays}
    if len(rows) != 1 or None in rows:
        return [element_digest(element)[0]]
    (count,) = rows
    found = []
    for index in range(count):
        digest = hashlib.blake2b(digest_size=16)
        for array in arrays:
            row = array[index]
            digest.update(f"{array.dtype}{row.shape};".encode())
            if array.dtype == object:
                for item in np.ravel(row):
                    digest.update(len(item).to_bytes(8, "little"))
                    digest.update(item)
            else:
                digest.update(np.ascontiguousarray(row).tobytes())
        found.append(digest.hexdigest())
    return found


def element_digest(element) -> Tuple[str, str]:
    """Digests of an element's values and of its structure (types and shapes)."""
    values = hashlib.blake2b(digest_size=16)
    structure = hashlib.blake2b(digest_size=16)
    for array in element_arrays(element):
        structure.update(f"{_dtype_name(array)}{tuple(array.shape)};".encode())
        if array.dtype == object:
            for item in array.ravel():
                values.update(len(item).to_bytes(8, "little"))
                values.update(item)
        else:
            values.update(array.tobytes())
    return values.hexdigest(), structure.hexdigest()


def element_arrays(element) -> List[np.ndarray]:
    """An element's tensors as NumPy arrays, in `tf.nest` order (`as_array` each)."""
    tf = tensorflow()
    return [as_array(tensor) for tensor in tf.nest.flatten(element, expand_composites=True)]


def as_array(tensor) -> np.ndarray:
    """A tensor's value as a NumPy array; strings as an array of `bytes` objects.

    A scalar string tensor's `numpy()` is `bytes`, not an array (text and CSV
    pipelines give them): it becomes a 0-d object array, as a batch of
    strings is an object array.

    Example:

    >>> as_array(tf.constant(b"a line")).dtype, as_array(tf.constant([1.5])).shape
    (dtype('O'), (1,))
    """
    value = tensor.numpy() if hasattr(tensor, "numpy") else tensor
    if isinstance(value, (bytes, str)):
        array = np.empty((), dtype=object)
        array[()] = value.encode() if isinstance(value, str) else value
        return array
    return np.asarray(value)


def _dtype_name(array: np.ndarray) -> str:
    """The element's type, named as TensorFlow names it for strings (object arrays)."""
    return "string" if array.dtype == object else array.dtype.name
