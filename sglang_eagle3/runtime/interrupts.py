"""Critical sections against Ctrl-C: ``with defer_interrupt(): ...`` runs its body whole, and a SIGINT that arrives
meanwhile raises KeyboardInterrupt once the body is done.

For the few moves that must not be cut in two: a message written to a worker's pipe (a partial one cannot be
repaired by sending it again), a request's pages leaving it and reaching the free list, an interrupted generate's
aborts. Python runs signal handlers on the main thread only, so elsewhere the section does nothing (a
KeyboardInterrupt never lands there).

NOTE: the body runs with Ctrl-C held back, however long it takes: keep sections short and out of per-token loops
(entering and leaving one swaps the SIGINT handler twice, a few microseconds).
"""

from __future__ import annotations

import signal
import threading


class defer_interrupt:  # noqa: N801 - used like contextlib's lower-case context managers
    """Defers SIGINT for the body of a ``with``; nests (an inner section hands a deferred signal to the outer)."""

    def __init__(self):
        self._previous = None  # the SIGINT handler to put back; None: the section is inactive
        self._deferred = False

    def __enter__(self) -> defer_interrupt:
        if threading.current_thread() is not threading.main_thread():
            return self
        previous = signal.getsignal(signal.SIGINT)
        if previous is None:  # a handler not installed from Python: it could not be put back
            return self
        self._deferred = False
        signal.signal(signal.SIGINT, self._record)
        self._previous = previous
        return self

    def _record(self, signum, frame) -> None:
        self._deferred = True

    def __exit__(self, *exc) -> bool:
        previous, self._previous = self._previous, None
        if previous is None:
            return False
        signal.signal(signal.SIGINT, previous)
        if self._deferred:
            self._deferred = False
            # Delivered again to the handler that was in place (KeyboardInterrupt by default, an outer section's
            # recorder when nested), as if it had arrived now; an exception already leaving the body is its context.
            signal.raise_signal(signal.SIGINT)
        return False
