"""Strict held-out accuracy on the arithmetic task, per operator: `Answer: <right number>` or nothing.

    python examples/eval_arithmetic.py [MODEL_PATH] [key=value ...]

MODEL_PATH is `smollm2` (the untrained model, the default) or a checkpoint's `hf/` folder. The
held-out prompts are the eval split of `configs/smollm2_arithmetic.yaml` (same seed, same size).
"""

from __future__ import annotations

import sys
from collections import defaultdict

from rlboost.config import RLBoostConfig, load_config
from rlboost.data import load_datasets
from rlboost.engine import LLMEngine, SamplingParams
from rlboost.models import load_model
from rlboost.rewards import arithmetic_score

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
correct = defaultdict(list)
for row, out in zip(rows, engine.generate(prompts, params)):
    text = tok.decode(out.token_ids, skip_special_tokens=True)
    correct[row.extra_info["op"]].append(arithmetic_score(text, row.ground_truth))
total = [c for v in correct.values() for c in v]
print(f"{model_path}: strict accuracy {sum(total) / len(total):.1%} over {len(total)} responses; "
      + ", ".join(f"{op}: {sum(v) / len(v):.1%} of {len(v)}" for op, v in sorted(correct.items())))
