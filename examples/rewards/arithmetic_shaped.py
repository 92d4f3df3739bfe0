"""A shaped reward for the arithmetic task, with veRL's signature (select it with
`reward.path=examples/rewards/arithmetic_shaped.py`).

SmolLM2-135M-Instruct rarely writes the `Answer:` line before training, so the strict built-in
reward (1 only for `Answer: <correct number>`) gives GRPO almost no signal. This one pays partially
for each half of the skill: the right number anywhere as the last number, and the `Answer:` format.
"""

from __future__ import annotations

import re

from rlboost.rewards import arithmetic_score
from rlboost.rewards.builtin import final_answer


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if arithmetic_score(solution_str, ground_truth) == 1.0:
        return 1.0  # the right number, in the right format
    numbers = re.findall(r"-?\d+", solution_str.replace(",", ""))
    right_number = bool(numbers) and int(numbers[-1]) == int(ground_truth)
    # Format credit needs a well-formed answer line (`Answer: <integer>`), not the bare marker: a first
    # version paid for any `Answer:` and the model learned to quote the prompt's "after 'Answer:'".
    answer = final_answer(solution_str)
    has_format = answer is not None and re.fullmatch(r"-?\d+", answer.replace(",", "")) is not None
    return 0.5 * right_number + 0.1 * has_format
