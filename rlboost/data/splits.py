"""Train and eval splits of generated problems that never share a problem.

Every possible problem belongs to exactly one split, decided by a keyed hash of (task, seed, problem):
one problem in EVAL_SHARE goes to eval. Each split then draws problems from its own seeded stream (or
the task's one stream), keeping only its own and skipping repeats. So the splits never share a problem,
whatever sizes are asked for, and the first n rows of a split do not depend on n.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any, Callable

SPLITS = ("train", "eval")
EVAL_SHARE = 8


def in_eval(task: str, seed: int, key: Any) -> bool:
    # blake2b rather than hash(): str hashes are salted per process.
    digest = hashlib.blake2b(f"{task}|{seed}|{key!r}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % EVAL_SHARE == 0


def draw_problems(task: str, n: int, seed: int, split: str, draw: Callable[[random.Random], Any]) -> list:
    """n distinct problems of `split` from `draw(rng)`, which returns (key, problem) or None to retry."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; use one of {', '.join(SPLITS)}")
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"number of rows must be an int >= 0, got {n!r}")
    rng = random.Random(f"rlboost/{task}/{split}/{seed}")  # str seeds are stable across runs
    want_eval = split == "eval"
    problems, seen = [], set()
    # Small problem spaces run out; a bounded number of draws turns that into an error, not a hang.
    max_draws = 10_000 + 100 * n
    for _ in range(max_draws):
        if len(problems) == n:
            return problems
        drawn = draw(rng)
        if drawn is None:
            continue
        key, problem = drawn
        if key in seen or in_eval(task, seed, key) != want_eval:
            continue
        seen.add(key)
        problems.append(problem)
    if len(problems) == n:
        return problems
    raise ValueError(f"{task}: found only {len(problems)} distinct {split} problems of the {n} asked for "
                     f"in {max_draws} draws; ask for fewer rows or widen the task's parameters")
