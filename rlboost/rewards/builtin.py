"""The built-in reward: exact checks for the built-in tasks, reasoning-gym's checkers for its datasets,
math-verify for math datasets."""

from __future__ import annotations

import ast
import re
import threading
import unicodedata
from fractions import Fraction
from typing import Any

from rlboost.data.reasoning_gym import SOURCE_PREFIX
from rlboost.rewards.answers import final_answer
from rlboost.rewards.reasoning_gym import reasoning_gym_score

INTEGER = re.compile(r"[+-]?(\d+|\d{1,3}(,\d{3})+)")
SIGNED_DIGITS = re.compile(r"[+-]?\d+")
# Longer answers are not equations a model meant; the bound also keeps ast.parse cheap.
MAX_EXPRESSION_CHARS = 300


def arithmetic_score(solution_str: str, ground_truth: Any) -> float:
    """1.0 iff the answer is one integer equal to ground_truth (thousands commas allowed), compared
    digit by digit: any length (int() refuses strings of over 4300 digits, Python's int-string limit)."""
    answer = final_answer(solution_str)
    if answer is None or not INTEGER.fullmatch(answer):
        return 0.0
    gold = str(ground_truth).strip()
    if not SIGNED_DIGITS.fullmatch(gold):
        raise ValueError(f"an arithmetic ground truth must be an integer, got {gold!r:.80}")
    return float(_canonical_integer(answer.replace(",", "")) == _canonical_integer(gold))


def _canonical_integer(text: str) -> str:
    """`[+-]digits` as ASCII digits without leading zeros, a `+` sign, or the sign of zero (what
    int() would make of it: other scripts' decimal digits count too)."""
    sign, digits = ("-", text[1:]) if text[0] == "-" else ("", text.lstrip("+"))
    digits = "".join(str(unicodedata.decimal(c)) for c in digits).lstrip("0") or "0"
    return ("" if digits == "0" else sign) + digits


def _evaluate(node: ast.AST, used: list[int]) -> Fraction:
    """Value of an expression of integer literals, + - * / and parentheses; anything else raises
    ValueError. Walking the tree ourselves means no text is ever executed."""
    if isinstance(node, ast.Expression):
        return _evaluate(node.body, used)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        used.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)):
        left, right = _evaluate(node.left, used), _evaluate(node.right, used)
        if isinstance(node.op, ast.Add):
            return left + right
        if isinstance(node.op, ast.Sub):
            return left - right
        if isinstance(node.op, ast.Mult):
            return left * right
        if right == 0:
            raise ValueError("division by zero")
        return left / right
    raise ValueError(f"not allowed in a countdown answer: {type(node).__name__}")


def countdown_score(solution_str: str, ground_truth: dict) -> float:
    """1.0 iff the answer (`expr` or `expr = target`) uses exactly the given numbers, each once, and
    equals the target."""
    answer = final_answer(solution_str)
    if answer is None or len(answer) > MAX_EXPRESSION_CHARS:
        return 0.0
    target, numbers = int(ground_truth["target"]), sorted(int(x) for x in ground_truth["numbers"])
    expression, *rest = answer.split("=")
    if len(rest) > 1 or (rest and rest[0].strip() != str(target)):
        return 0.0
    used: list[int] = []
    try:
        value = _evaluate(ast.parse(expression.strip(), mode="eval"), used)
    except (SyntaxError, ValueError, RecursionError):
        return 0.0
    return float(sorted(used) == numbers and value == target)


def math_score(solution_str: str, ground_truth: Any) -> float:
    """1.0 iff math-verify finds the response's answer equivalent to ground_truth. Unparsable input or
    a math-verify failure or timeout scores 0.0: a wrong answer, not a crash. So does a number of over
    4300 digits (sympy meets Python's int-string limit; math-verify reports it as a parse failure)."""
    import math_verify
    from math_verify.errors import TimeoutException  # a BaseException, so `except Exception` misses it

    # math-verify's timeouts use signal.alarm, which only the main thread may set; elsewhere it would
    # raise on every call (and score everything 0), so off the main thread it runs without timeouts.
    # The reward workers call it in their main thread; reward.timeout_s bounds it everywhere.
    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    try:
        gold = math_verify.parse(str(ground_truth), parsing_timeout=timeout)
        if not gold:
            gold = math_verify.parse(f"${ground_truth}$", parsing_timeout=timeout)
        answer = math_verify.parse(solution_str, parsing_timeout=timeout)
        return float(bool(gold and answer and math_verify.verify(gold, answer, timeout_seconds=timeout)))
    except (Exception, TimeoutException):
        return 0.0


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None) -> float:
    """veRL's reward signature: `arithmetic` and `countdown` rows are checked exactly, reasoning-gym's
    (`reasoning_gym/NAME`) by that dataset's own checker, every other data source (gsm8k, MATH, ...)
    with math-verify."""
    if data_source.startswith(SOURCE_PREFIX):
        return reasoning_gym_score(data_source, solution_str, ground_truth, extra_info)
    if data_source == "arithmetic":
        return arithmetic_score(solution_str, ground_truth)
    if data_source == "countdown":
        return countdown_score(solution_str, ground_truth)
    return math_score(solution_str, ground_truth)
