"""HistoSpec across instances with real Ray (`rlboost.hybrid.sibling_relay`): one GRPO group split over
two workers, the tiny model, greedy. The worker running the second sample has its report stream left
unread, so Ray's backpressure holds its engine after a few tokens, while the first sample runs to the
end on the other worker. The manager forwards the first sample's tokens to the held worker, whose
drafter takes exactly them (and no more than the budget); then its stream is read again and its sample
finishes drafting from its sibling. Both samples are exactly the plain engine's greedy output. Every
wait is for an event of the step, bounded by `patience`, never a sleep that decides a result."""

from __future__ import annotations

import itertools

import pytest
import ray

from hybrid_util import ENGINE, MODEL, Row, start_fleet, wait_for
from rlboost.engine import LLMEngine, SamplingParams
from rlboost.histospec.config import HistoSpecConfig
from rlboost.hybrid.harness import reports_held
from rlboost.models import load_model
from rlboost.rollout import new_groups
from rlboost.rollout.step_state import SampleState

pytestmark = pytest.mark.e2e  # a fleet of real processes: `make test-e2e`

PROMPT = [5, 44, 7, 86, 11]
MAX_TOKENS = 40
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
STEPS = itertools.count(1)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    spec = {"histospec": HistoSpecConfig(enabled=True, drafter="suffix")}
    fleet, _ = start_fleet(tmp_path_factory.mktemp("siblings"), num_preemptible=1, spec_overrides=spec)
    yield fleet
    fleet.shutdown()


@pytest.fixture(scope="module")
def plain():
    """The group's sample as a plain in-process engine generates it greedily (both samples are it)."""
    [out] = LLMEngine(load_model(MODEL).model, ENGINE).generate([PROMPT], GREEDY)
    return out.token_ids, out.logprobs


@pytest.mark.parametrize("budget, forwarded", [(64, MAX_TOKENS), (24, 24)])
def test_a_sibling_on_another_worker_is_forwarded_within_the_budget_and_changes_no_token(fleet, plain, budget,
                                                                                       forwarded):
    # JSQ deals the group's first sample to the first name, the second to the other: hold that one
    first, held = sorted(h.name for h in fleet.alive())
    group = new_groups(next(STEPS), [(0, PROMPT, Row())], 2, run_seed=0)
    uid_first, uid_held = (s.uid for s in group[0].samples)
    with reports_held(fleet, held):
        run = fleet.manager.start_step(group, GREEDY, version=fleet.manifest.version, seed_window_s=None,
                                       sibling_tokens_per_step=budget)
        relay = run.siblings

        def first_done_and_forwarded() -> bool:
            return (run.tracked[uid_first].state is SampleState.FINISHED and relay.share.sent[held] == forwarded
                    and relay.in_flight() == 0)  # answered: the held worker's drafter took them

        try:
            wait_for(first_done_and_forwarded, 60, f"{forwarded} tokens of {uid_first} forwarded to {held}")
            assert run.tracked[uid_held].worker == held and run.tracked[uid_held].state is SampleState.RUNNING
        except BaseException:
            run.cancel()  # the step's loop ends with the test
            raise
    [done] = list(run.groups())
    run.wait()
    # the sample that finished first never receives its sibling's tokens (it is done by then); the
    # budget caps what the other received
    assert dict(relay.share.sent) == {held: forwarded}
    stats = ray.get(fleet.worker(held).actor.spec_stats.remote())
    assert stats.sibling_tokens == forwarded  # in the held worker's drafter
    assert ray.get(fleet.worker(first).actor.spec_stats.remote()).sibling_tokens == 0
    tokens, logprobs = plain
    for sample in done.samples:  # lossless: what plain decoding gives, token for token
        assert sample.response_ids == tokens, sample.uid
        assert max(abs(a - b) for a, b in zip(sample.logprobs, logprobs)) < 1e-4, sample.uid
