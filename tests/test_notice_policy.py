"""What an instance under a preemption notice keeps (rlboost.policies.notice): the samples its history expects
to finish before the kill, less a margin, at the instance's speed per sample; all others (those not started
too), and all of them without a speed, go back at once."""

from __future__ import annotations

from rlboost.policies.notice import samples_to_take_back


def test_a_sample_stays_only_if_its_expected_rest_fits_before_the_kill_less_the_margin():
    so_far = {"a": 10, "b": 10, "c": 10, "d": 500, "e": 0}
    expected = {"a": 40, "b": 41, "c": None, "d": 300, "e": 5}  # d is past its history: one token more expected
    # 10 tokens/s per sample, 5 s left, 2 s margin: 30 tokens fit; e has not started: it moves for free
    assert samples_to_take_back(so_far, expected, 10.0, 5.0, 2.0) == ["b", "c", "e"]
    assert samples_to_take_back(so_far, expected, 10.0, 5.0, 4.95) == ["a", "b", "c", "d", "e"]  # not even d's token


def test_without_a_speed_everything_goes_back_in_order():
    so_far = {"b": 1, "a": 1}
    assert samples_to_take_back(so_far, {"a": 2, "b": 2}, None, 100.0, 0.0) == ["a", "b"]
    assert samples_to_take_back(so_far, {"a": 2, "b": 2}, 0.0, 100.0, 0.0) == ["a", "b"]
