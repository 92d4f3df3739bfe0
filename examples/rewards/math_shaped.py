"""A shaped reward for gsm8k-style math rows (veRL's gsm8k schema: the prompt asks for the final answer
after "####"), with veRL's signature (select it with `reward.path=examples/rewards/math_shaped.py`).

SmolLM2-135M-Instruct solves almost none of gsm8k's problems before training, so the strict built-in
reward (math-verify) gives GRPO no signal: 64 responses to 8 problems scored 0 and no weight moved. As
veRL's gsm8k reward has a `format_score`, this one pays partially for each half of the skill: the right
number as the last number written, and a final answer in the asked form (`#### <number>`).
"""

from __future__ import annotations

import re

from rlboost.rewards.builtin import math_score

NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
FINAL = re.compile(r"####\s*\$?(-?[\d,]+(?:\.\d+)?)\s*$")


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    final = FINAL.search(solution_str.strip())
    if final and math_score(final.group(1).replace(",", ""), ground_truth) == 1.0:
        return 1.0  # the right number, in the asked form
    numbers = NUMBER.findall(solution_str.replace(",", ""))
    right_number = bool(numbers) and float(numbers[-1]) == float(ground_truth)
    return 0.5 * right_number + 0.1 * (final is not None)
