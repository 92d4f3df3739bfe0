"""Real GRPO steps for the benchmarks that need trained weights (`bench spec`, `bench weights
--patches`): the showcase's task, reward and trainer settings (`rlboost/configs/showcase.yaml`: shaped
arithmetic reward, n=8 at its temperature, two optimizer steps per RL step), rlboost's engine
generating on the CPU, the trainer updating.

`grpo_steps(loaded, engine, rows, prompts, ...)` yields a `GrpoStep` after each RL step: the trainer's
weights (the engine loads them too, so the next step samples from them) and what moved them, the
reward's spread and the gradient's norm. A step whose groups all scored alike has no advantage and
leaves the weights where they were (weight decay aside), so a benchmark that measures how weights
change reports these beside its numbers. The strict built-in reward gave SmolLM2-135M no such signal:
every group of 5 runs scored all zeros, and no weight moved."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from omegaconf import OmegaConf

from rlboost.configs import SHOWCASE
from rlboost.engine import SamplingParams
from rlboost.rewards.config import RewardConfig
from rlboost.rewards.loading import load_reward_fn
from rlboost.rollout import Group, new_groups, run_colocated
from rlboost.trainer import Trainer, TrainerConfig
from rlboost.trainer.schedule import optimizer_steps


@dataclass
class GrpoStep:
    weights: dict[str, torch.Tensor]
    """The trainer's weights after the step (its own tensors: clone what you keep)."""
    reward_mean: float
    """Mean reward over the step's samples."""
    groups_with_signal: float
    """Share of the step's groups whose rewards differ (the others have no advantage)."""
    grad_norm: float
    """The trainer's `actor/grad_norm` (before clipping; the last optimizer step's)."""
    groups: list[Group]
    """The step's groups, scored (what `rlboost.histospec.recording` records)."""


def grpo_steps(loaded, engine, rows, prompts, *, lr: float, steps: int, max_tokens: int,
               seed: int, per_step: int | None = None, temperature: float | None = None,
               reward_fn=None) -> Iterator[GrpoStep]:
    """`steps` RL steps of `per_step` prompts (default: the showcase's batch) from `rows`/`prompts`, sampled
    at `temperature` (default: the showcase's), scored by `reward_fn` (veRL's signature; default: the
    showcase's)."""
    showcase = OmegaConf.load(SHOWCASE)
    train_cfg = _section(TrainerConfig, showcase.trainer, lr=lr, device="cpu")
    reward_fn = reward_fn or load_reward_fn(_section(RewardConfig, showcase.reward))
    n = showcase.rollout.n
    temperature = showcase.rollout.temperature if temperature is None else temperature
    per_step = per_step or showcase.data.train_batch_size
    trainer = Trainer(loaded.model, train_cfg, temperature=temperature, max_response_length=max_tokens,
                      total_optimizer_steps=steps * optimizer_steps(per_step, train_cfg.mini_batch_groups),
                      pad_token_id=loaded.tokenizer.pad_token_id or 0)
    params = SamplingParams(temperature=temperature, max_tokens=max_tokens)
    for step in range(steps):
        first = step * per_step % len(rows)
        chosen = [(i, prompts[i], rows[i]) for i in range(first, first + per_step) if i < len(rows)]
        groups = list(run_colocated(engine, new_groups(step + 1, chosen, n, seed), params))
        for g in groups:
            for s in g.samples:
                text = loaded.tokenizer.decode(s.response_ids, skip_special_tokens=True)
                s.reward = float(reward_fn(data_source=g.data_source, solution_str=text,
                                           ground_truth=g.ground_truth, extra_info=g.extra_info))
        metrics = trainer.train_step(groups, len(groups))
        engine.load_weights(trainer.weights(), version=step + 1)
        rewards = [s.reward for g in groups for s in g.samples]
        yield GrpoStep(trainer.weights(), sum(rewards) / len(rewards),
                       sum(len({s.reward for s in g.samples}) > 1 for g in groups) / len(groups),
                       float(metrics["actor/grad_norm"]), groups)


def chat_prompts(tokenizer, rows) -> list[list[int]]:
    """Each row's prompt through the tokenizer's chat template, ready to generate from."""
    return [list(tokenizer.apply_chat_template(r.prompt, add_generation_prompt=True, tokenize=True,
                                               return_dict=True)["input_ids"]) for r in rows]


def _section(schema, values, **overrides):
    """The showcase's section as its config dataclass (typed and checked by OmegaConf)."""
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), values, overrides))
