"""Suffix-tree drafts from three sources (`rollout.histospec.drafter=suffix`, docs/histospec.md, "How it works").

SuffixDecoding's method (arXiv 2411.04975) over the sources an RL request has:
- `own`: a trie over the request's prompt and output so far;
- `siblings`: a trie per prompt over the outputs of the requests on this engine that share the prompt
  and started since the prompt's history was last invalidated (a GRPO group on one engine: the store
  changes between steps; invalidating other prompts leaves the group whole), finished ones included
  until the last of them finishes; each output is taken from the context its request last proposed
  with, so a sibling further along drafts for one behind it. In
  hybrid rollout the group's samples on other instances join it too: `add_sibling(request_id,
  sibling, offset, tokens)` takes tokens of a remote sibling's response (the manager forwards them,
  `rlboost.histospec.sibling_share`) into the trie of every group of `request_id`'s prompt here, each
  remote sibling continuing its own sequence (tokens it already holds are skipped; after a gap a new
  sequence starts, so no substring spans the gap); they go with the group;
- `history`: a trie per prompt over its responses in the `HistoryStore` (the previous rollout).
The tries of `siblings` and `history` start with the prompt's tail, so a response's first tokens
can be drafted too. Per proposal every source yields a candidate per matched suffix length (at
least `min_order` tokens, at most `suffix_max_depth - 1`); the one with the highest expected number
of accepted tokens wins (ties: the one with more occurrences behind it, then the longer match,
then the order of `sources`). A draft is at most
ceil(`suffix_spec_factor` x match length) and `max_draft` tokens, and stops where its estimated
acceptance falls below `min_probability` (`rlboost.histospec.suffix_tree`); with `suffix_adaptive`
each request's drafts are also capped by its own acceptance, as the n-gram drafter sizes them
(`feedback`).
With `drafter=suffix_tree` it proposes a tree instead (`rlboost.engine.draft_tree`): every source's
`suffix_tree_tokens` likeliest continuations of every matched suffix (`SuffixTrie.tree`, at most
`max_draft` deep, each at least `min_probability` likely), merged by token path at the highest
probability any of them gives it, and of those the `suffix_tree_tokens` likeliest (ties: shallower,
then smaller token ids), a node's children likeliest first. Whether a step drafts at
all is the engine's batch-aware budget. Lossless whatever it proposes: the engine verifies.
Pure: no clock, no threads; deterministic for the same calls.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from rlboost.engine.draft_tree import DraftTree
from rlboost.histospec.drafter import DraftConfig
from rlboost.histospec.history import HistoryStore, PromptCache
from rlboost.histospec.suffix_tree import Candidate, SuffixTrie

SOURCES = ("own", "siblings", "history")


@dataclass
class _Group:
    key: tuple[tuple[int, ...], int]
    """(prompt, a serial number): the prompt's groups stay apart."""
    trie: SuffixTrie
    after_prompt: list
    """The trie's state after the prompt's tail: where each member's output starts."""
    members: set[str] = field(default_factory=set)
    remote: dict[str, _Remote] = field(default_factory=dict)
    """Siblings on other engines, by the key the manager sends them under."""


@dataclass
class _Remote:
    state: list
    """Open suffixes of its sequence in the group's trie."""
    held: int = 0
    """Tokens of its response taken (or skipped) so far."""


@dataclass
class _Request:
    prompt: tuple[int, ...]
    group: _Group
    generation: int
    history: SuffixTrie | None = None
    own: SuffixTrie | None = None
    own_state: list = field(default_factory=list)
    own_indexed: int = 0
    """Context tokens in the own trie."""
    group_state: list = field(default_factory=list)
    group_indexed: int = 0
    """Output tokens of this request in its group's trie."""
    limit: int = 0
    """Longest draft it may propose now (`DraftConfig.suffix_adaptive`)."""


class SuffixDrafter:
    """The drafter hook (`rlboost.engine.protocol.Drafter`) drafting from the best of `sources`."""

    def __init__(self, store: HistoryStore, config: DraftConfig | None = None, sources: Sequence[str] = SOURCES):
        self.store = store
        self.config = config or DraftConfig()
        self.config.validate()
        unknown = sorted(set(sources) - set(SOURCES))
        if unknown or not sources:
            raise ValueError(f"sources must be a non-empty subset of {SOURCES}, got {list(sources)}")
        self.sources = tuple(s for s in SOURCES if s in sources)
        self._histories = PromptCache(store, self._history_trie)
        self._groups: dict[tuple[tuple[int, ...], int], _Group] = {}
        self._open: dict[tuple[int, ...], tuple[tuple[int, ...], int]] = {}
        """The group a request of the prompt starting now joins, by prompt (closed by `invalidate`)."""
        self._serial = 0
        self._generation = 0
        """The store's version here: bumped by every `invalidate`, so requests re-read their history."""
        self._requests: dict[str, _Request] = {}

    # ---- the hook -----------------------------------------------------------------------------

    def start(self, request_id: str, prompt_ids: Sequence[int]) -> None:
        self.finish(request_id)  # a reused id starts afresh
        prompt = tuple(prompt_ids)
        group = self._groups.get(self._open.get(prompt))
        if group is None:
            self._serial += 1
            key = self._open[prompt] = (prompt, self._serial)
            trie = SuffixTrie(self.config.suffix_max_depth)
            group = self._groups[key] = _Group(key, trie, trie.extend(self._tail(prompt), trie.start()))
        group.members.add(request_id)
        self._requests[request_id] = _Request(prompt, group, self._generation - 1, group_state=list(group.after_prompt),
                                              limit=self.config.max_draft)

    def propose(self, request_id: str, context: Sequence[int]) -> list[int] | DraftTree:
        req = self._requests.get(request_id)
        if req is None:
            return []
        tries = [self._update(source, req, context) for source in self.sources]
        best: tuple[tuple[float, int, int, int], Candidate] | None = None
        cfg = self.config
        tail = list(context[-(cfg.suffix_max_depth - 1):])
        if cfg.drafter == "suffix_tree":
            return self._tree([trie for trie in tries if trie is not None], tail)
        max_len = (lambda k: min(self._max_len(k), req.limit)) if cfg.suffix_adaptive else self._max_len
        for rank, trie in enumerate(tries):
            if trie is None:
                continue
            for cand in trie.candidates(tail, cfg.min_order, cfg.min_probability, max_len):
                key = (cand.score, cand.support, cand.match_len, -rank)
                if cand.tokens and (best is None or key > best[0]):
                    best = (key, cand)
        return list(best[1].tokens) if best is not None else []

    def _tree(self, tries: list[SuffixTrie], tail: list[int]) -> DraftTree:
        cfg = self.config
        found: dict[tuple[int, ...], float] = {}
        for trie in tries:
            for path, p in trie.tree(tail, cfg.min_order, cfg.min_probability, cfg.max_draft,
                                     cfg.suffix_tree_tokens).items():
                found[path] = max(found.get(path, 0.0), p)
        # a path is at most as likely as its prefixes, so the likeliest (shallower first) form a tree
        kept: list[tuple[int, ...]] = []
        chosen: set[tuple[int, ...]] = {()}
        for path in sorted(found, key=lambda path: (-found[path], len(path), path)):
            if len(kept) == cfg.suffix_tree_tokens:
                break
            if path[:-1] in chosen:
                kept.append(path)
                chosen.add(path)
        kept.sort(key=lambda path: (len(path), -found[path], path))  # parents first, likeliest child first
        index = {path: i for i, path in enumerate(kept)}
        return DraftTree(tuple(path[-1] for path in kept), tuple(index.get(path[:-1], -1) for path in kept))

    def feedback(self, request_id: str, drafted: int, accepted: int) -> None:
        if not 0 <= accepted <= drafted:
            raise ValueError(f"need 0 <= accepted <= drafted, got accepted={accepted}, drafted={drafted}")
        req, cfg = self._requests.get(request_id), self.config
        if req is None or drafted == 0:
            return
        if accepted == drafted:
            req.limit = min(cfg.max_draft, req.limit + 1)
        else:
            req.limit = max(cfg.min_draft, min(req.limit - 1, accepted + 1))

    def finish(self, request_id: str) -> None:
        req = self._requests.pop(request_id, None)
        if req is None:
            return
        req.group.members.discard(request_id)
        if not req.group.members:
            self._groups.pop(req.group.key, None)
            if self._open.get(req.prompt) == req.group.key:
                del self._open[req.prompt]

    def add_sibling(self, request_id: str, sibling: str, offset: int, tokens: Sequence[int]) -> int:
        """Tokens of `sibling`'s response from `offset` on, `sibling` being a request with the prompt
        of `request_id` on another engine; returns how many were new to its group here (0: `request_id`
        is not running here, or it held them already)."""
        req = self._requests.get(request_id)
        if req is None:
            return 0
        taken = 0
        for group in [g for key, g in self._groups.items() if key[0] == req.prompt]:
            remote = group.remote.get(sibling)
            if remote is None:
                remote = group.remote[sibling] = _Remote(list(group.after_prompt) if offset == 0 else [])
            elif offset > remote.held:
                remote.state = []  # a gap: what follows is a new sequence
            new = tokens[max(remote.held - offset, 0):]
            if not new:
                continue
            remote.state = group.trie.extend(new, remote.state)
            remote.held = offset + len(tokens)
            if group is req.group:
                taken = len(new)
        return taken

    def invalidate(self, prompts: Iterable[Sequence[int]] | None = None) -> None:
        """The store changed (a step ended): rebuild the history tries of `prompts` (None: all) when
        next used; requests of those prompts started from now on form new sibling groups (a hybrid
        worker is sent a prompt's history with the first of its group's requests in a step, so the
        groups of other prompts, still being submitted, stay whole)."""
        prompts = None if prompts is None else [tuple(p) for p in prompts]
        self._histories.invalidate(prompts)
        if prompts is None:
            self._open.clear()
        for prompt in prompts or ():
            self._open.pop(prompt, None)
        self._generation += 1

    # ---- the sources --------------------------------------------------------------------------

    def _max_len(self, match_len: int) -> int:
        return min(self.config.max_draft, math.ceil(self.config.suffix_spec_factor * match_len))

    def _tail(self, prompt: Sequence[int]) -> list[int]:
        return list(prompt[-(self.config.suffix_max_depth - 1):])

    def _update(self, source: str, req: _Request, context: Sequence[int]) -> SuffixTrie | None:
        """The source's trie for `req`, brought up to date with `context`."""
        if source == "own":
            if req.own is None:
                req.own = SuffixTrie(self.config.suffix_max_depth)
            req.own_state = req.own.extend(context[req.own_indexed:], req.own_state)
            req.own_indexed = len(context)
            return req.own
        if source == "siblings":
            output = context[len(req.prompt):]
            req.group_state = req.group.trie.extend(output[req.group_indexed:], req.group_state)
            req.group_indexed = len(output)
            return req.group.trie
        if req.generation != self._generation:
            req.history, req.generation = self._histories.get(req.prompt), self._generation
        return req.history

    def _history_trie(self, prompt: tuple[int, ...], responses: list[list[int]]) -> SuffixTrie:
        trie = SuffixTrie(self.config.suffix_max_depth)
        after_prompt = trie.extend(self._tail(prompt), trie.start())
        for response in responses:
            trie.extend(response, list(after_prompt))
        return trie
