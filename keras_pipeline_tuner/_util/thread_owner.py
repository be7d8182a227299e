"""One tuner, one thread at a time: the check a fit and a custom loop both make."""

import threading
from typing import Optional


def refuse_another_live_thread(owner: Optional[int], message: str) -> None:
    """Raises `RuntimeError(message)` when `owner`, another thread, is still alive.

    A run belongs to the thread that began it; a call from another thread while
    that one lives would mix two runs' steps in one report. A run whose thread
    has ended (an interrupted fit, say) is over and may be replaced.

    Args:
        owner: the `threading.get_ident()` of the thread running the run, or
            `None` when no run is going.
        message: what to say: what is running and what to do instead.

    Example:

    >>> refuse_another_live_thread(threading.get_ident(), "never raised: this thread")
    >>> refuse_another_live_thread(None, "never raised: nothing running")
    """
    if owner is None or owner == threading.get_ident():
        return
    if any(thread.ident == owner for thread in threading.enumerate()):
        raise RuntimeError(message)
