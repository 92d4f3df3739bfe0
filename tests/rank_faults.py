"""Trainer-rank faults for tests, scripted from the driver's side: a real SIGKILL of a rank's process
at an exact event the driver sees (just before it dispatches the Nth micro-batch pass, which every
rank runs together), so production code carries no fault hooks."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from rlboost.trainer.ranks import TrainerGroup

from hybrid_util import wait_for


class RankKiller:
    """Installed with `kill_rank_before_pass`: counts the passes each `TrainerGroup` dispatches."""

    def __init__(self, rank: int, before_pass: int):
        self.rank, self.before_pass = rank, before_pass
        self.passes: dict[int, int] = {}
        """Passes dispatched so far, by id of the group."""
        self.killed: list[int] = []
        """The pid killed (once)."""

    def __call__(self, group: TrainerGroup) -> None:
        count = self.passes[id(group)] = self.passes.get(id(group), 0) + 1
        if count == self.before_pass and not self.killed:
            pid = group.info[self.rank]["pid"]
            os.kill(pid, signal.SIGKILL)
            wait_for(lambda: not alive(pid), 30, f"trainer rank {self.rank} (pid {pid}) to die")
            self.killed.append(pid)


def kill_rank_before_pass(monkeypatch, rank: int, before_pass: int) -> RankKiller:
    """From now on, SIGKILL trainer rank `rank` as a group is about to dispatch its `before_pass`-th
    micro-batch pass (counted over the group's life), and let the dispatch go on once the process is
    gone: the other ranks run that pass and meet a dead peer in its collectives."""
    killer = RankKiller(rank, before_pass)
    dispatch = TrainerGroup._pass

    def killing_pass(group: TrainerGroup, per_rank):
        killer(group)
        return dispatch(group, per_rank)

    monkeypatch.setattr(TrainerGroup, "_pass", killing_pass)
    return killer


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead: only its parent has not reaped it yet
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False
