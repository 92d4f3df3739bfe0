"""Per-token log-probs of responses under a causal LM, at the rollout temperature.

The quantity is the engine's: log_softmax(logits / T) of the token actually generated (raw logits
when T = 0), before any top-k/top-p truncation. Only response positions are projected through the
LM head, so the [tokens, vocab] logits tensor covers responses, not prompts.

Two ways to get there, equal up to float rounding: `response_logprobs` runs every sample's prompt
and response as one padded batch; `shared_prompt_logprobs` runs each prompt once for the run of
consecutive samples that share it (a GRPO group's `n` responses) and its responses on top of the
prompt's keys and values, expanded to the `n` of them. Gradients flow through those keys and values
into the prompt's one forward pass, so the two give the same gradients, with the prompt's share of
the compute cut `n`-fold (most of it when prompts are long and responses short).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import PreTrainedModel


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
    response_ids = torch.full((batch, max_resp), pad_id, dtype=torch.long)
    response_mask = torch.zeros((batch, max_resp), dtype=torch.bool)
    for b, (p, r) in enumerate(zip(prompts, responses)):
        ids = list(p) + list(r)
        input_ids[b, :len(ids)] = torch.tensor(ids)
        attention_mask[b, :len(ids)] = 1
        if r:
            # the token at sequence position i is predicted by the logits at position i - 1
            predict_pos[b, :len(r)] = torch.arange(len(p) - 1, len(p) - 1 + len(r))
            response_ids[b, :len(r)] = torch.tensor(list(r))
            response_mask[b, :len(r)] = True
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
    logits = model.get_output_embeddings()(picked).float()
    if temperature > 0:
        logits = logits / temperature
    log_probs = torch.log_softmax(logits, dim=-1)
    token_logp = torch.gather(log_probs, -1, batch["response_ids"][..., None]).squeeze(-1)
    token_logp = token_logp * batch["response_mask"]
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = -(log_probs.exp() * log_probs).sum(-1) * batch["response_mask"]
    return token_logp, entropy


def shared_prompt_logprobs(model: PreTrainedModel, prompts: Sequence[Sequence[int]],
                           responses: Sequence[Sequence[int]], temperature: float, with_entropy: bool = False,
                           pad_id: int = 0, device: torch.device | str = "cpu",
                           ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`response_logprobs(model, pad_batch(prompts, responses), ...)`, with each run of consecutive equal
    prompts computed once. Same shapes: [B, R], R the longest response (at least 1)."""
    max_resp = max(1, max(len(r) for r in responses))
    parts = [_one_prompt(model, prompts[start], responses[start:end], max_resp, temperature, with_entropy, pad_id,
                         device) for start, end in _runs(prompts)]
    logp = torch.cat([p[0] for p in parts])
    return logp, (torch.cat([p[1] for p in parts]) if with_entropy else None)


def _runs(prompts: Sequence[Sequence[int]]) -> list[tuple[int, int]]:
    """[start, end) of each run of consecutive equal prompts."""
    runs, start = [], 0
    for i in range(1, len(prompts) + 1):
        if i == len(prompts) or list(prompts[i]) != list(prompts[start]):
            runs.append((start, i))
            start = i
    return runs


def _one_prompt(model: PreTrainedModel, prompt: Sequence[int], responses: Sequence[Sequence[int]], max_resp: int,
                temperature: float, with_entropy: bool, pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    from transformers.cache_utils import DynamicCache

    n = len(responses)
    prompt_out = model.base_model(input_ids=torch.tensor([list(prompt)], device=device), use_cache=True)
    # the response's first token is predicted by the prompt's last position, token i by response position i - 1
    predicting = prompt_out.last_hidden_state[:, -1:].expand(n, 1, -1)
    if max_resp > 1:
        ids = torch.full((n, max_resp - 1), pad_id, dtype=torch.long)
        mask = torch.zeros((n, len(prompt) + max_resp - 1), dtype=torch.long)
        mask[:, :len(prompt)] = 1
        for b, r in enumerate(responses):
            head = list(r)[:max_resp - 1]
            ids[b, :len(head)] = torch.tensor(head, dtype=torch.long)
            mask[b, len(prompt):len(prompt) + len(head)] = 1
        # expand() is a view: the n responses read one copy of the prompt's keys and values, and their
        # gradients sum back into it
        cache = DynamicCache(ddp_cache_data=[(layer.keys.expand(n, -1, -1, -1), layer.values.expand(n, -1, -1, -1))
                                             for layer in prompt_out.past_key_values.layers])
        hidden = model.base_model(input_ids=ids.to(device), attention_mask=mask.to(device), past_key_values=cache,
                                  use_cache=False).last_hidden_state
        predicting = torch.cat([predicting, hidden], dim=1)
    logits = model.get_output_embeddings()(predicting).float()
    if temperature > 0:
        logits = logits / temperature
    log_probs = torch.log_softmax(logits, dim=-1)
    targets = torch.full((n, max_resp), pad_id, dtype=torch.long)
    response_mask = torch.zeros((n, max_resp), dtype=torch.bool)
    for b, r in enumerate(responses):
        targets[b, :len(r)] = torch.tensor(list(r), dtype=torch.long)
        response_mask[b, :len(r)] = True
    targets, response_mask = targets.to(device), response_mask.to(device)
    token_logp = torch.gather(log_probs, -1, targets[..., None]).squeeze(-1) * response_mask
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = -(log_probs.exp() * log_probs).sum(-1) * response_mask
    return token_logp, entropy
