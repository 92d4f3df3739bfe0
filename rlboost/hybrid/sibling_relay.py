"""Sibling progress sent across instances (HistoSpec): the Ray side of `rlboost.histospec.sibling_share`.

A GRPO group's samples run on several workers; each worker's suffix drafter drafts from the siblings
it runs, and from those elsewhere once the manager forwards their tokens. The manager has every
sibling's tokens already (the workers' reports carry them); a step's `SiblingRelay` sends each worker
the new ones of the groups it runs, as `SiblingShare` plans them under
`rollout.histospec.sibling_tokens_per_step`, to `RolloutWorker.siblings`.

Contract:
- A worker gets tokens only for requests whose submission it acknowledged (its drafter knows them,
  so a forward never races the submit that starts its request), and at most one `siblings` call is
  in flight per worker: its calls apply in order, and what arrives meanwhile goes with the next one.
- A group is planned again only when it has news: a report brought tokens of one of its samples, a
  submission of one was acknowledged, or a worker it had news for was busy. A turn without news
  costs nothing; one with news costs O(samples of those groups).
- Why a call of its own rather than riding on `submit`: a worker gets its submissions at dispatch
  and at the few refills after, while progress comes with every report; waiting for the next submit
  would leave most of a step's progress unsent. The call is batched per turn instead.
- What it costs: at most one actor call per worker per manager turn with news for it (turns are
  20-200 ms apart, `rlboost.hybrid.streams`, and reports come every `engine.stream_interval` tokens),
  never one per token. A call carries, per (group, sibling) with new tokens, the request id, the
  sibling's uid, an offset and the tokens: pickled ints, 3 bytes a token for a vocabulary under
  65,536 and 5 above, plus about 40 bytes per (group, sibling) and Ray's per-call overhead (measured:
  3.2 bytes a token for SmolLM2's vocabulary and 4.4 for Qwen's in 64-token forwards); in all
  at most `sibling_tokens_per_step` tokens per worker per step. A forward never changes what is
  generated (the engine verifies every draft): a lost or failed call only loses drafting material.
- A call that fails because its worker died is dropped (the death is found by its stream); any other
  failure is a bug and stops the step.
"""

from __future__ import annotations

from collections.abc import Callable

from rlboost.histospec.sibling_share import Sibling, SiblingShare
from rlboost.hybrid.handles import WorkerHandle, first_line
from rlboost.rollout.sample import Group
from rlboost.rollout.step_state import SampleState, Tracked


class SiblingRelay:
    def __init__(self, tokens_per_step: int, groups: list[Group]):
        self.share = SiblingShare(tokens_per_step)
        self.members = {g.index: [s.uid for s in g.samples] for g in groups}
        self.calls = 0
        """`siblings` calls made in the step."""
        self._news: set[int] = set()
        self._acknowledged: set[str] = set()
        """Request ids whose submission the worker acknowledged."""
        self._submits: dict[object, list[tuple[str, int]]] = {}
        """A submission in flight -> (request id, group) of its requests."""
        self._in_flight: dict[object, WorkerHandle] = {}

    def in_flight(self) -> int:
        return len(self._in_flight)

    # ---- what the step tells it ----------------------------------------------------------------------

    def submitted(self, ref: object, requests: list[tuple[str, int]]) -> None:
        self._submits[ref] = requests

    def acknowledged(self, ref: object) -> None:
        for request_id, group in self._submits.pop(ref, ()):
            self._acknowledged.add(request_id)
            self._news.add(group)

    def tokens_of(self, group: int) -> None:
        """A report brought tokens of a sample of `group`."""
        self._news.add(group)

    # ---- each turn -----------------------------------------------------------------------------------

    def relay(self, tracked: dict[str, Tracked], handle: Callable[[str], WorkerHandle | None]) -> None:
        """Collect answered calls, then send each worker what the plan gives it. `handle(name)`: the
        worker's handle (None once gone)."""
        self._collect()
        if not self._news:
            return
        groups = {g: [self._sibling(tracked[uid]) for uid in self.members[g]] for g in sorted(self._news)}
        plan, deferred = self.share.plan(groups, busy={h.name for h in self._in_flight.values()})
        self._news = deferred
        for name, forwards in plan.items():
            h = handle(name)
            if h is None or not h.alive:
                continue
            wire = [(f.request_id, f.sibling, f.start, tracked[f.uid].sample.response_ids[f.start:f.end])
                    for f in forwards]
            self._in_flight[h.actor.siblings.remote(wire)] = h
            self.calls += 1

    def _sibling(self, track: Tracked) -> Sibling:
        running = track.state is SampleState.RUNNING
        acked = running and track.request_id in self._acknowledged
        return Sibling(track.uid, track.worker if running else None, track.request_id if acked else None,
                       track.tokens)

    def _collect(self) -> None:
        import ray

        if not self._in_flight:
            return
        for ref in ray.wait(list(self._in_flight), num_returns=len(self._in_flight), timeout=0)[0]:
            h = self._in_flight.pop(ref)
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError:
                pass  # it died: its stream says so
            except ray.exceptions.RayTaskError as e:
                raise RuntimeError(f"rollout worker {h.name} failed to take sibling tokens: {first_line(e)}") from e


__all__ = ["SiblingRelay"]
