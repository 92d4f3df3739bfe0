"""A clean stop: the first SIGINT (Ctrl-C) or SIGTERM ends the run at a safe point, a second at once.

Contract: inside `StopOnSignal()`, the first signal raises `StopRequested` in the main thread where it
is (Python runs signal handlers there, between bytecodes: a blocked queue read or a sleeping reward
function is interrupted too), unless a section that must not be cut (`held()`: writing a checkpoint or
a step's metrics) is running, in which case it is raised when that section ends. The caller's cleanup
then runs (abort the rollout, shut Ray down); the last checkpoint on disk is whole. A second signal
ends the process at once with exit status 130, cleanup or not. Outside the main thread it does
nothing (a library caller keeps its own signal handling).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

SIGNALS = (signal.SIGINT, signal.SIGTERM)
EXIT_STATUS = 130
"""What a shell reports for a process ended by Ctrl-C (128 + SIGINT); used for SIGTERM too."""


class StopRequested(BaseException):
    """The run was asked to stop. A BaseException, like KeyboardInterrupt, so that no `except
    Exception` on its way up mistakes it for a failure to handle."""

    def __init__(self, signum: int):
        self.signal_name = signal.Signals(signum).name
        super().__init__(f"stopped by {self.signal_name}")


class StopOnSignal:
    def __init__(self):
        self.received: int | None = None
        self._held = 0
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopOnSignal:
        self.install()
        return self

    def install(self) -> None:
        """(Re)install the handlers: also after something replaced them (ray.init sets its own SIGTERM
        handler)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in SIGNALS:
            previous = signal.signal(signum, self._handle)
            self._previous.setdefault(signum, previous)

    def __exit__(self, *exc_info: object) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}

    @contextmanager
    def held(self) -> Iterator[None]:
        """A section a stop must not cut: a signal during it takes effect when it ends."""
        self._held += 1
        try:
            yield
        finally:
            self._held -= 1
        if self._held == 0 and self.received is not None:
            raise StopRequested(self.received)

    def _handle(self, signum: int, frame: object) -> None:
        if self.received is not None:
            os._exit(EXIT_STATUS)  # the second signal: now, whatever is still cleaning up
        self.received = signum
        if self._held == 0:
            raise StopRequested(signum)


__all__ = ["EXIT_STATUS", "StopOnSignal", "StopRequested"]
