"""Speculative decoding in the engine (the HistoSpec hook): lossless and exact. Drafters here are test
doubles that propose a known continuation, deliberately wrong tokens, or a mix, as paths or as trees
with decoy branches, so every path (full acceptance, partial acceptance with KV rollback, rejection,
bonus token, a branch other than the first accepted and its K/V moved into place) is exercised."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

import rlboost.engine.engine as engine_module
from conftest import make_engine, random_prompts
from rlboost.engine import EngineConfig, LLMEngine, SamplingParams
from rlboost.engine.draft_tree import DraftTree
from rlboost.models import tiny_model


class ScriptedDrafter:
    """Drafts the reference continuation of each request, wrong at every `wrong_every`-th draft token
    (0: never wrong), `length` tokens at a time."""

    def __init__(self, continuations: dict[tuple, list[int]], length: int = 4, wrong_every: int = 0, vocab=256):
        self.continuations, self.length, self.wrong_every, self.vocab = continuations, length, wrong_every, vocab
        self.prompts: dict[str, tuple] = {}
        self.feedbacks: list[tuple[int, int]] = []

    def start(self, request_id, prompt_ids):
        self.prompts[request_id] = tuple(prompt_ids)

    def propose(self, request_id, context):
        prompt = self.prompts[request_id]
        full = list(prompt) + self.continuations.get(prompt, [])
        draft = full[len(context):len(context) + self.length]
        if self.wrong_every:
            draft = [(t + 1) % self.vocab if (len(context) + i) % self.wrong_every == 0 else t
                     for i, t in enumerate(draft)]
        return draft

    def feedback(self, request_id, drafted, accepted):
        self.feedbacks.append((drafted, accepted))

    def finish(self, request_id):
        self.prompts.pop(request_id, None)


SAMPLING_MODES = {"greedy": dict(temperature=0.0), "sampled": dict(temperature=1.0),
                  "top_k": dict(temperature=0.8, top_k=20), "top_p": dict(temperature=1.0, top_p=0.9)}


def assert_plain_output(plain, spec) -> None:
    """Speculation changed no token, and the log-probs are the target model's."""
    for a, b in zip(plain, spec, strict=True):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4


def verify_every_draft(engine: LLMEngine) -> None:
    """The budget out of the way: every decode step verifies every draft whole."""
    engine.spec_budget.speculate = lambda batch: True
    engine.spec_budget.nodes = lambda batch, sizes: max(sizes, default=0)


def generate(engine: LLMEngine, prompts, params):
    return engine.generate(prompts, [dataclasses.replace(params, seed=100 + i) for i in range(len(prompts))])


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("wrong_every", [0, 3, 1])
def test_speculation_changes_no_token(family, temperature, wrong_every):
    prompts = random_prompts([5, 9, 3, 12], seed=1)
    params = SamplingParams(temperature=temperature, max_tokens=40, ignore_eos=True)
    plain = generate(make_engine(family), prompts, params)
    drafter = ScriptedDrafter({tuple(p): c.token_ids for p, c in zip(prompts, plain)}, wrong_every=wrong_every)
    spec_engine = make_engine(family, spec_max_batch=8)
    spec_engine.drafter = drafter
    spec = generate(spec_engine, prompts, params)
    assert_plain_output(plain, spec)
    assert all(b.finish_reason == "length" and len(b.token_ids) == 40 for b in spec)
    drafted, accepted = (sum(f[i] for f in drafter.feedbacks) for i in (0, 1))
    if wrong_every == 0:
        assert accepted == drafted > 0  # every draft accepted: up to 5 tokens per verification step
    elif wrong_every == 1:
        assert accepted == 0 and drafted > 0  # every draft rejected: one token per step, still exact
    else:
        assert 0 < accepted < drafted  # partial runs: the rejected tail's K/V is rolled back


def test_the_engine_verifies_the_nodes_the_budget_keeps_and_times_a_cut_step_with_its_drafting():
    """The budget's cut (`SpecBudget.nodes`) is what the engine verifies: the first n nodes of every
    draft, the output plain decoding's; cut whole, the step runs plain and is timed as a verify step
    of no extra positions (what its drafting cost)."""
    prompts = random_prompts([5, 9], seed=4)
    params = SamplingParams(temperature=1.0, max_tokens=24, ignore_eos=True)
    plain = generate(make_engine("qwen2"), prompts, params)
    observed = []
    for keep in (2, 0):
        drafter = ScriptedDrafter({tuple(p): c.token_ids for p, c in zip(prompts, plain)}, length=6)
        engine = make_engine("qwen2", spec_max_batch=8)
        engine.drafter = drafter
        engine.spec_budget.speculate = lambda batch: True
        engine.spec_budget.nodes = lambda batch, sizes, keep=keep: keep
        engine.spec_budget.observe = lambda *args: observed.append((keep, *args))
        assert_plain_output(plain, generate(engine, prompts, params))
        steps = [(speculative, extra) for k, _, _, _, speculative, extra in observed if k == keep]
        if keep:
            # 2 nodes of 6 (fewer only where max_tokens leaves less room), both rows 2 columns wider
            assert drafter.feedbacks and max(drafted for drafted, _ in drafter.feedbacks) == 2
            assert max(extra for speculative, extra in steps if speculative) == 2 * 2
        else:
            assert not drafter.feedbacks and engine.spec_stats.verifications == 0
            # (the last step of each request has no room for a draft: plain)
            assert {extra for speculative, extra in steps if speculative} == {0}


class DecoyTreeDrafter(ScriptedDrafter):
    """Drafts ScriptedDrafter's path as a tree in which every draft token has a decoy sibling listed
    before it (token + 1): the path the engine must accept is never the tree's first branch, so its
    nodes sit in columns other than their depths. `shapes` cycles per request over "tree", "path"
    (the plain list) and "none"."""

    def __init__(self, *args, shapes=("tree",), **kwargs):
        super().__init__(*args, **kwargs)
        self.shapes = shapes
        self.accepted_depths: list[int] = []

    def propose(self, request_id, context):
        path = super().propose(request_id, context)
        shape = self.shapes[sorted(self.prompts).index(request_id) % len(self.shapes)]
        if shape != "tree":
            return path if shape == "path" else []
        tokens, parents, parent = [], [], -1
        for t in path:
            tokens += [(t + 1) % self.vocab, t]
            parents += [parent, parent]
            parent = len(tokens) - 1
        return DraftTree(tuple(tokens), tuple(parents))

    def feedback(self, request_id, drafted, accepted):
        super().feedback(request_id, drafted, accepted)
        self.accepted_depths.append(accepted)


@pytest.mark.parametrize("mode", ["greedy", "sampled", "top_k", "top_p"])
@pytest.mark.parametrize("wrong_every, shapes", [(0, ("tree",)), (3, ("tree",)), (3, ("tree", "path", "none"))])
def test_draft_trees_change_no_token(family, mode, wrong_every, shapes):
    prompts = random_prompts([5, 9, 3, 12], seed=1)
    params = SamplingParams(max_tokens=40, ignore_eos=True, **SAMPLING_MODES[mode])
    plain = generate(make_engine(family), prompts, params)
    drafter = DecoyTreeDrafter({tuple(p): c.token_ids for p, c in zip(prompts, plain)}, wrong_every=wrong_every,
                               shapes=shapes)
    spec_engine = make_engine(family, spec_max_batch=8)
    spec_engine.drafter = drafter
    assert_plain_output(plain, generate(spec_engine, prompts, params))
    # branches other than the first were accepted, several nodes deep (their K/V moved into place;
    # with every third token wrong, at most 2)
    assert max(drafter.accepted_depths) >= (2 if wrong_every else 4), drafter.accepted_depths


def test_draft_trees_need_the_accepted_branch_moved_into_place(monkeypatch):
    """The test above has the power to catch a verifier that leaves an accepted branch's K/V in its
    columns: without the move, the next steps attend to the decoys' keys and the output changes."""
    prompts = random_prompts([5, 9], seed=1)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    plain = generate(make_engine("qwen2"), prompts, params)
    monkeypatch.setattr(LLMEngine, "_compact", lambda self, seq, columns: None)
    engine = make_engine("qwen2", spec_max_batch=8)
    engine.drafter = DecoyTreeDrafter({tuple(p): c.token_ids for p, c in zip(prompts, plain)})
    assert [c.token_ids for c in generate(engine, prompts, params)] != [c.token_ids for c in plain]


def test_draft_trees_are_cut_to_the_context_left():
    """Near max_model_len a tree keeps only as many nodes as the cache has positions left (each node's
    K/V takes one until verified), and the output is still plain decoding's."""
    prompts = random_prompts([10, 13], seed=6)
    params = SamplingParams(temperature=1.0, max_tokens=40, ignore_eos=True)
    plain = generate(make_engine("llama", max_model_len=24), prompts, params)
    assert all(len(p) + len(c.token_ids) == 24 for p, c in zip(prompts, plain))
    drafter = DecoyTreeDrafter({tuple(p): c.token_ids for p, c in zip(prompts, plain)}, length=6)
    engine = make_engine("llama", max_model_len=24, spec_max_batch=8)
    engine.drafter = drafter
    assert [c.token_ids for c in generate(engine, prompts, params)] == [c.token_ids for c in plain]
    assert sum(drafter.accepted_depths) > 0


def test_stop_tokens_and_max_tokens_inside_an_accepted_run():
    prompts = random_prompts([6], seed=2)
    plain = make_engine("qwen2").generate(prompts, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))[0]
    stop = plain.token_ids[9]
    drafter = ScriptedDrafter({tuple(prompts[0]): plain.token_ids}, length=8)
    engine = make_engine("qwen2")
    engine.drafter = drafter
    out = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=30, stop_token_ids=(stop,)))[0]
    first = plain.token_ids.index(stop)
    assert out.token_ids == plain.token_ids[:first + 1] and out.finish_reason == "stop"
    out = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=13, ignore_eos=True))[0]
    assert out.token_ids == plain.token_ids[:13] and out.finish_reason == "length"


def test_chunks_stay_within_stream_interval_with_multi_token_steps():
    prompts = random_prompts([4, 7], seed=3)
    params = SamplingParams(temperature=0, max_tokens=50, ignore_eos=True)
    plain = make_engine("llama").generate(prompts, params)
    engine = make_engine("llama", stream_interval=3)
    engine.drafter = ScriptedDrafter({tuple(p): c.token_ids for p, c in zip(prompts, plain)}, length=8)
    for i, p in enumerate(prompts):
        engine.add(f"r{i}", p, params)
    got = {"r0": [], "r1": []}
    while engine.has_unfinished():
        for chunk in engine.step():
            assert 1 <= len(chunk.token_ids) <= 3 and chunk.offset == len(got[chunk.request_id])
            got[chunk.request_id] += chunk.token_ids
    assert [got["r0"], got["r1"]] == [c.token_ids for c in plain]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_abort_and_resume_stay_exact_with_speculation(temperature):
    prompt = random_prompts([8], seed=4)[0]
    params = SamplingParams(temperature=temperature, max_tokens=48, ignore_eos=True, seed=7)
    plain = make_engine("qwen3").generate([prompt], params)[0]
    drafter = ScriptedDrafter({tuple(prompt): plain.token_ids}, length=5, wrong_every=4)
    engine = make_engine("qwen3")
    engine.drafter = drafter
    engine.add("a", prompt, params)
    for _ in range(6):
        engine.step()
    partial = engine.abort(["a"])["a"]
    assert 0 < len(partial.token_ids) < 48
    rest = dataclasses.replace(params, max_tokens=48 - len(partial.token_ids))
    engine.add("b", prompt + partial.token_ids, rest, prompt_len=len(prompt))  # drafts keyed by the original prompt
    resumed = list(partial.token_ids)
    while engine.has_unfinished():
        for chunk in engine.step():
            resumed += chunk.token_ids
    assert resumed == plain.token_ids
    assert any(a for _, a in drafter.feedbacks)  # the resumed request was drafted from its prompt's history


def _marginal_of_second_token(model, prompt: list[int], vocab: int) -> torch.Tensor:
    """Exact P(second generated token) = sum_x1 p(x1 | prompt) p(x2 | prompt, x1), at temperature 1."""
    with torch.no_grad():
        first = torch.softmax(model(torch.tensor([prompt])).logits[0, -1].double(), -1)
        both = torch.tensor([prompt + [x] for x in range(vocab)])
        second = torch.softmax(model(both).logits[:, -1].double(), -1)
    return first @ second


@pytest.mark.parametrize("rule", ["ours", "accept_every_draft"])
def test_sampled_output_is_distributed_as_without_speculation(monkeypatch, rule):
    """A chi-square test of the second token's marginal against the exact one, over 3000 samples whose
    draft always proposes the same token. A wrong acceptance rule must fail it (and does)."""
    vocab, n = 16, 3000
    model = tiny_model("qwen2", seed=3, vocab_size=vocab)
    expected = _marginal_of_second_token(model, [1, 2, 3], vocab) * n
    if rule == "accept_every_draft":
        monkeypatch.setattr(engine_module, "accepted_nodes", lambda tree, drawn: list(range(len(tree))))
    drafted = int(torch.argsort(expected)[vocab // 2])  # a middling-probability token
    engine = LLMEngine(tiny_model("qwen2", seed=3, vocab_size=vocab),
                       EngineConfig(device="cpu", max_num_seqs=500, spec_max_batch=500))
    engine.drafter = ScriptedDrafter({}, length=1)
    engine.drafter.propose = lambda request_id, context: [drafted]
    verify_every_draft(engine)  # every second token verified: the rule, not the budget
    outs = engine.generate([[1, 2, 3]] * n, [SamplingParams(temperature=1.0, max_tokens=3, seed=s) for s in range(n)])
    counts = torch.bincount(torch.tensor([o.token_ids[1] for o in outs]), minlength=vocab).double()
    keep = expected >= 5  # chi-square needs expected counts of at least ~5 per cell
    chi2 = float((((counts - expected) ** 2 / expected)[keep]).sum())
    critical = {10: 29.6, 11: 31.3, 12: 32.9, 13: 34.5, 14: 36.1, 15: 37.7}[int(keep.sum()) - 1]  # p = 0.001
    if rule == "ours":
        assert chi2 < critical, (chi2, counts.tolist(), expected.tolist())
    else:
        assert chi2 > 10 * critical


@functools.cache
def _plain_and_other_draws_of(mode: str, params: SamplingParams, prompts: tuple[tuple[int, ...], ...]):
    """Plain decoding's responses (seeds 100 + i) and other draws (seeds 900 + i): the same for both
    drafters, so made once per mode (deterministic)."""
    prompts = [list(p) for p in prompts]
    plain = generate(make_engine("qwen2"), prompts, params)
    other = make_engine("qwen2").generate(prompts, [dataclasses.replace(params, seed=900 + i) for i in range(len(prompts))])
    return plain, other


def _plain_and_other_draws(mode, params, prompts):
    return _plain_and_other_draws_of(mode, params, tuple(map(tuple, prompts)))


@pytest.mark.parametrize("mode", SAMPLING_MODES)
@pytest.mark.parametrize("drafter", ["ngram", "suffix", "suffix_tree"])
def test_histospec_drafters_end_to_end_change_no_token(drafter, mode):
    """The real drafters on the real engine, in every sampling mode. The history is each response's
    first half (same seeds as now) followed by other draws: the first half is drafted almost entirely
    from it, the drafts past it are wrong (sampled modes), and the output is what plain decoding gives."""
    from rlboost.histospec import DraftConfig, HistoryStore, make_drafter

    prompts = random_prompts([6, 9, 5], seed=5)
    params = SamplingParams(max_tokens=48, ignore_eos=True, **SAMPLING_MODES[mode])
    plain, other = _plain_and_other_draws(mode, params, prompts)
    store = HistoryStore()
    for p, a, b in zip(prompts, plain, other):
        store.update(p, [a.token_ids[:24] + b.token_ids[24:]])
    engine = make_engine("qwen2", spec_max_batch=8)
    engine.drafter = make_drafter(store, DraftConfig(drafter=drafter))
    verify_every_draft(engine)  # measure the drafter, not the budget's timing choices
    assert_plain_output(plain, generate(engine, prompts, params))
    stats = engine.spec_stats
    assert stats.accepted >= 0.8 * 3 * (24 - 1), stats  # the shared first halves, but their first tokens
    if mode == "greedy":  # the history is the whole greedy response
        assert stats.accepted / stats.drafted > 0.9 and stats.decode_steps < 0.4 * (48 - 1), stats
    else:
        assert stats.accepted < stats.drafted, stats  # drafts past the first half were rejected


def test_a_verify_curve_prior_reaches_the_budget_and_changes_no_token(tmp_path):
    """`engine.spec_verify_curve`: the engine's budget takes the curve as its prior (the cut it makes
    from it: tests/test_policies.py), the output is still plain decoding's, and a curve the file does
    not have is refused by the config's check."""
    import json

    curve = tmp_path / "gpu_check.json"
    curve.write_text(json.dumps({"shapes": [{"shape": "tiny", "verify": [
        {"batch": 1, "positions": [1, 2, 4, 8], "relative": [1.0, 1.5, 2.5, 4.5]}]}]}))
    prompts = random_prompts([5, 9], seed=1)
    params = SamplingParams(temperature=1.0, max_tokens=30, ignore_eos=True)
    plain = generate(make_engine("llama"), prompts, params)
    engine = make_engine("llama", spec_max_batch=8, spec_verify_curve=f"{curve}:tiny")
    assert engine.spec_budget.prior.relative(1, 8) == 4.5
    engine.drafter = ScriptedDrafter({tuple(p): c.token_ids for p, c in zip(prompts, plain)}, length=8)
    assert_plain_output(plain, generate(engine, prompts, params))
    with pytest.raises(ValueError, match="engine.spec_verify_curve=.*no verify curve for shape 'qwen'"):
        EngineConfig(spec_verify_curve=f"{curve}:qwen").validate()
