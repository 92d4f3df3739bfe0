"""An emulated rollout engine: tokens at the pace the simulator's profile predicts, by sleeping.

Contract (docs/simulator.md, "Emulated engine"): `EmulatedEngine` is an
`rlboost.engine.protocol.EngineBackend`, so the real runtime (Ray workers, the manager, migrations,
kills, weight pulls) runs on it unchanged, at the speed of a modelled H100 engine and with many
instances on one small machine. A `RolloutWorker` builds it through its engine factory
(`EmulatedEngines`), as it builds rlboost's own engine.

- Content (`rlboost.sim.emulated_content`): the token at absolute position t of a request and its
  log-prob are pure functions of (seed, t), the response length one of the seed, drawn from the
  simulator's workload scaled by `length_scale`; a seed made by `workload_seed(step, prompt, sample)`
  gets exactly the length `Workload.step(step)[prompt][sample]`, so a simulation of the same workload
  sees the same samples. `max_tokens` counts from the original prompt (`prompt_len`), so a request
  resubmitted as prompt + partial tokens ends at the same absolute length with the same tokens:
  exact continuation (invariant 3) is checkable, and `add` checks it.
- A response ends with the stop token (finish_reason "stop": the smallest of the request's stop ids,
  its params' `stop_token_ids` plus the engine's EOS ids unless `ignore_eos`) at its drawn length, or
  at `max_tokens` ("length"). Lengths at the workload's `max_response` stand for responses the cap
  truncated: they carry no stop token and run to `max_tokens`. Without any stop id every request
  runs to `max_tokens`.
- Time: the batching state is the simulator's own `EngineState` (rlboost.sim.batching): admission up
  to max_num_seqs and the KV capacity, batched prefill of new prompts, re-prefill of resumed ones,
  evictions. `step()` sleeps `time_scale` x the modelled time of what it does: a prefill, or up to
  `stream_interval` decode steps (fewer when a sample finishes or an admission point comes first),
  then appends the new tokens to its request book (`rlboost.engine.request_book`), which hands them
  out as chunks of at most `stream_interval` per request, and answers `flush`, `abort` and `progress`. Sleeps aim at
  absolute deadlines on the engine's modelled clock, so Python overhead inside a step is absorbed
  and a late step is caught up, not accumulated.
- Timing assumes every prompt is `workload.prompt_len` tokens long (as the simulator does); the
  actual prompt's length only fixes where the response starts.
- Weights: with a model skeleton (`worker="rollout"`), `load_weights` copies the pulled tensors in,
  as the real engine does (only the parameters `names` names, for a partial load); without one
  (`worker="light"`) it keeps only the version and ignores `names`, and the worker's process never
  imports torch (pulls still fetch and verify every byte). Speculative
  decoding is not emulated (`drafter` is ignored). No Ray here.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from rlboost.engine.protocol import (EngineStateError, InvalidRequestError, SpecStats, check_weights,
                                     weights_fingerprint)
from rlboost.engine.request_book import RequestBook
from rlboost.engine.rng import derive_seed
from rlboost.engine.sampling_params import SamplingParams
from rlboost.engine.sequence import PartialOutput, Request, StreamChunk
from rlboost.engine.weight_copy import copy_weights
from rlboost.sim.batching import EngineState
# the content's names stay importable from here too (the bench and the tests import them from this module)
from rlboost.sim.emulated_content import FIRST_TOKEN, ResponseLengths, logprob_at, token_at, workload_seed
from rlboost.sim.profile import EngineProfile, ProfileConfig, TrainProfile, make_profiles
from rlboost.sim.specs import MODELS
from rlboost.sim.workload import WorkloadConfig

_PREFIX = "emulate"
WORKER_KINDS = ("rollout", "light")
_EPS_S = 1e-9  # modelled seconds: keeps a horizon computed as clock + advance_s from rounding below it


@dataclass
class EmulationConfig:
    """What an emulated engine emulates, and how fast. One config serves every worker of a run."""

    model: str = "qwen3-8b"
    """The modelled model (rlboost.sim.specs.MODELS): its engine profile sets every step's time."""
    time_scale: float = 1.0
    """Wall seconds per modelled second: 1 runs at the modelled H100 engine's speed, 2 at half of it."""
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    """The response-length distribution (before `length_scale`) and the prompt length timing assumes."""
    length_scale: float = 1.0
    """Multiplies the workload's median_response and max_response (not prompt_len), so that a step
    of a long-response workload takes seconds, not minutes: `lengths()` is the workload in use."""
    max_num_seqs: int = 512
    """Most requests decoding at once; supersedes profile.max_num_seqs and is what the worker reports
    to the manager as its batch capacity."""
    stream_interval: int = 8
    """Tokens per chunk at most, and decode steps per `step()` at most (the worker streams after each)."""
    vocab: int = 151_936
    """Token ids are drawn from [3, vocab) (Qwen3's vocabulary by default)."""
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    """The performance model (its max_num_seqs is replaced by this config's)."""
    worker: str = "rollout"
    """What the worker's process holds besides the engine: `rollout`, the model's skeleton (torch, real
    tensor loads of every pulled version), or `light`, nothing: it never imports torch and verifies
    pulled bytes without making tensors of them (about 50 MB per process instead of 290 MB, so that
    64+ instances fit on one machine). See docs/simulator.md, "Emulated engine"."""
    check_continuation: bool = True
    """`add` refuses a resubmitted request whose partial tokens are not this emulation's tokens for
    that seed: a manager that garbled a migration fails loudly instead of silently."""
    seed: int = 0
    """Seed of requests that bring none."""

    def validate(self) -> None:
        """Raise ValueError naming the offending field."""
        if self.model not in MODELS:
            raise ValueError(f"{_PREFIX}.model={self.model!r}; valid: {', '.join(sorted(MODELS))}")
        for name in ("time_scale", "length_scale"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{_PREFIX}.{name} must be finite and > 0, got {value}")
        for name in ("max_num_seqs", "stream_interval"):
            if getattr(self, name) < 1:
                raise ValueError(f"{_PREFIX}.{name} must be >= 1, got {getattr(self, name)}")
        if self.vocab < FIRST_TOKEN + 2:
            raise ValueError(f"{_PREFIX}.vocab must be >= {FIRST_TOKEN + 2}, got {self.vocab}")
        if self.worker not in WORKER_KINDS:
            raise ValueError(f"{_PREFIX}.worker={self.worker!r}; valid: {', '.join(WORKER_KINDS)}")
        self.workload.validate()
        self.profile.validate()

    def lengths(self) -> WorkloadConfig:
        """The workload the emulation draws lengths from: median and cap scaled by length_scale."""
        w = self.workload
        return replace(w, median_response=max(1, round(w.median_response * self.length_scale)),
                       max_response=max(1, round(w.max_response * self.length_scale)))

    def profiles(self) -> tuple[EngineProfile, TrainProfile]:
        """The engine and training profiles of `model`, with this config's max_num_seqs."""
        return make_profiles(self.model, replace(self.profile, max_num_seqs=self.max_num_seqs))


# ---- the engine -------------------------------------------------------------------------------------

class _PacedState(EngineState):
    """EngineState plus the one query pacing needs: when the next stretch of at most `max_steps`
    decode steps ends (a completion, a full cache or an admission point may end it sooner)."""

    def horizon_s(self, max_steps: int) -> float:
        if not self._live:
            return self.clock
        batch = len(self._live)
        total = self._offset + batch * self.step
        steps = min(self._steps_to_event(batch, total), max_steps)
        return self.clock + self.engine.advance_s(batch, total, steps)


@dataclass(kw_only=True)
class _Request(Request):
    """The book's record of a request, plus what fixes its emulated content."""

    prompt_len: int
    """Length of the original prompt: response position i is absolute position prompt_len + i."""
    made_before: int
    """Response tokens the request already held when submitted."""
    target: int
    """The response length (from the original prompt) at which it finishes."""
    end_reason: str
    """How it will finish: stop or length."""
    stop: int | None
    stops: frozenset[int]


class EmulatedEngine:
    """See the module docstring. `model`: a model skeleton (a torch module) that `load_weights` copies
    pulled weights into, as the real engine does; None keeps only the version, and `fingerprint` says
    which model's weights it takes. `clock`/`sleep`: the wall clock and how to wait (tests pass a fake
    pair)."""

    exact_continuation = True
    """Content is a pure function of (seed, position): a resumed request ends as the uninterrupted one."""

    def __init__(self, config: EmulationConfig, eos_token_ids: Iterable[int] = (), weight_version: int = 0,
                 model=None, fingerprint: str = "", clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        config.validate()
        self.config = config
        self.profile, _ = config.profiles()
        self.lengths = ResponseLengths(config.lengths())
        self.prompt_len = config.workload.prompt_len
        self.state = _PacedState(self.profile, self.prompt_len)
        self.kv_capacity_tokens = int(self.profile.kv_capacity_tokens)
        """The modelled engine's KV cache (EngineBackend.kv_capacity_tokens): where its batch binds."""
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self.model = model
        self.fingerprint = weights_fingerprint(dict(model.named_parameters())) if model is not None else fingerprint
        self.weight_version = weight_version
        self.asleep = False
        self.drafter = None
        self.spec_stats = SpecStats()
        self.last_step: tuple[int, bool] = (0, False)
        """(requests in the last step, whether it was a prefill), as LLMEngine.last_step."""
        self.last_decode_steps = 1
        """Decode steps the last step() ran (>= 1): a worker divides the step's time by it, so the
        manager's throughput profile sees tokens/s per decode step as with the real engine."""
        self._clock, self._sleep = clock, sleep
        self._t0 = clock()
        self.book: RequestBook[_Request] = RequestBook(config)
        self._incoming: list[tuple[str, int, int]] = []
        """Requests added since the last step, handed to the batching state together (at the time of
        the first), as one submission: a worker adds a manager's batch one request at a time."""
        self._incoming_at = 0.0
        self._seeds = itertools.count()

    # ---- time ------------------------------------------------------------------------------------

    def now_s(self) -> float:
        """Modelled seconds since the engine was built (wall seconds / time_scale)."""
        return (self._clock() - self._t0) / self.config.time_scale

    def _sleep_until(self, t_s: float) -> None:
        wait = self._t0 + t_s * self.config.time_scale - self._clock()
        if wait > 0:
            self._sleep(wait)

    # ---- requests --------------------------------------------------------------------------------

    def add(self, request_id: str, prompt_token_ids: Sequence[int], params=None, prompt_len: int | None = None) -> int:
        """Admit a request; returns its seed. `prompt_len`: how much of `prompt_token_ids` is the
        original prompt when resubmitting prompt + partial tokens (None: all of it)."""
        params = params if params is not None else SamplingParams()
        where = f"request {request_id!r}"
        if self.asleep:
            raise EngineStateError(f"{where}: the engine is asleep; call wake() first")
        if request_id in self.book:
            raise InvalidRequestError(f"{where}: a request with this id is already in the engine")
        tokens = [int(t) for t in prompt_token_ids]
        if not tokens:
            raise InvalidRequestError(f"{where}: empty prompt")
        if not (isinstance(params.max_tokens, int) and params.max_tokens >= 1):
            raise InvalidRequestError(f"{where}: max_tokens must be an int >= 1, got {params.max_tokens!r}")
        p0 = len(tokens) if prompt_len is None else prompt_len
        if not 0 < p0 <= len(tokens):
            raise InvalidRequestError(f"{where}: prompt_len={prompt_len} but {len(tokens)} tokens were given")
        made = len(tokens) - p0
        seed = params.seed if params.seed is not None else derive_seed(self.config.seed, next(self._seeds))
        stops = frozenset(params.stop_token_ids or ()) | (frozenset() if params.ignore_eos else self.eos_token_ids)
        length, truncated = self.lengths(seed)
        cap = made + params.max_tokens
        if stops and not truncated and length <= cap:
            target, reason = length, "stop"
        else:
            target, reason = cap, "length"
        if target <= made:
            raise InvalidRequestError(f"{where}: its response ends at {target} tokens but {made} were given")
        if made and self.config.check_continuation:
            vocab = self.config.vocab
            for i, t in enumerate(tokens[p0:]):
                if t != token_at(seed, p0 + i, vocab, stops):
                    raise InvalidRequestError(f"{where}: response token {i} is {t}, not this seed's token "
                                              "there (not an exact continuation)")
        self.book.add(_Request(request_id, tokens, seed, prompt_len=p0, made_before=made, target=target,
                               end_reason=reason, stop=min(stops) if reason == "stop" else None, stops=stops))
        if not self._incoming:
            self._incoming_at = self.now_s()
        self._incoming.append((request_id, target, made))
        return seed

    def _flush(self) -> None:
        if self._incoming:
            items, self._incoming = self._incoming, []
            self.state.submit(items, self._incoming_at)

    def abort(self, request_ids: Iterable[str]) -> dict[str, PartialOutput]:
        """Remove requests; the exact partial output of each still in the engine (ids that finished
        or were never added are ignored)."""
        held = self.book.held(request_ids)
        if not held:
            return {}
        self._flush()
        made = self.state.abort([req.request_id for req in held], self.now_s())
        for req in held:
            self._materialize(req, made[req.request_id])
        return self.book.abort([req.request_id for req in held], self.weight_version)

    def has_unfinished(self) -> bool:
        return bool(self.book)

    def progress(self) -> dict[str, int]:
        """Tokens generated so far by each unfinished request, streamed or not (as of the last step,
        after which every request's tokens are in the book)."""
        return self.book.progress()

    @property
    def num_running(self) -> int:
        self._flush()
        return self.state.running

    @property
    def num_waiting(self) -> int:
        self._flush()
        return self.state.waiting

    # ---- the step --------------------------------------------------------------------------------

    def step(self) -> list[StreamChunk]:
        """A prefill, or up to stream_interval decode steps, slept through; returns the chunks."""
        if self.asleep:
            raise EngineStateError("the engine is asleep; call wake() first")
        state = self.state
        self.last_decode_steps = 1
        if not self.book:
            self.last_step = (0, False)
            return []
        self._flush()
        if state.clock > self.now_s() + _EPS_S:
            # an admission put prefill time on the engine's clock: that is this step
            self._sleep_until(state.clock)
            self.last_step = (state.running, True)
            return []
        batch, steps0 = state.running, state.step
        horizon = state.horizon_s(self.config.stream_interval)
        self._sleep_until(horizon)
        finished = state.advance_to(horizon + _EPS_S)
        self.last_step = (batch, False)
        self.last_decode_steps = max(state.step - steps0, 1)
        self.spec_stats.decode_steps += state.step - steps0
        progress, finished = state.progress(), set(finished)
        for req in self.book:
            done = req.request_id in finished
            self._materialize(req, req.target if done else progress[req.request_id], done)
        return self.book.take_chunks(self.weight_version)

    def flush(self) -> list[StreamChunk]:
        """A chunk of every unfinished request's tokens not chunked yet (fewer than stream_interval)."""
        self._flush()
        return self.book.flush(self.weight_version)

    def _materialize(self, req: _Request, made: int, done: bool = False) -> None:
        """Append the request's tokens up to `made` response tokens (from the original prompt) to the
        book; `done`: that is where it ends."""
        vocab = self.config.vocab
        positions = range(req.made_before + len(req.output_token_ids), made)
        tokens = [req.stop if i == req.target - 1 and req.stop is not None
                  else token_at(req.seed, req.prompt_len + i, vocab, req.stops) for i in positions]
        self.book.append(req.request_id, tokens, [logprob_at(req.seed, req.prompt_len + i) for i in positions],
                         req.end_reason if done else None)

    # ---- weights and memory ----------------------------------------------------------------------

    def load_weights(self, state_dict: Mapping | None, version: int, names: Iterable[str] | None = None) -> None:
        """Tag `version`; with a model skeleton, first copy the state dict (or only the parameters
        `names` names) into it in place, checked as the real engine checks it. Without one there is
        nothing to copy, so `names` is ignored."""
        self.book.require_idle("load_weights")
        if self.model is not None and state_dict is not None:
            params = dict(self.model.named_parameters())
            names = None if names is None else list(names)
            check_weights(params, set(self.model.state_dict()) - set(params), state_dict, version, names)
            copy_weights(self.model, state_dict, names)
        self.weight_version = version

    def sleep(self) -> None:
        """Free the (emulated) KV cache so the reserved GPUs can train."""
        self.book.require_idle("sleep")
        self.asleep = True

    def wake(self) -> None:
        self.asleep = False


@dataclass(frozen=True)
class EmulatedEngines:
    """The engine factory of emulated rollout workers (`WorkerSpec.engine_factory`): each worker builds
    an `EmulatedEngine` of `config` in its own process, on the skeleton of the spec's model when
    `config.worker == "rollout"`, on nothing when it is "light" (then `fingerprint`, computed once by
    the driver from the model's skeleton, says whose weights it takes)."""

    config: EmulationConfig
    fingerprint: str = ""

    def __call__(self, spec) -> EmulatedEngine:
        model = None
        if self.config.worker == "rollout":
            import torch

            from rlboost.models.loading import load_skeleton

            torch.set_num_threads(spec.num_threads)
            model = load_skeleton(spec.model)
        elif not self.fingerprint:
            raise ValueError("a light emulated worker needs the fingerprint of the run's model")
        return EmulatedEngine(self.config, spec.eos_token_ids, weight_version=-1, model=model,
                              fingerprint=self.fingerprint)


__all__ = ["FIRST_TOKEN", "WORKER_KINDS", "EmulatedEngine", "EmulatedEngines", "EmulationConfig", "ResponseLengths",
           "logprob_at", "token_at", "workload_seed"]
