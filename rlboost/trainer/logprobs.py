"""Per-token log-probs of responses under a causal LM, at the rollout temperature.

The quantity is the engine's: log_softmax(logits / T) of the token actually generated (raw logits
when T = 0), before any top-k/top-p truncation. Only response positions are projected through the
LM head, so the [tokens, vocab] logits tensor covers responses, not prompts.

Two ways to get there, equal up to float rounding:
- `response_logprobs` runs every sample's prompt and response as one right-padded batch (`pad_batch`);
  response token i is predicted by the hidden state at sequence position len(prompt) + i - 1.
- `shared_prompt_logprobs` runs each prompt once (batch 1, with a key/value cache) for the run of
  consecutive samples that share it (a GRPO group's `n` responses), then the `n` right-padded responses
  (batch n) on top of the prompt's keys and values repeated `n` times, at positions len(prompt) onwards.
  Response token 0 is predicted by the prompt's last hidden state, token i by the response pass's
  hidden state i - 1. Gradients flow through the repeated keys and values back into the prompt's one
  forward pass, so the two paths give the same gradients, with the prompt's share of the compute cut
  `n`-fold (most of it when prompts are long and responses short). A prompt no neighbour shares has
  nothing to gain and goes through the padded batch.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from functools import lru_cache

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel
from transformers.cache_utils import DynamicCache


def pad_batch(prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], pad_id: int = 0,
              device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """Right-padded prompt+response ids and the index of each response token's predicting position.

    Returns input_ids, attention_mask [B, L]; predict_pos, response_ids, response_mask [B, R].
    """
    lengths = [len(p) + len(r) for p, r in zip(prompts, responses)]
    batch, max_len = len(lengths), max(lengths)
    max_resp = max(1, max(len(r) for r in responses))
    input_ids = torch.full((batch, max_len), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((batch, max_len), dtype=torch.long)
    predict_pos = torch.zeros((batch, max_resp), dtype=torch.long)
    response_ids, response_mask = _targets(responses, max_resp, pad_id)
    for b, (p, r) in enumerate(zip(prompts, responses)):
        ids = list(p) + list(r)
        input_ids[b, :len(ids)] = torch.tensor(ids)
        attention_mask[b, :len(ids)] = 1
        if r:
            # the token at sequence position i is predicted by the logits at position i - 1
            predict_pos[b, :len(r)] = torch.arange(len(p) - 1, len(p) - 1 + len(r))
    tensors = dict(input_ids=input_ids, attention_mask=attention_mask, predict_pos=predict_pos,
                   response_ids=response_ids, response_mask=response_mask)
    return {k: v.to(device) for k, v in tensors.items()}


def response_logprobs(model: PreTrainedModel, batch: dict[str, torch.Tensor], temperature: float,
                      with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs [B, R] of `batch`'s response tokens (0 where masked) and, optionally, the entropy
    [B, R] of each predicting distribution (no gradient)."""
    hidden = model.base_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                              use_cache=False).last_hidden_state
    pos = batch["predict_pos"]
    picked = torch.gather(hidden, 1, pos[..., None].expand(-1, -1, hidden.shape[-1]))
    return _project(model, picked, batch["response_ids"], batch["response_mask"], temperature, with_entropy)


def shared_prompt_logprobs(model: PreTrainedModel, prompts: Sequence[Sequence[int]],
                           responses: Sequence[Sequence[int]], temperature: float, with_entropy: bool = False,
                           pad_id: int = 0, device: torch.device | str = "cpu",
                           ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`response_logprobs(model, pad_batch(prompts, responses), ...)`, with each run of consecutive equal
    prompts computed once. Same shapes: [B, R], R the longest response (at least 1)."""
    runs = _runs(prompts)
    blocks = _lone_prompts(model, prompts, responses, [s for s, e in runs if e - s == 1], temperature,
                           with_entropy, pad_id, device)
    for start, end in runs:
        if end - start > 1:
            blocks[start] = _one_prompt(model, prompts[start], responses[start:end], temperature, with_entropy,
                                        pad_id, device)
    # each block is as wide as its own longest response: widen them all to the batch's
    width = max(1, max(len(r) for r in responses))
    ordered = [blocks[start] for start, _ in runs]
    logp = torch.cat([_widen(b[0], width) for b in ordered])
    return logp, (torch.cat([_widen(b[1], width) for b in ordered]) if with_entropy else None)


def _widen(x: torch.Tensor, width: int) -> torch.Tensor:
    return F.pad(x, (0, width - x.shape[1]))


def _runs(prompts: Sequence[Sequence[int]]) -> list[tuple[int, int]]:
    """[start, end) of each run of consecutive equal prompts."""
    runs, start = [], 0
    for i in range(1, len(prompts) + 1):
        if i == len(prompts) or list(prompts[i]) != list(prompts[start]):
            runs.append((start, i))
            start = i
    return runs


def _lone_prompts(model: PreTrainedModel, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]],
                  rows: list[int], temperature: float, with_entropy: bool, pad_id: int,
                  device) -> dict[int, tuple[torch.Tensor, torch.Tensor | None]]:
    """{row: (logp [1, R], entropy)} of the samples whose prompt no neighbour shares, in one padded
    batch: sharing would only split each of them into two batch-1 passes."""
    if not rows:
        return {}
    batch = pad_batch([prompts[i] for i in rows], [responses[i] for i in rows], pad_id, device)
    logp, entropy = response_logprobs(model, batch, temperature, with_entropy)
    return {row: (logp[k:k + 1], None if entropy is None else entropy[k:k + 1]) for k, row in enumerate(rows)}


def _one_prompt(model: PreTrainedModel, prompt: Sequence[int], responses: Sequence[Sequence[int]], temperature: float,
                with_entropy: bool, pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs and entropies [n, R] of `responses` to one `prompt`, R their longest (at least 1): the
    prompt in one pass, the responses in a second on its keys and values."""
    if len(prompt) == 0:
        raise ValueError("a sample with an empty prompt has no position to predict its first response token")
    n, max_resp = len(responses), max(1, max(len(r) for r in responses))
    # A cache of full-length layers: the model's own cache would keep only the last window of a sliding-window
    # layer's keys, which the rebuilt cache below would then take for positions 0.. (wrong positions, wrong mask).
    cache_arg = _cache_arg(type(model.base_model))
    prompt_out = model.base_model(input_ids=torch.tensor([list(prompt)], device=device),
                                  **{cache_arg: DynamicCache()}, use_cache=True)
    # the response's first token is predicted by the prompt's last position, token i by response position i - 1
    predicting = prompt_out.last_hidden_state[:, -1:].expand(n, 1, -1)
    if max_resp > 1:
        hidden = _responses_on_prompt(model, getattr(prompt_out, cache_arg), len(prompt), responses, max_resp - 1,
                                      pad_id, device)
        predicting = torch.cat([predicting, hidden], dim=1)
    targets, mask = _targets(responses, max_resp, pad_id)
    return _project(model, predicting, targets.to(device), mask.to(device), temperature, with_entropy)


def _responses_on_prompt(model: PreTrainedModel, prompt_cache: DynamicCache, prompt_len: int,
                         responses: Sequence[Sequence[int]], width: int, pad_id: int, device) -> torch.Tensor:
    """Hidden states [n, width, H] of each response's first `width` tokens (right-padded), run on top of the
    prompt's keys and values. A response's last token predicts nothing, so it is never fed."""
    n = len(responses)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    mask = torch.zeros((n, prompt_len + width), dtype=torch.long)  # covers the cached prompt, then the responses
    mask[:, :prompt_len] = 1
    for b, r in enumerate(responses):
        head = list(r)[:width]
        ids[b, :len(head)] = torch.tensor(head, dtype=torch.long)
        mask[b, prompt_len:prompt_len + len(head)] = 1
    # The cache cat()s the n expanded views into tensors of its own (n copies, as batch_repeat_interleave would
    # make), and the backward of expand sums the n copies' gradients into the prompt's one pass. Positions
    # follow from the cache's length, so response token 0 sits at prompt_len.
    cache = DynamicCache(ddp_cache_data=[(layer.keys.expand(n, -1, -1, -1), layer.values.expand(n, -1, -1, -1))
                                         for layer in prompt_cache.layers])
    return model.base_model(input_ids=ids.to(device), attention_mask=mask.to(device),
                            **{_cache_arg(type(model.base_model)): cache}, use_cache=False).last_hidden_state


@lru_cache(maxsize=None)
def _cache_arg(model_class: type) -> str:
    """The name a model's forward (and its output) gives the key/value cache: transformers 5.x renamed
    `past_key_values` to `cache`, and the old name prints a deprecation warning on every call."""
    return "cache" if "cache" in inspect.signature(model_class.forward).parameters else "past_key_values"


def _targets(responses: Sequence[Sequence[int]], width: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded response ids and their mask, [B, width]."""
    ids = torch.full((len(responses), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(responses), width), dtype=torch.bool)
    for b, r in enumerate(responses):
        if r:
            ids[b, :len(r)] = torch.tensor(list(r), dtype=torch.long)
            mask[b, :len(r)] = True
    return ids, mask


def _project(model: PreTrainedModel, hidden: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor,
             temperature: float, with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs [B, R] of `targets` under the LM head applied to the predicting `hidden` states [B, R, H],
    0 where `mask` is off; optionally each distribution's entropy (no gradient)."""
    logits = model.get_output_embeddings()(hidden).float()  # fp32 softmax even under bf16 autocast
    if temperature > 0:
        logits = logits / temperature
    log_probs = torch.log_softmax(logits, dim=-1)
    token_logp = torch.gather(log_probs, -1, targets[..., None]).squeeze(-1) * mask
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = -(log_probs.exp() * log_probs).sum(-1) * mask
    return token_logp, entropy
