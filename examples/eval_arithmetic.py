"""Held-out accuracy on the arithmetic task, per operator. Strict: `Answer: <right number>`. Also the
two halves the shaped reward pays for: the right number as the response's last number, in any
format; and an `Answer:` line, right or wrong.

    python examples/eval_arithmetic.py [MODEL_PATH] [key=value ...]

MODEL_PATH is `smollm2` (the untrained model, the default) or a checkpoint's `hf/` folder. The
held-out prompts are the eval split of `configs/smollm2_arithmetic.yaml` (same seed, same size).
"""

from __future__ import annotations

import re
import sys
from collections import defaultdict

from rlboost.config import RLBoostConfig, load_config
from rlboost.data import load_datasets
from rlboost.engine import LLMEngine, SamplingParams
from rlboost.models import load_model
from rlboost.rewards import arithmetic_score
from rlboost.rewards.builtin import final_answer

args = sys.argv[1:]
model_path = args.pop(0) if args and "=" not in args[0] else "smollm2"
cfg = load_config(RLBoostConfig, "configs/smollm2_arithmetic.yaml", [f"model.path={model_path}", *args])
_, val_rows = load_datasets(cfg.data)
loaded = load_model(cfg.model)
tok = loaded.tokenizer
engine = LLMEngine(loaded.model, cfg.engine, eos_token_ids=loaded.eos_token_ids)
prompts, rows = [], []
for row in val_rows:
    ids = tok.apply_chat_template(row.prompt, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    for j in range(cfg.rollout.val_n):
        prompts.append(list(ids))
        rows.append(row)
params = SamplingParams(temperature=cfg.rollout.val_temperature, max_tokens=cfg.data.max_response_length)
strict, number, formatted = defaultdict(list), defaultdict(list), []
for i, (row, out) in enumerate(zip(rows, engine.generate(prompts, params))):
    text = tok.decode(out.token_ids, skip_special_tokens=True)
    op = row.extra_info["op"]
    strict[op].append(arithmetic_score(text, row.ground_truth))
    numbers = re.findall(r"-?\d+", text.replace(",", ""))
    number[op].append(float(bool(numbers) and int(numbers[-1]) == int(row.ground_truth)))
    formatted.append(final_answer(text) is not None)
    if i < 4:
        print(f"  {row.prompt[-1]['content']!r} -> {text!r}")


def rates(by_op):
    every = [x for v in by_op.values() for x in v]
    return f"{sum(every) / len(every):.1%} (" + ", ".join(
        f"{op} {sum(v) / len(v):.1%}" for op, v in sorted(by_op.items())) + ")"


print(f"{model_path}, {len(formatted)} responses: strict {rates(strict)}; right number {rates(number)}; "
      f"`Answer:` present {sum(formatted) / len(formatted):.1%}")
