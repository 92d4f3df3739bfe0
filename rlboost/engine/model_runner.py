"""The forward pass of Llama / Qwen2 / Qwen3 family models over our KV cache.

We run the HF model's own submodules (embedding, RMSNorms, rotary embedding, activation, LM head) so
the numerics are transformers' own; what we replace is the attention plumbing: keys and values live
in the engine's slot cache and a batch mixes sequences at different positions. Two more changes
serve speed: q/k/v and gate/up projections are fused into single matmuls (the HF parameters become
views into the fused tensors, so `load_state_dict`-style in-place copies still update them), and
grouped-query attention folds the query heads of a KV group into the query-length dimension instead
of repeating keys and values.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from rlboost.engine.kv_cache import KVCache

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")


def _onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    # oneDNN's brgemm beats MKL (F.linear) at decode batch sizes on AVX-512 CPUs: 1.5x engine decode
    # (see docs/engine.md); it takes the dense weight as is, so nothing is duplicated.
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def linear_fn(device: torch.device, dtype: torch.dtype, cpu_linear: str = "onednn"):
    """The linear to use: oneDNN on CPU when asked for and PyTorch has it, else F.linear."""
    if (cpu_linear == "onednn" and device.type == "cpu" and dtype in (torch.float32, torch.bfloat16)
            and torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        return _onednn_linear
    return F.linear


def _fuse_linears(linears: list[torch.nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One weight (and bias) tensor for several linears; the linears' parameters become views of it."""
    weight = torch.cat([lin.weight.data for lin in linears])
    has_bias = [lin.bias is not None for lin in linears]
    bias = None
    if any(has_bias):
        bias = torch.cat([lin.bias.data if lin.bias is not None
                          else torch.zeros(lin.out_features, dtype=weight.dtype, device=weight.device)
                          for lin in linears])
    offset = 0
    for lin in linears:
        n = lin.out_features
        lin.weight.data = weight[offset: offset + n]
        if lin.bias is not None:
            lin.bias.data = bias[offset: offset + n]
        offset += n
    return weight, bias


class _Layer:
    def __init__(self, hf_layer):
        attn, mlp = hf_layer.self_attn, hf_layer.mlp
        self.input_norm = hf_layer.input_layernorm
        self.post_norm = hf_layer.post_attention_layernorm
        self.q_norm = getattr(attn, "q_norm", None)  # Qwen3
        self.k_norm = getattr(attn, "k_norm", None)
        self.qkv_weight, self.qkv_bias = _fuse_linears([attn.q_proj, attn.k_proj, attn.v_proj])
        self.o_weight, self.o_bias = attn.o_proj.weight, attn.o_proj.bias
        self.gate_up_weight, self.gate_up_bias = _fuse_linears([mlp.gate_proj, mlp.up_proj])
        self.down_weight, self.down_bias = mlp.down_proj.weight, mlp.down_proj.bias
        self.act = mlp.act_fn
        self.scaling = attn.scaling


def check_supported(config) -> None:
    """Raise ValueError unless the engine can run models with this transformers config."""
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"model type {config.model_type!r} is not supported by the rollout engine; "
                         f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
    if "sliding_attention" in (getattr(config, "layer_types", None) or []):
        raise ValueError("sliding-window attention layers are not supported by the rollout engine")


class ModelRunner:
    """Runs forward passes for batches of sequences that occupy contiguous cache slots.

    The engine takes ownership of `model` (and has checked it with `check_supported`): its projection
    weights are re-laid out (fused) in place.
    """

    def __init__(self, model: PreTrainedModel, cache: KVCache, cpu_linear: str = "onednn"):
        config = model.config
        self.model = model
        self.cache = cache
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.group = self.num_heads // self.num_kv_heads
        inner = model.model
        self.embed = inner.embed_tokens
        self.rotary = inner.rotary_emb
        self.norm = inner.norm
        self.lm_head = model.lm_head
        param = next(model.parameters())
        self.linear = linear_fn(param.device, param.dtype, cpu_linear)
        self.layers = [_Layer(layer) for layer in inner.layers]
        self._apply_rope = _rope_fn(model)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, last_index: torch.Tensor | None,
                slot_offset: int, tree: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """Logits of each sequence's last valid token ([B, V]), or of every position ([B, T, V]) when
        last_index is None.

        input_ids, positions: [B, T] (right-padded for prefill; T = 1 for decode). Sequence b sits in
        cache slot slot_offset + b and already has positions[b, 0] tokens cached. last_index: [B],
        the column of each row's last real token. Padding columns write K/V past the sequence's end,
        where they are masked out now and overwritten later.
        tree: verifying draft trees, (cache_positions [B, T], visible [B, T, T]): column t's K/V goes
        to cache position cache_positions[b, t] (positions[b, t] is its rotary position, its depth),
        and it attends to the cache before cache_positions[b, 0] and to the columns `visible` marks.
        """
        batch, steps = input_ids.shape
        kv_len = int(positions.max()) + 1
        dim = self.head_dim
        hidden = self.embed(input_ids)
        cos, sin = self.rotary(hidden, positions)
        slots = torch.arange(slot_offset, slot_offset + batch, device=input_ids.device)
        if tree is None:
            cache_positions = positions
            key_positions = torch.arange(kv_len, device=input_ids.device)
            visible = key_positions[None, None, :] <= positions[:, :, None]  # [B, T, L]: up to its own position
        else:
            cache_positions, branch = tree
            kv_len = int(cache_positions.max()) + 1
            visible = _tree_visibility(cache_positions[:, 0], branch, kv_len)
        # [B, 1, G*T, L]: query (g, t) sees what query t does.
        mask = visible.repeat(1, self.group, 1)[:, None]
        q_size = self.num_heads * dim
        kv_size = self.num_kv_heads * dim
        k_cache, v_cache = self.cache.k, self.cache.v
        linear = self.linear
        for i, layer in enumerate(self.layers):
            x = layer.input_norm(hidden)
            qkv = linear(x, layer.qkv_weight, layer.qkv_bias)
            q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
            q = q.view(batch, steps, self.num_heads, dim)
            k = k.view(batch, steps, self.num_kv_heads, dim)
            v = v.view(batch, steps, self.num_kv_heads, dim)
            if layer.q_norm is not None:
                q, k = layer.q_norm(q), layer.k_norm(k)
            q, k = self._apply_rope(q, k, cos, sin, unsqueeze_dim=2)
            k_cache[i][slots[:, None], :, cache_positions] = k
            v_cache[i][slots[:, None], :, cache_positions] = v
            keys = k_cache[i, slot_offset: slot_offset + batch, :, :kv_len]
            values = v_cache[i, slot_offset: slot_offset + batch, :, :kv_len]
            # [B, T, KVH*G, D] -> [B, KVH, G*T, D]: a KV group's query heads share its keys.
            q = q.view(batch, steps, self.num_kv_heads, self.group, dim).permute(0, 2, 3, 1, 4)
            q = q.reshape(batch, self.num_kv_heads, self.group * steps, dim)
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=layer.scaling)
            out = out.view(batch, self.num_kv_heads, self.group, steps, dim).permute(0, 3, 1, 2, 4)
            hidden = hidden + linear(out.reshape(batch, steps, q_size), layer.o_weight, layer.o_bias)
            x = layer.post_norm(hidden)
            gate, up = linear(x, layer.gate_up_weight, layer.gate_up_bias).chunk(2, dim=-1)
            hidden = hidden + linear(layer.act(gate) * up, layer.down_weight, layer.down_bias)
        if last_index is None:  # speculative verification: every position's next-token logits
            return linear(self.norm(hidden), self.lm_head.weight, self.lm_head.bias)
        rows = torch.arange(batch, device=input_ids.device)
        last = self.norm(hidden[rows, last_index])
        return linear(last, self.lm_head.weight, self.lm_head.bias)


def _tree_visibility(start: torch.Tensor, branch: torch.Tensor, kv_len: int) -> torch.Tensor:
    """[B, T, L]: key position p is visible to column t of row b iff it is cached (p < start[b]) or
    holds column p - start[b], which `branch[b, t]` marks."""
    batch, steps, _ = branch.shape
    relative = torch.arange(kv_len, device=start.device)[None, :] - start[:, None]  # [B, L]
    in_row = (relative >= 0) & (relative < steps)
    column = relative.clamp(0, steps - 1)[:, None, :].expand(batch, steps, kv_len)
    return (relative < 0)[:, None, :] | (in_row[:, None, :] & branch.gather(2, column))


def _rope_fn(model: PreTrainedModel):
    """transformers' own apply_rotary_pos_emb for this family (identical maths, identical rounding)."""
    import importlib

    module = importlib.import_module(type(model).__module__)
    return module.apply_rotary_pos_emb
