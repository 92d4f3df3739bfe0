"""The final answer of a response: the text after its last `Answer:`, as every built-in task asks."""

from __future__ import annotations

import re

ANSWER = re.compile(r"answer\s*:", re.IGNORECASE)
# Characters models like to write for the four operations.
OPERATOR_LOOKALIKES = str.maketrans({"×": "*", "÷": "/", "−": "-", "–": "-"})


def final_answer(solution_str: str) -> str | None:
    """The text after the last `Answer:` (any case): the rest of its line, or the next non-empty line
    when it ends the line. Markdown emphasis, backticks, `$` and a trailing period are stripped."""
    matches = list(ANSWER.finditer(solution_str))
    if not matches:
        return None
    lines = solution_str[matches[-1].end():].split("\n")
    text = _strip_markup(lines[0])
    if not text:
        text = _strip_markup(next((line for line in lines[1:] if line.strip()), ""))
    return text.translate(OPERATOR_LOOKALIKES)


def _strip_markup(text: str) -> str:
    return text.strip().lstrip("*_`$ \t").rstrip("*_`$ \t.")
