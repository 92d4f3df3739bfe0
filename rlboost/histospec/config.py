"""HistoSpec configuration (`rollout.histospec.*`): the drafter's settings plus on/off and the history bound."""

from __future__ import annotations

from dataclasses import dataclass

from rlboost.histospec.drafter import DraftConfig


@dataclass
class HistoSpecConfig(DraftConfig):
    enabled: bool = False
    """Speculative decoding drafted from each prompt's responses in its previous rollout. Lossless: the
    same tokens come out as without it (given the same logits); only the speed changes. The engine
    speculates only on decode steps of at most `engine.spec_max_batch` requests, and there only where
    its measured time per token beats plain decoding."""
    history_max_tokens: int = 5_000_000
    """Response tokens kept in the history store; beyond it, the least recently updated prompts go."""

    def validate(self) -> None:
        """Raise ValueError naming the offending field."""
        try:
            super().validate()
        except ValueError as e:
            raise ValueError(f"rollout.histospec.{e}") from None
        if self.history_max_tokens < 0:
            raise ValueError(f"rollout.histospec.history_max_tokens must be >= 0, got {self.history_max_tokens}")
