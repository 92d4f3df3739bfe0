"""Repeated failures told once per cause: the first in full, the rest as rare summary lines.

Contract: `failed(now_s, message)` counts a failure and returns the line to report at once, or None:
the first failure of a cause is reported in full; later ones of the same cause are only counted.
`due(now_s)` returns one summary line per cause with failures not reported yet whose wait has
passed: "<its latest message> (N more times in the last S s; <note>)". A cause's wait starts at
`summary_s` after its full line and doubles after each summary, up to `summary_max_s`, so a failure
that repeats every tick forever still prints a line per `summary_max_s` at most. A cause quiet for
longer than `summary_max_s` with nothing left to report is forgotten: if it comes back, it is
reported in full again.

A cause is a message's first line with what differs between instances of one failure blanked:
numbers (instance names like pree-3, ports, pids), hexadecimal ids and addresses (Ray's node and
actor ids), terminal colour codes. "pree-3 failed to start: X" and "pree-7 failed to start: X" are
one cause; a summary shows the latest message as it was.

Pure: the caller passes the time (any monotonic seconds) and calls `due` as often as it likes; no
clock, no threads, no logging.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_COLOURS = re.compile(r"\x1b\[[0-9;]*m")
_VARYING = re.compile(r"0x[0-9a-fA-F]+|\b[0-9a-fA-F]{16,}\b|\d+(?:\.\d+)?")


def cause_of(message: str) -> str:
    """The cause `message` reports: its first line, numbers and ids blanked."""
    return _VARYING.sub("#", _COLOURS.sub("", _first_line(message)))


def seconds(s: float) -> str:
    """`s` for a one-line report: 0.5, 4.0, 12, 600."""
    return f"{s:.1f}" if s < 10 else f"{s:.0f}"


@dataclass
class _Cause:
    message: str
    """The latest failure's message: what its summary shows."""
    last_failure_s: float
    last_line_s: float
    """When its last line (full or summary) was reported."""
    wait_s: float
    """How long after its last line a summary may follow."""
    unreported: int = 0


class FailureDigest:
    def __init__(self, summary_s: float, summary_max_s: float):
        if not 0 <= summary_s <= summary_max_s:
            raise ValueError(f"need 0 <= summary_s <= summary_max_s, got {summary_s} and {summary_max_s}")
        self.summary_s, self.summary_max_s = summary_s, summary_max_s
        self.causes: dict[str, _Cause] = {}
        self.failures = 0
        """Failures counted, every cause."""

    def failed(self, now_s: float, message: str, note: str = "") -> str | None:
        """Count a failure; the line to report now (the message in full, `note` after it) if its
        cause is new, else None (`due` summarises it later)."""
        self.failures += 1
        key = cause_of(message)
        cause = self.causes.get(key)
        if cause is None or (not cause.unreported and now_s - cause.last_failure_s > self.summary_max_s):
            self.causes[key] = _Cause(message, now_s, now_s, self.summary_s)
            return f"{_first_line(message)}; {note}" if note else _first_line(message)
        cause.message, cause.last_failure_s = message, now_s
        cause.unreported += 1
        return None

    def due(self, now_s: float, note: str = "") -> list[str]:
        """The summary lines to report now, `note` in each (e.g. when the next attempt comes)."""
        lines = []
        for cause in self.causes.values():
            if cause.unreported and now_s - cause.last_line_s >= cause.wait_s:
                times = "time" if cause.unreported == 1 else "times"
                lines.append(f"{_first_line(cause.message)} ({cause.unreported} more {times} in the last "
                             f"{seconds(now_s - cause.last_line_s)} s{'; ' + note if note else ''})")
                cause.last_line_s, cause.unreported = now_s, 0
                cause.wait_s = min(2 * cause.wait_s, self.summary_max_s)
        return lines


def _first_line(message: str) -> str:
    lines = message.strip().splitlines()
    return lines[0] if lines else ""


__all__ = ["FailureDigest", "cause_of", "seconds"]
