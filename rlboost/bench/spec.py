"""`rlboost bench spec`: HistoSpec against plain decoding on repeated prompts, in one run.

A set of arithmetic prompts is rolled out once (`history_samples` responses each, per temperature)
to build the history. The same prompts are then rolled out again, with new seeds, by the plain
engine and by the engine with the HistoSpec drafter, taking turns on each workload:
(a) `same_weights`: with the weights that wrote the history;
(b) `after_training`: after `train_steps` real GRPO steps on those prompts, the history unchanged
    (the previous epoch's responses, as in training).
Batch 1 is measured over `batch1_requests` prompts one at a time; larger batches over the first
`batch` prompts together. tokens/s counts generated tokens over wall time (prefill included, the
same for both). `accepted_per_verify` is the mean accepted draft tokens per request per verification;
`spec_step_fraction` the share of decode steps that verified drafts (the budget turns speculation
off where it measures it slower); `identical` the share of responses equal to the plain ones.
Each of `drafters` takes its turn as HistoSpec's drafter (`rollout.histospec.drafter`).

`--record FILE` and `--replay FILE` measure the drafters' acceptance on recorded RL histories instead,
without timing (`rlboost.bench.spec_replay`).
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.table import Table

from rlboost.data import arithmetic_rows
from rlboost.engine import EngineConfig, LLMEngine, SamplingParams
from rlboost.engine.protocol import SpecStats
from rlboost.bench.grpo import chat_prompts, grpo_steps
from rlboost.bench.spec_replay import record_histories, render_replay, replay_result
from rlboost.data import DatasetError
from rlboost.histospec import DraftConfig, HistoryStore, make_drafter
from rlboost.histospec.drafter import DRAFTERS
from rlboost.models import ModelConfig, load_model


@dataclass
class SpecBenchConfig:
    model: str = "smollm2"
    """Model (any `model.path` value)."""
    prompts: int = 32
    """Arithmetic prompts (the largest batch uses all of them)."""
    max_tokens: int = 96
    """Tokens per response at most."""
    batches: list[int] = field(default_factory=lambda: [1, 8, 32])
    """Batch sizes measured."""
    temperatures: list[float] = field(default_factory=lambda: [1.0, 0.6])
    """Sampling temperatures measured."""
    history_samples: int = 4
    """Responses per prompt in the history rollout."""
    batch1_requests: int = 4
    """Prompts measured one at a time for batch 1."""
    train_steps: int = 3
    """GRPO steps between the history and the `after_training` rollouts."""
    lr: float = 2e-5
    """Learning rate of those steps."""
    seed: int = 0
    """Seed of prompts and sampling."""
    drafters: list[str] = field(default_factory=lambda: ["ngram"])
    """HistoSpec drafters measured, each in its turn (`rollout.histospec.drafter` values)."""
    record: str = ""
    """Instead of the timed bench: record RL histories to this JSONL file (`record_epochs` GRPO steps
    per temperature over the prompts, each step one epoch of them), then replay them."""
    record_epochs: int = 5
    """GRPO steps (epochs of the prompts) per temperature that `--record` records."""
    replay: str = ""
    """Instead of the timed bench: replay this recording (JSONL, `rlboost.histospec.recording`) with each
    drafter, no model and no timing: accepted tokens per verify step and decode steps saved."""
    instances: int = 1
    """Replay: engines a step's responses are dealt over, as a hybrid rollout's workers; above 1 the
    suffix drafter is replayed with the siblings on its own engine only and with those elsewhere
    forwarded too (`+forwarded`)."""
    stream_interval: int = 8
    """Replay with instances: tokens per report (engine.stream_interval), the lag of a forwarded sibling."""
    sibling_tokens_per_step: int = 16384
    """Replay with instances: the most forwarded tokens per engine per step
    (rollout.histospec.sibling_tokens_per_step)."""


def bench_spec(cfg: SpecBenchConfig) -> dict:
    for name in cfg.drafters:
        if name not in DRAFTERS:
            raise DatasetError(f"--drafters: unknown {name!r}; valid: {', '.join(DRAFTERS)}")
    if cfg.record:
        record_histories(cfg, Path(cfg.record))
    if cfg.record or cfg.replay:
        return replay_result(cfg, Path(cfg.record or cfg.replay))
    loaded = load_model(ModelConfig(path=cfg.model))
    rows = arithmetic_rows(cfg.prompts, cfg.seed, "train")
    prompts = chat_prompts(loaded.tokenizer, rows)
    engine_cfg = EngineConfig(device="cpu", max_num_seqs=max(cfg.batches + [cfg.prompts]),
                              spec_max_batch=max(cfg.batches))
    plain = LLMEngine(load_model(ModelConfig(path=cfg.model)).model, engine_cfg, eos_token_ids=loaded.eos_token_ids)
    spec = LLMEngine(load_model(ModelConfig(path=cfg.model)).model, engine_cfg, eos_token_ids=loaded.eos_token_ids)

    stores = {}
    for t in cfg.temperatures:  # the previous epoch: history_samples responses per prompt
        store = stores[t] = HistoryStore()
        params = [SamplingParams(temperature=t, max_tokens=cfg.max_tokens, seed=cfg.seed * 1000 + 7919 * j + i)
                  for i in range(len(prompts)) for j in range(cfg.history_samples)]
        outs = plain.generate([p for p in prompts for _ in range(cfg.history_samples)], params)
        for i, p in enumerate(prompts):
            store.update(p, [o.token_ids for o in outs[i * cfg.history_samples:(i + 1) * cfg.history_samples]])

    results = [_measure(cfg, "same_weights", plain, spec, prompts, stores)]
    for grpo in grpo_steps(loaded, plain, rows, prompts, lr=cfg.lr, steps=cfg.train_steps,
                           max_tokens=cfg.max_tokens, seed=cfg.seed):
        weights = grpo.weights  # the weights after the last step
    plain.load_weights(weights, 1)
    spec.load_weights(weights, 1)
    results.append(_measure(cfg, "after_training", plain, spec, prompts, stores))
    return {"config": asdict(cfg), "machine": {"cpus": os.cpu_count()}, "results": [r for rs in results for r in rs]}


def _measure(cfg, condition, plain, spec, prompts, stores) -> list[dict]:
    out = []
    for t, drafter in itertools.product(cfg.temperatures, cfg.drafters):
        for batch in cfg.batches:
            spec.drafter = make_drafter(stores[t], DraftConfig(drafter=drafter))
            waves = [[p] for p in prompts[:cfg.batch1_requests]] if batch == 1 else [prompts[:batch]]
            params = SamplingParams(temperature=t, max_tokens=cfg.max_tokens, seed=cfg.seed + 1)
            base_s, base_out = _timed(plain, waves, params)
            spec.spec_stats = SpecStats()
            spec_s, spec_out = _timed(spec, waves, params)
            stats = spec.spec_stats
            tokens = sum(len(o.token_ids) for o in base_out)
            spec_tokens = sum(len(o.token_ids) for o in spec_out)
            out.append({
                "condition": condition, "temperature": t, "batch": batch, "drafter": drafter,
                "tokens_per_s_base": tokens / base_s, "tokens_per_s_spec": spec_tokens / spec_s,
                "speedup": (spec_tokens / spec_s) / (tokens / base_s),
                "accepted_per_verify": stats.accepted / stats.verifications if stats.verifications else 0.0,
                "spec_step_fraction": stats.verify_steps / stats.decode_steps if stats.decode_steps else 0.0,
                "identical": sum(a.token_ids == b.token_ids for a, b in zip(base_out, spec_out)) / len(base_out),
            })
    return out


def _timed(engine: LLMEngine, waves, params: SamplingParams):
    outs = []
    t0 = time.perf_counter()
    for wave in waves:
        outs += engine.generate(wave, [dataclasses.replace(params, seed=params.seed * 7 + i) for i in range(len(wave))])
    return time.perf_counter() - t0, outs


def render(result: dict) -> Table:
    if "replay" in result:
        return render_replay(result)
    table = Table(title=f"HistoSpec vs plain decoding, {result['config']['model']}, {result['machine']['cpus']} CPUs")
    for column in ("condition", "T", "batch", "drafter", "tok/s plain", "tok/s spec", "speed-up", "accepted/step",
                   "spec steps", "identical"):
        table.add_column(column, justify="right")
    for r in result["results"]:
        table.add_row(r["condition"], f"{r['temperature']:g}", str(r["batch"]), r["drafter"], f"{r['tokens_per_s_base']:.1f}",
                      f"{r['tokens_per_s_spec']:.1f}", f"{r['speedup']:.2f}x", f"{r['accepted_per_verify']:.2f}",
                      f"{r['spec_step_fraction']:.0%}", f"{r['identical']:.0%}")
    return table
