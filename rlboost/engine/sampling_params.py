"""Per-request sampling parameters (vLLM's names and meanings)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    """Softmax temperature; 0 means greedy (argmax)."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches top_p (0 < top_p <= 1)."""
    top_k: int = 0
    """Keep only the k most likely tokens; 0 or -1 disables it."""
    max_tokens: int = 16
    """Most tokens to generate for this request."""
    stop_token_ids: tuple[int, ...] | None = None
    """Tokens that end the response (included in it), in addition to the model's EOS ids."""
    ignore_eos: bool = False
    """Keep generating past the model's EOS ids (explicit stop_token_ids still stop)."""
    seed: int | None = None
    """Seed of this request's random draws; token t's draw depends only on (seed, t). None: the engine
    picks one and reports it, so the request can be resumed with the same draws."""

    def validate(self) -> None:
        """Raise ValueError naming the offending field."""
        if not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature)
                and self.temperature >= 0):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or self.top_k < -1:
            raise ValueError(f"top_k must be an int >= 1, or 0/-1 to disable, got {self.top_k!r}")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an int >= 1, got {self.max_tokens!r}")
        if self.seed is not None and not isinstance(self.seed, int):
            raise ValueError(f"seed must be an int or None, got {self.seed!r}")
        if self.stop_token_ids is not None and not all(isinstance(t, int) for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be ints, got {self.stop_token_ids!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
