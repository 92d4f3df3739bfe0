"""A reward worker: the process in which `rlboost.rewards.pool` runs the reward function.

Contract: started as `python -m rlboost.rewards.worker FD DRIVER_PID`, FD being its end of a socket
pair (messages: `rlboost.rewards.wire`). It reads the reward's (path, name) as the user configured
them, imports the function itself (`load_reward_fn`), answers whether it could, then answers one call
at a time until the socket closes. Whatever a call raises, BaseException included (math-verify's
TimeoutException, SystemExit), is a `raised` reply and never the worker's end; what it cannot
survive (os._exit, a crash, the pool's SIGKILL after reward.timeout_s) the pool sees as the socket
closing. The call runs in the main thread, so math-verify's signal-based timeouts work; an alarm a
call leaves behind is cancelled after it. The worker ends itself once DRIVER_PID is no longer its
parent: a hard-killed run leaves no worker behind, not even one stuck in a call.
"""

from __future__ import annotations

import math
import numbers
import os
import pickle
import signal
import socket
import sys
import threading
import time
import traceback
from typing import Any, Callable

import numpy as np

from rlboost.rewards.config import RewardConfig
from rlboost.rewards.errors import RewardConfigError
from rlboost.rewards.loading import load_reward_fn
from rlboost.rewards.wire import MAX_TEXT_CHARS, encode_reply, recv_frame, send_frame

PARENT_POLL_S = 0.5
"""How often a worker checks that the driver is still its parent (how long an orphan outlives it)."""


def as_score(value: Any) -> float | None:
    """The float a reward function's return value stands for, or None if it is not a score."""
    if isinstance(value, dict) and "score" in value:
        value = value["score"]
    # numbers.Real covers bool and numpy's numeric scalars; a str "1.0" is deliberately not a score.
    if isinstance(value, (numbers.Real, np.bool_)):
        try:
            score = float(value)
        except OverflowError:  # an int past float's range
            return None
        return score if math.isfinite(score) else None
    return None


def call(fn: Callable, kwargs: dict[str, Any]) -> dict:
    """The reply to one call of `fn` (see rlboost.rewards.wire)."""
    try:
        value = fn(**kwargs)
        score = as_score(value)
    except BaseException as e:  # noqa: BLE001 - math-verify's TimeoutException and SystemExit are no Exception
        return {"raised": f"{type(e).__name__}: {_text(e)}"[:MAX_TEXT_CHARS],
                "traceback": traceback.format_exc()[-MAX_TEXT_CHARS:]}
    finally:
        signal.alarm(0)  # a SIGALRM timeout the call set and left would fire in the next message's read
    if score is None:
        return {"returned": _text(value, repr)[:200]}
    return {"score": score}


def _text(value: object, how: Callable[[object], str] = str) -> str:
    try:
        return how(value)
    except BaseException:  # noqa: BLE001 - a value whose str() raises still gets a reply
        return f"<{type(value).__name__} that cannot be printed>"


def _exit_with(driver_pid: int) -> None:
    """End this process once `driver_pid` is no longer its parent (the driver died; the worker was
    handed to init), from a thread, since the main thread may be stuck in a call."""
    def watch() -> None:
        while os.getppid() == driver_pid:
            time.sleep(PARENT_POLL_S)
        os._exit(0)

    threading.Thread(target=watch, name="rlboost-reward-parent-watch", daemon=True).start()


def serve(sock: socket.socket) -> None:
    path, name = pickle.loads(recv_frame(sock))
    try:
        fn = load_reward_fn(RewardConfig(path=path, name=name))
    except RewardConfigError as e:
        send_frame(sock, encode_reply({"ready": False, "error": str(e)[:MAX_TEXT_CHARS]}))
        return
    send_frame(sock, encode_reply({"ready": True}))
    while True:
        try:
            kwargs = pickle.loads(recv_frame(sock))
        except EOFError:
            return  # the pool closed
        send_frame(sock, encode_reply(call(fn, kwargs)))


def main(argv: list[str]) -> None:
    fd, driver_pid = int(argv[0]), int(argv[1])
    _exit_with(driver_pid)
    with socket.socket(fileno=fd) as sock:
        serve(sock)


if __name__ == "__main__":
    main(sys.argv[1:])
