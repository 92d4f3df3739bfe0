"""HistoSpec's suffix-tree drafter: the trie's counts and scores by hand, each of the three sources,
the choice between them, and the hook's lifecycle (DESIGN.md 2.8). Pure and deterministic."""

from __future__ import annotations

import pytest

from rlboost.histospec import DraftConfig, Drafter, HistoryStore, SuffixDrafter, make_drafter
from rlboost.engine.draft_tree import DraftTree
from rlboost.histospec.suffix_tree import Candidate, SuffixTrie


def test_trie_counts_occurrences_and_continuations():
    trie = SuffixTrie(max_depth=4)
    trie.extend([1, 2, 3, 1, 2, 4], trie.start())
    assert trie.stats([1]) == (2, 2, {2: 2})
    assert trie.stats([1, 2]) == (2, 2, {3: 1, 4: 1})
    assert trie.stats([4]) == (1, 0, {})  # the sequence's end: seen, followed by nothing
    assert trie.stats([9]) is None
    # depth is bounded: no path of 5 tokens
    assert trie.stats([1, 2, 3, 1]) == (1, 0, {})


def test_incremental_extension_equals_one_pass_and_shares_a_prefix():
    whole, parts = SuffixTrie(5), SuffixTrie(5)
    whole.extend([7, 8, 9, 7, 8, 1], whole.start())
    state = parts.extend([7, 8], parts.start())
    state = parts.extend([9, 7], state)
    parts.extend([8, 1], state)
    assert whole.num_nodes == parts.num_nodes
    assert list(whole.candidates([7, 8], 1, 0.01, lambda k: 4)) == list(parts.candidates([7, 8], 1, 0.01, lambda k: 4))
    # two continuations of one prefix: the prefix is counted once, each continuation once
    shared = SuffixTrie(4)
    after = shared.extend([5, 6], shared.start())
    shared.extend([1], list(after))
    shared.extend([2], list(after))
    assert shared.stats([5])[0] == 1 and shared.stats([5, 6])[1] == 2


def test_candidates_score_is_expected_accepted_tokens_and_threshold_cuts():
    trie = SuffixTrie(8)
    # after (1, 2): 3 three times, 4 once; after (1, 2, 3): always 5
    trie.extend([1, 2, 3, 5, 0, 1, 2, 3, 5, 0, 1, 2, 3, 5, 0, 1, 2, 4], trie.start())
    by_len = {c.match_len: c for c in trie.candidates([9, 1, 2], 2, 0.1, lambda k: 3)}
    assert set(by_len) == {2}  # (9, 1, 2) never occurs; 1 token is below min_match
    c = by_len[2]
    assert c.tokens == [3, 5, 0]
    assert c.score == pytest.approx(0.75 + 0.75 + 0.75)  # p(3)=3/4, then 5 and 0 are certain
    # a higher threshold stops the draft where its estimated acceptance falls below it
    assert next(trie.candidates([1, 2], 2, 0.8, lambda k: 3)).tokens == []
    # max_len caps it
    assert next(trie.candidates([1, 2], 2, 0.1, lambda k: 1)) == Candidate([3], 0.75, 2, 4)


def test_a_path_past_the_depth_bound_reanchors_on_its_suffix():
    trie = SuffixTrie(3)
    trie.extend([1, 2, 3, 4, 5, 6], trie.start())
    assert next(trie.candidates([1, 2], 2, 0.1, lambda k: 10)).tokens == [3, 4, 5, 6]


def test_tree_expands_the_likeliest_continuations_of_every_match_best_first():
    trie = SuffixTrie(8)
    # after (1, 2): 3 three times, 4 once; after (1, 2, 3): always 5; after 2 alone the same
    trie.extend([1, 2, 3, 5, 0, 1, 2, 3, 5, 0, 1, 2, 3, 5, 0, 1, 2, 4], trie.start())
    found = trie.tree([9, 1, 2], 1, 0.1, max_depth=3, budget=4)
    # per match (2 tokens, 1 token: the same counts here), the 4 likeliest: 3, 3 5, 3 5 0 at 3/4, 4 at 1/4
    assert found == pytest.approx({(3,): 0.75, (3, 5): 0.75, (3, 5, 0): 0.75, (4,): 0.25})
    # the budget takes the likeliest first; max_depth and min_probability bound them
    assert set(trie.tree([1, 2], 2, 0.1, max_depth=3, budget=2)) == {(3,), (3, 5)}
    assert set(trie.tree([1, 2], 2, 0.1, max_depth=1, budget=8)) == {(3,), (4,)}
    assert set(trie.tree([1, 2], 2, 0.5, max_depth=3, budget=8)) == {(3,), (3, 5), (3, 5, 0)}
    assert trie.tree([9, 9], 1, 0.1, max_depth=3, budget=8) == {}  # nothing matched
    # a shorter match can see what the longer one cannot: after (0, 1, 2) it is 3 always, after 2 too
    deep = SuffixTrie(8)
    deep.extend([7, 2, 6, 0, 1, 2, 3], deep.start())
    assert deep.tree([0, 1, 2], 3, 0.1, max_depth=1, budget=4) == {(3,): 1.0}
    assert deep.tree([0, 1, 2], 1, 0.1, max_depth=1, budget=4) == pytest.approx({(3,): 1.0, (6,): 0.5})


def test_a_trees_continuations_are_closed_under_prefixes_and_never_likelier_than_them():
    """What the tree drafter builds its tree on, on repetitive text with uneven counts (a certain
    token after an uncertain one must not round its probability above its prefix's)."""
    import random

    rng = random.Random(0)
    trie = SuffixTrie(8)
    phrases = [[5, 6, 7], [5, 6, 8], [9, 5], [7, 7, 6]]
    for _ in range(3):
        trie.extend([t for _ in range(60) for t in rng.choice(phrases)], trie.start())
    for context in ([5, 6], [7, 7], [9], [6, 7, 9, 5]):
        found = trie.tree(context, 1, 0.01, max_depth=6, budget=16)
        assert found
        for path, p in found.items():
            assert len(path) == 1 or found[path[:-1]] >= p, (path, p)


def test_a_tree_past_the_depth_bound_reanchors_on_its_suffix():
    trie = SuffixTrie(3)
    trie.extend([1, 2, 3, 4, 5, 6], trie.start())
    assert set(trie.tree([1, 2], 2, 0.1, max_depth=10, budget=10)) == {(3,), (3, 4), (3, 4, 5), (3, 4, 5, 6)}


PROMPT = [50, 51, 52]


def _suffix(store=None, sources=("own", "siblings", "history"), **cfg):
    cfg.setdefault("min_order", 1)
    cfg.setdefault("drafter", "suffix")
    return SuffixDrafter(store or HistoryStore(), DraftConfig(**cfg), sources)


def test_history_source_drafts_the_previous_responses_from_the_first_token():
    store = HistoryStore()
    store.update(PROMPT, [[10, 11, 12, 13], [10, 11, 12, 13], [10, 11, 20]])
    drafter = _suffix(store, sources=["history"])
    drafter.start("r", PROMPT)
    # matched on the prompt's last 3 tokens: at most 3 tokens; 12 follows 11 every time, 13 two times in three
    assert drafter.propose("r", PROMPT) == [10, 11, 12]
    assert drafter.propose("r", PROMPT + [10, 11, 12]) == [13]
    assert drafter.propose("r", PROMPT + [99]) == []  # 99 never occurs


def test_own_source_drafts_what_the_request_already_wrote():
    drafter = _suffix(sources=["own"])
    drafter.start("r", PROMPT)
    context = PROMPT + [7, 8, 9, 1, 7, 8]
    assert drafter.propose("r", context) == [9, 1]  # (7, 8) matched: at most 2 tokens
    assert drafter.propose("r", context + [9]) == [1, 7, 8]


def test_siblings_source_drafts_from_a_sibling_further_along():
    drafter = _suffix(sources=["siblings"])
    for rid in "ab":
        drafter.start(rid, PROMPT)
    assert drafter.propose("a", PROMPT + [30, 31, 32, 33, 34]) == []  # nobody else has written anything
    assert drafter.propose("b", PROMPT) == [30, 31, 32]  # a's progress, from b's first token on
    assert drafter.propose("b", PROMPT + [30, 31, 32]) == [33, 34]
    drafter.finish("a")  # a finished response still drafts for its running sibling
    assert drafter.propose("b", PROMPT + [30, 31, 32]) == [33, 34]
    drafter.finish("b")
    drafter.start("c", PROMPT)  # the group is gone with its last request
    assert drafter.propose("c", PROMPT) == []


def test_a_sibling_on_another_engine_drafts_once_its_tokens_are_forwarded():
    local_only, forwarded = _suffix(sources=["siblings"]), _suffix(sources=["siblings"])
    for drafter in (local_only, forwarded):
        drafter.start("r", PROMPT)
    # the sibling runs elsewhere: only the manager's forward brings its tokens here
    assert forwarded.add_sibling("r", "s", 0, [30, 31, 32]) == 3
    assert local_only.propose("r", PROMPT) == []
    assert forwarded.propose("r", PROMPT) == [30, 31, 32]  # from the first token on: after the prompt's tail
    # the next forward continues the sibling's sequence; what it holds already is skipped
    assert forwarded.add_sibling("r", "s", 2, [32, 33, 34]) == 2
    assert forwarded.propose("r", PROMPT + [30, 31, 32]) == [33, 34]
    assert forwarded.add_sibling("r", "s", 0, [30, 31]) == 0
    # after a gap the tokens are a new sequence: no substring spans it (32 34 is not followed by 60)
    assert forwarded.add_sibling("r", "s", 7, [60, 61]) == 2
    assert forwarded.propose("r", PROMPT + [33, 34]) == []
    assert forwarded.propose("r", PROMPT + [60]) == [61]
    assert forwarded.add_sibling("nobody", "s", 0, [1, 2]) == 0  # not running here: nothing taken


def test_forwarded_siblings_go_with_the_group_and_the_ngram_drafter_takes_none():
    drafter = _suffix(sources=["siblings"])
    drafter.start("r", PROMPT)
    drafter.add_sibling("r", "s", 0, [30, 31, 32])
    drafter.finish("r")
    drafter.start("q", PROMPT)  # a new group: the old one's siblings are gone with it
    assert drafter.propose("q", PROMPT) == []
    store = HistoryStore()
    store.update(PROMPT, [[1, 2, 3, 4]])
    ngram = Drafter(store, DraftConfig(min_order=1))
    ngram.start("r", PROMPT)
    before = ngram.propose("r", PROMPT + [1])
    assert ngram.add_sibling("r", "s", 0, [1, 9, 9, 9]) == 0
    assert ngram.propose("r", PROMPT + [1]) == before == [2, 3, 4]


def test_invalidate_starts_new_sibling_groups_and_reloads_history():
    store = HistoryStore()
    store.update(PROMPT, [[1, 2, 3]])
    drafter = _suffix(store, sources=["siblings", "history"])
    drafter.start("old", PROMPT)
    assert drafter.propose("old", PROMPT) == [1, 2, 3]
    drafter.start("sibling", PROMPT)
    drafter.propose("sibling", PROMPT + [40, 41, 42])
    store.update(PROMPT, [[7, 8, 9]])
    drafter.invalidate([PROMPT])
    drafter.start("new", PROMPT)
    # not the old step's sibling (which would win the tie: siblings come before history), nor the old history
    assert drafter.propose("new", PROMPT) == [7, 8, 9]
    assert drafter.propose("old", PROMPT) == [40, 41, 42]  # a running request keeps its group...
    history_only = _suffix(store, sources=["history"])
    history_only.start("old", PROMPT)
    store.update(PROMPT, [[4, 5, 6]])
    assert history_only.propose("old", PROMPT) == [4, 5, 6]  # ...and drafts from the history as it is now
    store.update(PROMPT, [[7, 8, 9]])
    assert history_only.propose("old", PROMPT) == [4, 5, 6]  # built once per generation
    history_only.invalidate()
    assert history_only.propose("old", PROMPT) == [7, 8, 9]


def test_invalidating_one_prompt_leaves_the_groups_of_the_others_whole():
    """A hybrid worker gets a prompt's history with the first of its group's requests in a step: the
    history of a second prompt arriving must not split the first prompt's group, whose other samples
    may reach this worker later in the step (migrated or submitted in a later batch)."""
    other = [5, 6, 7, 8]
    drafter = _suffix(sources=["siblings"])
    drafter.start("a", PROMPT)
    drafter.propose("a", PROMPT + [40, 41, 42])
    drafter.invalidate([other])  # the other prompt's history arrives
    drafter.start("b", PROMPT)  # a sibling of a, submitted after it
    assert drafter.propose("b", PROMPT) == [40, 41, 42]
    drafter.invalidate([PROMPT])
    drafter.start("c", PROMPT)  # the next step's group
    assert drafter.propose("c", PROMPT) == []
    drafter.invalidate()
    drafter.finish("c")
    drafter.start("d", PROMPT)
    assert drafter.propose("d", PROMPT) == []


def test_the_likeliest_source_wins():
    store = HistoryStore()
    store.update(PROMPT, [[5, 6, 1, 2], [5, 6, 3, 4], [5, 6, 3, 9]])  # after (5, 6): 3 two times in three
    drafter = _suffix(store)
    drafter.start("r", PROMPT)
    drafter.start("s", PROMPT)
    drafter.propose("s", PROMPT + [5, 6, 1, 2])  # the sibling went 5 6 1 2: certain, from one sample
    assert drafter.propose("r", PROMPT + [5, 6]) == [1, 2]
    # with the history alone, its likeliest path
    alone = _suffix(store, sources=["history"])
    alone.start("r", PROMPT)
    # 3 at 2/3, then 4 at 1/3 (tied with 9: the smaller id): 2/3 + 1/3 = 1 token expected, fewer than
    # the sibling's 2 certain ones, so the sibling won above
    assert alone.propose("r", PROMPT + [5, 6]) == [3, 4]


def _paths(tree: DraftTree) -> set[tuple[int, ...]]:
    paths: list[tuple[int, ...]] = []
    for token, parent in zip(tree.tokens, tree.parents):
        paths.append((paths[parent] if parent >= 0 else ()) + (token,))
    return set(paths)


def test_the_tree_drafter_merges_every_source_likeliest_first():
    store = HistoryStore()
    store.update(PROMPT, [[5, 6, 1, 2], [5, 6, 3, 4], [5, 6, 3, 9]])  # after (5, 6): 3 at 2/3, 1 at 1/3
    drafter = _suffix(store, drafter="suffix_tree", suffix_tree_tokens=5)
    drafter.start("r", PROMPT)
    tree = drafter.propose("r", PROMPT + [5, 6])
    assert isinstance(tree, DraftTree)
    # the 5 likeliest continuations of (5, 6): 3 (2/3), then 1, 3 4, 3 9, 1 2 (1/3 each); parents
    # before children, the root's likeliest child first; its best path is the path drafter's
    assert _paths(tree) == {(3,), (1,), (3, 4), (3, 9), (1, 2)} and tree.tokens[:2] == (3, 1)
    path = _suffix(store)
    path.start("r", PROMPT)
    assert tree.first_path() == path.propose("r", PROMPT + [5, 6]) == [3, 4]
    # a sibling that went 5 6 1 2 makes its branch certain: it comes first
    drafter.start("s", PROMPT)
    drafter.propose("s", PROMPT + [5, 6, 1, 2])
    tree = drafter.propose("r", PROMPT + [5, 6])
    assert tree.first_path() == [1, 2] and set(tree.tokens[:2]) == {1, 3}
    # the budget bounds the nodes, max_draft the depth
    small = _suffix(store, drafter="suffix_tree", suffix_tree_tokens=2, max_draft=1, initial_draft=1)
    small.start("r", PROMPT)
    assert small.propose("r", PROMPT + [5, 6]) == DraftTree((3, 1), (-1, -1))
    assert small.propose("nobody", PROMPT) == []


def test_draft_length_follows_the_match_length_and_max_draft():
    store = HistoryStore()
    response = list(range(100, 140))
    store.update(PROMPT, [response])
    drafter = _suffix(store, sources=["history"], max_draft=6, suffix_spec_factor=0.5)
    drafter.start("r", PROMPT)
    assert drafter.propose("r", PROMPT + response[:1]) == response[1:3]  # match 4 (prompt's 3 + 1) -> 2
    assert drafter.propose("r", PROMPT + response[:20]) == response[20:26]  # long match: max_draft


def test_a_requests_drafts_shrink_after_rejections_and_grow_back_when_accepted():
    """`suffix_adaptive`: the trie's confidence is capped by what the request's drafts actually got."""
    store = HistoryStore()
    response = list(range(100, 140))
    store.update(PROMPT, [response])
    for adaptive in (True, False):
        drafter = _suffix(store, sources=["history"], max_draft=6, suffix_adaptive=adaptive)
        drafter.start("r", PROMPT)
        assert drafter.propose("r", PROMPT + response[:10]) == response[10:16]
        drafter.feedback("r", 6, 1)  # one of six accepted: two next time
        assert drafter.propose("r", PROMPT + response[:12]) == response[12:14 if adaptive else 18]
        drafter.feedback("r", 2, 2)
        drafter.feedback("r", 3, 3)
        assert drafter.propose("r", PROMPT + response[:14]) == response[14:18 if adaptive else 20]
        drafter.feedback("r", 4, 0)
        assert drafter.propose("r", PROMPT + response[:15]) == response[15:16 if adaptive else 21]
        drafter.start("s", PROMPT)  # a new request starts from max_draft
        assert drafter.propose("s", PROMPT + response[:10]) == response[10:16]


def test_hook_edges_unknown_requests_feedback_and_reused_ids():
    drafter = _suffix()
    assert drafter.propose("nobody", PROMPT) == []
    drafter.finish("nobody")
    drafter.start("r", PROMPT)
    drafter.feedback("r", 3, 1)
    with pytest.raises(ValueError, match="accepted"):
        drafter.feedback("r", 1, 2)
    drafter.propose("r", PROMPT + [1, 2, 1])
    drafter.start("r", PROMPT)  # a reused id starts afresh
    assert drafter.propose("r", PROMPT + [1]) == []


def test_make_drafter_picks_by_config_and_config_is_checked():
    assert type(make_drafter(HistoryStore())) is Drafter
    assert type(make_drafter(HistoryStore(), DraftConfig(drafter="suffix"))) is SuffixDrafter
    assert type(make_drafter(HistoryStore(), DraftConfig(drafter="suffix_tree"))) is SuffixDrafter
    for bad, field in [(dict(drafter="tree"), "drafter"), (dict(suffix_max_depth=1), "suffix_max_depth"),
                       (dict(suffix_spec_factor=0.0), "suffix_spec_factor"),
                       (dict(drafter="suffix", min_order=24), "min_order"),
                       (dict(drafter="suffix_tree", min_order=24), "min_order"),
                       (dict(suffix_tree_tokens=0), "suffix_tree_tokens")]:
        with pytest.raises(ValueError, match=field):
            DraftConfig(**bad).validate()
    with pytest.raises(ValueError, match="sources"):
        SuffixDrafter(HistoryStore(), sources=["elsewhere"])


def test_a_trie_adds_nothing_for_the_garbage_collector_to_traverse():
    # a rollout engine's tries hold millions of nodes: as tracked objects every full collection walks them
    # (a pause of a quarter second mid-step on SmolLM2's CPU engine); ints in lists and dicts are not tracked
    import gc
    gc.collect()
    before = len(gc.get_objects())
    trie = SuffixTrie(24)
    state = trie.start()
    for i in range(400):
        state = trie.extend([i % 97, i % 13, i % 7], state)
    assert trie.num_nodes > 10_000
    assert len(gc.get_objects()) - before < 20
    # the n-gram drafter's index likewise (its k-gram tuples the first collection untracks)
    from rlboost.histospec.drafter import SuffixIndex
    index = SuffixIndex([[i % 97 for i in range(j, j + 400)] for j in range(25)], 1, 6)
    gc.collect()
    assert index.next_tokens([3, 4]) is not None and len(gc.get_objects()) - before < 40
