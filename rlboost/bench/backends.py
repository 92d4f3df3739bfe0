"""`rlboost bench engine --backends rlboost,vllm,hf`: engine backends side by side, in one run.

Every backend decodes the same greedy batches (the same random prompts, EOS ignored) at each batch
size; the backends take turns within every round so a machine's drift hits them alike, and the report
gives medians. Per backend: decode tokens/s at each batch (prefill timed apart: until every request
has its first token), the ratio to the first backend named, whether its greedy tokens equal HF's,
its start-up time (building the engine from the checkpoint, imports included: what a joining worker
pays) and its weight-swap times: an in-place reload of the full state dict, as a pull does, and a
partial one (`load_weights(..., names=...)`), as a worker that applied a patch does, where whole
tensors making up `partial_share` of the model's bytes changed; the two alternate in every round.
With the partial swap comes what reached each backend: the tensors named, and for vLLM the whole
fused layers they fall in (`rlboost.engine.vllm_backend.whole_layers`).

Backends: `rlboost` (rlboost's engine), `vllm` (`rlboost.engine.vllm_backend`; needs vLLM installed),
`hf` (HF transformers `generate`; its "swap" is `load_state_dict`).
"""

from __future__ import annotations

import random
import statistics
import time

import torch
from rich.table import Table

from rlboost.bench.engine import timed_decode, timed_hf_generate
from rlboost.engine import EngineConfig, SamplingParams
from rlboost.engine.engine import resolve_device
from rlboost.engine.factory import make_engine
from rlboost.engine.vllm_backend import whole_layers
from rlboost.models import ModelConfig, load_model

BACKENDS = ("rlboost", "vllm", "hf")


class _Engine:
    """An engine backend (`rlboost`, `vllm`) on the checkpoint, built as a run builds it
    (`rlboost.engine.factory`), with room for the largest batch."""

    def __init__(self, backend: str, model: ModelConfig, device: torch.device, max_batch: int, max_len: int):
        self.engine = make_engine(model, EngineConfig(
            backend=backend, device=str(device), max_num_seqs=max_batch, max_model_len=max_len,
            max_num_batched_tokens=max(4096, max_batch * max_len)), num_threads=torch.get_num_threads())

    def run(self, prompts: list[list[int]], new_tokens: int) -> tuple[list[list[int]], float, float]:
        params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
        # prefill: until every request has its first token (vLLM may split a prefill over steps)
        return timed_decode(self.engine, prompts, params,
                            lambda engine: all(n >= 1 for n in engine.progress().values()))

    def swap(self, state: dict, version: int, names: list[str] | None = None) -> float:
        start = time.perf_counter()
        self.engine.load_weights(state, version, names)
        return time.perf_counter() - start

    def reloaded(self, state: dict, names: list[str]) -> list[str]:
        """The tensors a partial swap of `names` hands the engine."""
        packed = getattr(self.engine, "packed_modules", None)  # vLLM: whole fused layers
        return names if packed is None else whole_layers(state, names, packed, tied=self.engine.tied)


class _HF:
    """HF generate; decode time = full run - a max_new_tokens=1 run."""

    def __init__(self, model: ModelConfig, device: torch.device):
        self.model = load_model(model).model.to(device)
        self.device = device

    def run(self, prompts, new_tokens):
        ids = torch.tensor(prompts, device=self.device)
        _, prefill_s = timed_hf_generate(self.model, ids, 1)
        out, total_s = timed_hf_generate(self.model, ids, new_tokens)
        return out[:, ids.shape[1]:].tolist(), prefill_s, max(total_s - prefill_s, 1e-9)

    def swap(self, state, version, names=None):
        start = time.perf_counter()
        with torch.no_grad():
            self.model.load_state_dict(state if names is None else {n: state[n] for n in names}, strict=False)
        return time.perf_counter() - start

    def reloaded(self, state, names):
        return names


def bench_backends(cfg) -> dict:
    """`cfg`: an `EngineBenchConfig` whose `backends` is not empty."""
    unknown = [b for b in cfg.backends if b not in BACKENDS]
    if unknown:
        raise ValueError(f"--backends: unknown {unknown}; choose from {', '.join(BACKENDS)}")
    device = resolve_device(cfg.device)
    model = ModelConfig(path=cfg.model, dtype=cfg.dtype)
    reference = load_model(model).model
    state = {name: p.detach().clone() for name, p in reference.named_parameters()}
    moved = moved_tensors(state, cfg.partial_share, cfg.seed)
    g = torch.Generator().manual_seed(cfg.seed)
    max_batch = max(cfg.batches)
    prompts = torch.randint(0, reference.config.vocab_size, (max_batch, cfg.prompt_len), generator=g).tolist()
    del reference
    max_len = cfg.prompt_len + cfg.new_tokens + 8

    runners, startup_s = {}, {}
    for name in cfg.backends:
        start = time.perf_counter()
        runners[name] = _HF(model, device) if name == "hf" else _Engine(name, model, device, max_batch, max_len)
        runners[name].run(prompts[:1], 3)  # warm-up
        startup_s[name] = time.perf_counter() - start

    samples = {name: {str(b): [] for b in cfg.batches} for name in cfg.backends}
    outputs: dict[str, dict[str, list]] = {name: {} for name in cfg.backends}
    for _ in range(cfg.repeats):
        for batch in cfg.batches:
            for name, runner in runners.items():
                outputs[name][str(batch)], _, decode_s = runner.run(prompts[:batch], cfg.new_tokens)
                samples[name][str(batch)].append(decode_s)
    patched = {n: t + 1e-3 if n in moved else t for n, t in state.items()}
    swaps = {name: {"full": [], "partial": []} for name in runners}
    for v in range(cfg.repeats):  # full and partial take turns: v -> v+1 full, then v+1 -> v+2 patched
        for name, runner in runners.items():
            swaps[name]["full"].append(runner.swap(state, version=2 * v + 1))
            swaps[name]["partial"].append(runner.swap(patched, version=2 * v + 2, names=moved))
    swap_s = {name: statistics.median(s["full"]) for name, s in swaps.items()}
    nbytes = {n: t.numel() * t.element_size() for n, t in state.items()}
    reloaded = {name: runner.reloaded(state, moved) for name, runner in runners.items()}

    rates = {name: {str(b): b * (cfg.new_tokens - 1) / statistics.median(samples[name][str(b)]) for b in cfg.batches}
             for name in cfg.backends}
    first = cfg.backends[0]
    result = {
        "model": cfg.model, "device": str(device), "dtype": cfg.dtype, "prompt_len": cfg.prompt_len,
        "new_tokens": cfg.new_tokens, "batches": list(cfg.batches), "backends": list(cfg.backends),
        "repeats": cfg.repeats, "threads": torch.get_num_threads(), "torch": torch.__version__,
        "decode_tokens_per_s": rates,
        f"decode_vs_{first}": {n: {b: rates[n][b] / rates[first][b] for b in rates[n]} for n in cfg.backends},
        "startup_s": startup_s, "weight_swap_s": swap_s,
        "partial_swap_s": {name: statistics.median(s["partial"]) for name, s in swaps.items()},
        "partial_swap": {
            "share": cfg.partial_share, "model_bytes": sum(nbytes.values()),
            "tensors_named": len(moved), "bytes_named": sum(nbytes[n] for n in moved),
            "tensors_reloaded": {name: len(r) for name, r in reloaded.items()},
            "bytes_reloaded": {name: sum(nbytes[n] for n in r) for name, r in reloaded.items()},
        },
        "samples_decode_s": samples, "samples_swap_s": swaps,
    }
    if "hf" in runners:
        result["greedy_identical_to_hf"] = {
            n: {b: sum(x == y for x, y in zip(outputs[n][b], outputs["hf"][b])) / int(b) for b in outputs[n]}
            for n in cfg.backends}
    return result


def moved_tensors(state: dict, share: float, seed: int) -> list[str]:
    """Whole tensors of `state`, taken in a seeded order while they fit, making up at most `share` of its
    bytes: the parameters a patched version changes in the partial swap."""
    if not 0 < share <= 1:
        raise ValueError(f"--partial-share: a share of the model's bytes in (0, 1], got {share}")
    order = sorted(state)
    random.Random(seed).shuffle(order)
    budget, taken = share * sum(t.numel() * t.element_size() for t in state.values()), 0
    moved = []
    for name in order:
        size = state[name].numel() * state[name].element_size()
        if taken + size <= budget:
            moved.append(name)
            taken += size
    return sorted(moved, key=list(state).index)  # the model's order: vLLM reloads layer by layer


def render(result: dict) -> Table:
    first = result["backends"][0]
    table = Table(title=f"rlboost bench engine --backends: {result['model']}, {result['dtype']}, "
                        f"{result['prompt_len']} prompt + {result['new_tokens']} new tokens, {result['device']}, "
                        f"{result['threads']} thread(s), median of {result['repeats']} interleaved rounds")
    table.add_column("backend")
    for b in result["batches"]:
        table.add_column(f"decode tok/s, batch {b}", justify="right")
    table.add_column("start-up s", justify="right")
    table.add_column("weight swap s", justify="right")
    table.add_column(f"partial swap s ({result['partial_swap']['share']:.0%} changed)", justify="right")
    for name in result["backends"]:
        cells = [f"{result['decode_tokens_per_s'][name][str(b)]:,.0f} "
                 f"({result[f'decode_vs_{first}'][name][str(b)]:.2f}x)" for b in result["batches"]]
        table.add_row(name, *cells, f"{result['startup_s'][name]:.1f}", f"{result['weight_swap_s'][name]:.2f}",
                      f"{result['partial_swap_s'][name]:.3f}")
    caption = f"(ratio to {first} in parentheses)"
    if "greedy_identical_to_hf" in result:
        same = ", ".join(f"{n} {min(v.values()):.0%}" for n, v in result["greedy_identical_to_hf"].items() if n != "hf")
        caption += f"; greedy outputs identical to HF's: {same} of requests (worst batch)"
    partial = result["partial_swap"]
    caption += (f"; partial swap: {partial['tensors_named']} tensors named, "
                f"{partial['bytes_named'] / partial['model_bytes']:.1%} of the bytes; reloaded: " + ", ".join(
                    f"{n} {partial['bytes_reloaded'][n] / partial['model_bytes']:.1%}" for n in result["backends"]))
    table.caption = caption
    return table
