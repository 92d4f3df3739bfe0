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
transfers. `colocated_step` composes them into one veRL step (rollout, then training, on the same
node): the calibration anchor. The defaults of `ProfileConfig` are calibrated so that veRL on
Qwen3-8B on one 8xH100 node makes about 10,000 tokens/s (the RLBoost artifact's ~1,300 per GPU); see
docs/simulator.md for every constant, its source and the fit. Pure: no clock, no torch, no Ray.

`python -m rlboost.sim.profile` prints the calibration and the per-model tables of docs/simulator.md.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field, fields, replace

from rlboost.sim.workload import Workload, WorkloadConfig

_PREFIX = "sim.profile"
BF16_BYTES = 2


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

    @property
    def weight_bytes(self) -> float:
        """All weights in bf16: what must fit in GPU memory and what a weight transfer moves."""
        return self.params * BF16_BYTES

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
    """Weight-transfer bandwidth to or within the reserved cluster, Gbit/s (a 200 Gb/s NIC)."""
    spot_gbps: float = 50.0
    """Weight-transfer bandwidth to one spot instance, Gbit/s (cloud VM network of a 2-GPU instance)."""
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
        for name in ("reserved_gbps", "spot_gbps", "train_flops_factor"):
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

    def weight_sync_s(self, gbps: float) -> float:
        """Seconds to move the bf16 weights once over a `gbps` Gbit/s link (bandwidth floor, no latency)."""
        if not gbps > 0:
            raise ValueError(f"weight_sync_s needs gbps > 0, got {gbps}")
        return self.model.weight_bytes * 8.0 / (gbps * 1e9)


def make_profiles(model: str, cfg: ProfileConfig | None = None,
                  gpu: GPUSpec = H100) -> tuple[EngineProfile, TrainProfile]:
    """The engine and training profiles of a model named in MODELS."""
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; valid: {', '.join(sorted(MODELS))}")
    cfg = cfg if cfg is not None else ProfileConfig()
    spec = MODELS[model]
    return EngineProfile(spec, gpu, cfg), TrainProfile(spec, gpu, cfg)


@dataclass(frozen=True)
class EngineRollout:
    """What one engine's rollout of a fixed set of samples took."""

    seconds: float
    """From the first prefill to the last token."""
    preemptions: int
    """Samples evicted because the KV cache was full (each re-prefills its context when resumed)."""
    max_running: int
    """The largest batch the engine ran."""


KV_WATERMARK = 0.01
"""Fraction of the KV cache that admission leaves free (vLLM v0's block-manager watermark): headroom
for the running samples to grow, so that a new sample is not evicted right after its prefill."""


class EngineState:
    """One engine's continuous batching through time: the state behind `engine_rollout` and behind
    every engine of the simulator (rlboost.sim.cluster). Samples are identified by caller-chosen
    hashable keys.

    The rules are vLLM's scheduler, as `engine_rollout` documents them:
    - Admission happens at admission points: at a `submit` to an idle engine, whenever samples
      finish, after an eviction, and at the first step boundary after a `submit` to (or an `abort`
      on) a busy engine. Waiting samples start in order while the batch is below max_num_seqs and
      their context fits in the KV cache with `KV_WATERMARK` spare. New samples admitted together
      share one batched prefill; a sample that already holds tokens (evicted, or migrated from
      another engine) re-prefills its prompt + tokens on its own. Prefill stalls decoding.
    - Decode: every running sample gains one token per step.
    - KV full: the most recently started sample is evicted to the front of the queue, keeping its
      tokens.
    Between two events (a completion, a full cache, an admission point) the batch is constant, so
    the decode in between is one `advance_s`; an interruption inside such a stretch is located with
    `steps_within`. Never one Python iteration per token.

    Time: `clock` is the engine's position, the end of its last complete decode step (or of its last
    prefill; for an idle engine, when it last did something). A decode step in progress at an
    `advance_to(t)` is not counted: its tokens do not exist yet, so an `abort` at t returns the
    tokens of the complete steps only.
    """

    def __init__(self, engine: EngineProfile, prompt_len: int, start_s: float = 0.0,
                 on_decode: Callable[[int, int, float], None] | None = None):
        self.engine = engine
        self.prompt_len = prompt_len
        self.capacity = engine.kv_capacity_tokens
        self._admit_limit = (1.0 - KV_WATERMARK) * self.capacity
        self._max_seqs = engine.cfg.max_num_seqs
        self.on_decode = on_decode
        """Called as on_decode(batch, steps, seconds) for every stretch of decode steps."""
        self.clock = float(start_s)
        self.step = 0
        """Decode steps done since the engine started (every running sample gained one token each)."""
        self.preemptions = 0
        """Samples evicted because the KV cache was full."""
        self.max_running = 0
        """The largest batch run so far."""
        self.tokens_generated = 0
        """Decode tokens made so far (sum over the stretches of batch x steps)."""
        self._waiting: deque[tuple[Hashable, int, int]] = deque()  # (key, length, tokens already made)
        self._live: dict[int, tuple[Hashable, int, int, int]] = {}  # id -> (key, length, made before, start step)
        self._id_of: dict[Hashable, int] = {}  # key of a live sample -> its admission id
        self._finishes: list[tuple[int, int]] = []  # heap of (finish step, id); entries of gone ids are stale
        self._started: list[int] = []  # ids in start order, to evict the newest; stale ids skipped
        self._next_id = 0
        # Total context of the running samples = offset + len(live) * step, with each sample
        # contributing prompt_len + made_before - start_step to the offset.
        self._offset = 0
        self._admit_due = False  # waiting samples may start at the next step boundary

    # ---- queries -----------------------------------------------------------------------------------

    @property
    def running(self) -> int:
        """Samples in the batch (holding KV)."""
        return len(self._live)

    @property
    def waiting(self) -> int:
        """Samples queued in the engine (not started, or evicted)."""
        return len(self._waiting)

    @property
    def busy(self) -> bool:
        return bool(self._live or self._waiting)

    def progress(self) -> dict[Hashable, int]:
        """key -> tokens made so far (as of `clock`), for every sample the engine holds."""
        made = {key: m for key, _, m in self._waiting}
        for key, _, before, start in self._live.values():
            made[key] = before + self.step - start
        return made

    def next_event_s(self) -> float:
        """When the engine's state next changes on its own (a completion, a full cache or an
        admission point); inf when it has nothing running."""
        if not self._live:
            return math.inf
        batch = len(self._live)
        total = self._offset + batch * self.step
        return self.clock + self.engine.advance_s(batch, total, self._steps_to_event(batch, total))

    # ---- changes -----------------------------------------------------------------------------------

    def submit(self, items: Sequence[tuple[Hashable, int, int]], now_s: float) -> None:
        """Queue samples (key, response length, tokens already made) at time `now_s`. An idle engine
        admits at once; a busy one at its next step boundary."""
        for key, length, made in items:
            if not 0 <= made < length:
                raise ValueError(f"sample {key!r}: tokens made ({made}) must be in [0, length={length})")
            if self.prompt_len + length > self.capacity:
                raise ValueError(f"{self.engine.model.name} at tp={self.engine.tp}: a sample of "
                                 f"{self.prompt_len + length} tokens does not fit in the KV cache "
                                 f"({self.capacity:.0f} tokens)")
        self._waiting.extend(items)
        if not self._live:
            self.clock = max(self.clock, now_s)
            self._settle()
        elif self._waiting:
            self._admit_due = True

    def advance_to(self, t_s: float) -> list[Hashable]:
        """Run the engine up to time `t_s`; returns the keys of the samples that finished (in order)."""
        finished: list[Hashable] = []
        advance_s = self.engine.advance_s
        while self._live:
            batch = len(self._live)
            total = self._offset + batch * self.step
            steps = self._steps_to_event(batch, total)
            seconds = advance_s(batch, total, steps)
            if self.clock + seconds > t_s:
                # Interrupted inside the stretch: only the complete steps count.
                part = min(self.engine.steps_within(batch, total, t_s - self.clock), steps - 1)
                if part > 0:
                    self._decode(batch, part, advance_s(batch, total, part))
                break
            self._decode(batch, steps, seconds)
            while self._finishes and self._finishes[0][0] == self.step:
                _, done = heapq.heappop(self._finishes)
                if done in self._live:
                    key, _, before, start = self._live.pop(done)
                    del self._id_of[key]
                    self._offset -= self.prompt_len + before - start
                    finished.append(key)
            self._admit_due = False
            self._settle()
        return finished

    def abort(self, keys: Iterable[Hashable], now_s: float) -> dict[Hashable, int]:
        """Take samples out of the engine (the caller has advanced it to `now_s`): key -> tokens
        made. Keys the engine does not hold are ignored. Freed KV lets waiting samples start at the
        next admission point."""
        keys = set(keys)
        made: dict[Hashable, int] = {}
        for key in keys & self._id_of.keys():
            sid = self._id_of.pop(key)
            _, _, before, start = self._live.pop(sid)
            self._offset -= self.prompt_len + before - start
            made[key] = before + self.step - start
        if len(made) < len(keys):
            kept: deque[tuple[Hashable, int, int]] = deque()
            for item in self._waiting:
                if item[0] in keys:
                    made[item[0]] = item[2]
                else:
                    kept.append(item)
            self._waiting = kept
        if self._waiting:
            if self._live:
                self._admit_due = True
            else:
                self.clock = max(self.clock, now_s)
                self._settle()
        return made

    # ---- internals ---------------------------------------------------------------------------------

    def _steps_to_event(self, batch: int, total: int) -> int:
        while self._finishes[0][1] not in self._live:
            heapq.heappop(self._finishes)
        room = int((self.capacity - total) // batch)  # steps until the KV cache is full
        steps = min(self._finishes[0][0] - self.step, room)
        return 1 if self._admit_due and steps > 1 else steps

    def _decode(self, batch: int, steps: int, seconds: float) -> None:
        self.clock += seconds
        self.step += steps
        self.tokens_generated += batch * steps
        if self.on_decode is not None:
            self.on_decode(batch, steps, seconds)

    def _settle(self) -> None:
        """An admission point: admit what fits, then evict while the cache is full."""
        cfg_max, prompt_len = self._max_seqs, self.prompt_len
        while True:
            new_prompts, total = 0, self._offset + len(self._live) * self.step
            while self._waiting and len(self._live) < cfg_max:
                key, length, made = self._waiting[0]
                context = prompt_len + made
                # The KV must also take one more token of every running sample in the next step.
                if self._live and total + context + len(self._live) + 1 > self._admit_limit:
                    break
                self._waiting.popleft()
                sid = self._next_id
                self._next_id += 1
                self._live[sid] = (key, length, made, self.step)
                self._id_of[key] = sid
                heapq.heappush(self._finishes, (self.step + length - made, sid))
                self._started.append(sid)
                self._offset += context - self.step
                total += context
                if made:  # a resumed sample recomputes its own prompt + partial response
                    self.clock += self.engine.prefill_s(context)
                else:
                    new_prompts += 1
            if new_prompts:
                self.clock += self.engine.prefill_s(new_prompts * prompt_len, sequences=new_prompts)
            if not self._live:
                return
            self.max_running = max(self.max_running, len(self._live))
            total = self._offset + len(self._live) * self.step
            if (self.capacity - total) // len(self._live) >= 1:
                return
            # Full: evict the newest sample; it keeps its tokens and resumes from the front of the queue.
            while self._started[-1] not in self._live:
                self._started.pop()
            victim = self._started.pop()
            key, length, before, start = self._live.pop(victim)
            del self._id_of[key]
            self._offset -= prompt_len + before - start
            self._waiting.appendleft((key, length, before + self.step - start))
            self.preemptions += 1


def engine_rollout(engine: EngineProfile, lengths: Sequence[int], prompt_len: int) -> EngineRollout:
    """One engine generating responses of `lengths` tokens, all submitted at once, under vLLM-style
    continuous batching with a KV-cache budget.

    - Admission, in the given order, at the start and whenever samples finish: a sample starts if
      the batch is below max_num_seqs and its context fits in the KV cache with `KV_WATERMARK`
      spare. Samples that start together share one batched prefill, which stalls decoding.
    - Decode: every running sample gains one token per step; its context is prompt + tokens so far.
    - KV full: the most recently started sample is evicted to the front of the queue (vLLM's
      recompute preemption) and, when it restarts, re-prefills its prompt + partial response.
    Between two events (a completion or a full cache) the batch is constant, so the decode in
    between is one `advance_s`. The rules live in `EngineState`, which the simulator's engines share."""
    if not lengths:
        return EngineRollout(0.0, 0, 0)
    if min(lengths) < 1:
        raise ValueError("every response length must be >= 1")
    state = EngineState(engine, prompt_len)
    state.submit([(i, length, 0) for i, length in enumerate(lengths)], 0.0)
    while state.running:
        state.advance_to(state.next_event_s())
    return EngineRollout(state.clock, state.preemptions, state.max_running)


DISPATCHES = ("chunked", "round_robin")


def colocated_step(engine: EngineProfile, train: TrainProfile, lengths: Sequence[int], prompt_len: int,
                   engines: int, gpus: int, dispatch: str = "chunked") -> dict:
    """One veRL step on one node: rollout on `engines` engines, then training on the same `gpus` GPUs.

    `dispatch` says which samples each engine gets. "chunked" (veRL's synchronous SPMD rollout, what
    the RLBoost artifact's baseline runs): the batch, a prompt's samples next to each other, is cut
    into `engines` contiguous chunks, so one engine decodes every sample of its prompts (the last
    engine takes any remainder). "round_robin": sample i goes to engine i mod engines. Each engine
    decodes its share (`engine_rollout`); the rollout ends with the slowest engine. Training then covers every
    prompt and response token, with attention at the sequences' mean causal context. Returns
    rollout_s, train_s, step_s, tokens (generated), tokens_per_s (generated tokens per second of the
    whole step, all GPUs together) and preemptions (KV-full evictions, summed over the engines)."""
    if engines < 1 or gpus < 1:
        raise ValueError(f"colocated_step needs engines >= 1 and gpus >= 1, got {engines} and {gpus}")
    if not lengths:
        raise ValueError("colocated_step needs at least one response")
    if dispatch not in DISPATCHES:
        raise ValueError(f"colocated_step: dispatch={dispatch!r}; valid: {', '.join(DISPATCHES)}")
    lengths = list(lengths)
    if dispatch == "round_robin":
        shares = [lengths[e::engines] for e in range(engines)]
    else:
        size = len(lengths) // engines
        shares = [lengths[e * size:(e + 1) * size if e < engines - 1 else len(lengths)] for e in range(engines)]
    rollouts = [engine_rollout(engine, share, prompt_len) for share in shares if share]
    rollout_s = max(r.seconds for r in rollouts)
    preemptions = sum(r.preemptions for r in rollouts)
    sequences = [prompt_len + length for length in lengths]
    trained = sum(sequences)
    context = sum(s * (s - 1) / 2.0 for s in sequences) / trained
    train_s = train.train_s(trained, gpus, context)
    tokens = sum(lengths)
    step_s = rollout_s + train_s
    return {"rollout_s": rollout_s, "train_s": train_s, "step_s": step_s, "tokens": tokens,
            "tokens_per_s": tokens / step_s, "preemptions": preemptions}


def colocated_run(model: str, workload: WorkloadConfig | None = None, cfg: ProfileConfig | None = None,
                  steps: int = 32, gpus: int = 8, gpu: GPUSpec = H100) -> dict:
    """veRL on one node of `gpus` GPUs for steps 0..steps-1 of a workload (default: the paper's; 32
    steps = one epoch of its 4096 prompts, so every prompt counts once).

    Returns the per-step means of rollout_s, train_s, step_s and preemptions, tokens_per_s (all
    generated tokens over all the time: the anchor's definition), tokens_per_gpu_s, and the engine
    layout (tp, engines)."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    engine, train = make_profiles(model, cfg, gpu)
    engines = gpus // engine.tp
    if engines < 1:
        raise ValueError(f"{model} needs tp={engine.tp} GPUs per engine, the node has {gpus}")
    work = Workload(workload if workload is not None else WorkloadConfig())
    totals = {"rollout_s": 0.0, "train_s": 0.0, "step_s": 0.0, "tokens": 0, "preemptions": 0}
    for s in range(steps):
        lengths = [length for group in work.step(s) for length in group]
        result = colocated_step(engine, train, lengths, work.cfg.prompt_len, engines, gpus)
        for key in totals:
            totals[key] += result[key]
    tokens_per_s = totals["tokens"] / totals["step_s"]
    return {"rollout_s": totals["rollout_s"] / steps, "train_s": totals["train_s"] / steps,
            "step_s": totals["step_s"] / steps, "preemptions": totals["preemptions"] / steps,
            "tokens_per_s": tokens_per_s, "tokens_per_gpu_s": tokens_per_s / gpus,
            "tp": engine.tp, "engines": engines}


CALIBRATION_TARGET = 10_000.0
"""veRL, Qwen3-8B, one 8xH100 node: generated tokens/s over whole steps (RLBoost artifact, ~1,300/GPU)."""


def model_table(cfg: ProfileConfig | None = None, steps: int = 32) -> str:
    """The markdown table of docs/simulator.md: veRL on one 8xH100 node and one engine's decode speed."""
    cfg = cfg if cfg is not None else ProfileConfig()
    lines = ["| model | params | tp | engines/node | rollout_s | train_s | tokens/s per node | tokens/s per GPU "
             "| KV evictions/step | engine decode tokens/s at 4K context: batch 1 / 64 / 256 |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name in MODELS:
        run = colocated_run(name, cfg=cfg, steps=steps)
        engine, _ = make_profiles(name, cfg)
        decode = []
        for batch in (1, 64, 256):
            mark = "*" if batch * 4096 > engine.kv_capacity_tokens else ""
            decode.append(f"{engine.tokens_per_s(batch, 4096):,.0f}{mark}")
        lines.append(f"| {name} | {engine.model.params / 1e9:.2f}B | {run['tp']} | {run['engines']} "
                     f"| {run['rollout_s']:.0f} | {run['train_s']:.0f} | {run['tokens_per_s']:,.0f} "
                     f"| {run['tokens_per_gpu_s']:,.0f} | {run['preemptions']:.0f} | {' / '.join(decode)} |")
    return "\n".join(lines)


def config_table(cfg: ProfileConfig | None = None) -> str:
    """The constants in use, as a markdown table."""
    cfg = cfg if cfg is not None else ProfileConfig()
    lines = ["| field | value |", "|---|---|"]
    lines += [f"| `{f.name}` | {getattr(cfg, f.name)} |" for f in fields(cfg)]
    return "\n".join(lines)


def calibration_table(cfg: ProfileConfig | None = None,
                      efficiencies: Sequence[float] = (0.6, 0.65, 0.7, 0.75, 0.8)) -> str:
    """veRL Qwen3-8B tokens/s per node against the fitted factor, mem_efficiency, as a markdown table."""
    cfg = cfg if cfg is not None else ProfileConfig()
    lines = ["| mem_efficiency | rollout_s | train_s | tokens/s per node | vs target |", "|---|---|---|---|---|"]
    for eff in efficiencies:
        run = colocated_run("qwen3-8b", cfg=replace(cfg, mem_efficiency=eff))
        lines.append(f"| {eff:g}{' (default)' if eff == cfg.mem_efficiency else ''} | {run['rollout_s']:.0f} "
                     f"| {run['train_s']:.0f} | {run['tokens_per_s']:,.0f} "
                     f"| {run['tokens_per_s'] / CALIBRATION_TARGET - 1:+.1%} |")
    return "\n".join(lines)


def fit_mem_efficiency(cfg: ProfileConfig | None = None, target: float = CALIBRATION_TARGET,
                       steps: int = 32, tolerance: float = 1e-3) -> float:
    """The mem_efficiency at which veRL Qwen3-8B on one 8xH100 node makes `target` tokens/s, the other
    factors as in `cfg` (bisection: throughput only grows with bandwidth). Raises ValueError when no
    efficiency in (0, 1] reaches the target."""
    cfg = cfg if cfg is not None else ProfileConfig()

    def throughput(eff: float) -> float:
        return colocated_run("qwen3-8b", cfg=replace(cfg, mem_efficiency=eff), steps=steps)["tokens_per_s"]

    lo, hi = 0.05, 1.0
    if throughput(hi) < target or throughput(lo) > target:
        raise ValueError(f"no mem_efficiency in [{lo}, {hi}] gives {target:,.0f} tokens/s with these factors")
    while hi - lo > tolerance:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if throughput(mid) < target else (lo, mid)
    return (lo + hi) / 2


def factor_table(cfg: ProfileConfig | None = None) -> str:
    """How the calibration leans on each fixed factor: veRL Qwen3-8B tokens/s with that factor moved
    (mem_efficiency kept), and the mem_efficiency the fit would then need."""
    cfg = cfg if cfg is not None else ProfileConfig()
    moves = [("train_mfu", 0.25), ("train_mfu", 0.45), ("compute_mfu_decode", 0.3), ("compute_mfu_decode", 0.6),
             ("step_overhead_s", 0.002), ("step_overhead_s", 0.005), ("kv_memory_fraction", 0.5),
             ("kv_memory_fraction", 0.9), ("prefill_mfu", 0.3), ("train_flops_factor", 6.0)]
    lines = ["| factor moved | tokens/s per node (mem_efficiency kept) | refitted mem_efficiency |", "|---|---|---|"]
    for name, value in moves:
        moved = replace(cfg, **{name: value})
        run = colocated_run("qwen3-8b", cfg=moved)
        try:
            refit = f"{fit_mem_efficiency(moved, tolerance=0.005):.2f}"
        except ValueError:
            refit = "none in (0, 1]"
        lines.append(f"| `{name}` {getattr(cfg, name):g} -> {value:g} | {run['tokens_per_s']:,.0f} "
                     f"| {refit} |")
    return "\n".join(lines)


def main() -> None:
    cfg = ProfileConfig()
    run = colocated_run("qwen3-8b", cfg=cfg)
    print(f"Calibration: veRL qwen3-8b on 8xH100, one epoch (32 steps) of the default workload: "
          f"{run['tokens_per_s']:,.0f} tokens/s (target {CALIBRATION_TARGET:,.0f}, "
          f"{run['tokens_per_s'] / CALIBRATION_TARGET - 1:+.1%})\n")
    print(f"Fitted mem_efficiency (exact): {fit_mem_efficiency(cfg):.3f}\n")
    print(calibration_table(cfg))
    print()
    print(factor_table(cfg))
    print()
    print(model_table(cfg))
    print("\n\\* the batch's KV cache (batch x 4K tokens) would not fit in the engine's memory\n")
    print(config_table(cfg))


__all__ = ["BF16_BYTES", "CALIBRATION_TARGET", "H100", "KV_WATERMARK", "MODELS", "EngineProfile", "EngineRollout",
           "EngineState", "GPUSpec", "ModelSpec", "ProfileConfig", "TrainProfile", "calibration_table", "colocated_run",
           "colocated_step", "config_table", "engine_rollout", "factor_table", "fit_mem_efficiency",
           "make_profiles", "model_table"]


if __name__ == "__main__":
    main()
