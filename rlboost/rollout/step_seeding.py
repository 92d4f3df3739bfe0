"""The seeding window of a step and its hand-off (docs/hybrid.md, "The step"): the reserved workers
generate for T_seed, then hand what they hold to the instances and free their memory for training,
unless no instance would end the step sooner. Part of `StepState` (rlboost.rollout.step_state), split
where its jobs divide. Pure, like the state: no clock, thread, Ray or torch.

A step has its window from its start, or none (an evaluation; a layout whose reserved workers never
train), or, started ahead of its trainer (bounded staleness: the instances generate the next batch
while the trainer trains this one), a window that opens later, when its trainer starts (`seed`).

`StepSeeding` is a base of `StepState` and works on its attributes: `workers`, `tracked`, `stats`,
`config`, `outlook`, `now`, `t0`, `seeding`, `done`, `_handoffs`, `_handed_off`, `_handoff_check_at`,
`_released`, `_ahead`, `_seed_from`, `_share_due`, `_changed`; it takes samples back through the state's `_take_back`.
"""

from __future__ import annotations

from rlboost.policies.handoff import StepOutlook, workers_should_hand_off
from rlboost.rollout.step_data import PREEMPTIBLE, RESERVED, WorkerState


class StepSeeding:
    """The seeding decisions of `StepState` (see the module docstring)."""

    @property
    def ahead(self) -> bool:
        """Started ahead of its trainer, and not seeded yet: the reserved workers are not its own."""
        return self._ahead

    def seed(self, now: float, window_s: float, outlook: StepOutlook | None = None) -> None:
        """The reserved workers come to a step started without its window (started ahead of its
        trainer): they seed it from `now` for `window_s`, and hand off as at a step's start. At the
        first decision they take their share of what is left (`_share_with_reserved`): the instances
        may hold the whole batch by then. A step whose rollout is over is not seeded: the reserved
        resources stay the trainer's, and a reserved worker that joins takes no work."""
        self._ahead = False
        if self.done:
            self._handed_off = True
            return
        self.now = now
        self.seeding, self._handed_off, self._released = True, False, False
        self._seed_from, self._handoff_check_at = now, now + window_s
        self._share_due = True
        self.outlook = outlook
        for w in self.workers.values():
            if w.kind == RESERVED:
                w.accepting = True
        self._changed(members=True)

    def _seeding_decisions(self, now: float) -> None:
        """The window's decisions at `decide`: the reserved workers' share of a step seeded late, and
        the hand-off once the window is over."""
        if self._share_due:
            self._share_due = False
            self._share_with_reserved()
        if self.seeding and now >= self._handoff_check_at:
            self._end_seeding()

    def _share_with_reserved(self) -> None:
        """The reserved workers of a step seeded late take their share of its unfinished samples, as
        at a step's start: by engines, from what waits and then from the instances, the samples with
        the fewest tokens first (the cheapest to move, the furthest from finishing)."""
        reserved = [w for w in self.workers.values() if w.kind == RESERVED and self._eligible(w)]
        instances = [w for w in self.workers.values() if w.kind == PREEMPTIBLE and w.alive and w.assigned]
        serving = sum(1 for w in self.workers.values() if w.kind == PREEMPTIBLE and self._eligible(w))
        if not reserved or not instances:
            return
        unfinished = len(self.pending) + sum(len(w.assigned) for w in instances)
        wanted = unfinished * len(reserved) // (len(reserved) + max(serving, 1)) - len(self.pending)
        held = sorted((tokens, uid, w.name) for w in instances for uid, tokens in self._tokens_so_far(w).items())
        moving: dict[str, list[str]] = {}
        for _, uid, name in held[:max(wanted, 0)]:
            moving.setdefault(name, []).append(uid)
        for name, uids in moving.items():
            self._take_back(self.workers[name], sorted(uids), "seed_share")

    def end_window(self, now: float) -> None:
        """The seeding window ends at `now`, before its deadline: the hand-off placed at an event of the
        step instead of a time (`StepRun.end_seed_window`); the next `decide` weighs it as at the end."""
        if self.seeding:
            self._handoff_check_at = min(self._handoff_check_at, now)

    def _end_seeding(self) -> None:
        """The window is over: the reserved workers hand what they hold to the instances and free their
        memory for training. With no instance serving the step, or none that would end it sooner,
        they keep going (checked again later)."""
        if not any(w.kind == PREEMPTIBLE and self._eligible(w) for w in self.workers.values()):
            return
        if self.outlook is not None and not self._handoff_pays():
            self.stats.handoff_deferred = True
            self._handoff_check_at = self.now + self.config.handoff_check_s
            return
        for w in self.workers.values():
            if w.kind == RESERVED and w.alive:
                w.accepting = False
                self._handoffs.add(self._take_back(w, sorted(w.assigned), "seed_handoff", then_sleep=True))
        self._changed(members=True)
        self.seeding, self._handed_off = False, True
        self.stats.seed_s = self.now - self._seed_from

    def _handoff_pays(self) -> bool:
        """Whether the instances serving the step would end it sooner than staying colocated
        (`rlboost.policies.handoff.workers_should_hand_off`): the rest is the step's expected tokens
        less those generated, received or not."""
        reserved = sum(1 for w in self.workers.values() if w.kind == RESERVED and w.status is WorkerState.SERVING)
        instances = sum(1 for w in self.eligible() if w.kind == PREEMPTIBLE)
        held = sum(track.tokens for track in self.tracked.values() if track.worker is None)
        held += sum(sum(self._tokens_so_far(w).values()) for w in self.workers.values() if w.assigned)
        rest = len(self.tracked) * self.outlook.tokens_per_sample - held
        return workers_should_hand_off(rest, reserved, instances, self.outlook)


__all__ = ["StepSeeding"]
