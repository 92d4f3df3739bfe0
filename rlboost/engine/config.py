"""Rollout engine configuration."""

from __future__ import annotations

from dataclasses import dataclass

CPU_LINEARS = ("onednn", "torch")


@dataclass
class EngineConfig:
    device: str = "auto"
    """`cpu`, `cuda`, `cuda:N`, or `auto` (CUDA when available, else CPU)."""

    max_num_seqs: int = 64
    """Most requests decoding at once (KV-cache slots). Further requests wait in FIFO order."""

    max_model_len: int | None = None
    """Longest sequence (prompt + response) in tokens; None means the model's max_position_embeddings.
    A prompt this long or longer is rejected; generation stops with finish_reason `length` there."""

    max_num_batched_tokens: int = 4096
    """Prefill budget per step: new prompts are batched while (number of prompts × longest prompt) stays
    within it. A single longer prompt still runs, alone."""

    stream_interval: int = 8
    """Tokens are streamed back in chunks of at most this many; it bounds the tokens lost when a
    worker dies (DESIGN invariant 4)."""

    kv_cache_init_len: int = 256
    """Initial per-slot KV capacity in tokens; it doubles on demand up to max_model_len."""

    cpu_linear: str = "onednn"
    """GEMM backend on CPU: `onednn` (oneDNN's small-batch kernels, the faster one on AVX-512 machines;
    falls back to `torch` when PyTorch lacks oneDNN) or `torch` (F.linear, i.e. MKL/OpenBLAS).
    `rlboost bench engine --compare-cpu-linear` measures both on your machine."""

    seed: int = 0
    """Seed from which requests that give no seed of their own get one."""

    spec_max_batch: int = 8
    """Speculative decoding (with a drafter, e.g. HistoSpec) runs only on decode steps of at most this many
    requests: small batches are memory-bound, so verifying a few draft tokens costs about one step,
    while large ones are compute-bound and would pay for every rejected token. 0 turns it off."""

    def validate(self) -> None:
        """Raise ValueError naming the first invalid field."""
        if self.max_num_seqs < 1:
            raise ValueError(f"engine.max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.stream_interval < 1:
            raise ValueError(f"engine.stream_interval must be >= 1, got {self.stream_interval}")
        if self.spec_max_batch < 0:
            raise ValueError(f"engine.spec_max_batch must be >= 0, got {self.spec_max_batch}")
        if self.cpu_linear not in CPU_LINEARS:
            raise ValueError(f"engine.cpu_linear must be one of {', '.join(CPU_LINEARS)}, got {self.cpu_linear!r}")
