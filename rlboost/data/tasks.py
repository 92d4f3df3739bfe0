"""Built-in tasks whose problems are generated from a seed: arithmetic and countdown, and reasoning-gym's
(`reasoning_gym:NAME`, rlboost.data.reasoning_gym); each split into train and eval by rlboost.data.splits.
"""

from __future__ import annotations

import random
from typing import Callable

from rlboost.data.reasoning_gym import dataset_name, reasoning_gym_rows
from rlboost.data.rows import PromptRow
from rlboost.data.splits import draw_problems

ARITHMETIC_OPERATORS = "+-*"


def check_arithmetic_params(digits: int, operators: str, prefix: str = "") -> None:
    """Raise ValueError naming the bad parameter (`prefix` is prepended to its name)."""
    if not isinstance(digits, int) or isinstance(digits, bool) or digits < 1:
        raise ValueError(f"{prefix}digits must be an int >= 1, got {digits!r}")
    if (not isinstance(operators, str) or not operators or len(set(operators)) != len(operators)
            or not set(operators) <= set(ARITHMETIC_OPERATORS)):
        raise ValueError(f"{prefix}operators must be a non-empty subset of {ARITHMETIC_OPERATORS!r} "
                         f"without repeats, got {operators!r}")


def check_countdown_params(num_numbers: int, max_number: int, max_target: int, prefix: str = "") -> None:
    """Raise ValueError naming the bad parameter (`prefix` is prepended to its name)."""
    for name, value, least in (("num_numbers", num_numbers, 2), ("max_number", max_number, 1),
                               ("max_target", max_target, 1)):
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise ValueError(f"{prefix}{name} must be an int >= {least}, got {value!r}")


def arithmetic_rows(n: int, seed: int, split: str, digits: int = 2, operators: str = "+-") -> list[PromptRow]:
    """`a op b` with operands of exactly `digits` digits (0 counts as a 1-digit number)."""
    check_arithmetic_params(digits, operators)
    low, high = (0 if digits == 1 else 10 ** (digits - 1)), 10 ** digits - 1

    def draw(rng: random.Random):
        a, op, b = rng.randint(low, high), rng.choice(operators), rng.randint(low, high)
        return (a, op, b), (a, op, b)

    rows = []
    for index, (a, op, b) in enumerate(draw_problems("arithmetic", n, seed, split, draw)):
        result = a + b if op == "+" else a - b if op == "-" else a * b
        # The wording SmolLM2-135M-Instruct answers best among those we tried (docs/training.md).
        question = f"What is {a} {op} {b}? Give the result after 'Answer:'."
        rows.append(PromptRow(
            data_source="arithmetic", prompt=[{"role": "user", "content": question}], ability="math",
            ground_truth=str(result),
            extra_info={"split": split, "index": index, "a": a, "b": b, "op": op},
            origin=f"arithmetic {split} row {index}"))
    return rows


def _random_expression(rng: random.Random, numbers: list[int]) -> tuple[int, str]:
    """Combine the numbers pairwise in random order with + - * and exact /, using each exactly once.
    Subtraction and division take the larger operand first and subtraction never makes 0, so every
    intermediate value is positive (no `x - x` hiding a number in a trivial term)."""
    items = [(x, str(x)) for x in numbers]
    while len(items) > 1:
        i, j = rng.sample(range(len(items)), 2)
        (x, ex), (y, ey) = items[i], items[j]
        if x < y:
            (x, ex), (y, ey) = (y, ey), (x, ex)
        choices = [("+", x + y), ("*", x * y)]
        if x > y:
            choices.append(("-", x - y))
        if x % y == 0:
            choices.append(("/", x // y))
        op, value = rng.choice(choices)
        items = [item for k, item in enumerate(items) if k not in (i, j)]
        items.append((value, f"({ex} {op} {ey})"))
    value, expression = items[0]
    return value, expression[1:-1]  # the last combination's parentheses enclose everything


def countdown_rows(n: int, seed: int, split: str, num_numbers: int = 3, max_number: int = 20,
                   max_target: int = 100) -> list[PromptRow]:
    """Numbers in 1..max_number and a target in 1..max_target that a random expression over all of
    them reaches, so every problem has a solution using each number exactly once."""
    check_countdown_params(num_numbers, max_number, max_target)

    def draw(rng: random.Random):
        numbers = [rng.randint(1, max_number) for _ in range(num_numbers)]
        target, expression = _random_expression(rng, numbers)
        if not 1 <= target <= max_target:
            return None
        return (tuple(sorted(numbers)), target), (numbers, target, expression)

    rows = []
    for index, (numbers, target, expression) in enumerate(draw_problems("countdown", n, seed, split, draw)):
        listed = ", ".join(map(str, numbers[:-1])) + f" and {numbers[-1]}"
        question = (f"Using the numbers {listed}, write an equation that equals {target}. Use each number "
                    f"exactly once, with only + - * / and parentheses. Think briefly, then give the "
                    f"equation on its own line as `Answer: <equation>`, for example `Answer: (3 + 5) * 2`.")
        rows.append(PromptRow(
            data_source="countdown", prompt=[{"role": "user", "content": question}], ability="math",
            ground_truth={"target": target, "numbers": numbers},
            extra_info={"split": split, "index": index, "solution": expression},
            origin=f"countdown {split} row {index}"))
    return rows


TASKS: dict[str, Callable[..., list[PromptRow]]] = {"arithmetic": arithmetic_rows, "countdown": countdown_rows}


def is_task(name: str) -> bool:
    """Whether `name` is a task `task_rows` generates: a built-in one or `reasoning_gym:NAME`."""
    return name in TASKS or dataset_name(name) is not None


def task_rows(name: str, n: int, seed: int, split: str, **params) -> list[PromptRow]:
    """Rows of the built-in task `name` (or `reasoning_gym:NAME`); `params` are that task's own parameters."""
    if (dataset := dataset_name(name)) is not None:
        return reasoning_gym_rows(n, seed, split, dataset, **params)
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; built-in tasks: {', '.join(TASKS)}, or reasoning_gym:NAME")
    return TASKS[name](n, seed, split, **params)
