"""The contract every rollout engine backend implements (docs/engine.md, "Contract"), as torch-free code.

A rollout worker (`rlboost.hybrid.worker.RolloutWorker`) drives any engine that satisfies
`EngineBackend`: rlboost's own `LLMEngine` (exact continuation, the HistoSpec verifier), `VllmEngine`,
the emulated engine of `rlboost.sim.emulated` (the profile's timing, no model), and any other backend
built behind the same calls; `rlboost.engine.factory.make_engine` builds the one `engine.backend`
names. Nothing here imports torch, so a worker process whose engine needs none never loads it.

Every backend keeps its requests in a `rlboost.engine.request_book.RequestBook`, which implements the
chunking, `flush`, `abort`, `progress` and the idle check promised below (invariants 3 and 4 rest on
them); a backend's `step` only appends the tokens it produced and says when a request ends.

The calls and what they promise:
- `add(request_id, prompt_token_ids, params, prompt_len=None) -> seed`: admit a request, or raise
  `InvalidRequestError` naming it (the other requests are unaffected); `EngineStateError` while asleep.
  `prompt_len`: how much of the ids is the original prompt when prompt + partial tokens are resubmitted.
- `step() -> list[StreamChunk]`: run one engine step; per request at most `config.stream_interval`
  new tokens per chunk, with their log-probs (log_softmax(logits / T), raw logits when greedy, before
  top-k/top-p), the offset of the first and the weight version that made them. A request's tokens
  are chunked once `stream_interval` of them wait, and when it finishes. `last_step` is (requests in
  it, whether it was a prefill); `last_decode_steps` how many decode steps it spanned.
- `flush() -> list[StreamChunk]`: a chunk of every unfinished request's tokens not chunked yet (fewer
  than `stream_interval` each): a worker that reports everything at once keeps its requests in step,
  so the next full chunks come together.
- `abort(request_ids) -> {request_id: PartialOutput}`: remove requests and return exactly what each
  generated, streamed or not. Ids that finished or were never added are ignored.
- `progress() -> {request_id: tokens generated so far}` of the unfinished requests; `has_unfinished()`,
  `num_running`, `num_waiting`.
- `load_weights(state, version, names=None)`: swap weights in place (a mapping of parameter name to
  tensor; an engine without a model only takes the version) and tag them `version` (`weight_version`).
  `state` is always a complete version, checked whole (`check_weights`). `names=None` copies all of
  it; `names` given (a patched version: the parameters whose bits differ from the version the engine
  serves now, which the caller guarantees is the one the patch was made against) copies only those,
  so an engine that holds v-1 ends up serving exactly what a full load of v gives. A tied weight may
  be named under either of its names. A name the model does not have is refused by name, as is an
  incomplete state with or without names; an empty `names` only retags the version.
  `sleep()` frees the KV cache, `wake()` allows it back (`asleep`). All three refuse with
  `EngineStateError` while requests are unfinished: every token of a request comes from one version.
- `drafter`: the speculative-decoding hook (HistoSpec's `Drafter`, or None). An engine that cannot
  verify drafts ignores it. `spec_stats`: the speculation counters (`SpecStats`), reset by the caller.
- `fingerprint`: names, shapes and dtypes of the weights it serves (`weights_fingerprint`): a worker
  whose fingerprint differs from the run's is refused.
- `exact_continuation`: whether a sampled request resumed as prompt + partial tokens with the same seed
  continues exactly (rlboost's engine, the emulated one) or only validly (vLLM on CPU): invariant 3
  holds either way; the manager never needs more.
"""

from __future__ import annotations

import hashlib
import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from rlboost.engine.draft_tree import DraftTree
from rlboost.engine.sampling_params import SamplingParams
from rlboost.engine.sequence import PartialOutput, StreamChunk


def weights_fingerprint(params: Mapping[str, object]) -> str:
    """Names, shapes and dtypes of a model's parameters (tensors, or anything with `shape` and `dtype`):
    two models share it iff one's weights fit the other."""
    spec = ";".join(f"{name}:{tuple(t.shape)}:{t.dtype}" for name, t in sorted(params.items()))
    return hashlib.sha256(spec.encode()).hexdigest()[:16]


def check_weights(params: Mapping[str, object], aliases: Iterable[str], state: Mapping[str, object],
                  version: int, names: Iterable[str] | None = None) -> None:
    """Raise ValueError unless `state` fits a model whose parameters are `params` (name -> anything with
    a `shape`; tied weights once) and whose other state names are `aliases`: every parameter given,
    nothing unknown, every shape right; and every one of `names` (a partial load's) is one of them.
    What every engine with a model checks before a swap, partial or not."""
    known = set(params) | set(aliases)
    if names is not None:
        strangers = sorted(set(names) - known)
        if strangers:
            raise ValueError(f"load_weights(version={version}): names {strangers[:5]} are not parameters "
                             f"of the model")
    unknown = sorted(set(state) - known)
    missing = sorted(set(params) - set(state))
    if unknown or missing:
        partial = "" if names is None else " (a partial load still takes the whole version; names pick what is copied)"
        raise ValueError(f"load_weights(version={version}): state dict does not match the model: "
                         f"unknown keys {unknown[:5]}, missing keys {missing[:5]}{partial}")
    for name, param in params.items():
        if tuple(state[name].shape) != tuple(param.shape):
            raise ValueError(f"load_weights(version={version}): `{name}` has shape {tuple(state[name].shape)}, "
                             f"the model expects {tuple(param.shape)}")


class InvalidRequestError(ValueError):
    """A request was rejected at `add`; the message names it and what was wrong."""


class EngineStateError(RuntimeError):
    """The engine cannot do this now (busy with requests, or asleep)."""


def stop_ids(params: SamplingParams, eos_token_ids: Iterable[int]) -> frozenset[int]:
    """The tokens that end a request: its own stop ids, plus the model's EOS ids unless `ignore_eos`."""
    return frozenset(params.stop_token_ids or ()) | (frozenset() if params.ignore_eos else frozenset(eos_token_ids))


def check_request(request_id: str, prompt_token_ids: Sequence[int], params: SamplingParams, vocab_size: int,
                  max_model_len: int, *, asleep: bool, duplicate: bool) -> list[int]:
    """The prompt as a list of ints, or an error naming the request and what was wrong: the checks
    every backend makes at `add`, so a bad request reads the same whichever engine got it. `asleep`:
    the engine is (EngineStateError); `duplicate`: a request with this id is in the engine."""
    where = f"request {request_id!r}"
    if asleep:
        raise EngineStateError(f"{where}: the engine is asleep; call wake() first")
    if duplicate:
        raise InvalidRequestError(f"{where}: a request with this id is already in the engine")
    try:
        params.validate()
    except ValueError as e:
        raise InvalidRequestError(f"{where}: invalid sampling params: {e}") from None
    try:
        tokens = [operator.index(t) for t in prompt_token_ids]
    except TypeError:
        raise InvalidRequestError(f"{where}: prompt_token_ids must be integers") from None
    if not tokens:
        raise InvalidRequestError(f"{where}: empty prompt")
    for i, t in enumerate(tokens):
        if not 0 <= t < vocab_size:
            raise InvalidRequestError(
                f"{where}: token id {t} at prompt position {i} is outside the vocabulary [0, {vocab_size})")
    if len(tokens) >= max_model_len:
        raise InvalidRequestError(
            f"{where}: prompt has {len(tokens)} tokens but the context is {max_model_len} "
            f"(engine.max_model_len), leaving no room to generate")
    return tokens



@dataclass
class SpecStats:
    """Speculation counters: per drafted request, verifications, draft tokens and accepted ones; per
    verification step, its time and the time plain decoding would have taken for the same tokens."""

    verifications: int = 0
    drafted: int = 0
    accepted: int = 0
    decode_steps: int = 0
    verify_steps: int = 0
    verify_s: float = 0.0
    plain_equivalent_s: float = 0.0
    sibling_tokens: int = 0
    """Tokens of siblings on other instances the drafter took in (a hybrid worker's, from the manager)."""

    def record(self, drafted: int, accepted: int) -> None:
        self.verifications += 1
        self.drafted += drafted
        self.accepted += accepted

    def decode_step(self, batch: int, seconds: float, tokens: int, speculative: bool,
                    plain_step_s: float | None) -> None:
        """A decode step of `batch` requests took `seconds` and emitted `tokens`; `plain_step_s`: the
        measured time of a plain decode step of that batch (None: not measured yet)."""
        self.decode_steps += 1
        self.verify_steps += speculative
        if speculative and plain_step_s is not None:  # plain decoding emits `batch` tokens per step
            self.verify_s += seconds
            self.plain_equivalent_s += plain_step_s * tokens / batch


class Drafter(Protocol):
    """The speculative-decoding hook (HistoSpec's drafter is one): proposes draft tokens per request,
    learns from how many were accepted, and forgets what it built from a history that changed."""

    def start(self, request_id: str, prompt_ids: Sequence[int]) -> None: ...
    def propose(self, request_id: str, context: Sequence[int]) -> list[int] | DraftTree:
        """Draft tokens to follow `context` (the prompt and the tokens so far): a path, or a tree that
        rlboost's engine verifies whole (vLLM verifies its first path)."""
        ...

    def feedback(self, request_id: str, drafted: int, accepted: int) -> None: ...
    def finish(self, request_id: str) -> None: ...
    def invalidate(self, prompts: Iterable[Sequence[int]] | None = None) -> None: ...
    def add_sibling(self, request_id: str, sibling: str, offset: int, tokens: Sequence[int]) -> int:
        """Tokens of a sibling of `request_id` (same prompt, same step) that runs on another engine,
        from `offset` of its response, to draft from; returns how many were new. Called by a hybrid
        worker, never by the engine; a drafter without such a source takes nothing."""
        ...


class EngineLimits(Protocol):
    max_num_seqs: int
    """Requests decoding at once: the batch capacity a worker reports to the manager."""
    stream_interval: int
    """Most tokens per request in one chunk."""


@runtime_checkable
class EngineBackend(Protocol):
    """See the module docstring."""

    config: EngineLimits
    weight_version: int
    asleep: bool
    drafter: Drafter | None
    spec_stats: SpecStats
    last_step: tuple[int, bool]
    last_decode_steps: int
    fingerprint: str
    kv_capacity_tokens: int | None
    """Tokens of context its KV cache holds, all requests together, where that can bind before
    `max_num_seqs` does (vLLM's blocks); None: it cannot (the CPU engine's cache grows per request up to
    max_model_len). The next batch's share of an engine in a step's tail counts it
    (`rlboost.policies.tail_share`)."""
    exact_continuation: bool
    """Whether prompt + partial tokens resubmitted with the same seed continue exactly as the
    uninterrupted request would have, sampled too (greedy continuation is exact on every backend that
    computes the same logits). False: the continuation is a fresh valid sample (right prefix, budget,
    aligned log-probs)."""

    def add(self, request_id: str, prompt_token_ids: Sequence[int], params: SamplingParams | None = None,
            prompt_len: int | None = None) -> int: ...
    def step(self) -> list[StreamChunk]: ...
    def flush(self) -> list[StreamChunk]: ...
    def abort(self, request_ids: Iterable[str]) -> dict[str, PartialOutput]: ...
    def progress(self) -> dict[str, int]: ...
    def has_unfinished(self) -> bool: ...
    @property
    def num_running(self) -> int: ...
    @property
    def num_waiting(self) -> int: ...
    def load_weights(self, state: Mapping[str, object] | None, version: int,
                     names: Iterable[str] | None = None) -> None: ...
    def sleep(self) -> None: ...
    def wake(self) -> None: ...


__all__ = ["Drafter", "EngineBackend", "EngineLimits", "EngineStateError", "InvalidRequestError", "SpecStats",
           "check_request", "check_weights", "stop_ids", "weights_fingerprint"]
