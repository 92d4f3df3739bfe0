"""The next batch's share of an engine in a step's tail (`rlboost.policies.tail_share.ahead_slots`): the
sequences the step leaves free, and where the engine's KV cache binds, only what the step's samples can
never need, against a brute-force reference."""

from __future__ import annotations

import random

import pytest

from rlboost.policies.tail_share import KV_SHARE, ahead_slots


def reference(max_running: int, held: int, kv: int | None, held_context: float, ahead_context: float) -> int:
    """The most samples n of the batch ahead such that the engine's sequences hold both batches and, with
    a bounded cache, the step's at their longest and the batch ahead's at their expected length fit in
    KV_SHARE of it."""
    best = 0
    for n in range(max_running + 1):
        if held + n > max_running:
            break
        if kv is not None and held * held_context + n * ahead_context > KV_SHARE * kv:
            break
        best = n
    return best


def test_without_a_kv_bound_it_is_the_sequences_the_step_leaves_free():
    assert ahead_slots(16, 5) == 11
    assert ahead_slots(16, 16) == 0
    assert ahead_slots(16, 20) == 0  # the step's own samples may queue there: the batch ahead gets nothing


def test_a_kv_cache_that_binds_first_bounds_the_batch_ahead():
    # 100,000 tokens of KV; 4 of the step's samples may reach 8,000 each: 95,000 - 32,000 = 63,000 left,
    # 15 samples of the batch ahead at 4,000 each, not the 252 sequences free
    assert ahead_slots(256, 4, 100_000, 8_000, 4_000) == 15
    # the step's samples alone may fill it: none
    assert ahead_slots(256, 12, 100_000, 8_000, 4_000) == 0
    # a large cache: the sequences bind again
    assert ahead_slots(16, 4, 10_000_000, 8_000, 4_000) == 12


def test_it_matches_the_reference_on_random_engines():
    rng = random.Random(0)
    for _ in range(2000):
        max_running = rng.randint(0, 64)
        held = rng.randint(0, 80)
        kv = rng.choice([None, rng.randint(0, 400_000)])
        held_context, ahead_context = rng.uniform(100, 20_000), rng.uniform(100, 20_000)
        args = (max_running, held, kv, held_context, ahead_context)
        assert ahead_slots(*args) == reference(*args), args


def test_a_bounded_cache_without_the_samples_contexts_is_an_error():
    with pytest.raises(ValueError, match="contexts"):
        ahead_slots(16, 2, 100_000)
    with pytest.raises(ValueError, match=">= 0"):
        ahead_slots(-1, 0)


def test_the_step_s_samples_count_at_their_longest_the_batch_ahead_s_at_the_step_s_mean():
    from rlboost.policies.tail_share import tail_contexts

    assert tail_contexts(100, 60, 1000, 300.0) == (1100, 360.0)
    assert tail_contexts(100, 60, 1000, None) == (1100, 1060)  # nothing finished yet: at their longest too
