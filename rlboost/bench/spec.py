"""`rlboost bench spec`: HistoSpec against plain decoding on repeated prompts, in one run.

A set of arithmetic prompts is rolled out once (`history_samples` responses each, per temperature)
to build the history. The same prompts are then rolled out again, with new seeds, by the plain
engine and by the engine with the HistoSpec drafter, taking turns on each workload:
(a) `same_weights`: with the weights that wrote the history;
(b) `after_training`: after `train_steps` real GRPO steps on those prompts, the history unchanged
    (the previous epoch's responses, as in training).
Batch 1 is measured over `batch1_requests` prompts one at a time (a wave each); larger batches over
the first `batch` prompts together (one wave); each `turns` times, plain and speculating taking turns
wave by wave (counterbalanced: plain, spec, spec, plain, ...), each pair of turns on seeds of its own
(a vLLM row then averages its samples' lengths). tokens/s counts generated tokens over wall time
(prefill included, the same for both); every engine generates a few tokens before the first turn
(vLLM's first steps are several times slower). `accepted_per_verify` is the mean accepted draft tokens
per request per verification; `spec_step_fraction` the share of decode steps that
verified drafts (the budget turns speculation off where it measures it slower); `identical` the share
of responses equal to the plain ones.
Each of `drafters` takes its turn as HistoSpec's drafter (`rollout.histospec.drafter`; `suffix_tree`
on rlboost's engine only: vLLM verifies single paths), with `min_order` and `suffix_tree_tokens`.

`backends`: `rlboost` (rlboost's engine verifies the drafts) and/or `vllm` (vLLM installed: plain vLLM
against vLLM verifying the same drafter's drafts on the same histories, `rlboost.bench.spec_vllm`,
plus vLLM's own `vllm_methods` against the same plain vLLM). Each row names its `backend`. On vLLM,
seeded sampled requests are the same sample only up to their first verified draft (vLLM's rejection
sampler draws noise of its own), so `identical` counts for greedy rows there.

`--record FILE` and `--replay FILE` measure the drafters' acceptance on recorded RL histories instead,
without timing (`rlboost.bench.spec_replay`).
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.table import Table

from rlboost.data import arithmetic_rows
from rlboost.data.reasoning_gym import check_task as check_reasoning_gym_task
from rlboost.data.reasoning_gym import dataset_name
from rlboost.engine import EngineConfig, LLMEngine, SamplingParams
from rlboost.engine.protocol import EngineBackend, SpecStats
from rlboost.bench.grpo import chat_prompts, grpo_steps
from rlboost.bench.spec_vllm import BACKENDS, VllmEngines, check_vllm_methods
from rlboost.bench.spec_replay import record_histories, render_replay, replay_result
from rlboost.policies.verify_curve import load_verify_curve
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
    batch1_requests: int = 8
    """Prompts measured one at a time for batch 1 (each a wave of its own, the sides alternating request
    by request). Four read 0.89-0.94x on rows whose verify steps were cheaper than plain ones."""
    turns: int = 2
    """Plain and speculating turns per row, in counterbalanced order (plain, spec, spec, plain, ...; each
    speculating turn with a fresh drafter on the same history; each pair of turns with seeds of its own);
    a row's speed is over all of them, so a pause in one turn weighs 1/turns, a drift of the machine's
    speed across the row cancels, and on vLLM, whose sampled speculating responses are other samples
    than the plain ones, so does one turn's luck in their lengths (a wave lasts as long as its longest).
    One turn (the default before) read the same work as 0.89-1.25x on a quiet shared 2-core machine."""
    train_steps: int = 3
    """GRPO steps between the history and the `after_training` rollouts."""
    lr: float = 2e-5
    """Learning rate of those steps."""
    seed: int = 0
    """Seed of prompts and sampling."""
    drafters: list[str] = field(default_factory=lambda: ["ngram"])
    """HistoSpec drafters measured, each in its turn (`rollout.histospec.drafter` values)."""
    min_order: int = 3
    """The drafters' shortest matched suffix (`rollout.histospec.min_order`), timed and replayed."""
    suffix_tree_tokens: int = 8
    """`suffix_tree`'s draft tokens per request and step (`rollout.histospec.suffix_tree_tokens`)."""
    record: str = ""
    """Instead of the timed bench: record RL histories to this JSONL file (`record_epochs` GRPO steps
    per temperature over the prompts, each step one epoch of them), then replay them."""
    record_epochs: int = 5
    """GRPO steps (epochs of the prompts) per temperature that `--record` records."""
    data: str = ""
    """`--record` from the first `prompts` rows of this veRL dataset (parquet or JSONL: `data_source`,
    chat `prompt`, `reward_model.ground_truth`) or of this built-in task's train split (`countdown`,
    `reasoning_gym:NAME`: `data.task`'s names, default parameters, `seed`), scored by the built-in reward
    (math-verify for gsm8k, MATH, ...; reasoning-gym's own checkers), instead of the showcase's
    arithmetic prompts and shaped reward."""
    reward: str = ""
    """`--record`'s reward instead: a veRL custom reward file (`file.py` or `file.py:function`, the
    signature of `reward.path`), e.g. examples/rewards/math_shaped.py for `--data` math rows."""
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
    verify_curve: str = ""
    """Replay: also project each row's decode speed-up at each of `batches` from its acceptance and this
    verify curve (`PATH[:SHAPE]` of a `make gpu-check` JSON; `rlboost.histospec.projection`), labelled
    as a projection."""
    backends: list[str] = field(default_factory=lambda: ["rlboost"])
    """Engines that verify the drafts, each against its own plain decoding: `rlboost`, `vllm` (needs
    vLLM installed)."""
    vllm_methods: list[str] = field(default_factory=lambda: ["ngram"])
    """With `vllm`: vLLM's own speculative methods measured beside HistoSpec on vLLM, against the same
    plain vLLM: `ngram` (prompt lookup in the request's own prompt and output), `suffix` (SuffixDecoding,
    needs arctic-inference). Empty: none."""
    vllm_method_tokens: int = 4
    """Draft tokens vLLM's own methods propose per request and step (HistoSpec's are the drafter's, at
    most its `max_draft`)."""

    def validate(self) -> None:
        """Every flag checked before anything runs (a bad replay flag after hours of `--record` would
        lose the recording's time); `--backends vllm` also needs what it names installed."""
        for name in self.drafters:
            if name not in DRAFTERS:
                raise ValueError(f"--drafters: unknown {name!r}; valid: {', '.join(DRAFTERS)}")
        for flag, value, least in (("instances", self.instances, 1), ("stream-interval", self.stream_interval, 1),
                                   ("min-order", self.min_order, 1), ("turns", self.turns, 1),
                                   ("suffix-tree-tokens", self.suffix_tree_tokens, 1),
                                   ("sibling-tokens-per-step", self.sibling_tokens_per_step, 0)):
            if value < least:
                raise ValueError(f"--{flag} must be >= {least}, got {value}")
        if self.min_order >= DraftConfig.suffix_max_depth:
            raise ValueError(f"--min-order must be < {DraftConfig.suffix_max_depth} (the suffix tries' depth), "
                             f"got {self.min_order}")
        for flag, value in (("data", self.data), ("reward", self.reward)):
            if value and not self.record:
                raise ValueError(f"--{flag}: only --record uses it (the timed bench runs the showcase's prompts)")
        if (name := dataset_name(self.data)) is not None:
            check_reasoning_gym_task(name, {}, task_key="--data")
        if self.verify_curve:
            if not (self.record or self.replay):
                raise ValueError("--verify-curve: only a replay (--replay, --record) projects from it")
            load_verify_curve(self.verify_curve, "--verify-curve")
        if self.record or self.replay:
            return  # no engine runs: the backends are not used
        unknown = sorted(set(self.backends) - set(BACKENDS))
        if unknown or not self.backends:
            raise ValueError(f"--backends: unknown {unknown or 'none given'}; valid: {', '.join(BACKENDS)}")
        if "vllm" in self.backends:
            check_vllm_methods(self.vllm_methods)


    def draft_config(self, drafter: str) -> DraftConfig:
        return DraftConfig(drafter=drafter, min_order=self.min_order, max_order=max(self.min_order, DraftConfig.max_order),
                           suffix_tree_tokens=self.suffix_tree_tokens)


def bench_spec(cfg: SpecBenchConfig, log=lambda *a: None) -> dict:
    cfg.validate()
    if cfg.record:
        record_histories(cfg, Path(cfg.record), log)
    if cfg.record or cfg.replay:
        return replay_result(cfg, Path(cfg.record or cfg.replay))
    loaded = load_model(ModelConfig(path=cfg.model))
    rows = arithmetic_rows(cfg.prompts, cfg.seed, "train")
    prompts = chat_prompts(loaded.tokenizer, rows)
    engine_cfg = EngineConfig(device="cpu", max_num_seqs=max(cfg.batches + [cfg.prompts]),
                              spec_max_batch=max(cfg.batches))
    plain = LLMEngine(load_model(ModelConfig(path=cfg.model)).model, engine_cfg, eos_token_ids=loaded.eos_token_ids)
    pairs = {}
    if "rlboost" in cfg.backends:
        pairs["rlboost"] = (plain, LLMEngine(load_model(ModelConfig(path=cfg.model)).model, engine_cfg,
                                             eos_token_ids=loaded.eos_token_ids))
    vllm = VllmEngines(ModelConfig(path=cfg.model), engine_cfg, loaded.eos_token_ids, cfg.vllm_methods,
                       cfg.vllm_method_tokens) if "vllm" in cfg.backends else None
    if vllm is not None:
        pairs["vllm"] = (vllm.plain, vllm.spec)

    stores = {t: previous_epoch(cfg, plain, prompts, t) for t in cfg.temperatures}

    try:
        for engine in _engines(pairs, vllm):  # vLLM's first steps run several times slower: not in any turn
            _generate(engine, prompts[:1], [SamplingParams(temperature=0, max_tokens=8)])
        for _, spec in pairs.values():  # nor in what the budget measured
            spec.spec_budget = spec.spec_budget.fresh()
        results = [_measure(cfg, "same_weights", pairs, vllm, prompts, stores)]
        if cfg.train_steps:
            for grpo in grpo_steps(loaded, plain, rows, prompts, lr=cfg.lr, steps=cfg.train_steps,
                                   max_tokens=cfg.max_tokens, seed=cfg.seed):
                weights = grpo.weights  # the weights after the last step
            for engine in _engines(pairs, vllm):
                engine.load_weights(weights, 1)
            results.append(_measure(cfg, "after_training", pairs, vllm, prompts, stores))
    finally:
        if vllm is not None:
            vllm.shutdown()
    return {"config": asdict(cfg), "machine": {"cpus": os.cpu_count()}, "results": [r for rs in results for r in rs]}


def previous_epoch(cfg: SpecBenchConfig, plain: LLMEngine, prompts, temperature: float) -> HistoryStore:
    """The history the bench drafts from: `cfg.history_samples` responses per prompt, sampled by
    `plain` at `temperature` on seeds of their own."""
    store = HistoryStore()
    params = [SamplingParams(temperature=temperature, max_tokens=cfg.max_tokens, seed=cfg.seed * 1000 + 7919 * j + i)
              for i in range(len(prompts)) for j in range(cfg.history_samples)]
    outs = plain.generate([p for p in prompts for _ in range(cfg.history_samples)], params)
    for i, p in enumerate(prompts):
        store.update(p, [o.token_ids for o in outs[i * cfg.history_samples:(i + 1) * cfg.history_samples]])
    return store


def _engines(pairs, vllm) -> list[EngineBackend]:
    """Every engine measured, once each (rlboost's plain one serves its pair and the GRPO steps)."""
    engines = {id(e): e for pair in pairs.values() for e in pair}
    engines.update({id(e): e for e in (vllm.methods.values() if vllm else ())})
    return list(engines.values())


def _measure(cfg, condition, pairs, vllm, prompts, stores) -> list[dict]:
    out = []
    for t, batch in itertools.product(cfg.temperatures, cfg.batches):
        waves = [[p] for p in prompts[:cfg.batch1_requests]] if batch == 1 else [prompts[:batch]]
        params = SamplingParams(temperature=t, max_tokens=cfg.max_tokens, seed=cfg.seed + 1)
        where = {"condition": condition, "temperature": t, "batch": batch}
        for drafter, (backend, (plain, spec)) in itertools.product(cfg.drafters, pairs.items()):
            if backend == "vllm" and drafter == "suffix_tree":
                continue  # vLLM verifies paths only (the config refuses this pair)
            spec.spec_stats = SpecStats()

            def speculating(turn, wave, spec=spec, drafter=drafter):  # each turn drafts afresh from the same history
                if wave == 0:
                    spec.drafter = make_drafter(stores[t], cfg.draft_config(drafter))
                return _timed(spec, waves[wave], params, turn)
            base, timed = _turns(cfg.turns, len(waves), lambda turn, wave: _timed(plain, waves[wave], params, turn),
                                 speculating)
            stats = spec.spec_stats
            out.append(where | {"backend": backend, "drafter": drafter} | _compared(base, timed) | {
                "accepted_per_verify": stats.accepted / stats.verifications if stats.verifications else 0.0,
                "drafted_per_verify": stats.drafted / stats.verifications if stats.verifications else 0.0,
                "spec_step_fraction": stats.verify_steps / stats.decode_steps if stats.decode_steps else 0.0,
                # time of the verify steps over what plain steps would have taken for their tokens: > 1, they lost
                "verify_cost": stats.verify_s / stats.plain_equivalent_s if stats.plain_equivalent_s else None})
        for method, engine in (vllm.methods.items() if vllm else ()):
            before = dataclasses.replace(engine.vllm_spec)
            base, timed = _turns(cfg.turns, len(waves),
                                 lambda turn, wave: _timed(vllm.plain, waves[wave], params, turn),
                                 lambda turn, wave, engine=engine: _timed(engine, waves[wave], params, turn))
            drafts, accepted = engine.vllm_spec.drafts - before.drafts, engine.vllm_spec.accepted - before.accepted
            out.append(where | {"backend": "vllm", "drafter": f"vllm:{method}"} | _compared(base, timed) | {
                "accepted_per_verify": accepted / drafts if drafts else 0.0, "spec_step_fraction": None})
    return out


Timed = tuple[float, list[list[int]]]
"""(seconds, responses) of a rollout, or of several summed and concatenated."""


def _turns(turns: int, waves: int, plain: Callable[[int, int], Timed],
           speculating: Callable[[int, int], Timed]) -> tuple[Timed, Timed]:
    """`turns` rollouts of each side, each of `waves` waves, summed per side: `plain(turn, wave)` and
    `speculating(turn, wave)` take turns wave by wave in counterbalanced order (plain first where
    turn + wave is even: plain, spec, spec, plain, ...). A drift of the machine's speed falls on both
    sides alike within a few seconds, not only across a whole turn: batch 1 times one request per wave,
    and its plain speed moved by a fifth between the rows of one run when a turn was all of a side's
    waves at once. The side that goes first at a new batch size or temperature (its allocations, its
    caches) is not always the same one."""
    runs: tuple[list, list] = ([], [])
    for turn in range(turns):
        for wave in range(waves):
            order = ((0, plain), (1, speculating)) if (turn + wave) % 2 == 0 else ((1, speculating), (0, plain))
            for side, measure in order:
                runs[side].append(measure(turn, wave))
    return tuple((sum(s for s, _ in run), [out for _, outs in run for out in outs]) for run in runs)


def _compared(base: Timed, spec: Timed) -> dict:
    """Speed and identity of a speculating run against the plain one, from (seconds, responses)."""
    (base_s, base_out), (spec_s, spec_out) = base, spec
    base_rate, spec_rate = sum(map(len, base_out)) / base_s, sum(map(len, spec_out)) / spec_s
    return {"tokens_per_s_base": base_rate, "tokens_per_s_spec": spec_rate, "speedup": spec_rate / base_rate,
            "identical": sum(a == b for a, b in zip(base_out, spec_out)) / len(base_out)}


def _timed(engine: EngineBackend, wave, params: SamplingParams, turn: int = 0) -> Timed:
    """One wave of prompts rolled out together, request i seeded by `params.seed`, `turn` and i."""
    t0 = time.perf_counter()
    outs = _generate(engine, wave, [dataclasses.replace(params, seed=params.seed * 7 + 100_003 * turn + i)
                                    for i in range(len(wave))])
    return time.perf_counter() - t0, outs


def _generate(engine: EngineBackend, prompts, params: list[SamplingParams]) -> list[list[int]]:
    """Run `prompts` to completion on an idle engine (any backend); the responses in prompt order."""
    ids = [f"bench-{i}" for i in range(len(prompts))]
    for request_id, prompt, p in zip(ids, prompts, params):
        engine.add(request_id, prompt, p)
    out: dict[str, list[int]] = {request_id: [] for request_id in ids}
    while engine.has_unfinished():
        for chunk in engine.step():
            out[chunk.request_id] += chunk.token_ids
    return [out[request_id] for request_id in ids]


def render(result: dict) -> Table:
    if "replay" in result:
        return render_replay(result)
    table = Table(title=f"HistoSpec vs plain decoding, {result['config']['model']}, {result['machine']['cpus']} CPUs")
    for column in ("condition", "T", "batch", "backend", "drafter", "tok/s plain", "tok/s spec", "speed-up",
                   "accepted/step", "spec steps", "identical"):
        table.add_column(column, justify="right")
    for r in result["results"]:
        steps = r["spec_step_fraction"]
        table.add_row(r["condition"], f"{r['temperature']:g}", str(r["batch"]), r.get("backend", "rlboost"), r["drafter"],
                      f"{r['tokens_per_s_base']:.1f}", f"{r['tokens_per_s_spec']:.1f}", f"{r['speedup']:.2f}x",
                      f"{r['accepted_per_verify']:.2f}", "-" if steps is None else f"{steps:.0%}", f"{r['identical']:.0%}")
    return table
