"""The reward workers of a run (`rlboost.rewards.worker`): the reward function runs there, a call at
a time per worker, each within a time limit, and never in the driver.

Contract:
- `RewardPool(path, name, num_workers, timeout_s, start_timeout_s)` starts the workers and returns
  once each has imported the function; RewardConfigError if one cannot (a bad path, name or
  signature, an import that fails, no answer within `start_timeout_s`), with nothing left running.
- Each worker is `python -m rlboost.rewards.worker`, started in a session of its own (a Ctrl-C at the
  terminal is the run's to handle: the run then closes the pool) with the driver's environment less
  every `RAY_*` variable: Ray's token (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, RAY_AUTH_MODE) and
  address stay the driver's. That is all it hides: workers run as the run's user, so this is no sandbox.
- `score(calls)` gives each call (veRL's keyword arguments) to an idle worker and returns one
  `Outcome` per call, in order. A call's clock starts when its worker gets it (waiting for a free
  worker does not count). A call past `timeout_s` has its worker SIGKILLed, since a running call
  cannot be stopped any other way, and replaced; so is a worker that died or sent a malformed reply.
  RewardFunctionError if a replacement cannot start. One `score` at a time (a lock).
- `close()` kills and reaps every worker; idempotent. A driver killed without closing leaves none
  either: each worker ends once the driver is no longer its parent.

Not multiprocessing nor concurrent.futures: their children inherit the driver's environment whole
(neither spawn nor forkserver takes another one), a pool's running future can neither be cancelled nor
its process replaced, and their results come back by unpickling what the child sent.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import rlboost
from rlboost.rewards.errors import RewardConfigError, RewardFunctionError
from rlboost.rewards.wire import MAX_REPLY_BYTES, ReplyError, parse_reply, recv_frame, send_frame

HIDDEN_ENV_PREFIX = "RAY_"
"""Variables no worker gets: Ray's (its token, the token's file, the cluster's address)."""
PACKAGE_ROOT = str(Path(rlboost.__file__).resolve().parents[1])


def worker_env() -> dict[str, str]:
    """The driver's environment less Ray's variables, with this rlboost importable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(HIDDEN_ENV_PREFIX)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
    return env


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What became of one call: `score`, or `failure` and what the failure says."""

    score: float | None = None
    failure: str | None = None
    """raised | returned (not a score) | timeout | died (the worker ended, or spoke nonsense)."""
    detail: str = ""
    """raised: `Type: message`; returned: the value's repr; died: the exit status or the bad reply."""
    traceback: str = ""
    """raised: the call's traceback, as the worker formatted it."""


class _Worker:
    """One worker process and the driver's end of its socket."""

    def __init__(self, path: str | None, name: str, start_timeout_s: float):
        ours, theirs = socket.socketpair()
        try:
            # -P: the working directory is not on its path, as for the `rlboost` command, so a file
            # there named like a module (json.py) does not replace that module in the worker
            self.proc = subprocess.Popen(
                [sys.executable, "-P", "-m", "rlboost.rewards.worker", str(theirs.fileno()), str(os.getpid())],
                pass_fds=(theirs.fileno(),), env=worker_env(), stdin=subprocess.DEVNULL,
                start_new_session=True)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.sock = ours
        self.ready = False
        self.call: int | None = None
        """Index of the call it is running (None: idle, or starting)."""
        self.deadline = time.monotonic() + start_timeout_s
        send_frame(self.sock, pickle.dumps((path, name)))

    def send(self, index: int, kwargs: dict[str, Any], timeout_s: float) -> None:
        self.call, self.deadline = index, time.monotonic() + timeout_s
        self.sock.settimeout(timeout_s)  # an idle worker reads at once; a stuck one cannot block us
        send_frame(self.sock, pickle.dumps(kwargs))

    def receive(self) -> dict:
        """Its next reply; EOFError, TimeoutError or ReplyError (see wire.recv_frame, parse_reply)."""
        return parse_reply(recv_frame(self.sock, self.deadline, MAX_REPLY_BYTES))

    def kill(self) -> str:
        """End the process now, with its session (what the call started too), and reap it; idempotent.
        Its exit status, in words."""
        if self.proc.returncode is None:  # not reaped yet, so its pid is still its own
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        self.sock.close()
        status = self.proc.returncode
        return f"exit status {status}" if status >= 0 else f"killed by {signal.Signals(-status).name}"


class RewardPool:
    def __init__(self, path: str | None, name: str, num_workers: int, timeout_s: float, start_timeout_s: float):
        self.path, self.name = path, name
        self.timeout_s, self.start_timeout_s = timeout_s, start_timeout_s
        self._lock = threading.Lock()
        self._started = False  # until then a worker that cannot start is a set-up error
        self._workers: list[_Worker | None] = [None] * num_workers
        """None: a slot whose worker was killed with a call it had not finished (refilled by score)."""
        try:
            self._refill()
            while not all(w.ready for w in self._workers):
                self._wait([])
        except BaseException:
            self.close()
            raise
        self._started = True

    def pids(self) -> list[int]:
        """The workers' process ids, as of now."""
        return [w.proc.pid for w in self._workers if w is not None]

    def score(self, calls: list[dict[str, Any]]) -> list[Outcome]:
        """One Outcome per call (keyword arguments of the reward function), in order."""
        with self._lock:
            self._refill()
            outcomes: list[Outcome | None] = [None] * len(calls)
            queue = deque(range(len(calls)))
            try:
                while queue or any(w.call is not None for w in self._workers):
                    for slot, w in enumerate(self._workers):
                        if w.ready and w.call is None and queue:
                            self._send(slot, queue.popleft(), calls, outcomes)
                    self._wait(outcomes)
            except BaseException:
                # a stop, or no worker to be had: calls under way, and starts, are abandoned with their
                # workers (a message may be half read); the next score starts new ones
                for slot, w in enumerate(self._workers):
                    if w is not None and (w.call is not None or not w.ready):
                        w.kill()
                        self._workers[slot] = None
                raise
            return outcomes  # type: ignore[return-value] - every index was filled

    def close(self) -> None:
        """Kill and reap every worker (idempotent)."""
        workers, self._workers = self._workers, []
        for w in workers:
            if w is not None:
                w.kill()

    def __enter__(self) -> RewardPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _refill(self) -> None:
        for slot, w in enumerate(self._workers):
            if w is None:
                self._workers[slot] = _Worker(self.path, self.name, self.start_timeout_s)

    def _send(self, slot: int, index: int, calls: list[dict[str, Any]], outcomes: list[Outcome | None]) -> None:
        try:
            self._workers[slot].send(index, calls[index], self.timeout_s)
        except OSError as e:  # it died while idle (killed from outside, out of memory)
            outcomes[index] = Outcome(failure="died", detail=f"{self._replace(slot)}; it did not take the call: {e}")

    def _replace(self, slot: int) -> str:
        """Kill the worker in `slot` and start another there; the dead one's exit status, in words."""
        status = self._workers[slot].kill()
        self._workers[slot] = _Worker(self.path, self.name, self.start_timeout_s)
        return status

    def _wait(self, outcomes: list[Outcome | None]) -> None:
        """Until a worker that is busy or starting answers or runs out of time, and handle that."""
        waiting = [w for w in self._workers if w.call is not None or not w.ready]
        with selectors.DefaultSelector() as selector:
            for w in waiting:
                selector.register(w.sock, selectors.EVENT_READ, w)
            timeout = max(0.0, min(w.deadline for w in waiting) - time.monotonic())
            answered = {id(key.data) for key, _ in selector.select(timeout)}
        now = time.monotonic()
        for w in waiting:
            if id(w) in answered or w.deadline <= now:
                slot = self._workers.index(w)
                if w.ready:
                    self._take_reply(slot, outcomes)
                else:
                    self._take_ready(slot)

    def _take_ready(self, slot: int) -> None:
        w = self._workers[slot]
        try:
            reply = w.receive()
        except TimeoutError:
            why = f"its worker did not start within reward.start_timeout_s={self.start_timeout_s:g}"
        except (EOFError, ReplyError) as e:
            bad = f"; it sent {e}" if isinstance(e, ReplyError) else ""
            why = f"its worker ended while starting ({w.kill()}){bad}"
        else:
            if reply.get("ready") is True:
                w.ready = True
                return
            why = reply.get("error") or f"its worker sent {reply} instead of saying whether it was ready"
        w.kill()
        self._workers[slot] = None
        if not self._started:
            raise RewardConfigError(why)
        raise RewardFunctionError(f"the reward function could not be loaded in a new worker process: {why}")

    def _take_reply(self, slot: int, outcomes: list[Outcome | None]) -> None:
        w = self._workers[slot]
        index = w.call
        try:
            reply = w.receive()
        except TimeoutError:
            self._replace(slot)
            outcomes[index] = Outcome(failure="timeout")
            return
        except (EOFError, ReplyError) as e:
            bad = f"; it sent {e}" if isinstance(e, ReplyError) else ""
            outcomes[index] = Outcome(failure="died", detail=self._replace(slot) + bad)
            return
        w.call = None
        if "score" in reply:
            outcomes[index] = Outcome(score=reply["score"])
        elif "raised" in reply:
            outcomes[index] = Outcome(failure="raised", detail=reply["raised"], traceback=reply["traceback"])
        elif "returned" in reply:
            outcomes[index] = Outcome(failure="returned", detail=reply["returned"])
        else:
            outcomes[index] = Outcome(failure="died", detail=f"{self._replace(slot)}; it sent {reply} "
                                                             f"instead of a call's reply")
