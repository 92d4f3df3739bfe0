"""`rlboost bench engine`: our engine's decode throughput against HF generate and the hardware roofline.

All numbers come from one run on one machine: the engine and HF `generate` decode the same greedy
batch (same prompts, same lengths, EOS ignored); the roofline is this device's measured matmul
FLOP/s over 2 x parameters (the FLOPs of one token). Decode throughput excludes the prefill, which
is timed separately for both (HF: a max_new_tokens=1 run). Shared machines drift by tens of percent
within a minute, so the contenders (and the matmul measurement) take turns for `repeats` rounds and
the report gives medians; every sample is kept in the JSON.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import torch

from rlboost.bench import hardware
from rlboost.engine import EngineConfig, LLMEngine, SamplingParams
from rlboost.engine.engine import resolve_device
from rlboost.models import ModelConfig, load_model

if TYPE_CHECKING:
    from rich.table import Table


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
    repeats: int = 3
    """Rounds in which every contender runs once; medians are reported."""
    hf_baseline: bool = True
    """Also time HF generate (the slowest part; turn off for a quick engine-only number)."""
    compare_cpu_linear: bool = False
    """On CPU, also time the engine with engine.cpu_linear=torch (F.linear) against the default oneDNN."""
    seed: int = 0
    """Seed of the random prompts."""
    backends: list[str] = field(default_factory=list)
    """Compare engine backends side by side instead (`rlboost`, `vllm`, `hf`, comma-separated; vLLM must be
    installed): decode tokens/s at each of `batches`, start-up and weight-swap time (rlboost.bench.backends).
    Empty: the engine against HF generate and the roofline at `batch`."""
    batches: list[int] = field(default_factory=lambda: [1, 8, 32])
    """Batch sizes of the `backends` comparison."""
    partial_share: float = 0.02
    """Share of the model's bytes a patched version changes in the `backends` comparison's partial weight
    swap (whole tensors, drawn in a seeded order), timed beside the full swap."""


class _EngineRun:
    """Our engine, built and warmed once; each call decodes the batch anew."""

    def __init__(self, cfg: EngineBenchConfig, device: torch.device, prompts: list[list[int]], **engine_options):
        model = load_model(ModelConfig(path=cfg.model, dtype=cfg.dtype)).model
        self.engine = LLMEngine(model, EngineConfig(device=str(device), max_num_seqs=cfg.batch,
                                                    max_num_batched_tokens=max(4096, cfg.batch * cfg.prompt_len),
                                                    **engine_options))
        self.prompts = prompts
        self.params = SamplingParams(temperature=0, max_tokens=cfg.new_tokens, ignore_eos=True)
        self.engine.generate(prompts, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))  # warm-up

    def __call__(self) -> tuple[list[list[int]], float, float]:
        """(tokens per request, prefill seconds, decode seconds)."""
        return timed_decode(self.engine, self.prompts, self.params, lambda engine: engine.num_waiting == 0)


def timed_decode(engine, prompts: list[list[int]], params: SamplingParams,
                 prefill_done) -> tuple[list[list[int]], float, float]:
    """Decode `prompts` on a streaming engine (any backend): (tokens per request, seconds until
    `prefill_done(engine)`, seconds from then until every request ends)."""
    for i, prompt in enumerate(prompts):
        engine.add(f"bench-{i}", prompt, params)
    outputs: list[list[int]] = [[] for _ in prompts]

    def run_until(done) -> float:
        start = time.perf_counter()
        while not done():
            for chunk in engine.step():
                outputs[int(chunk.request_id.removeprefix("bench-"))] += chunk.token_ids
        return time.perf_counter() - start

    prefill_s = run_until(lambda: prefill_done(engine))
    decode_s = run_until(lambda: not engine.has_unfinished())
    return outputs, prefill_s, decode_s


def timed_hf_generate(model, ids: torch.Tensor, n: int) -> tuple[torch.Tensor, float]:
    """HF `generate` of exactly `n` greedy tokens after `ids`: (output ids, seconds)."""
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                             do_sample=False, eos_token_id=None, pad_token_id=0)
    if ids.device.type == "cuda":
        torch.cuda.synchronize(ids.device)
    return out, time.perf_counter() - start


class _HFRun:
    """HF generate on the same batch; decode time = full run - a max_new_tokens=1 run."""

    def __init__(self, cfg: EngineBenchConfig, device: torch.device, prompts: list[list[int]]):
        self.model = load_model(ModelConfig(path=cfg.model, dtype=cfg.dtype)).model.to(device)
        self.ids = torch.tensor(prompts, device=device)
        self.device = device
        self.cfg = cfg
        self._generate(3)  # warm-up

    def _generate(self, n: int) -> tuple[torch.Tensor, float]:
        return timed_hf_generate(self.model, self.ids, n)

    def __call__(self) -> tuple[list[list[int]], float, float]:
        _, prefill_s = self._generate(1)
        out, total_s = self._generate(self.cfg.new_tokens)
        return out[:, self.cfg.prompt_len:].tolist(), prefill_s, max(total_s - prefill_s, 1e-9)


def bench_engine(cfg: EngineBenchConfig) -> dict:
    if cfg.backends:
        from rlboost.bench.backends import bench_backends

        return bench_backends(cfg)
    device = resolve_device(cfg.device)
    probe = load_model(ModelConfig(path=cfg.model, dtype=cfg.dtype))
    params = list(probe.model.parameters())  # tied weights counted once
    params_count = sum(p.numel() for p in params)
    weight_bytes = sum(p.numel() * p.element_size() for p in params)
    dtype = params[0].dtype
    g = torch.Generator().manual_seed(cfg.seed)
    prompts = torch.randint(0, probe.model.config.vocab_size, (cfg.batch, cfg.prompt_len), generator=g).tolist()
    del probe
    decode_tokens = cfg.batch * (cfg.new_tokens - 1)  # the first token of each request comes from prefill

    contenders = {"engine": _EngineRun(cfg, device, prompts)}
    if cfg.compare_cpu_linear and device.type == "cpu":
        contenders["engine_torch_linear"] = _EngineRun(cfg, device, prompts, cpu_linear="torch")
    if cfg.hf_baseline:
        contenders["hf_generate"] = _HFRun(cfg, device, prompts)

    samples: dict[str, dict[str, list[float]]] = {name: {"prefill_s": [], "decode_s": []} for name in contenders}
    outputs: dict[str, list[list[int]]] = {}
    flops_samples, bandwidth_samples = [], []
    for _ in range(cfg.repeats):
        for name, run in contenders.items():
            outputs[name], prefill_s, decode_s = run()
            samples[name]["prefill_s"].append(prefill_s)
            samples[name]["decode_s"].append(decode_s)
        flops_samples.append(hardware.matmul_flops(device, dtype))
        bandwidth_samples.append(hardware.memory_bandwidth(device))

    def decode_rate(name: str) -> float:
        return decode_tokens / statistics.median(samples[name]["decode_s"])

    def e2e_rate(name: str) -> float:
        s = samples[name]
        return cfg.batch * cfg.new_tokens / statistics.median(p + d for p, d in zip(s["prefill_s"], s["decode_s"]))

    flops = statistics.median(flops_samples)
    bandwidth = statistics.median(bandwidth_samples)
    result = {
        "model": cfg.model,
        "device": str(device),
        "device_name": hardware.device_name(device),
        "dtype": str(dtype).removeprefix("torch."),
        "batch": cfg.batch,
        "prompt_len": cfg.prompt_len,
        "new_tokens": cfg.new_tokens,
        "parameters": params_count,
        "repeats": cfg.repeats,
        "engine_tokens_per_s": decode_rate("engine"),
        "engine_e2e_tokens_per_s": e2e_rate("engine"),
        "matmul_flops": flops,
        "roofline_tokens_per_s": flops / (2 * params_count),
        "memory_bandwidth_bytes_per_s": bandwidth,
        # Every decode step streams all weights once: at this batch, tokens/s <= batch * BW / bytes.
        "bandwidth_roofline_tokens_per_s": cfg.batch * bandwidth / weight_bytes,
    }
    result["engine_vs_roofline"] = result["engine_tokens_per_s"] / result["roofline_tokens_per_s"]
    if "engine_torch_linear" in contenders:
        result["engine_torch_linear_tokens_per_s"] = decode_rate("engine_torch_linear")
        result["onednn_vs_torch_linear"] = result["engine_tokens_per_s"] / result["engine_torch_linear_tokens_per_s"]
    if "hf_generate" in contenders:
        result["hf_generate_tokens_per_s"] = decode_rate("hf_generate")
        result["hf_e2e_tokens_per_s"] = e2e_rate("hf_generate")
        result["engine_vs_hf"] = result["engine_tokens_per_s"] / result["hf_generate_tokens_per_s"]
        result["engine_e2e_vs_hf_e2e"] = result["engine_e2e_tokens_per_s"] / result["hf_e2e_tokens_per_s"]
        same = sum(a == b for a, b in zip(outputs["engine"], outputs["hf_generate"]))
        result["outputs_identical_to_hf"] = same / cfg.batch
    result.update({
        "samples": {**samples, "matmul_flops": flops_samples, "memory_bandwidth_bytes_per_s": bandwidth_samples},
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "config": asdict(cfg),
    })
    return result


def render(result: dict) -> Table:
    from rich.table import Table  # here, not above: the GPU check imports this module where rich is not installed

    if "backends" in result:
        from rlboost.bench import backends

        return backends.render(result)
    table = Table(title=f"rlboost bench engine: {result['model']}, {result['dtype']}, batch {result['batch']}, "
                        f"{result['prompt_len']} prompt + {result['new_tokens']} new tokens, {result['device']}, "
                        f"median of {result['repeats']} interleaved rounds")
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
