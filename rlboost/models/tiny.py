"""Tiny randomly initialised models of the Llama, Qwen2 and Qwen3 families, built in code.

They are real transformers models (same classes, same forward) with a few thousand parameters, so
tests exercise exactly the code paths of the real checkpoints in milliseconds. Initialisation is
seeded and sharper than the transformers default (std 0.1 instead of 0.02) so that greedy decoding
has clear winners rather than near-ties that float rounding could flip.
"""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedModel, Qwen2Config, Qwen3Config

TINY_FAMILIES = ("llama", "qwen2", "qwen3")

_COMMON = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    initializer_range=0.1,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)


def tiny_config(family: str, vocab_size: int = 256, **overrides):
    """The transformers config of a tiny `family` model; `overrides` replace any field."""
    kwargs = dict(_COMMON, vocab_size=vocab_size)
    if family == "llama":
        cls = LlamaConfig
        kwargs.update(tie_word_embeddings=False, rope_theta=10000.0)
    elif family == "qwen2":
        cls = Qwen2Config  # q/k/v projections carry biases in this family
        kwargs.update(tie_word_embeddings=True, rope_theta=1000000.0)
    elif family == "qwen3":
        cls = Qwen3Config  # per-head q/k RMSNorm, explicit head_dim
        kwargs.update(tie_word_embeddings=True, head_dim=32, rope_theta=1000000.0)
    else:
        raise ValueError(f"unknown tiny model family {family!r}; choose one of {', '.join(TINY_FAMILIES)}")
    kwargs.update(overrides)
    return cls(**kwargs)


def tiny_model(family: str, seed: int = 0, vocab_size: int = 256, dtype=torch.float32, **overrides) -> PreTrainedModel:
    """A tiny `family` causal LM with weights drawn from `seed` (the global RNG is left untouched)."""
    config = tiny_config(family, vocab_size=vocab_size, **overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
        if family == "qwen2":
            # transformers zero-initialises biases; give them values so the bias path is really tested.
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    torch.nn.init.normal_(proj.bias, std=0.1)
    return model.eval()
