"""Performance profiles for the simulator: how long decode, prefill, training and weight transfer take.

Contract: analytic roofline models, no measurement. `EngineProfile` times ONE rollout engine (a vLLM
instance over `tp` GPUs) under continuous batching: a decode step gives every running sample one
token and costs
    step_overhead + TP all-reduce latency + max(memory time, compute time)
    memory time  = (matmul weight bytes + KV bytes of all running contexts) / tp / (HBM x mem_efficiency)
    compute time = (batch x 2 x matmul params + attention flops of all contexts) / (tp x peak x mfu)
Both terms are linear in the batch's total context, so the time of many consecutive steps at a fixed
batch has a closed form (`advance_s`) and so has its inverse (`steps_within`); the simulator moves
from event to event with these, never step by step. `TrainProfile` times FSDP training and weight
transfers. The hardware and model figures are `rlboost.sim.specs`'; how an engine batches samples
through time is `rlboost.sim.batching`; the veRL step they compose into, the calibration anchor, is
`rlboost.sim.baselines`. The defaults of `ProfileConfig` are calibrated so that veRL on Qwen3-8B on
one 8xH100 node makes about 10,000 tokens/s (the RLBoost artifact's ~1,300 per GPU); see
docs/simulator.md for every constant, its source and the fit (`rlboost bench calibration` prints it).
Pure: no clock, no torch, no Ray.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from rlboost.sim.specs import H100, MODELS, GPUSpec, ModelSpec

_PREFIX = "sim.profile"


def _default_tp() -> dict[str, int]:
    return {"qwen3-8b": 2, "qwen3-14b": 2, "qwen3-32b": 2}


@dataclass
class ProfileConfig:
    """Efficiency factors and system settings of the performance model. The defaults are calibrated
    (docs/simulator.md, "Performance model and its assumptions"): `mem_efficiency` is the one fitted
    factor; the others are fixed at values from the literature or from the systems' defaults."""

    mem_efficiency: float = 0.64
    """Achieved fraction of HBM bandwidth in a decode step (weight GEMVs and paged attention reading
    the KV cache). FITTED to the veRL anchor (10,000 tokens/s for Qwen3-8B on 8xH100, the artifact's
    setting: tp=2 engines, each decoding a contiguous chunk of the batch; exact fit 0.639);
    well-tuned GEMV/attention kernels reach 0.7-0.85 of peak alone, end-to-end decode less."""
    compute_mfu_decode: float = 0.5
    """Achieved fraction of peak FLOP/s of decode matmuls when a large batch makes them compute-bound
    (bf16 GEMMs with skinny M reach ~50-70% of peak on H100; 0.5 for the whole step)."""
    prefill_mfu: float = 0.5
    """Achieved fraction of peak FLOP/s in prefill (large GEMMs + flash attention; vLLM and SGLang
    prefill reach ~50-60% MFU on H100)."""
    train_mfu: float = 0.35
    """FSDP training MFU, counting 6 x params FLOPs per token for forward + backward (plus attention)
    and NOT the recomputation of activation checkpointing, as veRL's own perf/mfu does: veRL/FSDP
    reports 0.3-0.4 on H100 for dense 7-32B models."""
    step_overhead_s: float = 0.003
    """Fixed time of every decode step outside the kernels' roofline time: CUDA-graph launch, sampling,
    detokenization and the scheduler's Python (vLLM V1: ~2-4 ms per step)."""
    tp_allreduce_s: float = 8e-6
    """Latency of one tensor-parallel all-reduce of decode activations over NVLink (vLLM's custom
    all-reduce: ~5-10 us for small messages); two per layer per step, only when tp > 1."""
    kv_memory_fraction: float = 0.7
    """Fraction of the engine's memory left after the weights that holds KV cache. vLLM with
    gpu_memory_utilization=0.8 (veRL's long-response recipes) minus activations and CUDA graphs
    (~4 GB) leaves about 0.7 of (80 GB - weights) for Qwen3-8B."""
    max_num_seqs: int = 256
    """Cap on an engine's running samples whatever the KV room: the RLBoost artifact's engines
    (max_num_seqs=256 on the reserved ones, --max-running-requests 256 on the instances). veRL's tp=2
    engines get 256 samples of a step each, so the cap does not bind for the baseline."""
    reserved_gbps: float = 200.0
    """Weight-transfer bandwidth to or within the reserved cluster, Gbit/s (a 200 Gb/s NIC). The link
    of a spot instance belongs to the cluster around the model: `SimConfig.link_gbps`."""
    tp: dict[str, int] = field(default_factory=_default_tp)
    """Tensor-parallel size of one rollout engine per model, for the reserved engines (veRL's too)
    and the instances alike. 8B: 2, the RLBoost artifact's (tensor_model_parallel_size=2 for veRL
    and RLBoost, --tp-size 2 on its instances). 14B: 2 (at tp=1, 30 GB of weights leave too little
    KV: ~55 evictions per engine per step and 29% fewer tokens/s). 32B: 2, the most that fits a
    2xH100 spot instance (66 GB of weights leave little room for long contexts; it still preempts,
    see docs/simulator.md). A 2xH100 spot instance thus runs one engine of each model. A model
    missing here gets the smallest power of two whose weights take at most half of the engine's
    memory."""
    train_flops_factor: float = 5.0
    """Training FLOPs per trained token in units of the forward's (2 x matmul params + attention): 3 for
    forward + backward of the update, 1 for veRL's recomputation of the old log-probs, 1 for the
    reference model's log-probs (KL). Activation checkpointing's extra forward is left to train_mfu,
    as MFU figures conventionally exclude it."""

    def validate(self) -> None:
        """Raise ValueError naming the offending field."""
        for name in ("mem_efficiency", "compute_mfu_decode", "prefill_mfu", "train_mfu", "kv_memory_fraction"):
            value = getattr(self, name)
            if not (math.isfinite(value) and 0 < value <= 1):
                raise ValueError(f"{_PREFIX}.{name} must be in (0, 1], got {value}")
        for name in ("step_overhead_s", "tp_allreduce_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{_PREFIX}.{name} must be finite and >= 0, got {value}")
        for name in ("reserved_gbps", "train_flops_factor"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{_PREFIX}.{name} must be finite and > 0, got {value}")
        if self.max_num_seqs < 1:
            raise ValueError(f"{_PREFIX}.max_num_seqs must be >= 1, got {self.max_num_seqs}")
        for model, size in self.tp.items():
            if not (isinstance(size, int) and size >= 1):
                raise ValueError(f"{_PREFIX}.tp.{model} must be an integer >= 1, got {size!r}")


def _tp_for(model: ModelSpec, gpu: GPUSpec, cfg: ProfileConfig) -> int:
    if model.name in cfg.tp:
        return cfg.tp[model.name]
    tp = 1
    while model.weight_bytes > 0.5 * tp * gpu.memory_bytes:
        tp *= 2
    return tp


class EngineProfile:
    """Time model of ONE rollout engine (tp GPUs) under continuous batching (see the module docstring).

    A decode step gives every running sample one token; `total_context` is the sum of the running
    samples' context lengths (prompt + tokens so far) at that step."""

    def __init__(self, model: ModelSpec, gpu: GPUSpec, cfg: ProfileConfig):
        cfg.validate()
        self.model, self.gpu, self.cfg = model, gpu, cfg
        self.tp = _tp_for(model, gpu, cfg)
        bandwidth = self.tp * gpu.hbm_bytes_per_s * cfg.mem_efficiency
        decode_flops = self.tp * gpu.peak_flops * cfg.compute_mfu_decode
        # Every step: fixed overhead, plus two all-reduces per layer (after attention and after the
        # MLP) when the engine is tensor-parallel.
        self.overhead_s = cfg.step_overhead_s + (2 * model.layers * cfg.tp_allreduce_s if self.tp > 1 else 0.0)
        # Step time = overhead + max(mem0 + mem1 * C, comp_per_sample * batch + comp1 * C), C = total context.
        self._mem0 = model.matmul_weight_bytes / bandwidth
        self._mem1 = model.kv_bytes_per_token() / bandwidth
        self._comp_per_sample = 2.0 * model.matmul_params / decode_flops
        self._comp1 = model.attention_flops_per_context / decode_flops
        self._weight_read_s = model.matmul_weight_bytes / bandwidth
        self._prefill_flops = self.tp * gpu.peak_flops * cfg.prefill_mfu

    @property
    def kv_capacity_tokens(self) -> float:
        """Tokens of context the engine's KV cache holds: kv_memory_fraction of the memory of its tp
        GPUs left after the weights (0 when the weights do not fit)."""
        free = self.tp * self.gpu.memory_bytes - self.model.weight_bytes
        return max(free, 0.0) * self.cfg.kv_memory_fraction / self.model.kv_bytes_per_token()

    def step_s(self, batch: int, total_context: float) -> float:
        """Seconds of one decode step of `batch` running samples whose contexts sum to `total_context`."""
        if batch < 1:
            raise ValueError(f"a decode step needs batch >= 1, got {batch}")
        memory = self._mem0 + self._mem1 * total_context
        compute = self._comp_per_sample * batch + self._comp1 * total_context
        return self.overhead_s + max(memory, compute)

    def verify_step_s(self, batch: int, total_context: float, draft_tokens: float) -> float:
        """Seconds of one speculative verify step: a forward over the last token and a draft of
        `draft_tokens` tokens of each of `batch` samples. It reads the weights and the running contexts'
        KV once, as a decode step does, and does draft_tokens + 1 times its compute (each token of the
        draft passes the matmuls and attends to its sample's context). So it costs about one decode
        step while the step is memory-bound and up to draft_tokens + 1 of them once compute-bound."""
        if batch < 1:
            raise ValueError(f"a verify step needs batch >= 1, got {batch}")
        (mem_a, mem_s), (comp_a, comp_s) = self.roofline(batch, draft_tokens)
        return self.overhead_s + max(mem_a + mem_s * total_context, comp_a + comp_s * total_context)

    def roofline(self, batch: int, draft_tokens: float = 0.0) -> tuple[tuple[float, float], tuple[float, float]]:
        """The two lines of a step's busy time in its total context C, as (intercept, slope): memory
        time and compute time; the step takes overhead_s + the larger at C. `draft_tokens` > 0: a
        verify step's (`verify_step_s`), whose compute is draft_tokens + 1 times a decode step's."""
        width = 1.0 + draft_tokens
        return ((self._mem0, self._mem1),
                (width * self._comp_per_sample * batch, width * self._comp1))

    def advance_s(self, batch: int, total_context: float, steps: int) -> float:
        """Seconds of `steps` consecutive decode steps at a constant `batch`, starting from
        `total_context`, which grows by `batch` tokens per step. Closed form: equal to
        sum(step_s(batch, total_context + k * batch) for k in range(steps))."""
        if steps <= 0:
            return 0.0
        if batch < 1:
            raise ValueError(f"decode steps need batch >= 1, got {batch}")
        c0, b, n = float(total_context), float(batch), steps
        mem_a, mem_s = self._mem0, self._mem1
        comp_a, comp_s = self._comp_per_sample * batch, self._comp1
        # Memory-bound at step k iff d0 + d1 * k >= 0. Two lines cross at most once, so the steps
        # split into one compute-bound run and one memory-bound run; sum each run as an arithmetic series.
        d0 = (mem_a - comp_a) + (mem_s - comp_s) * c0
        d1 = (mem_s - comp_s) * b
        if d1 == 0.0:
            split, memory_first = (n if d0 >= 0 else 0), True
        else:
            # Clamp in floats first: the crossover can lie astronomically far away.
            cross = min(max(-d0 / d1, -1.0), n + 1.0)
            if d1 > 0:  # compute-bound up to the crossover, memory-bound after it
                split, memory_first = min(max(math.ceil(cross), 0), n), False
            else:  # memory-bound up to the crossover, compute-bound after it
                split, memory_first = min(max(math.floor(cross) + 1, 0), n), True

        def run(intercept: float, slope: float, k0: int, k1: int) -> float:
            m = k1 - k0
            if m <= 0:
                return 0.0
            # sum over k in [k0, k1) of intercept + slope * (c0 + k * b)
            return m * intercept + slope * (m * c0 + b * (k0 + k1 - 1) * m / 2.0)

        if memory_first:
            busy = run(mem_a, mem_s, 0, split) + run(comp_a, comp_s, split, n)
        else:
            busy = run(comp_a, comp_s, 0, split) + run(mem_a, mem_s, split, n)
        return n * self.overhead_s + busy

    def steps_within(self, batch: int, total_context: float, seconds: float) -> int:
        """The largest k with advance_s(batch, total_context, k) <= seconds: how many decode steps
        (tokens per running sample) fit in `seconds` if the batch stays the same, e.g. how far the
        samples got before a preemption at that moment. Bisection on the closed form."""
        if not seconds >= 0:  # also catches NaN
            return 0
        first = self.step_s(batch, total_context)
        if seconds < first:
            return 0
        if math.isinf(seconds):
            raise ValueError("steps_within: seconds must be finite")
        # Step times never shrink as contexts grow, so k steps take at least k * first.
        lo, hi = 1, int(seconds // first) + 1
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.advance_s(batch, total_context, mid) <= seconds:
                lo = mid
            else:
                hi = mid
        return lo

    def prefill_s(self, tokens: int, context_before: int = 0, sequences: int = 1) -> float:
        """Seconds to prefill `tokens` new tokens split evenly over `sequences` sequences, each already
        holding `context_before` tokens of KV (0 for new prompts; a migrated sample's prompt +
        partial response is prefilled from 0). Compute-bound at prefill_mfu, plus one read of the
        weights and one step overhead. Prompts batched into one prefill share the weight read."""
        if tokens <= 0:
            return 0.0
        if sequences < 1:
            raise ValueError(f"prefill needs sequences >= 1, got {sequences}")
        per_seq = tokens / sequences
        # Causal: the i-th new token of a sequence attends to context_before + i tokens (i from 1).
        attended = tokens * context_before + sequences * per_seq * (per_seq + 1) / 2.0
        flops = 2.0 * self.model.matmul_params * tokens + self.model.attention_flops_per_context * attended
        return self.overhead_s + self._weight_read_s + flops / self._prefill_flops

    def max_batch(self, context_per_sample: float) -> int:
        """How many samples of `context_per_sample` tokens of context fit in the KV cache, capped at
        `max_num_seqs`; 0 when not even one fits."""
        capacity = self.kv_capacity_tokens
        if capacity <= 0:
            return 0
        if context_per_sample <= 0:
            return self.cfg.max_num_seqs
        return min(int(capacity // context_per_sample), self.cfg.max_num_seqs)

    def tokens_per_s(self, batch: int, context: float) -> float:
        """Decode tokens/s of the engine with `batch` samples at `context` tokens each (for tables)."""
        return batch / self.step_s(batch, batch * context)


class TrainProfile:
    """Time model of FSDP training and of weight transfers for one model."""

    def __init__(self, model: ModelSpec, gpu: GPUSpec, cfg: ProfileConfig):
        cfg.validate()
        self.model, self.gpu, self.cfg = model, gpu, cfg

    def train_s(self, tokens: float, gpus: int, context: float = 0.0) -> float:
        """Seconds to train on `tokens` tokens (prompts + responses) with `gpus` GPUs:
        tokens x train_flops_factor x flops_per_token(context) / (gpus x peak x train_mfu), where
        `context` is the mean number of earlier tokens a trained token attends to (for causal
        sequences of lengths S: sum S(S-1)/2 / sum S; 0 leaves attention out)."""
        if gpus < 1:
            raise ValueError(f"training needs gpus >= 1, got {gpus}")
        if tokens <= 0:
            return 0.0
        flops = tokens * self.cfg.train_flops_factor * self.model.flops_per_token(context)
        return flops / (gpus * self.gpu.peak_flops * self.cfg.train_mfu)

    def sequences_s(self, sequences: list[int] | tuple[int, ...], gpus: int) -> float:
        """Seconds to train on causal sequences of these lengths (prompt + response each): `train_s` of
        their tokens with the mean attention context of a trained token. The one formula the
        simulator, the veRL baseline and the emulation time a step's (or a group's) training with."""
        tokens = sum(sequences)
        context = sum(s * (s - 1) / 2.0 for s in sequences) / tokens
        return self.train_s(tokens, gpus, context)

    def weight_sync_s(self, gbps: float, dtype: str = "bfloat16") -> float:
        """Seconds to move the weights once, in `dtype` (specs.WIRE_DTYPES), over a `gbps` Gbit/s link:
        bytes / bandwidth, the floor (no latency, no protocol overhead)."""
        if not gbps > 0:
            raise ValueError(f"weight_sync_s needs gbps > 0, got {gbps}")
        return self.model.weight_bytes_in(dtype) * 8.0 / (gbps * 1e9)


def make_profiles(model: str, cfg: ProfileConfig | None = None,
                  gpu: GPUSpec = H100) -> tuple[EngineProfile, TrainProfile]:
    """The engine and training profiles of a model named in MODELS."""
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; valid: {', '.join(sorted(MODELS))}")
    cfg = cfg if cfg is not None else ProfileConfig()
    spec = MODELS[model]
    return EngineProfile(spec, gpu, cfg), TrainProfile(spec, gpu, cfg)


__all__ = ["EngineProfile", "ProfileConfig", "TrainProfile", "make_profiles"]
