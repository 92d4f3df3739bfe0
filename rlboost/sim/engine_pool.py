"""The rollout engines of a simulated run (`EnginePool`) and their traffic with the step: every live
engine by name, each one's batching state (`rlboost.sim.batching.EngineState`) and the response
tokens each of its requests held when submitted, and the decode tokens the run made.

Contract: the cluster (`rlboost.sim.cluster`) adds an engine with `add` and removes it with `remove`.
Whenever an engine's next completion or admission point moves, the pool asks `wake_at(t, name, gen)`
for an engine event and the cluster hands that event back to `woke` at t (an event of an older `gen`
is void). The step's commands act at once: `submit`, and `abort`, which answers the step with the
exact partial outputs. The step learns of finished samples from `report_finished`, of the tokens of
the current attempts from `progress`, and of a hard-killed engine's streamed tokens from `kill`.

Streaming, as the simulator sees it: nothing depends on the chunks in between, so a sample's tokens
are reported when it finishes, or when its engine is hard-killed: then the complete chunks of
`stream_interval` of its attempt, and the rest dies with the instance (the waste). Pure: no events
of its own, no clock; every time is the simulated one passed in.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from rlboost.policies.profile import ThroughputProfile
from rlboost.rollout.step_state import Abort, Partial, StepState, Submit
from rlboost.sim.batching import EngineState
from rlboost.sim.members import SimEngine
from rlboost.sim.profile import EngineProfile


class EnginePool:
    """The live engines of one run, by name. `lengths`: the step's response length of each sample (uid)."""

    def __init__(self, profile: EngineProfile, prompt_len: int, stream_interval: int,
                 wake_at: Callable[[float, str, int], None]):
        self.profile, self.prompt_len, self.stream_interval = profile, prompt_len, stream_interval
        self._wake_at = wake_at
        self.engines: dict[str, SimEngine] = {}
        self.tokens_generated = 0
        """Decode tokens made on every engine of the run so far: responses + wasted + recomputed."""
        self._due: list[tuple[SimEngine, str]] = []
        """(engine, request id) of samples an engine finished, not yet reported to the step."""

    def add(self, name: str, instance: str | None, now: float) -> SimEngine:
        """A new engine, idle from `now`, on `instance` (None: a reserved engine)."""
        state = EngineState(self.profile, self.prompt_len, start_s=now)
        e = SimEngine(name, instance, state, ThroughputProfile())
        observe = e.profile.observe

        def on_decode(batch: int, steps: int, seconds: float) -> None:
            # every decode stretch: the run's tokens, and the engine's rate as the step's balancer sees it
            self.tokens_generated += batch * steps
            observe(batch, batch * steps / seconds)

        state.on_decode = on_decode
        self.engines[name] = e
        return e

    def remove(self, e: SimEngine) -> None:
        e.gen += 1  # its scheduled events are void
        del self.engines[e.name]

    def woke(self, name: str, gen: int, now: float) -> None:
        """The engine event `wake_at` asked for is due at `now` (void if the engine moved on since)."""
        e = self.engines.get(name)
        if e is not None and e.gen == gen:
            self.sync(e, now)
            self._reschedule(e)

    def _reschedule(self, e: SimEngine) -> None:
        e.gen += 1
        t = e.state.next_event_s()
        if t < math.inf:
            self._wake_at(t, e.name, e.gen)

    def sync(self, e: SimEngine, now: float) -> None:
        """Bring an engine to `now`; what it finished is reported to the step by `report_finished`."""
        for request_id in e.state.advance_to(now):
            self._due.append((e, request_id))

    def report_finished(self, served: Sequence[tuple[StepState, Mapping[str, int]]], now: float) -> None:
        """What the engines finished since the last call, each to the batch of `served` (a step, and its
        response length by uid) its sample belongs to: an engine may serve two at once (a batch started
        ahead in the step's tail), their uids apart."""
        due, self._due = self._due, []
        for e, request_id in due:
            held = e.held.pop(request_id)
            uid = request_id.rpartition("#")[0]
            step, lengths = _owner(served, uid)
            step.chunk(e.name, request_id, 0, lengths[uid] - held, step.workers[e.name].version, True, now, "stop")

    def progress(self, name: str, now: float) -> Mapping[str, int]:
        """The step's `progress`: tokens each request on engine `name` made in its current attempt."""
        e = self.engines.get(name)
        if e is None:
            return {}
        self.sync(e, now)
        held = e.held
        return {rid: made - held[rid] for rid, made in e.state.progress().items()}

    def submit(self, command: Submit, lengths: Mapping[str, int], now: float) -> None:
        e = self.engines[command.worker]
        self.sync(e, now)
        items = []
        for r in command.requests:
            e.held[r.request_id] = r.held
            items.append((r.request_id, lengths[r.uid], r.held))
        e.state.submit(items, now)
        self._reschedule(e)

    def abort(self, command: Abort, step: StepState, now: float) -> None:
        """An abort answers at once with the exact tokens of the complete decode steps."""
        e = self.engines[command.worker]
        self.sync(e, now)
        made = e.state.abort(command.request_ids, now)
        version = step.workers[command.worker].version  # a refresh swaps in its new version after the answer
        partials = {rid: Partial(n - e.held.pop(rid), version) for rid, n in made.items()}
        self._reschedule(e)
        step.aborted(command.id, partials, now)

    def kill(self, e: SimEngine, steps: Sequence[StepState], now: float) -> None:
        """A hard kill: the complete chunks of each attempt reached the manager (the batch of `steps` its
        sample belongs to); the rest is lost."""
        interval = self.stream_interval
        for request_id, made in e.state.progress().items():
            attempt = made - e.held[request_id]
            streamed = attempt - attempt % interval
            uid = request_id.rpartition("#")[0]
            step = next((step for step in steps if uid in step.tracked), None)
            if streamed and step is not None:
                step.chunk(e.name, request_id, 0, streamed, step.workers[e.name].version, False, now)
        for i, step in enumerate(steps):  # one preemption, the step's (the first), whoever else it hit
            step.dead(e.name, "preempted by the trace", now, counted=not i)


def _owner(served: Sequence[tuple[StepState, Mapping[str, int]]], uid: str) -> tuple[StepState, Mapping[str, int]]:
    for step, lengths in served:
        if uid in lengths:
            return step, lengths
    raise RuntimeError(f"sample {uid} finished on an engine, but no batch served holds it")


__all__ = ["EnginePool"]
