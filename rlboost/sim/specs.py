"""Datasheet figures the simulator's performance model starts from: GPUs and model shapes.

Contract: frozen dataclasses of published numbers (NVIDIA's H100 datasheet, the Qwen3 models' public
`config.json`), with the parameter, byte and FLOP counts derived from them. No efficiency factor lives
here: those are `rlboost.sim.profile.ProfileConfig`'s. Pure: no clock, no torch, no Ray.
"""

from __future__ import annotations

from dataclasses import dataclass

BF16_BYTES = 2
WIRE_DTYPES: dict[str, int] = {"bfloat16": BF16_BYTES, "float32": 4}
"""Bytes per parameter of the dtypes a weight version can move in, by torch's name for them: the
weight store (`rlboost.cluster.weights`) sizes a version as numel x element size of every parameter,
so a join pulls params x these bytes."""


@dataclass(frozen=True)
class GPUSpec:
    """Datasheet figures of one GPU."""

    name: str
    hbm_bytes_per_s: float
    """Peak HBM bandwidth, bytes/s."""
    peak_flops: float
    """Peak dense BF16 tensor-core FLOP/s (no sparsity)."""
    memory_bytes: float
    """HBM capacity, bytes."""


H100 = GPUSpec(name="H100-SXM", hbm_bytes_per_s=3.35e12, peak_flops=989e12, memory_bytes=80e9)
"""NVIDIA H100 SXM5 80GB datasheet: 3.35 TB/s HBM3, 989 TFLOP/s dense BF16."""


@dataclass(frozen=True)
class ModelSpec:
    """Shapes of a dense decoder-only transformer (Qwen3 layout: GQA, q/k RMSNorm, SwiGLU MLP, untied
    embeddings, no attention bias)."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int

    @property
    def attention_params(self) -> int:
        """Per layer: q and o projections (hidden x heads*head_dim), k and v (hidden x kv_heads*head_dim),
        plus the per-head q and k RMSNorm weights."""
        q_dim, kv_dim = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return 2 * self.hidden * q_dim + 2 * self.hidden * kv_dim + 2 * self.head_dim

    @property
    def mlp_params(self) -> int:
        """Per layer: gate, up and down projections of the SwiGLU MLP."""
        return 3 * self.hidden * self.intermediate

    @property
    def params(self) -> float:
        """All parameters: input embedding + untied lm_head + layers x (attention + MLP + 2 RMSNorms)
        + the final RMSNorm."""
        per_layer = self.attention_params + self.mlp_params + 2 * self.hidden
        return float(2 * self.vocab * self.hidden + self.layers * per_layer + self.hidden)

    @property
    def matmul_params(self) -> float:
        """Parameters that take part in a matmul for every token: everything but the input embedding
        (a row lookup, read for one row per token) and the norms (elementwise). This is what a decode
        step reads from HBM and what 2 FLOPs per parameter per token apply to."""
        return float(self.vocab * self.hidden + self.layers * (self.attention_params + self.mlp_params))

    def weight_bytes_in(self, dtype: str) -> float:
        """All weights in `dtype` (a key of WIRE_DTYPES): what a weight transfer of that dtype moves,
        every parameter once, as the weight store packs a version."""
        if dtype not in WIRE_DTYPES:
            raise ValueError(f"unknown weight dtype {dtype!r}; valid: {', '.join(WIRE_DTYPES)}")
        return self.params * WIRE_DTYPES[dtype]

    @property
    def weight_bytes(self) -> float:
        """All weights in bf16: what the serving engine holds in GPU memory."""
        return self.weight_bytes_in("bfloat16")

    @property
    def matmul_weight_bytes(self) -> float:
        """The weights a decode step reads, in bf16."""
        return self.matmul_params * BF16_BYTES

    def kv_bytes_per_token(self) -> float:
        """KV cache of one token in bf16: K and V x layers x kv_heads x head_dim x 2 bytes."""
        return float(2 * self.layers * self.kv_heads * self.head_dim * BF16_BYTES)

    @property
    def attention_flops_per_context(self) -> float:
        """FLOPs one token spends per earlier token it attends to: QK^T and softmax x V, each a
        multiply-add (2 FLOPs) over heads x head_dim, in every layer."""
        return float(4 * self.layers * self.heads * self.head_dim)

    def flops_per_token(self, context: float) -> float:
        """Forward FLOPs of one token that attends to `context` tokens: 2 x matmul params + attention."""
        return 2.0 * self.matmul_params + self.attention_flops_per_context * context


# Public Hugging Face configs (config.json of Qwen/Qwen3-8B, -14B, -32B); all three untie embeddings.
MODELS: dict[str, ModelSpec] = {
    "qwen3-8b": ModelSpec("qwen3-8b", layers=36, hidden=4096, heads=32, kv_heads=8, head_dim=128,
                          intermediate=12288, vocab=151936),
    "qwen3-14b": ModelSpec("qwen3-14b", layers=40, hidden=5120, heads=40, kv_heads=8, head_dim=128,
                           intermediate=17408, vocab=151936),
    "qwen3-32b": ModelSpec("qwen3-32b", layers=64, hidden=5120, heads=64, kv_heads=8, head_dim=128,
                           intermediate=25600, vocab=151936),
}



__all__ = ["BF16_BYTES", "H100", "MODELS", "WIRE_DTYPES", "GPUSpec", "ModelSpec"]
