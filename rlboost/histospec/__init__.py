"""HistoSpec: speculative drafts from the history of each prompt's previous rollout (DESIGN.md 2.8)."""

from rlboost.histospec.drafter import DraftConfig, Drafter, SuffixIndex
from rlboost.histospec.history import HistoryStore, prompt_key

__all__ = ["DraftConfig", "Drafter", "HistoryStore", "SuffixIndex", "prompt_key"]
