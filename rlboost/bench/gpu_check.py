"""`make gpu-check`: what a GPU does for rlboost, measured in one short run on a bare machine, as one JSON.

Made for a lent GPU machine that reaches no package registry (docs/engine.md, "The GPU check"): it
needs only torch, transformers, safetensors and numpy (zstandard for the patch figures, carried as
an unpacked wheel where the machine lacks it), never OmegaConf, Ray or rich, downloads nothing, and
stops starting new measurements once `budget_s` is spent (each left out is named in `skipped`).
Models are random-initialised at real shapes (`SHAPES`), so no checkpoint travels.

Each figure stands beside its baseline, measured in the same run:
- `decode`: rlboost's engine decode tokens/s per batch, against HF `generate` on the same greedy batch
  and against the bandwidth roofline (weights and the KV read per step over the measured copy bandwidth);
- `verify`: the model forward of a verify step of n positions per request relative to a plain decode
  step at the same batch and context (the curve HistoSpec's budget weighs drafts with:
  `rlboost.policies.spec_budget`);
- `train`: a forward and backward over prompt+response sequences (`response_logprobs`, the trainer's),
  tokens/s; `weight_load`: an in-place load of a whole version from host memory (`LLMEngine.load_weights`);
- `patch`: `rlboost.cluster.patches` encode and apply GB/s on a bucket of the model's own weights after a
  small update (host-side work, beside the copy bandwidth).
The same code runs on a CPU with the `tiny` shape (`tests/test_gpu_check.py`), so it cannot rot while no
GPU is at hand. JSON keys: docs/engine.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from rlboost.bench import hardware
from rlboost.bench.engine import timed_decode, timed_hf_generate
from rlboost.engine import EngineConfig, LLMEngine, SamplingParams
from rlboost.engine.engine import resolve_device
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


class _Clock:
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
                clock: _Clock) -> list[dict]:
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
                clock: _Clock) -> list[dict]:
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


def _size(shape: str, dtype: torch.dtype, device: torch.device, seed: int) -> dict:
    model = random_model(shape, dtype, device, seed)
    return {"parameters": sum(p.numel() for p in model.parameters()), "weight_bytes": _weight_bytes(model)}


def gpu_check(cfg: GpuCheckConfig, log=print, progress=None) -> dict:
    """Every figure, per shape in order; `progress(result)` after each shape (the partial result: what a run
    cut short by its lease still leaves). A section that raises is recorded in `errors` and the rest goes on."""
    import transformers

    device = resolve_device(cfg.device, key="gpu_check.device")
    dtype = getattr(torch, cfg.dtype)
    clock = _Clock(cfg.budget_s)
    bandwidth = hardware.memory_bandwidth(device)
    result: dict = {
        "device": str(device), "device_name": hardware.device_name(device), "torch": torch.__version__,
        "transformers": transformers.__version__, "python": sys.version.split()[0], "dtype": cfg.dtype,
        "copy_bytes_per_s": bandwidth, "matmul_flops": hardware.matmul_flops(device, dtype),
        "config": asdict(cfg), "shapes": [], "patch": None,
    }
    errors: list[dict] = []

    def measured(what: str, fn):
        """fn()'s figure, or None with the failure recorded: one broken section (the first CUDA run of a
        path) must not cost the figures of the others, on a lease that may not come again."""
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - recorded in the JSON and printed, then the next section
            errors.append({"what": what, "error": f"{type(e).__name__}: {e}",
                           "traceback": traceback.format_exc(limit=-8)})
            log(f"{what}: FAILED {type(e).__name__}: {e}")
            traceback.print_exc()
            return None
        finally:
            if device.type == "cuda":
                torch.cuda.empty_cache()

    result.update(errors=errors, skipped=clock.skipped)  # the same lists, filled as the check goes
    for shape in cfg.shapes:
        if not clock.allows(f"{shape}"):
            continue
        row: dict = {"shape": shape}
        size = measured(f"{shape} build", lambda: _size(shape, dtype, device, cfg.seed))
        if size is None:
            continue
        row.update(size)
        log(f"{shape}: {row['parameters'] / 1e6:.0f}M parameters, decode ...")
        row["decode"] = measured(f"{shape} decode", lambda: decode_rows(cfg, shape, device, dtype, bandwidth, clock)) or []
        log(f"{shape}: verify curve ...")
        row["verify"] = measured(f"{shape} verify", lambda: verify_rows(cfg, shape, device, dtype, clock)) or []
        if clock.allows(f"{shape} step profile"):
            if (prof := measured(f"{shape} step profile", lambda: step_profile_row(shape, device, dtype, cfg.seed))):
                row["step_profile"] = prof
        if clock.allows(f"{shape} trainer step"):
            log(f"{shape}: trainer step ...")
            if (train := measured(f"{shape} trainer step", lambda: train_row(cfg, shape, device, dtype))) is not None:
                row["train"] = train
        if clock.allows(f"{shape} weight load"):
            if (load := measured(f"{shape} weight load", lambda: weight_load_row(cfg, shape, device, dtype))) is not None:
                row["weight_load"] = load
        result["shapes"].append(row)
        result["elapsed_s"] = time.perf_counter() - clock.start
        if progress is not None:
            progress(result)
    if cfg.shapes and clock.allows("patch encode/apply"):
        if importlib.util.find_spec("zstandard") is None:
            clock.skipped.append("patch encode/apply: zstandard is not installed for this Python (make gpu-check-deps "
                                 "where the registry is reachable, and carry .gpu-check)")
        else:
            result["patch"] = measured("patch encode/apply", lambda: patch_row(cfg, cfg.shapes[0], device, dtype))
    result["elapsed_s"] = time.perf_counter() - clock.start
    return result


def summary(result: dict) -> str:
    """A few lines for the log: each shape's decode and verify figures beside their baselines."""
    lines = [f"{result['device_name']} ({result['device']}, torch {result['torch']}, {result['dtype']}): copy "
             f"{result['copy_bytes_per_s'] / 1e9:.0f} GB/s, matmul {result['matmul_flops'] / 1e12:.1f} TFLOP/s"]
    for row in result["shapes"]:
        for d in row["decode"]:
            hf = f", {d['engine_vs_hf']:.2f}x HF" if "engine_vs_hf" in d else ""
            if "greedy_gap_max" in d:
                hf += f", greedy gap max {d['greedy_gap_max']:.3f} (logit spread {d['logit_spread']:.2f})"
            lines.append(f"  {row['shape']} decode b{d['batch']}: {d['engine_tokens_per_s']:,.0f} tok/s{hf}, "
                         f"{d['engine_vs_roofline']:.0%} of roofline")
        for v in row["verify"]:
            curve = " ".join(f"{n}:{r:.2f}" for n, r in zip(v["positions"], v["relative"]))
            lines.append(f"  {row['shape']} verify b{v['batch']} (n: step / plain step): {curve}")
        if "step_profile" in row:
            p = row["step_profile"]
            lines.append(f"  {row['shape']} b1 step {p['step_s'] * 1e3:.1f} ms: {p['launches']} launches x "
                         f"{p['launch_latency_s'] * 1e6:.1f} us = {p['launch_bound_share']:.0%} of it")
        if "train" in row:
            lines.append(f"  {row['shape']} trainer fwd+bwd: {row['train']['tokens_per_s']:,.0f} tok/s")
        if "weight_load" in row:
            lines.append(f"  {row['shape']} weight load: {row['weight_load']['bytes_per_s'] / 1e9:.1f} GB/s")
    if result["patch"]:
        p = result["patch"]
        lines.append(f"  patch: {p['changed_share']:.1%} changed, encode {p['encode_bytes_per_s'] / 1e9:.2f} GB/s, "
                     f"apply {p['apply_bytes_per_s'] / 1e9:.2f} GB/s")
    lines += [f"  skipped: {s}" for s in result["skipped"]]
    lines += [f"  FAILED {e['what']}: {e['error']}" for e in result.get("errors", [])]
    return "\n".join(lines)


QUICK_DTYPE = "float32"
"""--quick's dtype: a CPU's bf16 matmuls are emulated, tens of times slower than fp32."""


def _int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlboost.bench.gpu_check", description=__doc__.split("\n")[0])
    parser.add_argument("--json", required=True, help="where the result goes")
    parser.add_argument("--device", default=GpuCheckConfig.device)
    parser.add_argument("--dtype", default=None, help=f"default {GpuCheckConfig.dtype} ({QUICK_DTYPE} with --quick)")
    parser.add_argument("--shapes", default=None, help=f"comma-separated, from {', '.join(SHAPES)}")
    parser.add_argument("--decode-batches", type=_int_list, default=None)
    parser.add_argument("--verify-batches", type=_int_list, default=None)
    parser.add_argument("--verify-positions", type=_int_list, default=None)
    parser.add_argument("--budget-s", type=float, default=GpuCheckConfig.budget_s)
    parser.add_argument("--quick", action="store_true", help="the CPU test's sizes: tiny shape, small batches")
    args = parser.parse_args(argv)
    cfg = GpuCheckConfig(device=args.device, budget_s=args.budget_s)
    if args.quick:
        cfg.dtype = QUICK_DTYPE
        cfg.shapes, cfg.decode_batches, cfg.verify_batches, cfg.verify_positions = ["tiny"], [1, 4], [1, 4], [1, 2, 4]
        cfg.prompt_len, cfg.new_tokens, cfg.train_batch, cfg.train_response_len = 16, 8, 2, 16
        cfg.timing_iters, cfg.repeats, cfg.patch_bucket_mb = 3, 1, 1.0
    cfg.dtype = args.dtype or cfg.dtype
    for name in ("shapes",):
        if getattr(args, name) is not None:
            setattr(cfg, name, [s for s in getattr(args, name).split(",") if s])
    for name in ("decode_batches", "verify_batches", "verify_positions"):
        if getattr(args, name) is not None:
            setattr(cfg, name, getattr(args, name))
    bad = [s for s in cfg.shapes if s not in SHAPES]
    if bad:
        print(f"error: --shapes: unknown shape {bad[0]!r}; choose from {', '.join(SHAPES)}", file=sys.stderr)
        return 2
    try:
        dtype = getattr(torch, cfg.dtype)
        if not isinstance(dtype, torch.dtype):
            raise AttributeError
        device = resolve_device(cfg.device, key="--device")
        if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
            raise ValueError(f"--device={cfg.device!r} but this machine has {torch.cuda.device_count()} CUDA devices")
    except AttributeError:
        print(f"error: --dtype: {cfg.dtype!r} is not a torch dtype", file=sys.stderr)
        return 2
    except (ValueError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = gpu_check(cfg, log=lambda line: print(line, flush=True),
                       progress=lambda partial: out.write_text(json.dumps(partial, indent=1)))
    out.write_text(json.dumps(result, indent=1))
    print(summary(result))
    print(f"wrote {args.json} in {result['elapsed_s']:.0f} s")
    if result["errors"]:
        print(f"error: {len(result['errors'])} measurement(s) failed: "
              + "; ".join(f"{e['what']}: {e['error']}" for e in result["errors"]), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
