"""`rlboost bench spec --record FILE` and `--replay FILE`: HistoSpec's drafters on recorded RL histories.

`--record FILE`: for each of `temperatures`, from the model's own weights, `record_epochs` real GRPO
steps (`rlboost.bench.grpo`: the showcase's reward, n and trainer settings, rlboost's engine on the
CPU, no drafter) over the `prompts` arithmetic prompts (or, with `--data`, the first `prompts` rows of a
veRL dataset scored by the built-in reward: a math set such as gsm8k), every step rolling out each
prompt once (one epoch per step), each step's groups appended to FILE (`rlboost.histospec.recording`,
run `T=<t>`), its reward and lengths logged;
then FILE is replayed. `--replay FILE`: only the replay (`rlboost.histospec.replay`), no model and no
timing: per run, epoch and drafter (`ngram`, the suffix drafter per source, `suffix`, `suffix_tree`), accepted
tokens per verify step and the share of decode steps saved, acceptance being exact match with the
recorded tokens (what rlboost's coupled verifier accepts). `--instances K` deals each step's responses
over K engines, and adds the suffix drafter with siblings forwarded across them (`+forwarded`, a
report late, at most `--sibling-tokens-per-step` per engine per step) beside the local-only one.
`--verify-curve JSON[:SHAPE]` adds each row's decode speed-up at each of `--batches`, projected from its
acceptance and that verify curve (`rlboost.histospec.projection`), labelled as a projection.
"""

from __future__ import annotations

import os
from pathlib import Path

from rich.table import Table

from rlboost.bench.grpo import chat_prompts, grpo_steps
from rlboost.data import DatasetError, arithmetic_rows, read_rows, task_rows
from rlboost.data.tasks import is_task
from rlboost.engine import EngineConfig, LLMEngine
from rlboost.histospec.recording import GroupRecorder, read_recording
from rlboost.histospec.projection import projected_speedup
from rlboost.histospec.replay import replay
from rlboost.models import ModelConfig, load_model
from rlboost.policies.verify_curve import load_verify_curve
from rlboost.rewards.builtin import compute_score
from rlboost.rewards.config import RewardConfig
from rlboost.rewards.loading import load_reward_fn


def record_histories(cfg, path: Path, log=lambda *a: None) -> None:
    """Record `cfg.record_epochs` GRPO steps per temperature to `path` (which must not exist)."""
    if path.exists():
        raise DatasetError(f"--record {path}: the file exists; a recording is written whole (choose another path)")
    rows, reward_fn = _prompts(cfg)
    for t in cfg.temperatures:
        loaded = load_model(ModelConfig(path=cfg.model))  # each temperature trains from the same weights
        prompts = chat_prompts(loaded.tokenizer, rows)
        engine = LLMEngine(load_model(ModelConfig(path=cfg.model)).model, EngineConfig(device="cpu"),
                           eos_token_ids=loaded.eos_token_ids)
        recorder = GroupRecorder(path, run=f"T={t:g}")
        for step, grpo in enumerate(grpo_steps(loaded, engine, rows, prompts, lr=cfg.lr, steps=cfg.record_epochs,
                                               max_tokens=cfg.max_tokens, seed=cfg.seed, per_step=len(prompts),
                                               temperature=t, reward_fn=reward_fn), 1):
            recorder.record(step, [(g.samples[0].prompt_ids, [s.response_ids for s in g.samples]) for g in grpo.groups])
            tokens = [len(s.response_ids) for g in grpo.groups for s in g.samples]
            log(f"T={t:g} step {step}: reward {grpo.reward_mean:.3f}, groups with signal {grpo.groups_with_signal:.0%}, "
                f"{sum(tokens) / len(tokens):.1f} tokens per response, grad norm {grpo.grad_norm:.3g}")


def _prompts(cfg) -> tuple[list, object]:
    """The rows to record and their reward (None: the showcase's): `cfg.data`'s first `cfg.prompts` rows
    (a file's, or a built-in task's train split) or the showcase's arithmetic prompts; `cfg.reward`'s
    function, else the built-in one for `cfg.data`."""
    if is_task(cfg.data):
        rows = task_rows(cfg.data, cfg.prompts, cfg.seed, "train")
    elif cfg.data:
        rows = read_rows(cfg.data)[:cfg.prompts]
        if not rows:
            raise DatasetError(f"--data {cfg.data}: no rows")
    else:
        rows = arithmetic_rows(cfg.prompts, cfg.seed, "train")
    if cfg.reward:
        return rows, load_reward_fn(RewardConfig(path=cfg.reward))
    return rows, compute_score if cfg.data else None


def replay_result(cfg, path: Path) -> dict:
    """`cfg` validated (`SpecBenchConfig.validate`)."""
    try:
        groups = read_recording(path)
    except (OSError, ValueError) as e:
        raise DatasetError(f"--replay: {e}") from None
    spread = {"instances": cfg.instances, "stream_interval": cfg.stream_interval,
              "sibling_tokens_per_step": cfg.sibling_tokens_per_step, "min_order": cfg.min_order,
              "suffix_tree_tokens": cfg.suffix_tree_tokens}
    rows = replay(groups, config=cfg.draft_config("ngram"), instances=cfg.instances, stream_interval=cfg.stream_interval,
                  sibling_tokens_per_step=cfg.sibling_tokens_per_step)
    if cfg.verify_curve:  # a projection from the acceptance, labelled as one wherever it is shown
        curve = load_verify_curve(cfg.verify_curve, "--verify-curve")
        spread["verify_curve"] = curve.source
        for row in rows:
            row["projected_speedup"] = {b: projected_speedup(row, b, curve) for b in cfg.batches}
    return {"config": {"recording": str(path)} | ({"model": cfg.model, "prompts": cfg.prompts,
                                                   "record_epochs": cfg.record_epochs, "data": cfg.data,
                                                   "reward": cfg.reward} if cfg.record else {}) | spread,
            "machine": {"cpus": os.cpu_count()}, "replay": rows}


def render_replay(result: dict) -> Table:
    cfg = result["config"]
    spread = (f", {cfg['instances']} instances, reports every {cfg['stream_interval']} tokens, "
              f"{cfg['sibling_tokens_per_step']} forwarded tokens per instance per step"
              if cfg.get("instances", 1) > 1 else "")
    projected = sorted(result["replay"][0].get("projected_speedup", {})) if result["replay"] else []
    caption = (f"projected bN: decode speed-up at batch N, a projection from the acceptance and the verify curve "
               f"{cfg['verify_curve']} (whole drafts, the batch's drafts independent; not measured)"
               if projected else None)
    table = Table(title=f"HistoSpec drafters replayed on {cfg['recording']} (exact-match acceptance{spread})",
                  caption=caption)
    for column in ("run", "epoch", "drafter", "responses", "tokens", "accepted/verify", "acceptance",
                   "steps saved", *(f"projected b{b}" for b in projected)):
        table.add_column(column, justify="right")
    for r in result["replay"]:
        table.add_row(r["run"], str(r["epoch"]), r["drafter"], str(r["responses"]), str(r["tokens"]),
                      f"{r['accepted_per_verify']:.2f}", f"{r['acceptance_rate']:.0%}", f"{r['steps_saved']:.0%}",
                      *(f"{r['projected_speedup'][b]:.2f}x" for b in projected))
    return table
