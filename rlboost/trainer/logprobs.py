"""Per-token log-probs of responses under a causal LM, at the rollout temperature.

The quantity is the engine's: log_softmax(logits / T) of the token actually generated (raw logits
when T = 0), before any top-k/top-p truncation. Only response positions are projected through the
LM head, so the [tokens, vocab] logits tensor covers responses, not prompts.
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
