"""The preemptible instances' events in a simulated run: part of `ClusterRun` (rlboost.sim.cluster), split
where its jobs divide. The trace's decisions (launch, notice, kill, release), an instance booting, its
weight pulls, and what each does to the batches its engines serve: the step's rollout, and with bounded
staleness the batch started ahead of its trainer, both at once in the step's tail (the batch ahead
fills the slots the step leaves free, `StepState.limit`). Every batch an engine serves hears of its
join, its new weights, its notice and its end. Pure, like the cluster: simulated time only.

`InstanceEvents` is a base of `ClusterRun` and works on its attributes: `spot`, `pool`, `cfg`, `now`,
`cap`, `done`, `published`, `max_running`, `totals`, `k`; it reads `_served()` (the batches the engines
serve, with their response lengths) and `_limit_ahead()`, and schedules through `_push` with the
cluster's event kinds `BOOTED`, `PULLED` and `WINDOW`.
"""

from __future__ import annotations

from rlboost.rollout.step_state import PREEMPTIBLE, StepState, WorkerState
from rlboost.sim.members import SimInstance


class InstanceEvents:
    """The instances' side of `ClusterRun` (see the module docstring)."""

    def _replay_step(self) -> None:
        actions = None if self.done else self.spot.decide(self.now, self.cap)
        if actions is None:
            return
        for name in actions.kill:
            self._end_instance(name, preempted=True)
        for name, kill_at in actions.notify:
            self._doom(name, kill_at)
        for name in actions.release:
            self._end_instance(name, preempted=False)
        for _ in range(actions.start):
            self._push(self.now + self.cfg.instance_startup_s, self.BOOTED, self.spot.launch(self.now).name, None)

    def _join(self, inst: SimInstance, step: StepState) -> None:
        """The instance's engines take part in the batch `step`: serving it (at a version it admits), or
        pulling its weights."""
        state = (WorkerState.NOTICED if inst.doomed else WorkerState.SERVING if step.admits(inst.version)
                 else WorkerState.PULLING)
        pulling = inst.version is None and step.admits(self.published)
        for e in inst.engines:
            step.join(e.name, PREEMPTIBLE, self.max_running, e.profile, state=state,
                      pulling_since=inst.pull_started if pulling else None,
                      version=inst.version if state is WorkerState.SERVING else None)

    def _booted(self, name: str) -> None:
        """The instance's engines are up: they pull the newest weights, then serve."""
        inst = self.spot.instances.get(name)
        if inst is None:
            return
        inst.booted = True
        inst.engines = [self.pool.add(f"{name}/e{j}", name, self.now) for j in range(self.engines_per_instance)]
        self._pull(inst)
        for step, _ in self._served():
            self._join(inst, step)
        self._limit_ahead()

    def _pull(self, inst: SimInstance) -> None:
        """Start pulling the newest version: a patch, from the base or whole, by what `inst` holds."""
        self._push(self.spot.pull(inst, self.now, self.published), self.PULLED, inst.name, self.published)

    def _pulled(self, name: str, version: int) -> None:
        inst = self.spot.instances.get(name)
        if inst is None:
            return
        self.spot.pulled(inst, version)
        if version != self.published:  # a newer version came out during the pull: pull that one
            self._pull(inst)
            return
        inst.version = version
        if not inst.served:
            inst.served = True
            self.totals.provision_s.append(self.now - inst.launched)
        for step, _ in self._served():
            if step.admits(version):
                for e in inst.engines:
                    step.ready(e.name, self.now, inst.pull_s, version=version)

    def _doom(self, name: str, kill_at: float) -> None:
        """A preemption notice of the kill at `kill_at`: the instance gets no more work, and its samples
        are taken back (exact partial outputs) now, or those expected to finish before the kill at its
        margin before it (`StepState.notice`), so the kill that follows wastes nothing."""
        inst = self.spot.instances[name]
        inst.doomed = True
        for step, _ in self._served():
            for e in inst.engines:
                step.notice(e.name, self.now, kill_at)
            due = step.next_deadline()
            if due is not None and due > self.now:
                self._push(due, self.WINDOW, self.k, None)

    def _end_instance(self, name: str, preempted: bool) -> None:
        """A hard kill (preempted) or a graceful end (a release beyond the cap, the end of the run)."""
        inst = self.spot.end(name, self.now, preempted)
        if preempted:
            self.totals.preemptions += 1
        served = self._served()
        for e in inst.engines:
            steps = [step for step, _ in served if e.name in step.workers]
            if steps:
                self.pool.sync(e, self.now)
                self.pool.report_finished(served, self.now)
            if preempted and steps:
                self.pool.kill(e, steps, self.now)
            for step in steps if not preempted else ():
                # given back: its samples come back exactly (an abort), then it ends
                step.retire(e.name, self.now)
                self._execute(step.take_commands(), step)
                self._execute(step.take_commands(), step)
                step.dead(e.name, "released", self.now, released=True)
            self.pool.remove(e)


__all__ = ["InstanceEvents"]
