"""reasoning-gym rows scored by their dataset's own checker (rows from rlboost.data.reasoning_gym)."""

from __future__ import annotations

import json
from typing import Any

from rlboost.data.reasoning_gym import SOURCE_PREFIX, build_dataset, package
from rlboost.rewards.answers import final_answer


def _entry(key: dict, ground_truth: str) -> tuple[Any, dict]:
    """(dataset, entry) the row's key regenerates; ValueError when it is not the row's (another
    reasoning-gym version, a row edited by hand)."""
    dataset = build_dataset(key["dataset"], json.dumps(key.get("config") or {}, sort_keys=True), int(key["seed"]))
    entry = dataset[int(key["entry"])]
    if str(entry["answer"]) != str(ground_truth):
        raise ValueError(f"reasoning-gym's {key['dataset']} entry {key['entry']} (seed {key['seed']}) regenerates "
                         f"with answer {str(entry['answer'])!r:.60}, not the row's {str(ground_truth)!r:.60}: "
                         f"another reasoning-gym version made the row")
    return dataset, entry


def reasoning_gym_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None) -> float:
    """The dataset's own checker on the response's final answer (after the last `Answer:`, else in
    `<answer>` tags), in [0, 1]; 0.0 without an answer, and when the checker itself raises on what the
    model wrote (a wrong answer, not a crash, as for math-verify). A row without the regeneration key
    (made by another tool) is checked against an entry of its ground truth and `extra_info["metadata"]`."""
    reasoning_gym, _ = package()
    answer = final_answer(solution_str)
    if answer is None:
        from reasoning_gym.utils import extract_answer

        answer = extract_answer(solution_str)
    if answer is None:
        return 0.0
    key = (extra_info or {}).get("reasoning_gym")
    if key:
        dataset, entry = _entry(key, ground_truth)
        check = dataset.score_answer
    else:
        check = reasoning_gym.get_score_answer_fn(data_source[len(SOURCE_PREFIX):])
        entry = {"question": "", "answer": str(ground_truth), "metadata": (extra_info or {}).get("metadata") or {}}
    try:
        return min(1.0, max(0.0, float(check(answer, entry))))
    except Exception:
        return 0.0
