"""Acceptance of the drafters measured without a model: recorded RL histories replayed token by token.

`replay(groups, variants, config)` replays each run of a recording (`rlboost.histospec.recording`) step
by step. Per step, each group's responses are generated again from their record, the group's
siblings in lockstep as on one engine: per round every unfinished response proposes a draft through
the drafter hook (start / propose / feedback / finish, as `LLMEngine` calls it) from its prompt and
the tokens it has so far, the draft is cut to the tokens the response still has less one (the
correction or bonus token every verify step emits), and accepted is the length of the draft's prefix
equal to the recorded tokens; the response advances by accepted + 1. Exact-match acceptance is what
rlboost's engine accepts: its verifier accepts a draft token iff it equals the token plain decoding
draws there with the same seed, i.e. the recorded one (greedy or sampled alike). A response's first
token comes from the prefill, so plain decoding takes len - 1 decode steps for it. After a step the
history store holds that step's responses of its prompts (the latest rollout, as in training) and
every drafter is invalidated, so epoch e drafts from epoch e - 1, its siblings and itself.

Variants: `ngram` (today's `Drafter`), `suffix:own`, `suffix:siblings`, `suffix:history` (the
suffix drafter restricted to one source) and `suffix` (all three). Per run, epoch and variant: tokens,
decode steps with and without drafts, verifications (steps that verified a draft), drafted and
accepted tokens; `accepted_per_verify` = accepted / verifications, `steps_saved` = 1 - steps / plain
steps. Pure and deterministic: no model, no clock.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from rlboost.histospec.drafter import DraftConfig, Drafter
from rlboost.histospec.history import HistoryStore
from rlboost.histospec.recording import RecordedGroup
from rlboost.histospec.suffix_drafter import SOURCES, SuffixDrafter

VARIANTS = ("ngram", *(f"suffix:{s}" for s in SOURCES), "suffix")


def make_variant(name: str, store: HistoryStore, config: DraftConfig):
    if name == "ngram":
        return Drafter(store, dataclasses.replace(config, drafter="ngram"))
    if name not in VARIANTS:
        raise ValueError(f"unknown drafter variant {name!r}; valid: {', '.join(VARIANTS)}")
    sources = SOURCES if name == "suffix" else (name.split(":")[1],)
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

    def add(self, other: Tally) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def row(self) -> dict[str, float]:
        return dataclasses.asdict(self) | {
            "accepted_per_verify": self.accepted / self.verifications if self.verifications else 0.0,
            "acceptance_rate": self.accepted / self.drafted if self.drafted else 0.0,
            "steps_saved": 1 - self.steps / self.plain_steps if self.plain_steps else 0.0}


def replay_group(drafter, name: str, prompt: Sequence[int], responses: Sequence[Sequence[int]]) -> Tally:
    """Generate the group's responses again from their record, drafting with `drafter`."""
    tally = Tally(responses=len(responses), tokens=sum(map(len, responses)),
                  plain_steps=sum(max(len(r) - 1, 0) for r in responses))
    ids = [f"{name}/{j}" for j in range(len(responses))]
    for rid in ids:
        drafter.start(rid, prompt)
    done = [min(len(r), 1) for r in responses]  # the prefill's token
    live = [j for j, r in enumerate(responses) if done[j] < len(r)]
    for j in set(range(len(responses))) - set(live):
        drafter.finish(ids[j])
    while live:
        for j in live:
            response, pos = responses[j], done[j]
            draft = list(drafter.propose(ids[j], list(prompt) + list(response[:pos])))[:len(response) - pos - 1]
            accepted = 0
            while accepted < len(draft) and draft[accepted] == response[pos + accepted]:
                accepted += 1
            if draft:
                drafter.feedback(ids[j], len(draft), accepted)
                tally.verifications += 1
                tally.drafted += len(draft)
                tally.accepted += accepted
            tally.steps += 1
            done[j] = pos + accepted + 1
            if done[j] == len(response):
                drafter.finish(ids[j])
        live = [j for j in live if done[j] < len(responses[j])]
    return tally


def replay(groups: Sequence[RecordedGroup], variants: Sequence[str] = VARIANTS,
           config: DraftConfig | None = None) -> list[dict]:
    """Rows per (run, epoch, variant), in that order, with the `Tally` counts and the ratios."""
    config = config or DraftConfig()
    rows = []
    for run in dict.fromkeys(g.run for g in groups):
        by_step: dict[int, list[RecordedGroup]] = defaultdict(list)
        for g in groups:
            if g.run == run:
                by_step[g.step].append(g)
        store = HistoryStore(max_tokens=2**62)
        drafters = {name: make_variant(name, store, config) for name in variants}
        seen: dict[tuple[int, ...], int] = defaultdict(int)
        tallies: dict[tuple[int, str], Tally] = defaultdict(Tally)
        for step in sorted(by_step):
            for n, g in enumerate(by_step[step]):
                epoch = seen[g.prompt]
                for name, drafter in drafters.items():
                    tallies[epoch, name].add(replay_group(drafter, f"{step}/{n}/{name}", g.prompt, g.responses))
            for g in by_step[step]:
                seen[g.prompt] += 1
                store.update(g.prompt, g.responses)
            for drafter in drafters.values():
                drafter.invalidate([g.prompt for g in by_step[step]])
        rows += [{"run": run, "epoch": epoch, "drafter": name} | tallies[epoch, name].row()
                 for epoch in sorted({e for e, _ in tallies}) for name in variants]
    return rows
