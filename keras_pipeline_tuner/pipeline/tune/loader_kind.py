"""What `tune` needs to know of a kind of loader: its settings, copies, epochs and code.

`loader_tuning` searches any loader through this interface; each kind
(`py_dataset_loader`, `torch_loader`, `grain_loader`) says which settings it
has (`knobs`), how a copy with other settings is made (`build`), how one epoch
is read (`epoch`), which settings to try (`candidates`), and the code that
writes a setting (`code`).
"""

from typing import Any
from typing import Dict
from typing import List
from typing import Tuple


class LoaderKind:
    """A kind of loader, as `loader_tuning` tunes it. Subclasses fill in the rest.

    Attributes:
        name: the loader's name in results and notes ("PyDataset", ...).
        knobs: the settings searched, in the order code writes them.
        least_workers: the fewest workers (0 where the loader can read in
            the consumer's process).
        tried_settings_warnings: the loader's own warnings about a setting
            tried (messages, as `warnings.filterwarnings` matches them), left
            out while tuning.

    Example:

    >>> kind = LoaderKind()
    >>> kind.knobs = ("workers", "queue")
    >>> kind.describe({"workers": 4, "queue": 8})
    'workers=4, queue=8'
    """

    name = ""
    knobs: Tuple[str, ...] = ()
    worker_knob = "workers"
    least_workers = 1
    tried_settings_warnings: Tuple[str, ...] = ()

    def settings(self, loader) -> Dict[str, Any]:
        """The loader's settings, by knob."""
        return {knob: getattr(loader, knob) for knob in self.knobs}

    def describe(self, setting: Dict[str, Any]) -> str:
        """A setting as keyword arguments, in the knobs' order."""
        return ", ".join(f"{knob}={setting[knob]!r}" for knob in self.knobs)

    def with_workers(self, setting: Dict[str, Any], workers: int) -> Dict[str, Any]:
        raise NotImplementedError

    def candidates(
        self, original: Dict[str, Any], counts: List[int], cpus: int, waits: bool
    ) -> List[Dict[str, Any]]:
        raise NotImplementedError

    def build(self, loader, setting: Dict[str, Any]):
        raise NotImplementedError

    def epoch(self, loader):
        """The batches of one epoch (an iterator)."""
        return iter(loader)

    def persists(self, setting: Dict[str, Any]) -> bool:
        """Whether its workers outlive an epoch with `setting` (they start once a fit)."""
        return False

    def keeps_order(self, loader) -> bool:
        """Whether its batches come in the same order whatever its settings."""
        return True

    def code(self, loader, setting: Dict[str, Any]) -> str:
        raise NotImplementedError
