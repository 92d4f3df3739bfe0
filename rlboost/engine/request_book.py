"""The requests an engine holds and what it owes its caller about each: one bookkeeping for every backend.

Invariants 3 (exact continuation: `abort` returns exactly what a request generated) and 4 (bounded
waste: at most `stream_interval` tokens of a request wait unsent) rest on this bookkeeping, so it is
written once. A backend (rlboost's `LLMEngine`, `VllmEngine`, the emulated engine) `add`s each request
it admits (a `Request`, or its own subclass with its scheduling state) and `append`s what each of its
steps produced; the book does the rest:
- `append(request_id, token_ids, logprobs, finish_reason=None)`: new tokens of one request, a
  log-prob each; a `finish_reason` ends its response.
- `take_chunks(weight_version, request_ids=None)`: per request (those named, in that order; None:
  every one, oldest first) each full chunk of `stream_interval` tokens, and once it has finished the
  rest, the last chunk marked `finished`; a finished request leaves the book with it.
- `flush(weight_version)`: every unfinished request's tokens not chunked yet, in chunks of at most
  `stream_interval`.
- `abort(request_ids, weight_version)`: the requests leave the book, each with exactly the tokens it
  generated, streamed or not (`PartialOutput`). Ids not in the book (finished, never added) are
  ignored: finishing races aborting.
- `progress()`: tokens generated so far per unfinished request; `require_idle(what)` refuses with
  `EngineStateError` while any request is in the book.
Pure: no torch, clock or threads.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Generic, TypeVar

from rlboost.engine.protocol import EngineLimits, EngineStateError
from rlboost.engine.sequence import PartialOutput, Request, StreamChunk

R = TypeVar("R", bound=Request)


class RequestBook(Generic[R]):
    """See the module docstring. `limits`: the engine's config, whose `stream_interval` the book reads
    whenever it chunks (a config changed between steps takes effect at the next one). Iterating
    yields the requests held, oldest first."""

    def __init__(self, limits: EngineLimits):
        self.limits = limits
        self._held: dict[str, R] = {}

    # ---- what a backend tells the book ------------------------------------------------------------

    def add(self, request: R) -> R:
        """Hold `request` (its id not held yet: `check_request` refuses a duplicate first)."""
        if request.request_id in self._held:
            raise ValueError(f"request {request.request_id!r} is already in the book")
        self._held[request.request_id] = request
        return request

    def append(self, request_id: str, token_ids: Iterable[int], logprobs: Iterable[float],
               finish_reason: str | None = None) -> None:
        """Record tokens a step produced for a request, with their log-probs; `finish_reason` ends it."""
        req = self._held[request_id]
        if req.finish_reason is not None:
            raise ValueError(f"request {request_id!r} already finished ({req.finish_reason})")
        before = len(req.output_token_ids)
        req.output_token_ids.extend(token_ids)
        req.output_logprobs.extend(logprobs)
        if len(req.output_logprobs) != len(req.output_token_ids):
            added = len(req.output_token_ids) - before
            raise ValueError(f"request {request_id!r}: {added} tokens but "
                             f"{len(req.output_logprobs) - before} log-probs")
        req.finish_reason = finish_reason

    # ---- what the book hands back -----------------------------------------------------------------

    def take_chunks(self, weight_version: int, request_ids: Iterable[str] | None = None) -> list[StreamChunk]:
        """The chunks now due (module docstring); finished requests leave the book."""
        chunks, interval = [], self.limits.stream_interval
        for rid in self._held.copy() if request_ids is None else request_ids:
            req = self._held.get(rid)
            if req is None:
                continue
            done = req.finish_reason is not None
            while len(req.output_token_ids) - req.num_streamed >= interval or (
                    done and req.num_streamed < len(req.output_token_ids)):
                chunks.append(self._chunk(req, weight_version, interval))
            if done:
                del self._held[rid]
        return chunks

    def flush(self, weight_version: int) -> list[StreamChunk]:
        """Every unfinished request's tokens not chunked yet, in chunks of at most stream_interval."""
        chunks, interval = [], self.limits.stream_interval
        for req in self._held.values():
            while req.num_streamed < len(req.output_token_ids):
                chunks.append(self._chunk(req, weight_version, interval))
        return chunks

    def abort(self, request_ids: Iterable[str], weight_version: int) -> dict[str, PartialOutput]:
        """Remove the requests held among `request_ids`; the exact partial output of each."""
        out = {}
        for req in self.held(request_ids):
            del self._held[req.request_id]
            out[req.request_id] = PartialOutput(req.request_id, list(req.prompt_token_ids),
                                                list(req.output_token_ids), list(req.output_logprobs),
                                                req.seed, weight_version)
        return out

    def progress(self) -> dict[str, int]:
        """Tokens generated so far by each request held, streamed or not (what a dying worker would
        lose beyond its last chunk)."""
        return {rid: len(req.output_token_ids) for rid, req in self._held.items()}

    # ---- queries --------------------------------------------------------------------------------

    def held(self, request_ids: Iterable[str]) -> list[R]:
        """The requests among `request_ids` still in the book, each once, in the order given."""
        return [self._held[rid] for rid in dict.fromkeys(request_ids) if rid in self._held]

    def require_idle(self, what: str) -> None:
        """Refuse `what` (a weight swap, sleep) while requests are unfinished: every token of a request
        comes from one weight version."""
        if self._held:
            raise EngineStateError(f"{what}() needs an idle engine but {len(self._held)} requests are "
                                   "unfinished; let them finish or abort() them first")

    def __getitem__(self, request_id: str) -> R:
        return self._held[request_id]

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._held

    def __len__(self) -> int:
        return len(self._held)

    def __iter__(self) -> Iterator[R]:
        return iter(list(self._held.values()))

    @staticmethod
    def _chunk(req: R, weight_version: int, interval: int) -> StreamChunk:
        """The next at most `interval` unstreamed tokens; `finished` only on the one that ends the response."""
        start = req.num_streamed
        req.num_streamed = end = min(len(req.output_token_ids), start + interval)
        done = req.finish_reason is not None and end == len(req.output_token_ids)
        return StreamChunk(req.request_id, req.output_token_ids[start:end], req.output_logprobs[start:end], start,
                           done, req.finish_reason if done else None, weight_version)


__all__ = ["RequestBook"]
