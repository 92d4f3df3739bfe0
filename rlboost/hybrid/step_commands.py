"""The commands of a step's `StepState` carried out on Ray, and the answers to those calls: part of
`StepRun` (rlboost.hybrid.step_run), split where its jobs divide. `Submit` and `Abort` become
non-blocking actor calls whose answers (acknowledged submissions, exact partial outputs) the loop
collects each turn; a failed call means a dead worker, declared so; `GroupDone` hands the group to the
trainer, `ReleaseReserved` lets it start, `Retire` ends a given-back instance.

`StepCommands` is a base of `StepRun` and works on its attributes: `table`, `state`, `params`,
`history`, `siblings`, `groups_by_index`, `training_may_start`, `released_at`, `_out`, `_submits`,
`_aborts`, `_history_sent`. It runs in the loop thread, which owns the workers.
"""

from __future__ import annotations

import dataclasses
import time

from rlboost.hybrid.handles import WorkerHandle, first_line
from rlboost.rollout.step_state import Abort, GroupDone, Partial, ReleaseReserved, Retire, Submit


class StepCommands:
    """The command side of `StepRun` (see the module docstring)."""

    def _collect_answers(self) -> None:
        """Results of control calls: a failed submit or abort means a dead worker; an abort's partial
        outputs go to the state."""
        import ray

        calls = list(self._submits) + list(self._aborts)
        if not calls:
            return
        done = ray.wait(calls, num_returns=len(calls), timeout=0)[0]
        self._collect_submits([ref for ref in done if ref in self._submits])
        for ref in done:
            if ref not in self._aborts:
                continue
            abort_id, h, _ = self._aborts.pop(ref)
            now = time.monotonic()
            try:
                partials = ray.get(ref)
            except ray.exceptions.RayError as e:
                self.table.declare_dead(h, f"abort failed: {first_line(e)}", now)
                continue
            self.state.aborted(abort_id, {rid: Partial(len(p.token_ids), p.weight_version, p.token_ids, p.logprobs)
                                          for rid, p in partials.items()}, now)

    def _collect_submits(self, refs: list) -> None:
        """Acknowledged submissions, fetched in one call; one by one only when some failed, to tell which."""
        import ray

        if not refs:
            return
        try:
            ray.get(refs)
        except Exception:  # noqa: BLE001 - sorted out, and re-raised where it must be, one by one below
            pass
        else:
            for ref in refs:
                del self._submits[ref]
                if self.siblings is not None:
                    self.siblings.acknowledged(ref)
            return
        for ref in refs:
            h = self._submits.pop(ref)
            try:
                ray.get(ref)
                if self.siblings is not None:
                    self.siblings.acknowledged(ref)
            except ray.exceptions.RayActorError as e:
                self.table.declare_dead(h, f"it died: {first_line(e)}", time.monotonic())
            except ray.exceptions.RayTaskError as e:  # the engine refused a request: a bug, not a death
                raise RuntimeError(f"rollout worker {h.name} rejected a submission: {e}") from e

    # ---- commands ------------------------------------------------------------------------------------

    def _execute(self, commands) -> None:
        for command in commands:
            if isinstance(command, Submit):
                self._submit(command)
            elif isinstance(command, Abort):
                h = self.table.get(command.worker)
                ref = h.actor.abort.remote(command.request_ids, command.then_sleep, command.then_load)
                self._aborts[ref] = (command.id, h, time.monotonic())
            elif isinstance(command, GroupDone):
                self._out.put(self.groups_by_index[command.group])
            elif isinstance(command, ReleaseReserved):
                self._release_reserved()
            elif isinstance(command, Retire) and not self._peer_holds(command.worker):
                self.table.retire(self.table.get(command.worker), time.monotonic())

    def _release_reserved(self) -> None:
        if not self.training_may_start.is_set():
            self.released_at = time.monotonic()
            self.training_may_start.set()

    def _submit(self, command: Submit) -> None:
        h = self.table.get(command.worker)
        requests = []
        for r in command.requests:
            sample = self.state.tracked[r.uid].sample
            params = dataclasses.replace(self.params, seed=sample.seed, max_tokens=self.params.max_tokens - r.held)
            requests.append((r.request_id, sample.prompt_ids + sample.response_ids, params, len(sample.prompt_ids)))
        ref = h.actor.submit.remote(requests, self._histories_for(h, command))
        self._submits[ref] = h
        if self.siblings is not None:
            self.siblings.submitted(ref, [(r.request_id, self.state.tracked[r.uid].group) for r in command.requests])

    def _histories_for(self, h: WorkerHandle, command: Submit) -> list | None:
        """The drafting history of the prompts submitted to `h` that it has not been sent this step."""
        if self.history is None:
            return None
        out = []
        for r in command.requests:
            group = self.groups_by_index[self.state.tracked[r.uid].group]
            if (h.name, group.index) not in self._history_sent:
                self._history_sent.add((h.name, group.index))
                responses = self.history(group.samples[0].prompt_ids)
                if responses:
                    out.append((group.samples[0].prompt_ids, responses))
        return out or None


__all__ = ["StepCommands"]
