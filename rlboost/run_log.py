"""Where a run's messages go: the console gets one line per event, the run's log file gets everything.

Contract: code reports what happened to the run (an instance preempted, joined, given back) with
`event(...)`, an INFO record of the `rlboost.events` logger, and anything else through loggers under
`rlboost`. Ray's own messages (its raylet's paragraphs on every worker death, its warnings) are routed
by `rlboost.cluster.ray_setup` to the `rlboost.ray` logger at INFO, and vLLM's log lines (its engine's
start-up, its warnings) by `rlboost.engine.vllm_backend` to `rlboost.vllm` at their own level
(`route_library_logger`). Inside `run_log(path, console)`:
- the log file gets every record of `rlboost.*` and of Ray's `ray` logger, with a timestamp and
  its logger's name;
- the console gets the events and our own warnings and errors, one line each, never Ray's nor vLLM's
  messages: a preemption is the system working, and Ray's paragraph about it reads like a crash.
Outside it (a library user, a test) nothing is configured here: records at INFO go nowhere unless the
caller configures logging, and pytest shows them only with a failing test.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console

EVENTS = "rlboost.events"
RAY_MESSAGES = "rlboost.ray"
VLLM_MESSAGES = "rlboost.vllm"
_LIBRARY_MESSAGES = (RAY_MESSAGES, VLLM_MESSAGES)
"""Other systems' messages: the log file's, never the console's."""
_FILE_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def event(message: str, *args: object) -> None:
    """Report something that happened to the run, for the console and the log (one line, %-args)."""
    logging.getLogger(EVENTS).info(message, *args)


class _Forward(logging.Handler):
    """Logs every record it gets again under the logger `to`, at its level, named by its origin."""

    def __init__(self, to: str):
        super().__init__()
        self.to = to

    def emit(self, record: logging.LogRecord) -> None:
        try:
            logging.getLogger(self.to).log(record.levelno, "(%s) %s", record.name, record.getMessage(),
                                           exc_info=record.exc_info)
        except Exception:
            self.handleError(record)


def route_library_logger(name: str, to: str, level: int | str) -> None:
    """Send the records of a library's logger `name` (and its children) at `level` or above to our
    logger `to` (one of the `rlboost.*` message loggers), and nowhere else: its own handlers go.
    Idempotent."""
    library = logging.getLogger(name)
    library.handlers = [_Forward(to)]
    library.propagate = False
    library.setLevel(level)


class _ConsoleHandler(logging.Handler):
    """The console's share: events, and our warnings and errors; not Ray's nor vLLM's messages."""

    def __init__(self, console: Console):
        super().__init__(logging.INFO)
        self.console = console

    def filter(self, record: logging.LogRecord) -> bool:
        if any(record.name == name or record.name.startswith(name + ".") for name in _LIBRARY_MESSAGES):
            return False
        return record.name == EVENTS or record.levelno >= logging.WARNING

    def emit(self, record: logging.LogRecord) -> None:
        try:
            prefix = "" if record.name == EVENTS else f"{record.levelname.lower()}: "
            # soft_wrap: a long line stays one line in a CI log instead of being cut at 80 columns
            self.console.print(f"{prefix}{record.getMessage()}", markup=False, highlight=False, soft_wrap=True)
        except Exception:  # a broken console must not stop the run
            self.handleError(record)


@contextmanager
def run_log(path: Path, console: Console | None = None) -> Iterator[Path]:
    """Send `rlboost.*` and Ray's records to the file `path` (appended: a resumed run continues its
    log) and events, warnings and errors to `console` (none: only the file) while the block runs."""
    path.parent.mkdir(parents=True, exist_ok=True)
    to_file, ray_to_file = _file_handler(path), _file_handler(path)
    ours, ray_logger = logging.getLogger("rlboost"), logging.getLogger("ray")
    saved = (ours.level, ray_logger.handlers[:], ray_logger.propagate)
    handlers = [to_file] + ([_ConsoleHandler(console)] if console is not None else [])
    ours.setLevel(logging.INFO)
    for handler in handlers:
        ours.addHandler(handler)
    # Ray's logger prints to stderr through its own handler: it writes to the file instead, through a
    # handler of its own, since ray.init sets the format of every handler of that logger
    ray_logger.handlers, ray_logger.propagate = [ray_to_file], False
    try:
        yield path
    finally:
        for handler in handlers:
            ours.removeHandler(handler)
        ours.setLevel(saved[0])
        ray_logger.handlers, ray_logger.propagate = saved[1], saved[2]
        to_file.close()
        ray_to_file.close()


def _file_handler(path: Path) -> logging.FileHandler:
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter(_FILE_FORMAT))
    return handler


__all__ = ["EVENTS", "RAY_MESSAGES", "VLLM_MESSAGES", "event", "route_library_logger", "run_log"]
