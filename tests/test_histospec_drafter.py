"""HistoSpec history store and drafter: pure, deterministic rules (DESIGN.md 2.8)."""

from __future__ import annotations

import hashlib
import json
import struct
from collections import Counter

import pytest

from rlboost.histospec import DraftConfig, Drafter, HistoryStore, SuffixIndex, prompt_key
from rlboost.histospec import history


def test_prompt_key_is_stable_blake2b_and_distinguishes_prompts():
    expected = hashlib.blake2b(struct.pack("<3i", 1, 2, 3), digest_size=16).hexdigest()
    assert prompt_key([1, 2, 3]) == prompt_key((1, 2, 3)) == expected
    assert len({prompt_key([1, 2, 3]), prompt_key([1, 2, 4]), prompt_key([3, 2, 1]), prompt_key([1, 2])}) == 4


def test_store_update_replaces_and_skips_empty_responses():
    store = HistoryStore()
    store.update([7, 8], [[1, 2], [3]])
    assert store.responses([7, 8]) == [[1, 2], [3]] and store.response_lengths([7, 8]) == [2, 1]
    store.update([7, 8], [[4, 5, 6], []])
    assert store.responses([7, 8]) == [[4, 5, 6]] and store.num_tokens == 3 and len(store) == 1
    store.update([7, 8], [[], []])
    assert store.responses([7, 8]) == [] and store.num_tokens == 0 and len(store) == 0
    assert store.responses([9]) == [] and store.response_lengths([9]) == []


def test_store_key_collision_never_returns_another_prompts_history(monkeypatch):
    monkeypatch.setattr(history, "prompt_key", lambda ids: "same")
    store = HistoryStore()
    store.update([1, 2, 3], [[10, 11]])
    assert store.responses([4, 5, 6]) == [] and store.response_lengths([4, 5, 6]) == []
    assert store.responses([1, 2, 3]) == [[10, 11]]


def test_store_evicts_least_recently_updated_prompts_first():
    store = HistoryStore(max_tokens=5)
    for p in ([1], [2], [3]):
        store.update(p, [[9, 9]])
    assert store.responses([1]) == [] and len(store) == 2 and store.num_tokens == 4
    store.update([2], [[8, 8]])  # refreshes [2]: [3] is now the oldest
    store.responses([3])  # a lookup does not refresh
    store.update([4], [[7, 7]])
    assert store.responses([3]) == [] and store.responses([2]) == [[8, 8]] and store.responses([4]) == [[7, 7]]


def test_store_state_dict_round_trip_keeps_eviction_order():
    store = HistoryStore(max_tokens=6)
    store.update([1], [[5, 6]])
    store.update([2], [[7], [8]])
    store.update([1], [[9, 9]])  # order now: [2], [1]
    state = json.loads(json.dumps(store.state_dict()))
    loaded = HistoryStore(max_tokens=6)
    loaded.load_state_dict(state)
    assert loaded.state_dict() == store.state_dict() and loaded.num_tokens == 4
    loaded.update([3], [[1, 1, 1]])
    assert loaded.responses([2]) == [] and loaded.responses([1]) == [[9, 9]]


def test_suffix_index_prefers_longest_suffix_and_backs_off():
    index = SuffixIndex([[1, 2, 3, 4, 5], [9, 2, 3, 4, 6]], min_order=3, max_order=7)
    assert index.next_tokens([1, 2, 3, 4]) == (Counter({5: 1}), 4)
    assert index.next_tokens([2, 3, 4]) == (Counter({5: 1, 6: 1}), 3)
    long = SuffixIndex([[10, 11, 12, 13, 14, 15, 16, 17]], min_order=3, max_order=7)
    assert long.next_tokens([99, 98, 97, 96, 12, 13, 14]) == (Counter({15: 1}), 3)


def test_suffix_index_counts_and_min_order():
    index = SuffixIndex([[1, 2, 3, 7], [1, 2, 3, 7], [1, 2, 3, 8]], min_order=3, max_order=7)
    assert index.next_tokens([0, 1, 2, 3]) == (Counter({7: 2, 8: 1}), 3)
    assert index.next_tokens([2, 3]) is None  # (2, 3) occurs but is shorter than min_order
    assert index.next_tokens([4, 5, 6]) is None


def test_suffix_index_prefix_is_context_only():
    index = SuffixIndex([[5, 6]], min_order=3, max_order=7, prefix=[1, 2, 3, 4])
    assert index.next_tokens([2, 3, 4]) == (Counter({5: 1}), 3)
    assert index.next_tokens([1, 2, 3]) is None  # never predicts a prompt token


def test_draft_follows_most_frequent_continuation_and_respects_max_len():
    index = SuffixIndex([[1, 2, 3, 4, 5, 6]] * 2 + [[1, 2, 3, 9, 9, 9]], min_order=3, max_order=7)
    assert index.draft([1, 2, 3], 8, 0.1) == [4, 5, 6]
    assert index.draft([1, 2, 3], 2, 0.1) == [4, 5]
    assert index.draft([1, 2, 3], 0, 0.1) == []


def test_draft_stops_below_min_probability():
    index = SuffixIndex([[5, 6, 7, 1, 2, 3, 100 + i] for i in range(11)], min_order=3, max_order=7)
    assert index.draft([5, 6, 7], 8, 0.1) == [1, 2, 3]  # then 11 candidates at 1/11 < 0.1 each
    assert index.draft([5, 6, 7], 8, 0.09) == [1, 2, 3, 100]


def test_draft_tie_breaks_on_smallest_token_id():
    index = SuffixIndex([[1, 2, 3, 9], [1, 2, 3, 4]], min_order=3, max_order=7)
    assert index.draft([1, 2, 3], 1, 0.1) == [4]


@pytest.mark.parametrize("bad, field", [(dict(min_order=0), "min_order"), (dict(max_order=2), "max_order"),
                                        (dict(min_probability=0.0), "min_probability"),
                                        (dict(min_probability=1.5), "min_probability"),
                                        (dict(min_draft=0), "min_draft"), (dict(initial_draft=9), "initial_draft")])
def test_draft_config_validate_names_the_field(bad, field):
    with pytest.raises(ValueError, match=field):
        DraftConfig(**bad).validate()


PROMPT = [50, 51, 52, 53]
# (10, 11, 12) recurs with different continuations: only the longer match is unambiguous.
RESPONSE = [10, 11, 12, 13, 10, 11, 12, 14, 15, 16]


def test_drafter_without_history_proposes_nothing():
    drafter = Drafter(HistoryStore())
    drafter.start("r", PROMPT)
    assert drafter.propose("r", PROMPT + [10, 11, 12]) == [] and drafter.propose("unknown", PROMPT) == []


def test_drafter_proposes_the_history_continuation():
    store = HistoryStore()
    store.update(PROMPT, [RESPONSE])
    drafter = Drafter(store)
    drafter.start("r", PROMPT)
    for j in range(len(RESPONSE) + 1):
        assert drafter.propose("r", PROMPT + RESPONSE[:j]) == RESPONSE[j:j + 4]


def test_drafter_adapts_draft_length_within_bounds():
    store = HistoryStore()
    store.update(PROMPT, [RESPONSE])
    drafter = Drafter(store, DraftConfig(min_draft=1, initial_draft=4, max_draft=6))
    drafter.start("r", PROMPT)
    lengths = []
    for _ in range(4):
        drafter.feedback("r", drafter.draft_length("r"), drafter.draft_length("r"))
        lengths.append(drafter.draft_length("r"))
    assert lengths == [5, 6, 6, 6]
    drafter.feedback("r", 6, 5)  # min(length - 1, accepted + 1) = 5
    assert drafter.draft_length("r") == 5
    drafter.feedback("r", 5, 1)  # -> 2
    drafter.feedback("r", 0, 0)  # nothing drafted: no change
    assert drafter.draft_length("r") == 2
    drafter.feedback("r", 2, 0)
    drafter.feedback("r", 1, 0)
    assert drafter.draft_length("r") == 1 and drafter.propose("r", PROMPT) == RESPONSE[:1]
    with pytest.raises(ValueError):
        drafter.feedback("r", 1, 2)


def test_drafter_finish_forgets_and_invalidate_picks_up_store_updates():
    store = HistoryStore()
    store.update(PROMPT, [[1, 2, 3]])
    drafter = Drafter(store)
    drafter.start("a", PROMPT)
    store.update(PROMPT, [[7, 8, 9]])
    drafter.start("b", PROMPT)
    assert drafter.propose("a", PROMPT) == drafter.propose("b", PROMPT) == [1, 2, 3]  # cached index
    drafter.invalidate()
    drafter.start("c", PROMPT)
    assert drafter.propose("a", PROMPT) == drafter.propose("c", PROMPT) == [7, 8, 9]
    drafter.finish("a")
    assert drafter.propose("a", PROMPT) == []
    with pytest.raises(KeyError):
        drafter.draft_length("a")
