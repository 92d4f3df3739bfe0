"""HistoSpec configuration (`rollout.histospec.*`)."""

from __future__ import annotations

from dataclasses import dataclass

from rlboost.histospec.drafter import DraftConfig


@dataclass
class HistoSpecConfig:
    enabled: bool = False
    """Speculative decoding drafted from each prompt's responses in its previous rollout. Lossless: the
    same tokens come out as without it (given the same logits); only the speed changes. The engine
    speculates only on decode steps of at most `engine.spec_max_batch` requests, and there only where
    its measured time per token beats plain decoding."""
    max_order: int = 7
    """Longest suffix of a running response matched in the history."""
    min_order: int = 3
    """Shortest suffix matched (the back-off floor)."""
    min_probability: float = 0.1
    """Drafting follows the most frequent continuation while its empirical probability stays at least this."""
    min_draft: int = 1
    """Shortest draft a request shrinks to after rejections."""
    max_draft: int = 8
    """Longest draft a request grows to while its drafts are fully accepted."""
    initial_draft: int = 4
    """Draft length of a new request."""
    history_max_tokens: int = 5_000_000
    """Response tokens kept in the history store; beyond it, the least recently updated prompts go."""

    def draft_config(self) -> DraftConfig:
        return DraftConfig(self.max_order, self.min_order, self.min_probability, self.min_draft, self.max_draft,
                           self.initial_draft)

    def validate(self) -> None:
        """Raise ValueError naming the offending field."""
        try:
            self.draft_config().validate()
        except ValueError as e:
            raise ValueError(f"rollout.histospec.{e}") from None
        if self.history_max_tokens < 0:
            raise ValueError(f"rollout.histospec.history_max_tokens must be >= 0, got {self.history_max_tokens}")
