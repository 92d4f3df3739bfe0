"""Acceptance of the drafters measured without a model: recorded RL histories replayed token by token.

`replay(groups, variants, config)` replays each run of a recording (`rlboost.histospec.recording`) step
by step. Per step, the step's responses are generated again from their record, all together in
lockstep as on one engine: per round every unfinished response proposes a draft through the drafter
hook (start / propose / feedback / finish, as `LLMEngine` calls it) from its prompt and the tokens it
has so far, the draft is cut to the tokens the response still has less one (the correction or bonus
token every verify step emits), and accepted is the length of the draft's prefix equal to the
recorded tokens; the response advances by accepted + 1. Exact-match acceptance is what rlboost's
engine accepts: its verifier accepts a draft token iff it equals the token plain decoding draws there
with the same seed, i.e. the recorded one (greedy or sampled alike). A response's first token comes
from the prefill, so plain decoding takes len - 1 decode steps for it. After a step the history store
holds that step's responses of its prompts (the latest rollout, as in training) and every drafter is
invalidated, so epoch e drafts from epoch e - 1, its siblings and itself.

Variants: `ngram` (today's `Drafter`), `suffix:own`, `suffix:siblings`, `suffix:history` (the
suffix drafter restricted to one source), `suffix` (all three) and `suffix_tree` (all three, drafting
trees: a node is accepted iff its token is the recorded one after its accepted parent, which is what
the engine's verifier accepts). Per run, epoch and variant: tokens,
decode steps with and without drafts, verifications (steps that verified a draft), drafted and
accepted tokens; `accepted_per_verify` = accepted / verifications, `steps_saved` = 1 - steps / plain
steps. Pure and deterministic: no model, no clock.

Instances (`instances` = K > 1, hybrid rollout): a step's responses are dealt round-robin over K
engines in the step's order (what join-shortest-queue does with equal, empty workers: a group of 8
over 4 instances puts 2 on each), each with its own drafter over the same history (every worker gets
the prompt's history with its requests). The plain variants see the siblings on their own engine
only. The `+forwarded` variants (`suffix:siblings+forwarded`, `suffix+forwarded`) also get the
siblings on other engines as the manager forwards them: an engine reports as a hybrid worker does,
when one of its responses has `stream_interval` tokens not reported yet or finishes, and then every
response on it up to where it is; after each round the reported tokens go to the other engines'
drafters as `SiblingShare` plans them (the runtime's own decisions), at most
`sibling_tokens_per_step` per engine per step. A forwarded sibling is thus seen a report (up to
`stream_interval` tokens) and a round late.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from rlboost.engine.draft_tree import DraftTree, accepted_nodes
from rlboost.histospec.drafter import DraftConfig, Drafter
from rlboost.histospec.history import HistoryStore
from rlboost.histospec.recording import RecordedGroup
from rlboost.histospec.sibling_share import Sibling, SiblingShare
from rlboost.histospec.suffix_drafter import SOURCES, SuffixDrafter

VARIANTS = ("ngram", *(f"suffix:{s}" for s in SOURCES), "suffix", "suffix_tree")
FORWARDED = ("suffix:siblings+forwarded", "suffix+forwarded")
"""With several instances: the suffix drafter given the siblings on other instances too."""


def make_variant(name: str, store: HistoryStore, config: DraftConfig):
    if name == "ngram":
        return Drafter(store, dataclasses.replace(config, drafter="ngram"))
    if name not in VARIANTS + FORWARDED:
        raise ValueError(f"unknown drafter variant {name!r}; valid: {', '.join(VARIANTS + FORWARDED)}")
    base = name.removesuffix("+forwarded")
    if base == "suffix_tree":
        return SuffixDrafter(store, dataclasses.replace(config, drafter="suffix_tree"))
    sources = SOURCES if base == "suffix" else (base.split(":")[1],)
    return SuffixDrafter(store, dataclasses.replace(config, drafter="suffix"), sources)


@dataclass
class Tally:
    responses: int = 0
    tokens: int = 0
    plain_steps: int = 0
    steps: int = 0
    verifications: int = 0
    drafted: int = 0
    accepted: int = 0
    draft_sizes: dict[int, int] = dataclasses.field(default_factory=dict)
    """Decode rounds per draft size (0: a round without a draft): what a batch's verify steps compute
    (`rlboost.histospec.projection`)."""

    def add(self, other: Tally) -> None:
        for f in dataclasses.fields(self):
            if f.name == "draft_sizes":
                for size, rounds in other.draft_sizes.items():
                    self.draft_sizes[size] = self.draft_sizes.get(size, 0) + rounds
            else:
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def row(self) -> dict[str, float]:
        return dataclasses.asdict(self) | {
            "accepted_per_verify": self.accepted / self.verifications if self.verifications else 0.0,
            "acceptance_rate": self.accepted / self.drafted if self.drafted else 0.0,
            "steps_saved": 1 - self.steps / self.plain_steps if self.plain_steps else 0.0}


@dataclass
class _Response:
    id: str
    group: int
    """Its group's index in the step."""
    tokens: Sequence[int]
    engine: int
    done: int
    """Tokens generated so far."""
    reported: int = 0
    """Tokens a report has carried to the manager."""

    @property
    def running(self) -> bool:
        return self.done < len(self.tokens)


def replay_step(drafters: Sequence, name: str, groups: Sequence[RecordedGroup], stream_interval: int = 8,
                share: SiblingShare | None = None) -> list[Tally]:
    """Generate a step's responses again from their record, dealt over one engine per drafter of
    `drafters`; `share`: forward siblings across engines under its budget. One tally per group."""
    tallies = [Tally(responses=len(g.responses), tokens=sum(map(len, g.responses)),
                     plain_steps=sum(max(len(r) - 1, 0) for r in g.responses)) for g in groups]
    responses: list[_Response] = []
    for n, g in enumerate(groups):
        for j, tokens in enumerate(g.responses):
            # the first token comes from the prefill
            r = _Response(f"{name}/{n}/{j}", n, tokens, len(responses) % len(drafters), min(len(tokens), 1))
            responses.append(r)
            drafters[r.engine].start(r.id, g.prompt)
    for r in responses:
        if not r.running:
            drafters[r.engine].finish(r.id)
    live = [r for r in responses if r.running]
    while live:
        for r in live:
            drafter, tally, pos = drafters[r.engine], tallies[r.group], r.done
            context = list(groups[r.group].prompt) + list(r.tokens[:pos])
            draft = drafter.propose(r.id, context)
            tree = (draft if isinstance(draft, DraftTree) else DraftTree.path(draft)).cut(len(r.tokens) - pos - 1)
            # the verifier's draw after the root and after each node is the recorded token at its depth
            drawn = [r.tokens[pos + depth] for depth in [0, *tree.depths()]]
            accepted = len(accepted_nodes(tree, drawn))
            if len(tree):
                drafter.feedback(r.id, len(tree), accepted)
                tally.verifications += 1
                tally.drafted += len(tree)
                tally.accepted += accepted
            tally.steps += 1
            tally.draft_sizes[len(tree)] = tally.draft_sizes.get(len(tree), 0) + 1
            r.done = pos + accepted + 1
            if not r.running:
                drafter.finish(r.id)
        live = [r for r in live if r.running]
        if share is not None:
            _forward(drafters, responses, stream_interval, share)
    return tallies


def _forward(drafters: Sequence, responses: list[_Response], stream_interval: int, share: SiblingShare) -> None:
    """The engines' reports after a round, then the manager's forwards to the other engines' drafters."""
    news: set[int] = set()
    for engine in range(len(drafters)):
        mine = [r for r in responses if r.engine == engine]
        if any(r.done - r.reported >= stream_interval or (not r.running and r.reported < r.done) for r in mine):
            for r in mine:
                if r.reported < r.done:
                    r.reported = r.done
                    news.add(r.group)
    if not news:
        return
    by_id = {r.id: r for r in responses}
    groups = {g: [Sibling(r.id, str(r.engine) if r.running else None, r.id if r.running else None, r.reported)
                  for r in responses if r.group == g] for g in sorted(news)}
    plan, _ = share.plan(groups)
    for engine, forwards in plan.items():
        for f in forwards:
            drafters[int(engine)].add_sibling(f.request_id, f.sibling, f.start, by_id[f.uid].tokens[f.start:f.end])


def replay(groups: Sequence[RecordedGroup], variants: Sequence[str] | None = None, config: DraftConfig | None = None,
           instances: int = 1, stream_interval: int = 8, sibling_tokens_per_step: int = 16384) -> list[dict]:
    """Rows per (run, epoch, variant), in that order, with the `Tally` counts and the ratios. `variants`:
    None, every one that applies (the `+forwarded` ones with several instances)."""
    config = config or DraftConfig()
    if instances < 1:
        raise ValueError(f"instances must be >= 1, got {instances}")
    if stream_interval < 1:
        raise ValueError(f"stream_interval must be >= 1, got {stream_interval}")
    variants = list(variants or (VARIANTS + FORWARDED if instances > 1 else VARIANTS))
    rows = []
    for run in dict.fromkeys(g.run for g in groups):
        by_step: dict[int, list[RecordedGroup]] = defaultdict(list)
        for g in groups:
            if g.run == run:
                by_step[g.step].append(g)
        store = HistoryStore(max_tokens=2**62)
        drafters = {name: [make_variant(name, store, config) for _ in range(instances)] for name in variants}
        seen: dict[tuple[int, ...], int] = defaultdict(int)
        tallies: dict[tuple[int, str], Tally] = defaultdict(Tally)
        for step in sorted(by_step):
            epochs = [seen[g.prompt] for g in by_step[step]]
            for name, engines in drafters.items():
                share = SiblingShare(sibling_tokens_per_step) if name in FORWARDED else None
                for epoch, tally in zip(epochs, replay_step(engines, f"{step}/{name}", by_step[step],
                                                            stream_interval, share)):
                    tallies[epoch, name].add(tally)
            for g in by_step[step]:
                seen[g.prompt] += 1
                store.update(g.prompt, g.responses)
            for engines in drafters.values():
                for drafter in engines:
                    drafter.invalidate([g.prompt for g in by_step[step]])
        rows += [{"run": run, "epoch": epoch, "drafter": name} | tallies[epoch, name].row()
                 for epoch in sorted({e for e, _ in tallies}) for name in variants]
    return rows
