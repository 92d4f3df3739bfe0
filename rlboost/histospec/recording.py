"""Recorded RL histories: each step's groups as token ids, the material `rlboost.histospec.replay` replays.

The format (JSONL, one object per line, one line per GRPO group):

    {"run": "T=0.6", "step": 3, "prompt": [1, 2, ...], "responses": [[5, 6, ...], [5, 9, ...], ...]}

- `run`: a label (optional, default ""): a file may hold several runs (e.g. one per temperature),
  each replayed on its own.
- `step`: the RL step (an int >= 0) whose rollout made the responses; a prompt's epoch is how many
  earlier steps of its run it appeared in, so lines need not be in order.
- `prompt`: the prompt's token ids (non-empty); `responses`: the group's responses' token ids, each
  as generated (EOS included), in the group's order.

`read_recording(path)` returns the groups in file order or raises ValueError naming the file, the
line and what was wrong with it; `GroupRecorder` appends lines (one flush per step).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RecordedGroup:
    run: str
    step: int
    prompt: tuple[int, ...]
    responses: tuple[tuple[int, ...], ...]

    def to_json(self) -> str:
        return json.dumps({"run": self.run, "step": self.step, "prompt": list(self.prompt),
                           "responses": [list(r) for r in self.responses]})


def _ids(value, what: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                              for t in value):
        raise ValueError(f"`{what}` must be a list of token ids (ints >= 0)")
    return tuple(value)


def parse_group(line: str) -> RecordedGroup:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON ({e.msg})") from None
    if not isinstance(obj, dict):
        raise ValueError("a line must be a JSON object")
    unknown = sorted(set(obj) - {"run", "step", "prompt", "responses"})
    if unknown:
        raise ValueError(f"unknown keys {unknown}; valid: run, step, prompt, responses")
    run, step = obj.get("run", ""), obj.get("step")
    if not isinstance(run, str):
        raise ValueError("`run` must be a string")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"`step` must be an int >= 0, got {step!r}")
    prompt = _ids(obj.get("prompt"), "prompt")
    if not prompt:
        raise ValueError("`prompt` is empty")
    responses = obj.get("responses")
    if not isinstance(responses, list):
        raise ValueError("`responses` must be a list of responses")
    return RecordedGroup(run, step, prompt, tuple(_ids(r, f"responses[{i}]") for i, r in enumerate(responses)))


def read_recording(path: str | Path) -> list[RecordedGroup]:
    path = Path(path)
    groups = []
    with path.open() as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                try:
                    groups.append(parse_group(line))
                except ValueError as e:
                    raise ValueError(f"{path}:{number}: {e}") from None
    if not groups:
        raise ValueError(f"{path}: no groups recorded")
    return groups


class GroupRecorder:
    """Appends a run's groups to a recording, step by step."""

    def __init__(self, path: str | Path, run: str = ""):
        self.path, self.run = Path(path), run
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def record(self, step: int, groups: Sequence[tuple[Sequence[int], Sequence[Sequence[int]]]]) -> None:
        """One step's groups, each as (prompt ids, response ids of its samples)."""
        lines = [RecordedGroup(self.run, step, tuple(p), tuple(tuple(r) for r in rs)).to_json() + "\n"
                 for p, rs in groups]
        with self.path.open("a") as f:
            f.writelines(lines)
