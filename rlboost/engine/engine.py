"""LLMEngine: continuous-batching generation with token streaming, exact abort/resume, weight swaps.

Contract (docs/engine.md, "Contract"; the calls every backend shares are
`rlboost.engine.protocol.EngineBackend`):
- `add(request_id, prompt_token_ids, params)` admits a request or raises InvalidRequestError naming it;
  other requests are unaffected.
- `step()` runs one batch (a prefill of waiting prompts, or one decode token for every running
  request) and returns StreamChunks: per request, at most `stream_interval` new tokens with their
  log-probs (log_softmax(logits / T), or of raw logits when greedy, before top-k/top-p), the offset
  of the first one, and the weight version that produced them. The tokens, their chunking, `flush`,
  `abort` and `progress` are the request book's (`rlboost.engine.request_book`): a step appends there.
- `abort(ids)` removes requests and returns each one's exact partial output, streamed or not.
  Resubmitting prompt + partial tokens with max_tokens reduced by their count and the same seed
  continues exactly as if never interrupted: greedy always; sampled given identical logits (the
  draw of the token at absolute position t depends only on (seed, t)).
- Speculative decoding (docs/histospec.md, "How it works"): with a `drafter` (HistoSpec's), small
  decode batches verify draft tokens, a path or a tree of them (`rlboost.engine.draft_tree`), in one
  forward pass. The token emitted at each position is exactly the one plain decoding draws there
  (given the same logits), so speculation changes speed, never output.
- `load_weights(state_dict, version, names=None)` copies weights in place (only `names` when given:
  a patched version's changed parameters, the rest already served); `sleep()` frees the KV cache and
  `wake()` allows it back. All three need an engine with no unfinished request, so every token of a
  request comes from one weight version.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable, Mapping, Sequence as SequenceABC

import torch
from transformers import PreTrainedModel

from rlboost.engine.config import EngineConfig
from rlboost.engine.draft_tree import DraftTree, accepted_nodes
from rlboost.engine.kv_cache import KVCache
from rlboost.engine.model_runner import ModelRunner, check_supported
from rlboost.engine.protocol import (Drafter, EngineStateError, SpecStats, check_request,
                                     check_weights, stop_ids, weights_fingerprint)
from rlboost.engine.request_book import RequestBook
from rlboost.engine.rng import derive_seed, uniform
from rlboost.engine.sampler import sample
from rlboost.engine.sampling_params import SamplingParams
from rlboost.engine.scheduler import Scheduler
from rlboost.engine.sequence import Completion, PartialOutput, Sequence, StreamChunk
from rlboost.engine.weight_copy import copy_weights
from rlboost.policies.spec_budget import SpecBudget


def resolve_device(name: str, key: str = "engine.device") -> torch.device:
    """`auto` is CUDA when available, else CPU; `key` names the config field in errors."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{key}={name!r} but CUDA is not available on this machine")
    return device


class LLMEngine:
    """Takes ownership of `model` (moved to the device, projections fused in place)."""

    exact_continuation = True
    """Token t's draw depends only on (seed, t): a resumed request continues exactly."""
    kv_capacity_tokens = None
    """Its cache grows per sequence up to max_model_len, for every one of max_num_seqs: sequences bind first."""

    def __init__(self, model: PreTrainedModel, config: EngineConfig | None = None,
                 eos_token_ids: Iterable[int] = (), weight_version: int = 0, drafter: Drafter | None = None):
        self.config = config = config or EngineConfig()
        config.validate()
        check_supported(model.config)
        self.device = resolve_device(config.device)
        self.model = model.to(self.device).eval()
        model_config = model.config
        self.max_model_len = config.max_model_len or model_config.max_position_embeddings
        self.vocab_size = model.get_input_embeddings().num_embeddings
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        head_dim = getattr(model_config, "head_dim", None) or (
            model_config.hidden_size // model_config.num_attention_heads)
        self.cache = KVCache(
            num_layers=model_config.num_hidden_layers, num_kv_heads=model_config.num_key_value_heads,
            head_dim=head_dim, max_slots=config.max_num_seqs, max_len=self.max_model_len,
            dtype=next(model.parameters()).dtype, device=self.device, init_len=config.kv_cache_init_len)
        self.runner = ModelRunner(self.model, self.cache, config.cpu_linear)
        self.scheduler = Scheduler(config.max_num_seqs, config.max_num_batched_tokens)
        self.weight_version = weight_version
        self.asleep = False
        self.drafter = drafter
        self.spec_stats = SpecStats()
        self.spec_budget = SpecBudget(config.spec_max_batch, prior=config.verify_curve())
        self.last_step: tuple[int, bool] = (0, False)
        """(requests in the last step, whether it was a prefill): lets a worker profile decode speed."""
        self.last_decode_steps = 1
        """Decode steps the last step() ran: always one here (the protocol allows engines that run several)."""
        self.fingerprint = weights_fingerprint(dict(self.model.named_parameters()))
        self.book: RequestBook[Sequence] = RequestBook(config)
        self._seed_counter = itertools.count()
        self._request_counter = itertools.count()

    # ---- requests ------------------------------------------------------------------------------

    def add(self, request_id: str, prompt_token_ids: SequenceABC[int],
            params: SamplingParams | None = None, prompt_len: int | None = None) -> int:
        """Admit a request; returns its seed (given or assigned). `prompt_len`: how much of
        `prompt_token_ids` is the original prompt when resubmitting prompt + partial tokens (the
        drafter looks history up by the original prompt); None: all of it."""
        params = params or SamplingParams()
        tokens = check_request(request_id, prompt_token_ids, params, self.vocab_size, self.max_model_len,
                               asleep=self.asleep, duplicate=request_id in self.book)
        seed = params.seed if params.seed is not None else derive_seed(self.config.seed, next(self._seed_counter))
        seq = self.book.add(Sequence(request_id, tokens, seed, params=params,
                                     stop_token_ids=stop_ids(params, self.eos_token_ids)))
        self.scheduler.add(seq)
        if self.drafter is not None:
            self.drafter.start(request_id, tokens[:prompt_len] if prompt_len else tokens)
        return seed

    def abort(self, request_ids: Iterable[str]) -> dict[str, PartialOutput]:
        """Remove requests; returns the exact partial output of each that was still in the engine
        (ids that already finished or were never added are ignored: finishing races aborting)."""
        seqs = self.book.held(request_ids)
        self.scheduler.remove(seqs, self.cache)
        for seq in seqs if self.drafter is not None else ():
            self.drafter.finish(seq.request_id)
        return self.book.abort([seq.request_id for seq in seqs], self.weight_version)

    def has_unfinished(self) -> bool:
        return bool(self.book)

    def progress(self) -> dict[str, int]:
        """Tokens generated so far by each unfinished request, streamed or not."""
        return self.book.progress()

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    # ---- the step ------------------------------------------------------------------------------

    def step(self) -> list[StreamChunk]:
        if self.asleep:
            raise EngineStateError("the engine is asleep; call wake() first")
        batch, is_prefill = self.scheduler.schedule()
        self.last_step = (len(batch), is_prefill)
        if not batch:
            return []
        # a verify step's time includes its drafting, which the budget weighs too; a step that found
        # nothing to draft is timed as the plain step it is (so speculation is first measured with drafts),
        # one whose drafts the budget cut whole as a verify step of no extra positions (its drafting cost)
        t0 = time.perf_counter()
        speculating = not is_prefill and self.drafter is not None and self.spec_budget.speculate(len(batch))
        drafts = self._drafts(batch) if speculating else {}
        if not drafts:
            speculating, t0 = False, time.perf_counter()
        else:
            keep = self.spec_budget.nodes(len(batch), [len(tree) for tree in drafts.values()])
            drafts = {rid: tree.cut(len(tree), keep) for rid, tree in drafts.items()} if keep else {}
        width = 1 + max(map(len, drafts.values()), default=0)
        try:
            self.cache.reserve(len(self.scheduler.running),
                               min(self.max_model_len, max(seq.num_tokens for seq in batch) + width - 1))
            if drafts:
                emitted = self._verify(batch, drafts, width)
            else:
                input_ids, positions, last_index = self._inputs(batch, is_prefill)
                logits = self.runner.forward(input_ids, positions, last_index, slot_offset=batch[0].slot)
                uniforms = [uniform(seq.seed, seq.num_tokens) for seq in batch]
                tokens, logprobs = sample(logits, [seq.params for seq in batch], uniforms)
                emitted = [[pair] for pair in zip(tokens, logprobs)]
        except BaseException:
            # E.g. out of memory growing the cache. Nothing was committed for a decode batch; a prefill
            # batch goes back to waiting, so a later step never decodes from a cache it never filled.
            if is_prefill:
                self.scheduler.unschedule_prefill(batch)
            raise

        if not is_prefill:
            self._observe_decode(len(batch), time.perf_counter() - t0, sum(map(len, emitted)), speculating,
                                 len(batch) * (width - 1))
        for seq, pairs in zip(batch, emitted):
            kept, reason = self._kept(seq, pairs)
            self.book.append(seq.request_id, [token for token, _ in kept], [logprob for _, logprob in kept], reason)
            seq.num_cached = seq.num_tokens - 1  # the K/V of every token but the newest (and no rejected draft)
        finished = [seq for seq in batch if seq.finish_reason is not None]
        for seq in finished if self.drafter is not None else ():
            self.drafter.finish(seq.request_id)
        chunks = self.book.take_chunks(self.weight_version, [seq.request_id for seq in batch])
        self.scheduler.remove(finished, self.cache)
        return chunks

    def flush(self) -> list[StreamChunk]:
        """A chunk of every unfinished request's tokens not chunked yet (fewer than stream_interval)."""
        return self.book.flush(self.weight_version)

    # ---- speculative decoding (HistoSpec) ----------------------------------------------------------

    def _drafts(self, batch: list[Sequence]) -> dict[str, DraftTree]:
        """Draft trees per request (a drafter's list is a path). A draft leaves room for the bonus token
        within max_tokens and the context."""
        drafts = {}
        for seq in batch:
            context_room = self.max_model_len - seq.num_tokens - 1
            room = min(seq.params.max_tokens - len(seq.output_token_ids) - 1, context_room)
            if room > 0:
                draft = self.drafter.propose(seq.request_id, seq.prompt_token_ids + seq.output_token_ids)
                # a node's K/V takes a cache position of its own (its column) until verified
                tree = (draft if isinstance(draft, DraftTree) else DraftTree.path(draft)).cut(room, context_room)
                if len(tree):
                    drafts[seq.request_id] = tree
        return drafts

    def _observe_decode(self, batch: int, seconds: float, tokens: int, speculative: bool, extra_positions: int) -> None:
        self.spec_budget.observe(batch, seconds, tokens, speculative, extra_positions)
        self.spec_stats.decode_step(batch, seconds, tokens, speculative, self.spec_budget.plain_step_s(batch))

    def _verify(self, batch: list[Sequence], drafts: dict[str, DraftTree], width: int) -> list[list[tuple[int, float]]]:
        """One forward over each request's last token plus its draft tree; returns the tokens to emit.

        Lossless by coupling: the token after each node is drawn exactly as plain decoding would draw
        it at that position (inverse CDF of the target distribution with the uniform of (seed, t)), and
        a draft node is accepted iff its token equals the draw after its parent. For a path this is the
        lossless rule (acceptance with probability p(draft), a rejection yields p conditioned on "not
        the draft", all-accepted a bonus token); for a tree, the draws along the accepted branch are
        plain decoding's draws, so the output is identical to plain decoding given identical logits
        (and abort/resume stays exact).
        """
        trees = [drafts.get(seq.request_id, DraftTree((), ())) for seq in batch]
        rows = [[seq.last_token_id, *tree.tokens] for seq, tree in zip(batch, trees)]
        depths = [[0, *tree.depths()] for tree in trees]
        input_ids = torch.tensor([row + [0] * (width - len(row)) for row in rows])
        start = torch.tensor([seq.num_cached for seq in batch])
        columns = torch.arange(width)
        # padding columns write K/V past a row's end (masked now, overwritten later); keep them in range
        cache_positions = (start[:, None] + columns[None, :]).clamp(max=self.max_model_len - 1)
        tree_layout = None
        if all(tree.is_path for tree in trees):
            positions = cache_positions
        else:
            # a node sits at its depth for the rotary embedding and attends to the cache and its own
            # branch; its K/V goes to its column's cache position until the accepted branch is compacted
            positions = (start[:, None] + torch.tensor([d + [0] * (width - len(d)) for d in depths])
                         ).clamp(max=self.max_model_len - 1)
            tree_layout = (cache_positions.to(self.device), _branch_masks(trees, width).to(self.device))
        logits = self.runner.forward(input_ids.to(self.device), positions.to(self.device), None,
                                     slot_offset=batch[0].slot, tree=tree_layout)
        index = [(b, j) for b, row in enumerate(rows) for j in range(len(row))]
        flat = logits[torch.tensor([b for b, _ in index]), torch.tensor([j for _, j in index])]
        params = [batch[b].params for b, _ in index]
        uniforms = [uniform(batch[b].seed, batch[b].num_tokens + depths[b][j]) for b, j in index]
        tokens, logprobs = sample(flat, params, uniforms)
        by_row: list[list[tuple[int, float]]] = [[] for _ in batch]
        for (b, _), token, logprob in zip(index, tokens, logprobs):
            by_row[b].append((token, logprob))
        emitted = []
        for seq, tree, drawn in zip(batch, trees, by_row):
            accepted = accepted_nodes(tree, [token for token, _ in drawn])
            # the accepted draft tokens (each the draw at its parent's column), then the draw after the
            # last of them (the correction or the bonus token): plain decoding's tokens
            columns = [0] + [node + 1 for node in accepted]
            emitted.append([(tree.tokens[node], drawn[column][1]) for node, column in zip(accepted, columns)]
                           + [drawn[columns[-1]]])
            if tree_layout is not None:
                self._compact(seq, columns[1:])
            if len(tree):
                self.drafter.feedback(seq.request_id, len(tree), len(accepted))
                self.spec_stats.record(len(tree), len(accepted))
                self.spec_budget.verified(len(tree), accepted)
        return emitted

    def _compact(self, seq: Sequence, columns: list[int]) -> None:
        """Move the K/V of a request's accepted tree nodes (`columns` of its verify row, root to leaf)
        from their columns' cache positions to their depths' (the sequence's next positions)."""
        moved = [(depth, column) for depth, column in enumerate(columns, 1) if column != depth]
        if moved:
            dst = torch.tensor([seq.num_cached + depth for depth, _ in moved], device=self.device)
            src = torch.tensor([seq.num_cached + column for _, column in moved], device=self.device)
            for cache in (self.cache.k, self.cache.v):
                cache[:, seq.slot, :, dst] = cache[:, seq.slot, :, src]

    def _inputs(self, batch: list[Sequence], is_prefill: bool):
        if is_prefill:
            steps = max(seq.num_tokens - seq.num_cached for seq in batch)
            ids = [seq.prompt_token_ids[seq.num_cached:] + seq.output_token_ids for seq in batch]
            input_ids = torch.tensor([row + [0] * (steps - len(row)) for row in ids])
            start = torch.tensor([seq.num_cached for seq in batch])
            positions = start[:, None] + torch.arange(steps)[None, :]
            last_index = torch.tensor([len(row) - 1 for row in ids])
        else:
            input_ids = torch.tensor([[seq.last_token_id] for seq in batch])
            positions = torch.tensor([[seq.num_cached] for seq in batch])
            last_index = torch.zeros(len(batch), dtype=torch.long)
        return input_ids.to(self.device), positions.to(self.device), last_index.to(self.device)

    def _kept(self, seq: Sequence, pairs: list[tuple[int, float]]) -> tuple[list[tuple[int, float]], str | None]:
        """The (token, log-prob) pairs a step emitted for `seq` that its response keeps, and why it
        ends there (None: it goes on): tokens verified past a stop token or max_tokens are dropped."""
        made, total = len(seq.output_token_ids), seq.num_tokens
        for n, (token, _) in enumerate(pairs, 1):
            if token in seq.stop_token_ids:
                return pairs[:n], "stop"
            if made + n >= seq.params.max_tokens or total + n >= self.max_model_len:
                return pairs[:n], "length"
        return pairs, None

    # ---- offline convenience -------------------------------------------------------------------

    def generate(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams] | None = None
                 ) -> list[Completion]:
        """Run `prompts` to completion on an otherwise idle engine; results in prompt order."""
        if self.has_unfinished():
            raise EngineStateError("generate() needs an idle engine; use add()/step() alongside other requests")
        params_list = params if isinstance(params, list) else [params or SamplingParams()] * len(prompts)
        ids = [f"generate-{next(self._request_counter)}" for _ in prompts]
        seqs = []
        try:
            for rid, prompt, p in zip(ids, prompts, params_list):
                self.add(rid, prompt, p)
                seqs.append(self.book[rid])
            while self.has_unfinished():
                self.step()
        finally:
            self.abort(ids)  # on error, leave the engine idle rather than half-full
        return [Completion(s.request_id, s.prompt_token_ids, s.output_token_ids, s.output_logprobs,
                           s.finish_reason, s.seed) for s in seqs]

    # ---- weights and memory ----------------------------------------------------------------------

    def load_weights(self, state_dict: Mapping[str, torch.Tensor], version: int,
                     names: Iterable[str] | None = None) -> None:
        """Check a complete state dict, copy it (or only the parameters `names` names) into the model in
        place and tag it `version` (the protocol's partial load)."""
        self.book.require_idle("load_weights")
        params = dict(self.model.named_parameters())  # tied weights appear once
        names = None if names is None else list(names)
        check_weights(params, set(self.model.state_dict()) - set(params), state_dict, version, names)
        copy_weights(self.model, state_dict, names)
        self.weight_version = version

    def sleep(self) -> None:
        """Free the KV cache so the device can train; the weights stay."""
        self.book.require_idle("sleep")
        self.cache.release()
        self.asleep = True

    def wake(self) -> None:
        self.asleep = False  # the cache is re-allocated on the next step that needs it


def _branch_masks(trees: list[DraftTree], width: int) -> torch.Tensor:
    """[B, width, width] bool: column j of a verify row (0: the last token, i + 1: node i) sees column
    m iff m is j or one of its ancestors; a padding column sees itself only."""
    masks = torch.eye(width, dtype=torch.bool).repeat(len(trees), 1, 1)
    for b, tree in enumerate(trees):
        for i, parent in enumerate(tree.parents):
            masks[b, i + 1] |= masks[b, parent + 1]
    return masks
