"""Real GRPO steps for the benchmarks that need trained weights (`bench spec`, `bench weights
--patches`): the showcase's task (arithmetic), rlboost's engine generating, the trainer updating.

`grpo_steps(loaded, engine, rows, prompts, ...)` yields the trainer's weights after each step (the
engine loads them too, so the next step samples from them): `per_step` prompts x 4 samples, T=1."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from rlboost.engine import SamplingParams
from rlboost.rewards import compute_score
from rlboost.rollout import new_groups, run_colocated
from rlboost.trainer import Trainer, TrainerConfig


def grpo_steps(loaded, engine, rows, prompts, *, lr: float, steps: int, max_tokens: int,
               seed: int, per_step: int = 8) -> Iterator[dict[str, torch.Tensor]]:
    trainer = Trainer(loaded.model, TrainerConfig(lr=lr, device="cpu"), temperature=1.0,
                      max_response_length=max_tokens, total_optimizer_steps=steps,
                      pad_token_id=loaded.tokenizer.pad_token_id or 0)
    params = SamplingParams(temperature=1.0, max_tokens=max_tokens)
    for step in range(steps):
        first = step * per_step % len(rows)
        chosen = [(i, prompts[i], rows[i]) for i in range(first, first + per_step) if i < len(rows)]
        groups = list(run_colocated(engine, new_groups(step + 1, chosen, 4, seed), params))
        for g in groups:
            for s in g.samples:
                text = loaded.tokenizer.decode(s.response_ids, skip_special_tokens=True)
                s.reward = compute_score(g.data_source, text, g.ground_truth, g.extra_info)
        trainer.train_step(groups, len(groups))
        engine.load_weights(trainer.weights(), version=step + 1)
        yield trainer.weights()
