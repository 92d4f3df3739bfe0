"""A request's state inside an engine, and what the engine hands back about it."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from rlboost.engine.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    """Where a request of rlboost's engine is scheduled (a finished one has left the engine)."""

    WAITING = "waiting"      # admitted, prompt not yet in the KV cache
    RUNNING = "running"      # holds a KV-cache slot, decoding


@dataclass(slots=True)
class StreamChunk:
    """Tokens of one request produced since its previous chunk (at most `stream_interval`). Slots: the
    manager unpickles thousands a second, a third faster than with a `__dict__` each."""

    request_id: str
    token_ids: list[int]
    logprobs: list[float]
    offset: int
    """Index within the response of token_ids[0]; lets a receiver detect gaps and duplicates."""
    finished: bool
    finish_reason: str | None
    """`stop` (a stop token, included in token_ids), `length` (max_tokens or the context), or None."""
    weight_version: int
    """Version of the weights that generated these tokens."""

    def __reduce__(self):
        # positional fields: a worker's reports carry hundreds of chunks a second, and a tuple unpickles
        # in about two thirds of the time of the default per-field state
        return StreamChunk, (self.request_id, self.token_ids, self.logprobs, self.offset, self.finished,
                             self.finish_reason, self.weight_version)


@dataclass
class PartialOutput:
    """Everything an aborted request generated, streamed or not: resubmit `prompt + token_ids` with
    `max_tokens - len(token_ids)` and the same seed to continue it exactly."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    seed: int
    weight_version: int


@dataclass
class Completion:
    """A finished request, as returned by `LLMEngine.generate`."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    seed: int


@dataclass
class Request:
    """What every backend records about a request it holds (`rlboost.engine.request_book`): its
    prompt and seed, every token it generated with its log-prob, how many of them were handed out in
    chunks, and how it ended."""

    request_id: str
    prompt_token_ids: list[int]
    """The submitted ids: the original prompt, plus partial response tokens when resubmitted."""
    seed: int
    output_token_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    num_streamed: int = 0
    """How many output tokens have been handed out in chunks."""
    finish_reason: str | None = None
    """Set when the response ends: `stop` or `length`."""


@dataclass(kw_only=True)
class Sequence(Request):
    """A request of rlboost's engine: the book's record plus its scheduling and cache state."""

    params: SamplingParams
    stop_token_ids: frozenset[int]
    num_cached: int = 0
    """How many leading tokens of prompt + output have their K/V in the cache."""
    slot: int | None = None
    status: SequenceStatus = SequenceStatus.WAITING

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def last_token_id(self) -> int:
        return self.output_token_ids[-1] if self.output_token_ids else self.prompt_token_ids[-1]
