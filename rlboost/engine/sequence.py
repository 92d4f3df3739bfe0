"""A request's state inside an engine, and what the engine hands back about it."""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Iterator
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


@dataclass(slots=True)
class ChunkColumns:
    """Several chunks, in order, as columns: what a worker's report carries (`rlboost.hybrid.wire`).
    Row i is the chunk of `request_ids[i]` whose `counts[i]` tokens are the next ones of `token_ids` and
    `logprobs` (flat, every chunk's in order). At 256 instances the manager unpickles tens of thousands
    of chunks a second: two flat lists and a few short ones unpickle in about two thirds of the time of
    an object and two lists per chunk (docs/simulator.md, "256 instances"). Iterating gives the
    `StreamChunk`s back."""

    request_ids: list[str]
    offsets: list[int]
    counts: list[int]
    versions: list[int]
    finished: list[bool]
    finish_reasons: list[str | None]
    token_ids: list[int]
    logprobs: list[float]

    @classmethod
    def of(cls, chunks: Iterable[StreamChunk]) -> ChunkColumns:
        chunks = list(chunks)
        return cls([c.request_id for c in chunks], [c.offset for c in chunks], [len(c.token_ids) for c in chunks],
                   [c.weight_version for c in chunks], [c.finished for c in chunks],
                   [c.finish_reason for c in chunks], [t for c in chunks for t in c.token_ids],
                   [x for c in chunks for x in c.logprobs])

    def __len__(self) -> int:
        return len(self.request_ids)

    def __iter__(self) -> Iterator[StreamChunk]:
        end = 0
        for request_id, offset, count, version, finished, reason in zip(
                self.request_ids, self.offsets, self.counts, self.versions, self.finished, self.finish_reasons):
            start, end = end, end + count
            yield StreamChunk(request_id, self.token_ids[start:end], self.logprobs[start:end], offset, finished,
                              reason, version)

    def split(self, first: Callable[[str], bool]) -> tuple[ChunkColumns, ChunkColumns]:
        """(the chunks whose request id `first` holds, the others), each in order: a report of a worker
        serving two steps' samples at once, split between them."""
        taken: tuple[ChunkColumns, ChunkColumns] = (ChunkColumns([], [], [], [], [], [], [], []),
                                                    ChunkColumns([], [], [], [], [], [], [], []))
        end = 0
        for i, request_id in enumerate(self.request_ids):
            out = taken[0 if first(request_id) else 1]
            start, end = end, end + self.counts[i]
            out.request_ids.append(request_id)
            out.offsets.append(self.offsets[i])
            out.counts.append(self.counts[i])
            out.versions.append(self.versions[i])
            out.finished.append(self.finished[i])
            out.finish_reasons.append(self.finish_reasons[i])
            out.token_ids.extend(self.token_ids[start:end])
            out.logprobs.extend(self.logprobs[start:end])
        return taken

    def ends(self) -> dict[str, int]:
        """Each request's response length up to its last chunk here."""
        return {rid: offset + count for rid, offset, count in zip(self.request_ids, self.offsets, self.counts)}

    def __reduce__(self):
        return ChunkColumns, (self.request_ids, self.offsets, self.counts, self.versions, self.finished,
                              self.finish_reasons, self.token_ids, self.logprobs)


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
