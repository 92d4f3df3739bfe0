"""`rlboost train` that sends itself a stop signal at an exact event of a step, for the tests of a clean stop:

    python tests/stop_probe.py PHASE SIGNAL[,SIGNAL] FAMILY_FILE -- train CONFIG [key=value ...]
    python tests/stop_probe.py PHASE HEAD FAMILY_FILE -- train ...   # the Ray head's GCS killed instead

runs `rlboost.cli.main(["train", ...])` in this process with hooks installed on the run's own code: when
PHASE begins, the process sends itself SIGNAL (SIGINT or SIGTERM, as a user's Ctrl-C or a scheduler
would) with `os.kill`, from whichever thread meets the event; Python raises it in the main thread, which
is what a signal from outside does. A second signal, when given, follows as soon as the run's shutdown
has begun (a user pressing Ctrl-C twice). At the first signal the pids of every process the run started
are written to FAMILY_FILE, so the test can check that none outlives the run.

The phases (each the first time it happens in the run):
- booting: a preemptible instance's worker was launched and has not answered yet;
- seeding: a training step's rollout has started and its seeding window is open;
- handoff: the seeding window ends (the reserved workers' samples are aborted to move to the instances);
- offloaded: after the hand-off, an instance has streamed tokens of the step;
- training: the trainer takes its first micro-batch of a step;
- publishing: the new version is being published to the weight store;
- pull: an instance's pull of a new version is in flight;
- validation: the held-out evaluation begins;
- checkpointing: a checkpoint is being written (a stop waits until it is whole).
Nothing here changes what the run does; it only chooses the moment of the signal.

"""

from __future__ import annotations

import functools
import os
import signal
import sys
import threading
from pathlib import Path

HEAD = "HEAD"
"""In place of a signal: SIGKILL the run's Ray head's GCS at the phase (the driver's Ray head lost)."""
PHASES = ("booting", "seeding", "handoff", "offloaded", "training", "publishing", "pull", "validation",
          "checkpointing")


class Probe:
    def __init__(self, phase: str, signals: list[int], family_file: Path):
        if phase not in PHASES:
            raise SystemExit(f"stop_probe: unknown phase {phase!r} (one of {', '.join(PHASES)})")
        self.phase, self.signals, self.family_file = phase, signals, family_file
        self.fired = False
        self._lock = threading.Lock()

    def at(self, phase: str) -> None:
        """The run met `phase`: the first signal, if it is the probe's and none was sent yet."""
        with self._lock:
            if phase != self.phase or self.fired:
                return
            self.fired = True
        import psutil

        family = psutil.Process().children(recursive=True)
        self.family_file.write_text("\n".join(str(p.pid) for p in family))
        if self.signals[0] == HEAD:  # the Ray head's GCS dies under the run (killed, crashed, OOM)
            [gcs] = [p for p in family if p.name().startswith("gcs_server")]
            gcs.kill()
        else:
            os.kill(os.getpid(), self.signals[0])

    def shutting_down(self) -> None:
        """The run's shutdown began: the second signal, once, if there is one."""
        with self._lock:
            if not self.fired or len(self.signals) < 2:
                return
            second, self.signals = self.signals[1], self.signals[:1]
        os.kill(os.getpid(), second)


def install(probe: Probe) -> None:
    """Hooks on the run's own methods, each calling the original and telling the probe of its event."""
    from rlboost.hybrid import fleet, manager, pulls, rollout, step_run
    from rlboost.hybrid.handles import PREEMPTIBLE
    from rlboost.rollout.step_data import Abort
    from rlboost import train

    def after(cls, name, event):
        original = getattr(cls, name)

        @functools.wraps(original)
        def hooked(self, *args, **kwargs):
            result = original(self, *args, **kwargs)
            event(self, args, result)
            return result
        setattr(cls, name, hooked)

    def before(cls, name, event):
        original = getattr(cls, name)

        @functools.wraps(original)
        def hooked(self, *args, **kwargs):
            event(self, args)
            return original(self, *args, **kwargs)
        setattr(cls, name, hooked)

    # Fleet._await_boot(name, info_ref): a worker's actor exists and its boot is awaited; only instances
    # are billed (what a cloud bills)
    before(fleet.Fleet, "_await_boot", lambda self, args: args[0] in self._billed and probe.at("booting"))
    after(rollout.HybridRollout, "generate",
          lambda self, args, result: self.training and self.run.state.seeding and probe.at("seeding"))

    def executed(run, args):
        if any(isinstance(c, Abort) and c.reason == "seed_handoff" for c in list(args[0])):
            probe.at("handoff")
        if not run.state.seeding and run.stats.tokens_by_kind[PREEMPTIBLE] > 0 and run.stats.migrated["seed_handoff"]:
            probe.at("offloaded")

    original_execute = step_run.StepRun._execute

    def execute(self, commands):
        commands = list(commands)
        executed(self, (commands,))
        return original_execute(self, commands)

    step_run.StepRun._execute = execute

    def watched(groups):  # the trainer's stream of groups: it is training once it took the first
        for group in groups:
            yield group
            probe.at("training")

    for cls in _trainers():
        original_train_step = cls.train_step

        def train_step(self, groups, *args, _original=original_train_step, **kwargs):
            return _original(self, watched(groups), *args, **kwargs)
        cls.train_step = train_step
    before(rollout.HybridRollout, "publish", lambda self, args: probe.at("publishing"))

    def pulling(tracker, args):
        handle = args[0]
        if handle.kind == PREEMPTIBLE and tracker.manifest is not None and tracker.manifest.version > 0:
            probe.at("pull")

    after(pulls.PullTracker, "start", lambda self, args, result: pulling(self, args))
    before(train.Run, "evaluate", lambda self, args: self.step > 0 and probe.at("validation"))
    before(train.Run, "save", lambda self, args: probe.at("checkpointing"))
    before(rollout.HybridRollout, "close", lambda self, args: probe.shutting_down())
    before(manager.RolloutManager, "shutdown", lambda self, args: probe.shutting_down())


def _trainers() -> list[type]:
    """Every kind of trainer a run may build: one device, and the ranks' group (trainer.world_size > 1)."""
    from rlboost.trainer.ranks import TrainerGroup
    from rlboost.trainer.trainer import Trainer

    return [Trainer, TrainerGroup]


def main(argv: list[str]) -> int:
    phase, names, family_file, dash, *train_args = argv
    assert dash == "--", "usage: stop_probe.py PHASE SIGNAL[,SIGNAL] FAMILY_FILE -- train ..."
    signals = [HEAD if name == HEAD else getattr(signal, name) for name in names.split(",")]
    install(Probe(phase, signals, Path(family_file)))
    from rlboost.cli import main as cli

    return cli(train_args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
