"""What a rollout produces: samples (one response each), GRPO groups (a prompt's `n` samples), and
while it runs, its progress."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Sample:
    """One response to one prompt, token by token, with where every token came from."""

    uid: str
    """Unique within the run: `<step>:<group index>:<sample index>`."""
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    """Behaviour log-prob of each response token (log_softmax(logits / T) of the generating weights)."""
    versions: list[int] = field(default_factory=list)
    """Weight version that generated each response token."""
    seed: int = 0
    """Sampling seed: the draw of the token at absolute position t depends only on (seed, t)."""
    finish_reason: str | None = None
    """`stop` or `length` once finished; None while generating."""
    reward: float | None = None
    """The reward function's score of the decoded response, once scored."""

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class Group:
    """A prompt and its `n` samples; GRPO normalises advantages within it, so it trains as a unit."""

    index: int
    """Position of the prompt in the step's batch."""
    row_index: int
    """Index of the prompt's row in the training set (for logs and history keyed by prompt)."""
    data_source: str
    ground_truth: Any
    extra_info: dict
    samples: list[Sample]

    @property
    def finished(self) -> bool:
        return all(s.finished for s in self.samples)


@dataclass(frozen=True)
class RolloutProgress:
    """What the step's rollout is doing now: the console's live view of it."""

    phase: str
    """generating (colocated), seeding (the reserved workers alone, in the seeding window), offloaded
    (the instances generate while the trainer trains), or done."""
    samples_done: int
    samples: int
    tokens: int
    """Generated in the step so far."""
    elapsed_s: float
    wasted_tokens: int = 0
    instances: tuple[int, int, int] | None = None
    """(serving, pulling weights, booting) preemptible instances; None: a backend without any."""

    def describe(self) -> str:
        """One line: `offloaded · 41/64 samples · instances 3 serving, 1 booting · 812 tok/s · 0 tokens lost`."""
        parts = [self.phase, f"{self.samples_done}/{self.samples} samples"]
        if self.instances is not None:
            serving, pulling, booting = self.instances
            counts = [f"{serving} serving"] + [f"{n} {what}" for n, what in ((pulling, "pulling"), (booting, "booting"))
                                                if n]
            parts.append("instances " + ", ".join(counts))
        if self.elapsed_s > 0:
            parts.append(f"{self.tokens / self.elapsed_s:,.0f} tok/s")
        if self.instances is not None:
            parts.append(f"{self.wasted_tokens} tokens lost")
        return " · ".join(parts)
