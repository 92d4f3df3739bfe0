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
    sibling_tokens_per_step: int = 16384
    """Hybrid rollout with the suffix drafter: the most tokens of a group's samples running on other
    workers that the manager forwards to one worker in one step, for its drafter's sibling trie
    (`rlboost.histospec.sibling_share`; 0: off, a worker drafts from the siblings it runs only). It
    bounds what forwarding costs a worker per step: 3-5 bytes a token on the wire and the drafter's
    indexing, about 46 us of CPU a token at suffix_max_depth 24 (measured on a 2-core CPU; the same
    as a local sibling's token). The default keeps that under a second and 80 KB per worker per
    step, and covers every remote sibling of a worker holding 8 groups of 8 x 256 tokens; replayed
    acceptance against the budget is in docs/histospec.md."""

    def validate(self) -> None:
        """Raise ValueError naming the offending field."""
        try:
            super().validate()
        except ValueError as e:
            raise ValueError(f"rollout.histospec.{e}") from None
        if self.history_max_tokens < 0:
            raise ValueError(f"rollout.histospec.history_max_tokens must be >= 0, got {self.history_max_tokens}")
        n = self.sibling_tokens_per_step
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"rollout.histospec.sibling_tokens_per_step must be an integer >= 0 (0: off), got {n!r}")
