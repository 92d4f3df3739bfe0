"""Sibling progress across instances: which siblings' new tokens go to which worker, under a budget.

In hybrid rollout a GRPO group's samples are spread over several workers, and a worker's suffix
drafter (`rlboost.histospec.suffix_drafter`) sees only the siblings it runs. The manager receives
every sibling's tokens in the workers' reports; it forwards to each worker that runs a sample of the
group the tokens of the group's other samples that the worker does not hold yet, and the worker's
drafter takes them into the group's trie (`SuffixDrafter.add_sibling`). `SiblingShare` decides what
goes where; the runtime (`rlboost.hybrid.step_run`) and the replay (`rlboost.histospec.replay`)
carry it out.

Contract:
- One `SiblingShare` per step. `plan(groups, busy)` takes groups as the manager knows them now (per
  group, each sample's `Sibling`: where it runs, its request there once that worker has acknowledged
  it, the response tokens the manager holds) and returns per worker the `Forward`s to send it: for
  each group in which it has a receiver (an acknowledged request of the group), each sibling not
  running on it whose tokens go past what it holds of it, the new range [start, end) of its response.
- What a worker holds of a sibling: what it was sent, and what it generated itself while the sibling
  ran there (its drafter indexed that as a local sibling). A worker that no longer has a receiver in
  a group has dropped its trie (the drafter forgets a group with its last request): what it held of
  the group is forgotten, and a later receiver there gets every sibling again from its start. A
  sibling that migrates to a worker it was forwarded to is indexed there again as a local request
  (its resubmitted context holds its tokens): its counts there are doubled, which shifts estimates
  only; drafts are verified whatever they are.
- A sibling whose tokens fell below what a worker holds of it (they were thrown away:
  migration=recompute) is sent again from its start under a new key (`Forward.sibling`): the drafter
  keeps what it took and starts a new sequence.
- Budget: at most `tokens_per_step` tokens per worker per step, all groups together. Where a worker's
  new tokens exceed what it has left, what is left is shared max-min fairly among its (group,
  sibling) pairs: each gets an equal share, one that needs less takes only what it needs and the rest
  is shared among the others (ties in the order of `groups` and of their samples). A pair cut short
  continues from where it stopped at the next plan, while budget is left.
- `busy` workers (a forward to them still in flight) get nothing now; the groups they had news in
  are returned as `deferred`, to plan again once they answered: one message in flight per worker
  keeps each worker's messages in order, and batches what arrives meanwhile into the next.
- Pure: no clock, no threads, no Ray; deterministic for the same calls.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Sibling:
    """One sample of a group, as the manager knows it."""

    uid: str
    worker: str | None
    """Where it runs now (None: finished, or waiting for a worker)."""
    request_id: str | None
    """Its request on `worker` once the worker acknowledged it (None: not yet, or not running)."""
    tokens: int
    """Response tokens the manager holds of it."""


@dataclass(frozen=True)
class Forward:
    """Tokens [start, end) of sample `uid`'s response, for the group of `request_id` on its worker."""

    request_id: str
    sibling: str
    """The key the worker's drafter keeps them under: `uid`, or `uid~k` after its k-th restart."""
    uid: str
    start: int
    end: int


def fair_shares(needs: Sequence[int], budget: int) -> list[int]:
    """Max-min fair grants of `budget` to `needs` (each at most its need, sum min(budget, sum of needs)):
    smallest needs first, each taking at most an equal share of what is left."""
    grants = [0] * len(needs)
    left = max(budget, 0)
    order = sorted(range(len(needs)), key=lambda i: needs[i])  # stable: equal needs keep their order
    for k, i in enumerate(order):
        grants[i] = min(needs[i], left // (len(order) - k))
        left -= grants[i]
    return grants


class SiblingShare:
    """See the module docstring."""

    def __init__(self, tokens_per_step: int):
        if not isinstance(tokens_per_step, int) or tokens_per_step < 0:
            raise ValueError(f"tokens_per_step must be an integer >= 0, got {tokens_per_step!r}")
        self.tokens_per_step = tokens_per_step
        self.sent: Counter[str] = Counter()
        """Tokens sent to each worker this step."""
        self._held: dict[int, dict[str, dict[str, list[int]]]] = {}
        """group -> worker -> uid -> [tokens the worker holds of it, restarts seen]."""

    def left(self, worker: str) -> int:
        return self.tokens_per_step - self.sent[worker]

    def plan(self, groups: Mapping[int, Sequence[Sibling]],
             busy: Collection[str] = ()) -> tuple[dict[str, list[Forward]], set[int]]:
        """(worker -> forwards to send it now, groups to plan again once a busy worker answered)."""
        wants: dict[str, list[tuple[int, str, int]]] = {}  # worker -> (group, uid, new tokens)
        deferred: set[int] = set()
        receivers_of: dict[int, dict[str, str]] = {}
        for group, siblings in groups.items():
            receivers = receivers_of[group] = {}
            for s in siblings:
                if s.worker is not None and s.request_id:
                    receivers.setdefault(s.worker, s.request_id)  # its first acknowledged request of the group
            held = self._held.setdefault(group, {})
            for worker in [w for w in held if w not in receivers]:
                del held[worker]  # its drafter dropped the group with its last request there
            for worker in receivers:
                if worker in busy:
                    deferred.add(group)
                    continue
                mine = held.setdefault(worker, {})
                for s in siblings:
                    have = mine.setdefault(s.uid, [0, 0])
                    if s.worker == worker:
                        have[0] = max(have[0], s.tokens)  # generated there: indexed as a local sibling
                        continue
                    if s.tokens < have[0]:
                        have[:] = [0, have[1] + 1]  # its tokens were thrown away: a new sequence
                    if s.tokens > have[0]:
                        wants.setdefault(worker, []).append((group, s.uid, s.tokens - have[0]))
        out: dict[str, list[Forward]] = {}
        for worker, pairs in wants.items():
            grants = fair_shares([need for _, _, need in pairs], self.left(worker))
            for (group, uid, _), grant in zip(pairs, grants):
                if not grant:
                    continue
                have = self._held[group][worker][uid]
                key = uid if not have[1] else f"{uid}~{have[1]}"
                out.setdefault(worker, []).append(
                    Forward(receivers_of[group][worker], key, uid, have[0], have[0] + grant))
                have[0] += grant
                self.sent[worker] += grant
        return out, deferred


__all__ = ["Forward", "Sibling", "SiblingShare", "fair_shares"]
