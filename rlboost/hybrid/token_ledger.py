"""A worker's token ledger: per request, the tokens it generated and the tokens it put in reports,
appended to a file that outlives a hard kill of the worker (`rollout.hybrid.ledger_dir`).

Contract: `TokenLedger.generated(counts)` after every engine step and `TokenLedger.sent(counts)` just
before a report leaves append one line each, flushed to the OS at once (a SIGKILL loses the process,
not the page cache). `read_ledger(path)` gives the most of each ever written; a line cut short by a
kill is ignored. The manager reads a dead worker's ledger to count the tokens it generated and never
delivered exactly (`migration/wasted_tokens`); the tests read it to check the waste bound. Torch-free
and Ray-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


def ledger_path(ledger_dir: str | Path, worker: str) -> Path:
    """Where worker `worker` keeps its ledger under `ledger_dir`."""
    return Path(ledger_dir) / f"{worker}.ledger"


class TokenLedger:
    def __init__(self, path: str | Path):
        self._file = open(path, "a")

    def generated(self, counts: dict[str, int]) -> None:
        """Tokens each request has generated so far."""
        self._write("", counts)

    def sent(self, counts: dict[str, int]) -> None:
        """Tokens of each request in the reports handed to Ray so far."""
        self._write("> ", counts)

    def _write(self, prefix: str, counts: dict[str, int]) -> None:
        if counts:
            self._file.write(prefix + " ".join(f"{rid}={n}" for rid, n in counts.items()) + "\n")
            self._file.flush()


@dataclass(frozen=True)
class Ledger:
    """What one worker's ledger says about each request it served: the most tokens ever generated, and
    the most put in its reports."""

    generated: dict[str, int]
    sent: dict[str, int]


def read_ledger(path: str | Path) -> Ledger:
    """The ledger the worker writing to `path` kept, up to its last whole line."""
    generated: dict[str, int] = {}
    sent: dict[str, int] = {}
    lines = Path(path).read_text().split("\n")[:-1]  # the last piece is "" or a line a kill cut short
    for line in lines:
        most = sent if line.startswith("> ") else generated
        for item in line.removeprefix("> ").split():
            rid, n = item.rsplit("=", 1)
            most[rid] = max(most.get(rid, 0), int(n))
    return Ledger(generated, sent)


__all__ = ["Ledger", "TokenLedger", "ledger_path", "read_ledger"]
