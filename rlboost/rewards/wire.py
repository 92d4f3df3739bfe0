"""The messages between the driver's reward pool and a reward worker, over a socket pair.

A frame is a 4-byte big-endian length and that many bytes. Driver to worker: pickles (the worker
trusts the driver). Worker to driver: JSON of plain values, each reply checked field by field
(`parse_reply`), at most MAX_REPLY_BYTES: whatever a reward function does inside its worker, what
comes back is data, never code for the driver to run (unpickling could run some).

Replies, one per message the worker gets:
- to the reward's (path, name): {"ready": true} or {"ready": false, "error": <RewardConfigError's text>};
- to a call's keyword arguments: {"score": <finite float>}, {"raised": "<Type>: <message>",
  "traceback": <text>}, or {"returned": <repr of what is not a score>}.
"""

from __future__ import annotations

import json
import math
import socket
import struct
import time

HEADER = struct.Struct(">I")
MAX_REPLY_BYTES = 1 << 20
MAX_TEXT_CHARS = 20_000
"""What a reply's texts are cut to (the end of a traceback, the start of anything else)."""


class ReplyError(ValueError):
    """A worker's reply that is not one of the replies above."""


def send_frame(sock: socket.socket, payload: bytes) -> None:
    sock.sendall(HEADER.pack(len(payload)) + payload)


def recv_frame(sock: socket.socket, deadline: float | None = None, max_bytes: int | None = None) -> bytes:
    """The next frame's payload. EOFError: the other end closed (or died); TimeoutError: the whole
    frame has not arrived by `deadline` (time.monotonic(); None: wait) nor at once after it;
    ReplyError: it is longer than `max_bytes`."""
    (size,) = HEADER.unpack(_recv_exact(sock, HEADER.size, deadline))
    if max_bytes is not None and size > max_bytes:
        raise ReplyError(f"a reply of {size} bytes (at most {max_bytes})")
    return _recv_exact(sock, size, deadline)


def _recv_exact(sock: socket.socket, size: int, deadline: float | None) -> bytes:
    chunks, left = [], size
    while left:
        if deadline is not None:
            # per chunk, so that a worker sending a byte at a time still meets the one deadline; past
            # it, what has arrived is still taken (0: don't wait)
            sock.settimeout(max(0.0, deadline - time.monotonic()))
        try:
            chunk = sock.recv(min(left, 1 << 16))
        except (socket.timeout, BlockingIOError) as e:
            raise TimeoutError from e
        except ConnectionResetError as e:
            raise EOFError from e
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def encode_reply(reply: dict) -> bytes:
    return json.dumps(reply).encode()


def parse_reply(payload: bytes) -> dict:
    """The reply, checked to be one of the module's replies; ReplyError otherwise."""
    try:
        reply = json.loads(payload)
    except (ValueError, RecursionError) as e:
        raise ReplyError(f"a reply that is not JSON: {e}") from e
    if not isinstance(reply, dict):
        raise ReplyError("a reply that is not a JSON object")
    shape = {key: type(value) for key, value in reply.items()}
    if shape in ({"ready": bool}, {"ready": bool, "error": str}, {"raised": str, "traceback": str},
                 {"returned": str}):
        return reply
    if shape in ({"score": float}, {"score": int}) and math.isfinite(reply["score"]):
        return {"score": float(reply["score"])}
    raise ReplyError(f"an unexpected reply with fields {sorted(reply)}")
