"""HistoSpec: speculative drafts from the history of each prompt's previous rollout
(docs/histospec.md, "How it works")."""

from rlboost.histospec.drafter import DraftConfig, Drafter, SuffixIndex
from rlboost.histospec.factory import make_drafter
from rlboost.histospec.history import HistoryStore, prompt_key
from rlboost.histospec.suffix_drafter import SuffixDrafter

__all__ = ["DraftConfig", "Drafter", "HistoryStore", "SuffixDrafter", "SuffixIndex", "make_drafter", "prompt_key"]
