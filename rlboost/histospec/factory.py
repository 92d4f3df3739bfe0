"""The drafter `rollout.histospec.drafter` names, over a history store."""

from __future__ import annotations

from rlboost.histospec.drafter import SUFFIX_DRAFTERS, DraftConfig, Drafter
from rlboost.histospec.history import HistoryStore
from rlboost.histospec.suffix_drafter import SuffixDrafter


def make_drafter(store: HistoryStore, config: DraftConfig | None = None) -> Drafter | SuffixDrafter:
    config = config or DraftConfig()
    config.validate()
    return SuffixDrafter(store, config) if config.drafter in SUFFIX_DRAFTERS else Drafter(store, config)
