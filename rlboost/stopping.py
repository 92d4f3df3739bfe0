"""A clean stop: the first SIGINT (Ctrl-C) or SIGTERM ends the run at a safe point, a second at once.

Contract: inside `StopOnSignal()`, the first signal raises `StopRequested` in the main thread where it
is (Python runs signal handlers there, between bytecodes: a blocked queue read or a sleeping reward
function is interrupted too), unless a section that must not be cut (`held()`: writing a checkpoint or
a step's metrics) is running, in which case it is raised when that section ends. The caller's cleanup
then runs (abort the rollout, shut Ray down); the last checkpoint on disk is whole, and the command
exits with the shell's status for the signal (`exit_status`: 130 for SIGINT, 143 for SIGTERM). A
second signal ends the process at once, cleanup or not: every process it started (Ray's, the workers)
is killed first, so nothing outlives it. Outside the main thread it does nothing (a library caller
keeps its own signal handling).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

SIGNALS = (signal.SIGINT, signal.SIGTERM)


def exit_status(signum: int) -> int:
    """What a shell reports for a process ended by signal `signum`: 128 + its number (130: Ctrl-C's
    SIGINT, 143: SIGTERM)."""
    return 128 + signum


class StopRequested(BaseException):
    """The run was asked to stop. A BaseException, like KeyboardInterrupt, so that no `except
    Exception` on its way up mistakes it for a failure to handle."""

    def __init__(self, signum: int):
        self.signal_name = signal.Signals(signum).name
        self.exit_status = exit_status(signum)
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
        if self.received is not None:  # the second signal: now, whatever is still cleaning up
            end_now(exit_status(signum))
        self.received = signum
        if self._held == 0:
            raise StopRequested(signum)


def end_now(status: int) -> None:
    """End this process at once with `status`, after a SIGKILL to every process it started (Ray's head,
    its workers, local nodes): none is left behind, and nothing runs that could print a traceback."""
    try:
        import psutil

        for child in psutil.Process().children(recursive=True):
            try:
                child.kill()
            except psutil.Error:
                pass
    finally:
        os._exit(status)


__all__ = ["StopOnSignal", "StopRequested", "end_now", "exit_status"]
