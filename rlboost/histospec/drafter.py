"""Draft tokens for running requests from the history of their prompt (HistoSpec, docs/histospec.md, "How it works").

Contract:
- `SuffixIndex` maps every k-gram (min_order <= k <= max_order) of a prompt's history to counts of
  the token that follows it. A lookup uses the longest suffix of the context that occurs, backing off
  down to min_order; shorter contexts find nothing.
- `SuffixIndex.draft` walks greedily: the most frequent next token (ties: smallest id), appended to
  the context, until nothing matches, its empirical probability drops below min_probability, or
  max_len tokens are drafted. Pure and deterministic.
- `Drafter` keeps one index per prompt (shared by the requests of a group) and one draft length per
  request: all accepted -> +1 (up to max_draft); a rejection -> max(min_draft, min(length - 1,
  accepted + 1)). Requests whose prompt has no history, and unknown requests, get no drafts.
- After the store is updated, `invalidate()` makes every request (running ones included) draft from
  the new history.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from rlboost.histospec.history import HistoryStore, PromptCache


DRAFTERS = ("ngram", "suffix", "suffix_tree")
SUFFIX_DRAFTERS = ("suffix", "suffix_tree")
"""The drafters of `rlboost.histospec.suffix_drafter`."""


@dataclass
class DraftConfig:
    drafter: str = "ngram"
    """Which drafter: `ngram` (this module: n-grams of the prompt's previous responses, a draft length
    adapted per request) or `suffix` (`rlboost.histospec.suffix_drafter`: suffix trees over the
    request's own context, its siblings' outputs and the previous responses, the likeliest path of
    the three, its length set by the match length) or `suffix_tree` (the same tries, drafting a tree:
    the `suffix_tree_tokens` likeliest continuations of all three, verified together in one forward;
    SuffixDecoding's tree speculation. rlboost's engine only: vLLM verifies single paths)."""
    max_order: int = 7
    """ngram: longest suffix of a running response matched in the history."""
    min_order: int = 3
    """Shortest suffix matched (the back-off floor), both drafters: shorter matches are too ambiguous
    to pay for a draft."""
    min_probability: float = 0.1
    """ngram: drafting follows the most frequent continuation while its empirical probability stays at
    least this. suffix: while the product of those probabilities along the draft (its estimated
    acceptance) does."""
    min_draft: int = 1
    """Shortest draft a request shrinks to after rejections (ngram; suffix with `suffix_adaptive`)."""
    max_draft: int = 8
    """Longest draft, both drafters (ngram: the length a request grows to while its drafts are fully
    accepted)."""
    initial_draft: int = 4
    """ngram: draft length of a new request."""
    suffix_max_depth: int = 24
    """suffix: depth of the suffix trees, so matches are at most this minus one tokens long; memory and
    time per indexed token grow with it."""
    suffix_spec_factor: float = 1.0
    """suffix: a match of k tokens drafts at most ceil(suffix_spec_factor * k) tokens (SuffixDecoding's
    max_spec_factor): longer matches are more reliable."""
    suffix_adaptive: bool = False
    """suffix: also cap each request's drafts as ngram sizes them (from `max_draft`: +1 after a fully
    accepted draft, down to accepted + 1 after a rejection, at least `min_draft`). For engines whose
    verify step costs per draft token (a CPU; a GPU at large batch): the trie's counts, from a few
    responses, are confident where sampling is not. It drafts fewer tokens that would have been
    accepted too: replayed on SmolLM2's T=0.6 histories, epoch 4 saves 41% of decode steps instead
    of 47%. False: SuffixDecoding's lengths only."""

    suffix_tree_tokens: int = 8
    """suffix_tree: most draft tokens (tree nodes) per request and step, each one more position the
    verify forward computes; the tree's depth is at most `max_draft`."""

    def validate(self) -> None:
        if self.drafter not in DRAFTERS:
            raise ValueError(f"drafter must be one of {', '.join(DRAFTERS)}, got {self.drafter!r}")
        if self.suffix_max_depth < 2:
            raise ValueError("suffix_max_depth must be >= 2")
        if not 0 < self.suffix_spec_factor < float("inf"):
            raise ValueError("suffix_spec_factor must be > 0")
        if self.drafter in SUFFIX_DRAFTERS and self.min_order >= self.suffix_max_depth:
            raise ValueError("min_order must be < suffix_max_depth (the longest match of the suffix drafter)")
        if self.min_order < 1:
            raise ValueError("min_order must be >= 1")
        if self.max_order < self.min_order:
            raise ValueError("max_order must be >= min_order")
        if not 0 < self.min_probability <= 1:
            raise ValueError("min_probability must be in (0, 1]")
        n = self.suffix_tree_tokens
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"suffix_tree_tokens must be an integer >= 1, got {n!r}")
        if self.min_draft < 1:
            raise ValueError("min_draft must be >= 1")
        if not self.min_draft <= self.initial_draft <= self.max_draft:
            raise ValueError("initial_draft must be within [min_draft, max_draft]")


class SuffixIndex:
    """n-gram index over one prompt's history responses (k-gram -> counts of the next token). Plain dicts
    of ints, which the garbage collector does not track (a Counter per k-gram it would walk in every full
    collection; SuffixTrie says what that cost)."""

    def __init__(self, responses: Sequence[Sequence[int]], min_order: int, max_order: int,
                 *, prefix: Sequence[int] = ()):
        # `prefix` (the prompt's tail) precedes every response as context only: it lets the first
        # response tokens be drafted without ever predicting prompt tokens.
        if not 1 <= min_order <= max_order:
            raise ValueError("need 1 <= min_order <= max_order")
        self.min_order, self.max_order = min_order, max_order
        self._next: dict[tuple[int, ...], dict[int, int]] = {}
        tail = list(prefix)[-max_order:]
        for response in responses:
            seq = tail + list(response)
            for i in range(len(tail), len(seq)):
                for k in range(min_order, min(max_order, i) + 1):
                    counts = self._next.setdefault(tuple(seq[i - k:i]), {})
                    counts[seq[i]] = counts.get(seq[i], 0) + 1

    def next_tokens(self, context: Sequence[int]) -> tuple[Counter[int], int] | None:
        """Counts of the token after the longest occurring suffix of `context`, and its order."""
        found = self._lookup(context)
        return (Counter(found[0]), found[1]) if found else None

    def draft(self, context: Sequence[int], max_len: int, min_probability: float) -> list[int]:
        ctx = list(context[-self.max_order:])
        out: list[int] = []
        while len(out) < max_len:
            found = self._lookup(ctx)
            if found is None:
                break
            counts = found[0]
            token = min(counts, key=lambda t: (-counts[t], t))
            if counts[token] / sum(counts.values()) < min_probability:
                break
            out.append(token)
            ctx = (ctx + [token])[-self.max_order:]
        return out

    def _lookup(self, context: Sequence[int]) -> tuple[dict[int, int], int] | None:
        for k in range(min(self.max_order, len(context)), self.min_order - 1, -1):
            counts = self._next.get(tuple(context[len(context) - k:]))
            if counts is not None:
                return counts, k
        return None


@dataclass
class _Request:
    prompt: tuple[int, ...]
    index: SuffixIndex | None
    generation: int
    length: int


class Drafter:
    """Drafts for running requests from their prompt's history, with a per-request draft length."""

    def __init__(self, store: HistoryStore, config: DraftConfig | None = None):
        self.store = store
        self.config = config or DraftConfig()
        self.config.validate()
        self._indexes = PromptCache(store, self._build_index)
        self._generation = 0
        self._requests: dict[str, _Request] = {}

    def start(self, request_id: str, prompt_ids: Sequence[int]) -> None:
        prompt = tuple(prompt_ids)
        self._requests[request_id] = _Request(prompt, self._index_for(prompt), self._generation,
                                              self.config.initial_draft)

    def propose(self, request_id: str, context: Sequence[int]) -> list[int]:
        req = self._requests.get(request_id)
        if req is None:
            return []
        if req.generation != self._generation:
            req.index, req.generation = self._index_for(req.prompt), self._generation
        if req.index is None:
            return []
        return req.index.draft(context, req.length, self.config.min_probability)

    def feedback(self, request_id: str, drafted: int, accepted: int) -> None:
        if not 0 <= accepted <= drafted:
            raise ValueError(f"need 0 <= accepted <= drafted, got accepted={accepted}, drafted={drafted}")
        req = self._requests.get(request_id)
        if req is None or drafted == 0:
            return
        cfg = self.config
        if accepted == drafted:
            req.length = min(cfg.max_draft, req.length + 1)
        else:
            req.length = max(cfg.min_draft, min(req.length - 1, accepted + 1))

    def finish(self, request_id: str) -> None:
        self._requests.pop(request_id, None)

    def add_sibling(self, request_id: str, sibling: str, offset: int, tokens: Sequence[int]) -> int:
        """Siblings on other engines are the suffix drafter's source; this one drafts from history
        only: nothing is taken."""
        return 0

    def draft_length(self, request_id: str) -> int:
        return self._requests[request_id].length

    def invalidate(self, prompts: Iterable[Sequence[int]] | None = None) -> None:
        """The store changed: rebuild the indexes of `prompts` (None: of every prompt) when next used."""
        self._indexes.invalidate(prompts)
        self._generation += 1

    def _index_for(self, prompt: tuple[int, ...]) -> SuffixIndex | None:
        return self._indexes.get(prompt)

    def _build_index(self, prompt: tuple[int, ...], responses: list[list[int]]) -> SuffixIndex:
        return SuffixIndex(responses, self.config.min_order, self.config.max_order, prefix=prompt)
