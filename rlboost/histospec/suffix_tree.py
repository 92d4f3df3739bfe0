"""A depth-bounded suffix trie over token sequences, scored as in SuffixDecoding (arXiv 2411.04975).

Contract:
- Every substring of at most `max_depth` tokens of the indexed sequences is a path from the root;
  a node's `count` is how many times its substring occurs, `total` how many of those occurrences
  are followed by a token (the sum of its children's counts). A token's empirical probability after
  a substring is child.count / node.total: occurrences at a sequence's end (a growing request's own
  open suffix) predict nothing, so they do not dilute it.
- `extend(tokens, state)` appends tokens to one sequence: `state` (from `start()` or an earlier
  `extend`) is that sequence's open suffixes, so sequences grow incrementally in O(max_depth) per
  token, and several sequences may continue one shared prefix (a prompt's tail, then each response).
- `candidates(context, min_match, ...)` yields, for every suffix of `context` of min_match..max_depth
  tokens that occurs (all lengths up to the longest that does: a substring of an occurring one
  occurs too), the greedy draft from it: the most frequent next token (ties: smallest id) while the
  draft's estimated acceptance (the product of the empirical probabilities along it) stays at least
  `min_probability`, at most `max_len(match_len)` tokens. A path that runs into the depth bound is
  re-anchored on the longest suffix that still fits. `score` is the draft's expected accepted tokens,
  the sum of those products (SuffixDecoding's tree score, for one path); `support` how often the
  matched suffix was followed by a token.
- `tree(context, min_match, min_probability, max_depth, budget)`: for every suffix of `context` of
  min_match..max_depth - 1 tokens that occurs, its `budget` likeliest continuations, best first
  (SuffixDecoding's tree expansion): a continuation's probability is the product of the empirical
  probabilities along it, at least `min_probability`, and at most `max_depth` tokens long
  (re-anchored at the depth bound like a path). Returns each continuation with its highest
  probability over the matched lengths; with a continuation, every prefix of it is there, as
  likely or likelier. Pure and deterministic.
"""

from __future__ import annotations

import heapq

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Candidate:
    tokens: list[int]
    """The drafted tokens."""
    score: float
    """Expected accepted tokens: the sum over the draft of the product of probabilities up to each."""
    match_len: int
    """How many trailing context tokens the draft was matched on."""
    support: int
    """How many times the matched tokens were followed by a token: the evidence behind the draft."""


class SuffixTrie:
    """Nodes are ints indexing flat lists, children are {token: node} dicts of ints: the garbage collector
    tracks none of them (a trie of objects put millions of nodes under every full collection, a pause of
    a quarter second mid-rollout on a CPU engine)."""

    ROOT = 0

    def __init__(self, max_depth: int):
        if max_depth < 2:
            raise ValueError(f"max_depth must be >= 2, got {max_depth}")
        self.max_depth = max_depth
        self._children: list[dict[int, int]] = [{}]
        self._count: list[int] = [0]
        self._total: list[int] = [0]

    @property
    def num_nodes(self) -> int:
        return len(self._count)

    def start(self) -> list[int]:
        """The state of a new, empty sequence."""
        return []

    def extend(self, tokens: Sequence[int], state: list[int]) -> list[int]:
        """Append `tokens` to the sequence whose open suffixes are `state`; returns its new state."""
        children, count, total, keep = self._children, self._count, self._total, self.max_depth - 1
        for token in tokens:
            nxt = []
            # each open suffix (and the empty one, the root) grows by `token`; one at the depth bound closes
            for node in [self.ROOT, *state]:
                kids = children[node]
                child = kids.get(token)
                if child is None:
                    child = kids[token] = len(count)
                    children.append({})
                    count.append(0)
                    total.append(0)
                count[child] += 1
                total[node] += 1
                nxt.append(child)
            state = nxt[:keep]  # nxt[i] has depth i + 1
        return state

    def stats(self, path: Sequence[int]) -> tuple[int, int, dict[int, int]] | None:
        """(count, total, {next token: its count}) of the substring `path`; None if it never occurs."""
        node = self._node(path)
        if node is None:
            return None
        return self._count[node], self._total[node], {t: self._count[c] for t, c in self._children[node].items()}

    def _past_bound(self, path: Sequence[int], node: int) -> int:
        """Where `path` (ending at `node`) continues: `node`, unless the depth bound rather than the data
        ended it, then the node of its longest suffix that fits (re-anchored)."""
        if self._total[node] or len(path) < self.max_depth:
            return node
        found = self._node(path[len(path) - self.max_depth + 1:])
        return found if found is not None else node

    def _node(self, tokens: Sequence[int]) -> int | None:
        node, children = self.ROOT, self._children
        for token in tokens:
            node = children[node].get(token)
            if node is None:
                return None
        return node

    def candidates(self, context: Sequence[int], min_match: int, min_probability: float,
                   max_len: Callable[[int], int]) -> Iterator[Candidate]:
        longest = min(len(context), self.max_depth - 1)
        for k in range(min_match, longest + 1):
            node = self._node(context[len(context) - k:])
            if node is None:
                return  # no longer suffix occurs either
            limit = max_len(k)
            if limit > 0 and self._total[node]:
                yield self._follow(list(context[len(context) - k:]), node, k, limit, min_probability)

    def _follow(self, path: list[int], node: int, match_len: int, limit: int,
                min_probability: float) -> Candidate:
        count, total = self._count, self._total
        draft: list[int] = []
        support = total[node]
        prob, score = 1.0, 0.0
        while len(draft) < limit:
            node = self._past_bound(path, node)
            if not total[node]:
                break
            token, child = min(self._children[node].items(), key=lambda kv: (-count[kv[1]], kv[0]))
            p = prob * count[child] / total[node]
            if p < min_probability:
                break
            prob = p
            score += p
            draft.append(token)
            path.append(token)
            node = child
        return Candidate(draft, score, match_len, support)

    def tree(self, context: Sequence[int], min_match: int, min_probability: float, max_depth: int,
             budget: int) -> dict[tuple[int, ...], float]:
        count, total = self._count, self._total
        found: dict[tuple[int, ...], float] = {}
        longest = min(len(context), self.max_depth - 1)
        for k in range(min_match, longest + 1):
            node = self._node(context[len(context) - k:])
            if node is None:
                break  # no longer suffix occurs either
            matched = tuple(context[len(context) - k:])
            # best first: (-probability, draft); ties go to the smaller draft, so the order is deterministic
            heap: list[tuple[float, tuple[int, ...], int]] = [(-1.0, (), node)]
            taken = 0
            while heap and taken < budget:
                neg, draft, at = heapq.heappop(heap)
                if draft:
                    found[draft] = max(found.get(draft, 0.0), -neg)
                    taken += 1
                if len(draft) >= max_depth:
                    continue
                at = self._past_bound(matched + draft, at)
                for token, child in self._children[at].items():
                    p = -neg * (count[child] / total[at])  # a certain token keeps p exactly
                    if p >= min_probability:
                        heapq.heappush(heap, (-p, draft + (token,), child))
        return found
