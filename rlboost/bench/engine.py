"""`rlboost bench engine`: our engine's decode throughput against HF generate and the hardware roofline.

All numbers come from one run on one machine: the engine and HF `generate` decode the same greedy
batch (same prompts, same lengths, EOS ignored); the roofline is this device's measured matmul
FLOP/s over 2 x parameters (the FLOPs of one token). Decode throughput excludes the prefill, which
is timed separately for both (HF: a max_new_tokens=1 run).
"""

from __future__ import annotations

import platform
import time
from dataclasses import asdict, dataclass

import torch

from rlboost.bench import hardware
from rlboost.engine import EngineConfig, LLMEngine, SamplingParams
from rlboost.engine.engine import resolve_device
from rlboost.models import ModelConfig, load_model


@dataclass
class EngineBenchConfig:
    model: str = "smollm2"
    """Model to benchmark (any `model.path` value)."""
    batch: int = 32
    """Requests decoded together."""
    prompt_len: int = 64
    """Prompt tokens per request (random ids, seeded)."""
    new_tokens: int = 64
    """Tokens generated per request."""
    device: str = "auto"
    """cpu, cuda or auto."""
    dtype: str = "float32"
    """Weights' dtype."""
    hf_baseline: bool = True
    """Also time HF generate (the slowest part; turn off for a quick engine-only number)."""
    compare_cpu_linear: bool = False
    """On CPU, also time the engine with engine.cpu_linear=torch (F.linear) against the default oneDNN."""
    seed: int = 0
    """Seed of the random prompts."""


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def _time_engine(cfg: EngineBenchConfig, device: torch.device, prompts: list[list[int]], **engine_options):
    """(tokens per request, prefill seconds, decode seconds) of one greedy batch on a fresh engine."""
    model = load_model(ModelConfig(path=cfg.model, dtype=cfg.dtype)).model
    engine = LLMEngine(model, EngineConfig(device=str(device), max_num_seqs=cfg.batch,
                                           max_num_batched_tokens=max(4096, cfg.batch * cfg.prompt_len),
                                           **engine_options))
    engine.generate(prompts, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))  # warm-up
    greedy = SamplingParams(temperature=0, max_tokens=cfg.new_tokens, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add(str(i), prompt, greedy)
    outputs: list[list[int]] = [[] for _ in prompts]

    def run_until(done):
        while not done():
            for chunk in engine.step():
                outputs[int(chunk.request_id)] += chunk.token_ids

    _, prefill_s = _timed(lambda: run_until(lambda: engine.num_waiting == 0))
    _, decode_s = _timed(lambda: run_until(lambda: not engine.has_unfinished()))
    return outputs, prefill_s, decode_s


def _time_hf(cfg: EngineBenchConfig, device: torch.device, prompts: list[list[int]]):
    """(tokens per request, prefill seconds, total seconds) of HF generate on the same greedy batch."""
    model = load_model(ModelConfig(path=cfg.model, dtype=cfg.dtype)).model.to(device)
    ids = torch.tensor(prompts, device=device)

    def generate(n):
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                                 do_sample=False, eos_token_id=None, pad_token_id=0)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return out

    generate(3)  # warm-up
    _, prefill_s = _timed(lambda: generate(1))
    out, total_s = _timed(lambda: generate(cfg.new_tokens))
    return out[:, cfg.prompt_len:].tolist(), prefill_s, total_s


def bench_engine(cfg: EngineBenchConfig) -> dict:
    device = resolve_device(cfg.device)
    probe = load_model(ModelConfig(path=cfg.model, dtype=cfg.dtype))
    params = list(probe.model.parameters())  # tied weights counted once
    params_count = sum(p.numel() for p in params)
    weight_bytes = sum(p.numel() * p.element_size() for p in params)
    dtype = params[0].dtype
    g = torch.Generator().manual_seed(cfg.seed)
    prompts = torch.randint(0, probe.model.config.vocab_size, (cfg.batch, cfg.prompt_len), generator=g).tolist()
    decode_tokens = cfg.batch * (cfg.new_tokens - 1)  # the first token of each request comes from prefill

    outputs, prefill_s, decode_s = _time_engine(cfg, device, prompts)
    result = {
        "model": probe.name,
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "dtype": str(dtype).removeprefix("torch."),
        "batch": cfg.batch,
        "prompt_len": cfg.prompt_len,
        "new_tokens": cfg.new_tokens,
        "parameters": params_count,
        "engine_tokens_per_s": decode_tokens / decode_s,
        "engine_prefill_s": prefill_s,
        "engine_e2e_tokens_per_s": cfg.batch * cfg.new_tokens / (prefill_s + decode_s),
    }
    if cfg.compare_cpu_linear and device.type == "cpu":
        _, _, torch_decode_s = _time_engine(cfg, device, prompts, cpu_linear="torch")
        result["engine_torch_linear_tokens_per_s"] = decode_tokens / torch_decode_s
        result["onednn_vs_torch_linear"] = result["engine_tokens_per_s"] / result["engine_torch_linear_tokens_per_s"]

    if cfg.hf_baseline:
        hf_tokens, hf_prefill_s, hf_total_s = _time_hf(cfg, device, prompts)
        result.update({
            "hf_generate_tokens_per_s": decode_tokens / max(hf_total_s - hf_prefill_s, 1e-9),
            "hf_prefill_s": hf_prefill_s,
            "hf_e2e_tokens_per_s": cfg.batch * cfg.new_tokens / hf_total_s,
            "outputs_identical_to_hf": sum(a == b for a, b in zip(outputs, hf_tokens)) / cfg.batch,
        })
        result["engine_vs_hf"] = result["engine_tokens_per_s"] / result["hf_generate_tokens_per_s"]
        result["engine_e2e_vs_hf_e2e"] = result["engine_e2e_tokens_per_s"] / result["hf_e2e_tokens_per_s"]

    flops = hardware.matmul_flops(device, dtype)
    bandwidth = hardware.memory_bandwidth(device)
    result.update({
        "matmul_flops": flops,
        "roofline_tokens_per_s": flops / (2 * params_count),
        "memory_bandwidth_bytes_per_s": bandwidth,
        # Every decode step streams all weights once: at this batch, tokens/s <= batch * BW / bytes.
        "bandwidth_roofline_tokens_per_s": cfg.batch * bandwidth / weight_bytes,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "config": asdict(cfg),
    })
    result["engine_vs_roofline"] = result["engine_tokens_per_s"] / result["roofline_tokens_per_s"]
    return result


def render(result: dict) -> "rich.table.Table":  # noqa: F821
    from rich.table import Table

    table = Table(title=f"rlboost bench engine: {result['model']}, {result['dtype']}, batch {result['batch']}, "
                        f"{result['prompt_len']} prompt + {result['new_tokens']} new tokens, {result['device']}")
    table.add_column("measure")
    table.add_column("tokens/s", justify="right")
    table.add_column("engine / this", justify="right")
    eng = result["engine_tokens_per_s"]
    table.add_row("rlboost engine (decode)", f"{eng:,.0f}", "1.00")
    if "engine_torch_linear_tokens_per_s" in result:
        table.add_row("rlboost engine, engine.cpu_linear=torch (decode)",
                      f"{result['engine_torch_linear_tokens_per_s']:,.0f}", f"{result['onednn_vs_torch_linear']:.2f}x")
    if "hf_generate_tokens_per_s" in result:
        hf = result["hf_generate_tokens_per_s"]
        table.add_row("HF generate (decode)", f"{hf:,.0f}", f"{eng / hf:.2f}x")
        table.add_row("rlboost engine (prefill + decode)", f"{result['engine_e2e_tokens_per_s']:,.0f}", "")
        table.add_row("HF generate (prefill + decode)", f"{result['hf_e2e_tokens_per_s']:,.0f}",
                      f"{result['engine_e2e_vs_hf_e2e']:.2f}x (end to end)")
    table.add_row(f"compute roofline ({result['matmul_flops'] / 1e9:,.0f} GFLOP/s matmul / 2N)",
                  f"{result['roofline_tokens_per_s']:,.0f}", f"{result['engine_vs_roofline']:.0%}")
    table.add_row(f"bandwidth roofline ({result['memory_bandwidth_bytes_per_s'] / 1e9:,.1f} GB/s x batch / weights)",
                  f"{result['bandwidth_roofline_tokens_per_s']:,.0f}",
                  f"{eng / result['bandwidth_roofline_tokens_per_s']:.0%}")
    if "outputs_identical_to_hf" in result:
        table.caption = f"greedy outputs identical to HF for {result['outputs_identical_to_hf']:.0%} of requests"
    return table
