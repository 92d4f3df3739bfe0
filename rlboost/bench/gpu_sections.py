"""The measurements of `make gpu-check` (`rlboost.bench.gpu_check` runs them in order, writes the JSON and
prints the summary): the model shapes, the check's config, and one function per section, each measuring a
figure beside its baseline in the same run. Needs only torch and transformers (zstandard for `patch_row`).
JSON keys: docs/engine.md, "The GPU check"."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import torch

from rlboost.bench import hardware
from rlboost.bench.engine import timed_decode, timed_hf_generate
from rlboost.engine import EngineConfig, LLMEngine, SamplingParams
from rlboost.models.tiny import tiny_config

SHAPES: dict[str, tuple[str, dict]] = {
    "tiny": ("llama", dict(vocab_size=256)),
    "smollm2-135m": ("llama", dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                   num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True,
                                   max_position_embeddings=8192, initializer_range=0.02)),
    "qwen2.5-0.5b": ("qwen2", dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                   num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                                   initializer_range=0.02)),
    "qwen2.5-1.5b": ("qwen2", dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                                   num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=32768,
                                   initializer_range=0.02)),
}
"""name -> (family, transformers config fields): the real models' shapes (SmolLM2-135M-Instruct, Qwen2.5-0.5B
and -1.5B) at transformers' initialisation scale, and `tiny` for the CPU test (the test models' sharper
initialisation: greedy decoding without near-ties, so the engine's tokens must equal HF's)."""


@dataclass
class GpuCheckConfig:
    device: str = "auto"
    """cuda, cpu or auto (CUDA when available)."""
    dtype: str = "bfloat16"
    """The weights' dtype (the engines serve bf16 on GPUs)."""
    shapes: list[str] = field(default_factory=lambda: ["smollm2-135m", "qwen2.5-0.5b", "qwen2.5-1.5b"])
    """Model shapes (`SHAPES`), measured in this order."""
    decode_batches: list[int] = field(default_factory=lambda: [1, 8, 32, 128])
    """Batch sizes of the decode comparison."""
    verify_batches: list[int] = field(default_factory=lambda: [1, 8, 32, 64])
    """Batch sizes of the verify-cost curve."""
    verify_positions: list[int] = field(default_factory=lambda: [1, 2, 3, 4, 6, 8, 12, 16])
    """Positions per request of a verify step (1: the last token alone, n: it and n - 1 draft tokens)."""
    prompt_len: int = 128
    """Prompt tokens per request (random ids); the verify steps run at this context."""
    new_tokens: int = 64
    """Tokens decoded per request in the decode comparison."""
    hf_baseline: bool = True
    """Time HF generate beside the engine."""
    repeats: int = 3
    """Rounds of the decode comparison (engine and HF take turns), after a full-length warm-up; medians reported."""
    timing_iters: int = 10
    """Forward passes timed per verify point (median reported), after one warm-up."""
    train_batch: int = 8
    """Sequences per trainer step."""
    train_response_len: int = 384
    """Response tokens per sequence of the trainer step (after a `prompt_len` prompt)."""
    patch_bucket_mb: float = 64.0
    """Bytes of weights the patch figures encode and apply (at most the model's)."""
    budget_s: float = 420.0
    """No measurement starts after this many seconds; what is left out is named in `skipped`."""
    seed: int = 0


class BudgetClock:
    """The check's budget: `allows(what)` until `budget_s` is spent, then names each measurement left out."""

    def __init__(self, budget_s: float):
        self.start, self.budget_s = time.perf_counter(), budget_s
        self.skipped: list[str] = []

    def allows(self, what: str) -> bool:
        if time.perf_counter() - self.start < self.budget_s:
            return True
        self.skipped.append(f"{what}: the check's budget of {self.budget_s:g} s was spent (gpu_check.budget_s)")
        return False


def random_model(shape: str, dtype: torch.dtype, device: torch.device, seed: int = 0):
    """A transformers causal LM at `shape`'s real dimensions, random weights drawn on `device`."""
    from transformers import AutoModelForCausalLM

    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; choose from {', '.join(SHAPES)}")
    family, fields = SHAPES[shape]
    config = tiny_config(family, **fields)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


def _median_time(fn, device: torch.device, iters: int) -> float:
    return statistics.median(hardware.timings(fn, device, iters))


def _weight_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())  # tied weights once


def _kv_bytes_per_token(config, element_size: int) -> int:
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * element_size


def decode_rows(cfg: GpuCheckConfig, shape: str, device: torch.device, dtype: torch.dtype, bandwidth: float,
                clock: BudgetClock) -> list[dict]:
    """Engine and HF decode tokens/s per batch, and the bandwidth roofline at the mean context."""
    rows = []
    model = random_model(shape, dtype, device, cfg.seed)
    weight_bytes, kv_per_token = _weight_bytes(model), _kv_bytes_per_token(model.config, dtype.itemsize)
    vocab = model.config.vocab_size
    hf = random_model(shape, dtype, device, cfg.seed) if cfg.hf_baseline else None
    engine = LLMEngine(model, EngineConfig(device=str(device), max_num_seqs=max(cfg.decode_batches),
                                           max_model_len=cfg.prompt_len + cfg.new_tokens + 8,
                                           max_num_batched_tokens=max(cfg.decode_batches) * cfg.prompt_len))
    g = torch.Generator().manual_seed(cfg.seed)
    for batch in cfg.decode_batches:
        if not clock.allows(f"{shape} decode at batch {batch}"):
            break
        prompts = torch.randint(3, vocab, (batch, cfg.prompt_len), generator=g).tolist()
        params = SamplingParams(temperature=0, max_tokens=cfg.new_tokens, ignore_eos=True)
        # Warm-up at this batch over the whole length: the first pass through each context length pays the
        # allocator's and the kernels' first-call costs (3-5x a GPU decode's time when warmed on 2 tokens).
        timed_decode(engine, prompts, params, lambda e: e.num_waiting == 0)
        ids = torch.tensor(prompts, device=device)
        if hf is not None:
            timed_hf_generate(hf, ids, cfg.new_tokens)
        engine_s, hf_s, same = [], [], None
        for _ in range(cfg.repeats):
            out, _, decode_s = timed_decode(engine, prompts, params, lambda e: e.num_waiting == 0)
            engine_s.append(decode_s)
            if hf is not None:
                _, prefill_s = timed_hf_generate(hf, ids, 1)
                hf_out, total_s = timed_hf_generate(hf, ids, cfg.new_tokens)
                hf_s.append(total_s - prefill_s)  # <= 0 only where decoding is lost in the noise
                same = sum(a == b for a, b in zip(out, hf_out[:, cfg.prompt_len:].tolist())) / batch
        if hf is not None:
            row_gap = greedy_gap(hf, prompts, out, device)
        tokens = batch * (cfg.new_tokens - 1)  # each request's first token comes from its prefill
        step_bytes = weight_bytes + batch * (cfg.prompt_len + cfg.new_tokens / 2) * kv_per_token
        row = {"batch": batch, "engine_tokens_per_s": tokens / statistics.median(engine_s),
               "roofline_tokens_per_s": batch * bandwidth / step_bytes, "engine_decode_s": engine_s}
        row["engine_vs_roofline"] = row["engine_tokens_per_s"] / row["roofline_tokens_per_s"]
        if hf is not None:
            hf_decode_s = statistics.median(hf_s)
            row.update(hf_tokens_per_s=tokens / hf_decode_s if hf_decode_s > 0 else None, hf_decode_s=hf_s,
                       outputs_identical_to_hf=same, **row_gap)
            if row["hf_tokens_per_s"]:
                row["engine_vs_hf"] = row["engine_tokens_per_s"] / row["hf_tokens_per_s"]
        rows.append(row)
    del engine, model, hf
    return rows


def greedy_gap(hf, prompts: list[list[int]], outputs: list[list[int]], device: torch.device) -> dict:
    """How far the engine's greedy tokens are from HF's argmax, HF teacher-forced on the engine's own output:
    per token, HF's top logit minus its logit of the engine's token (0 where they agree). Whole-sequence
    agreement is a poor test in bf16 on random weights, whose near-tied logits flip at the first rounding
    difference; a correct engine's gaps stay at the logits' rounding size (`logit_spread` gives the scale),
    a wrong one's do not."""
    ids = torch.tensor([p + o for p, o in zip(prompts, outputs)], device=device)
    start = len(prompts[0])
    with torch.inference_mode():
        logits = hf(ids[:, :-1]).logits[:, start - 1:].float()  # logits predicting each engine token
    chosen = logits.gather(-1, ids[:, start:, None]).squeeze(-1)
    gaps = logits.max(-1).values - chosen
    return {"greedy_gap_max": float(gaps.max()), "greedy_gap_mean": float(gaps.mean()),
            "greedy_agreement": float((gaps == 0).float().mean()), "logit_spread": float(logits.std(-1).mean())}


def step_profile_row(shape: str, device: torch.device, dtype: torch.dtype, seed: int, context: int = 128) -> dict:
    """Where a batch-1 decode step's time goes: the device's kernels (or, on a CPU, operators) one plain step
    launches, times the host's cost of a launch (`hardware.launch_latency`), against the step's time. A
    `launch_bound_share` near 1 says the step waits on the host, not on memory or math, which no batch size
    or smaller model mends (CUDA graphs do)."""
    from torch.profiler import ProfilerActivity, profile

    model = random_model(shape, dtype, device, seed)
    engine = LLMEngine(model, EngineConfig(device=str(device), max_num_seqs=1, max_model_len=context + 2))
    engine.cache.reserve(1, context + 2)
    ids = torch.randint(3, model.config.vocab_size, (1, 1), device=device)
    positions = torch.full((1, 1), context, device=device)
    last = torch.zeros(1, dtype=torch.long, device=device)

    def step():
        engine.runner.forward(ids, positions, last, slot_offset=0)

    step_s = _median_time(step, device, 10)
    activity = ProfilerActivity.CUDA if device.type == "cuda" else ProfilerActivity.CPU
    with profile(activities=[activity]) as prof:
        step()
        hardware._sync(device)
    events = prof.events()
    if device.type == "cuda":
        launches = sum(1 for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
    else:
        launches = sum(1 for e in events if e.name.startswith("aten::") and e.cpu_parent is None)
    latency = hardware.launch_latency(device)
    del engine, model
    return {"batch": 1, "context": context, "step_s": step_s, "launches": launches, "launch_latency_s": latency,
            "launch_bound_share": min(1.0, launches * latency / step_s)}


def verify_rows(cfg: GpuCheckConfig, shape: str, device: torch.device, dtype: torch.dtype,
                clock: BudgetClock) -> list[dict]:
    """Per batch: a plain decode step's forward and a verify step's of each n positions per request
    (`relative`: n's time over the plain step's), at a context of `prompt_len` cached tokens."""
    model = random_model(shape, dtype, device, cfg.seed)
    width = max(cfg.verify_positions)
    engine = LLMEngine(model, EngineConfig(device=str(device), max_num_seqs=max(cfg.verify_batches),
                                           max_model_len=cfg.prompt_len + width + 1))
    runner, vocab = engine.runner, model.config.vocab_size
    rows = []
    for batch in cfg.verify_batches:
        if not clock.allows(f"{shape} verify curve at batch {batch}"):
            break
        engine.cache.reserve(batch, cfg.prompt_len + width + 1)

        def step(n: int, plain: bool):
            ids = torch.randint(3, vocab, (batch, n), device=device)
            positions = (cfg.prompt_len + torch.arange(n, device=device))[None, :].expand(batch, n)
            last = torch.zeros(batch, dtype=torch.long, device=device) if plain else None
            return lambda: runner.forward(ids, positions, last, slot_offset=0)

        plain_s = _median_time(step(1, True), device, cfg.timing_iters)
        step_s = [_median_time(step(n, False), device, cfg.timing_iters) for n in cfg.verify_positions]
        rows.append({"batch": batch, "context": cfg.prompt_len, "plain_step_s": plain_s,
                     "positions": list(cfg.verify_positions), "step_s": step_s,
                     "relative": [s / plain_s for s in step_s]})
    del engine, model
    return rows


def train_row(cfg: GpuCheckConfig, shape: str, device: torch.device, dtype: torch.dtype) -> dict:
    """The trainer's forward and backward (log-probs of the responses, their mean as the loss)."""
    from rlboost.trainer.logprobs import pad_batch, response_logprobs

    model = random_model(shape, dtype, device, cfg.seed).train()
    g = torch.Generator().manual_seed(cfg.seed)
    vocab = model.config.vocab_size
    prompts = torch.randint(3, vocab, (cfg.train_batch, cfg.prompt_len), generator=g).tolist()
    responses = torch.randint(3, vocab, (cfg.train_batch, cfg.train_response_len), generator=g).tolist()
    batch = pad_batch(prompts, responses, device=device)

    def step():
        model.zero_grad(set_to_none=True)
        logprobs, _ = response_logprobs(model, batch, temperature=1.0)
        (-(logprobs * batch["response_mask"]).sum() / batch["response_mask"].sum()).backward()

    seconds = _median_time(step, device, max(2, cfg.timing_iters // 3))
    tokens = cfg.train_batch * (cfg.prompt_len + cfg.train_response_len)
    del model
    return {"batch": cfg.train_batch, "seq_len": cfg.prompt_len + cfg.train_response_len, "step_s": seconds,
            "tokens_per_s": tokens / seconds}


def weight_load_row(cfg: GpuCheckConfig, shape: str, device: torch.device, dtype: torch.dtype) -> dict:
    """A whole version loaded in place from host memory (pinned where the device is a GPU), as a worker
    loads what it pulled."""
    model = random_model(shape, dtype, device, cfg.seed)
    engine = LLMEngine(model, EngineConfig(device=str(device), max_num_seqs=1, max_model_len=64))
    state = {name: p.detach().to("cpu") for name, p in engine.model.named_parameters()}
    if device.type == "cuda":
        state = {name: t.pin_memory() for name, t in state.items()}
    version = iter(range(1, 1000))
    seconds = _median_time(lambda: engine.load_weights(state, next(version)), device, 3)
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    del engine, model
    return {"bytes": nbytes, "seconds": seconds, "bytes_per_s": nbytes / seconds}


def patch_row(cfg: GpuCheckConfig, shape: str, device: torch.device, dtype: torch.dtype) -> dict:
    """Encode and apply of one bucket of the model's weights after a small update (lr 1e-6 x noise: most
    bf16 elements keep every bit, as after an RL step)."""
    from rlboost.cluster import patches

    model = random_model(shape, dtype, device, cfg.seed)
    limit = int(cfg.patch_bucket_mb * 2**20) // dtype.itemsize
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])[:limit]
    updated = (flat.float() + 1e-6 * torch.randn_like(flat, dtype=torch.float32)).to(dtype)
    old = flat.contiguous().view(torch.uint8).cpu().numpy()
    new = updated.contiguous().view(torch.uint8).cpu().numpy()
    start = time.perf_counter()
    patch = patches.encode(old, new, dtype.itemsize)
    encode_s = time.perf_counter() - start
    buf = old.copy()
    start = time.perf_counter()
    patches.apply(buf, patch)
    apply_s = time.perf_counter() - start
    if not (buf == new).all():
        raise AssertionError("a patch applied to its base did not give the new bucket bit for bit")
    del model
    return {"bytes": old.nbytes, "patch_bytes": len(patch), "changed_share": patches.changed_share(old, new, dtype.itemsize),
            "encode_bytes_per_s": old.nbytes / encode_s, "apply_bytes_per_s": old.nbytes / apply_s}


def model_size(shape: str, dtype: torch.dtype, device: torch.device, seed: int) -> dict:
    model = random_model(shape, dtype, device, seed)
    return {"parameters": sum(p.numel() for p in model.parameters()), "weight_bytes": _weight_bytes(model)}


__all__ = ["SHAPES", "BudgetClock", "GpuCheckConfig", "decode_rows", "greedy_gap", "model_size", "patch_row", "random_model",
           "step_profile_row", "train_row", "verify_rows", "weight_load_row"]
