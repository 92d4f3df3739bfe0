"""The pure policies behind provider failures: launches held back exponentially after failed boots
(reset by a boot that succeeds, capped), and failures told once per cause, then in rare summary lines.
Time is scripted: every call gets its moment."""

from __future__ import annotations

import itertools

import pytest

from rlboost.policies.failure_digest import FailureDigest, cause_of
from rlboost.policies.launch_backoff import LaunchBackoff


def test_the_wait_doubles_with_each_failure_in_a_row_up_to_the_cap():
    backoff = LaunchBackoff(first_s=1.0, max_s=10.0)
    assert backoff.may_launch(0.0)
    waits = [backoff.failed(now) for now in (0.0, 1.0, 3.0, 7.0, 15.0, 25.0)]
    assert waits == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert not backoff.may_launch(34.9) and backoff.wait_s(34.9) == pytest.approx(0.1)
    assert backoff.may_launch(35.0) and backoff.wait_s(35.0) == 0.0


def test_a_boot_that_succeeds_resets_the_backoff():
    backoff = LaunchBackoff(first_s=0.5, max_s=60.0)
    for now in (0.0, 1.0, 2.0):
        backoff.failed(now)
    assert backoff.delay_s == 2.0 and not backoff.may_launch(3.0)
    backoff.booted()
    assert backoff.may_launch(3.0) and backoff.failures == 0
    assert backoff.failed(3.0) == 0.5  # the next failure starts over


def test_a_thousand_failures_in_a_row_stay_at_the_cap():
    backoff = LaunchBackoff(first_s=1.0, max_s=60.0)
    for now in range(2000):  # 2**2000 would overflow a float
        wait = backoff.failed(float(now))
    assert wait == 60.0


def test_no_backoff_when_its_first_wait_is_zero():
    backoff = LaunchBackoff(first_s=0.0, max_s=0.0)
    assert backoff.failed(5.0) == 0.0 and backoff.may_launch(5.0)


@pytest.mark.parametrize("first, most", [(-1.0, 1.0), (2.0, 1.0), (float("nan"), 1.0)])
def test_a_backoff_that_makes_no_sense_is_refused(first, most):
    with pytest.raises(ValueError, match="need 0 <= first_s <= max_s"):
        LaunchBackoff(first, most)


def test_failures_of_different_instances_are_one_cause():
    assert cause_of("rollout worker pree-3 (preemptible) failed to start: OSError: no model at /m") == \
        cause_of("rollout worker pree-17 (preemptible) failed to start: OSError: no model at /m\ntraceback")
    # Ray's ids, addresses and colours differ between attempts of one failure
    a = "\x1b[36mray::W.__init__()\x1b[39m (pid=5629, actor_id=4dc3b47bdba84e90b8a3009501000000, repr=<W at 0x7f5d3b485c50>)"
    b = "ray::W.__init__() (pid=77, actor_id=0123456789abcdef0123456789abcdef, repr=<W at 0x7fab12>)"
    assert cause_of(a) == cause_of(b)
    assert cause_of("pree-3 failed to start: OSError: no model") != cause_of("pree-3 failed to start: MemoryError")


def test_each_cause_is_told_once_then_in_summaries_that_back_off():
    digest = FailureDigest(summary_s=10.0, summary_max_s=40.0)
    missing = "rollout worker pree-{} failed to start: OSError: no model at /m"
    names = itertools.count(1)
    assert digest.failed(0.0, missing.format(next(names)), note="next launch in 1 s") == \
        "rollout worker pree-1 failed to start: OSError: no model at /m; next launch in 1 s"
    lines = []
    for now in range(1, 200):  # the same failure every second, another instance each time
        assert digest.failed(float(now), missing.format(next(names))) is None  # never in full again
        lines += [(now, line) for line in digest.due(float(now), note="next launch in 1 s")]
    # summaries 10, 20, 40, 40 ... s apart (the cap), each the latest message with the count since the last line
    assert [now for now, _ in lines] == [10, 30, 70, 110, 150, 190]
    assert lines[0][1] == ("rollout worker pree-11 failed to start: OSError: no model at /m "
                           "(10 more times in the last 10 s; next launch in 1 s)")
    assert lines[1][1].endswith("(20 more times in the last 20 s; next launch in 1 s)")
    assert sum(int(line.split("(")[1].split()[0]) for _, line in lines) == 190  # every failure counted once
    assert digest.due(191.0) == []  # nothing left to tell... until a repeat has waited long enough
    digest.failed(192.0, missing.format(0))
    assert digest.due(229.0) == [] and len(digest.due(230.0)) == 1


def test_a_new_cause_is_told_at_once_beside_a_repeating_one():
    digest = FailureDigest(summary_s=5.0, summary_max_s=60.0)
    assert digest.failed(0.0, "pree-1 failed to start: OSError: no model") is not None
    assert digest.failed(1.0, "pree-2 failed to start: OSError: no model") is None
    assert digest.failed(2.0, "pree-3 failed to start: TimeoutError: no answer in 120 s") == \
        "pree-3 failed to start: TimeoutError: no answer in 120 s"
    assert digest.due(4.0) == []
    assert digest.due(5.0) == ["pree-2 failed to start: OSError: no model (1 more time in the last 5.0 s)"]
    assert digest.failures == 3


def test_a_cause_quiet_for_long_is_told_in_full_again():
    digest = FailureDigest(summary_s=1.0, summary_max_s=8.0)
    digest.failed(0.0, "pree-1 failed to start: X")
    assert digest.failed(8.0, "pree-2 failed to start: X") is None  # not quiet for longer than the cap yet
    assert digest.due(8.0) == ["pree-2 failed to start: X (1 more time in the last 8.0 s)"]
    assert digest.failed(16.5, "pree-3 failed to start: X") == "pree-3 failed to start: X"


def test_a_zero_summary_wait_tells_every_repeat_at_once():
    digest = FailureDigest(summary_s=0.0, summary_max_s=60.0)
    assert digest.failed(0.0, "tick failed: E") == "tick failed: E"
    assert digest.due(0.0) == []
    digest.failed(0.1, "tick failed: E")
    assert digest.due(0.1) == ["tick failed: E (1 more time in the last 0.1 s)"]
    digest.failed(0.2, "tick failed: E")
    assert digest.due(0.2) == ["tick failed: E (1 more time in the last 0.1 s)"]  # the wait stays 0
    never_quiet = FailureDigest(summary_s=0.0, summary_max_s=0.0)  # every failure a cause seen anew
    assert [never_quiet.failed(t, "tick failed: E") for t in (0.0, 0.1)] == ["tick failed: E"] * 2
