"""A stop at every phase of a step: `rlboost train` gets SIGINT or SIGTERM at an exact event of its own
(tests/stop_probe.py sends it when the phase begins, from inside the run, as a signal from outside
arrives) and must end with one line naming the signal and the command that resumes, the shell's exit
status for the signal (130, 143), no traceback on the console or in the run's log, and no process of the
run left behind. The hybrid phases run as one chain: each run after the first resumes the one stopped
before it and is itself stopped at the next phase, the last one runs to the end, so every resume after a
stop at each phase is exercised too; a colocated run stopped mid-training resumes to the same metrics as
an uninterrupted one (its metrics are deterministic), and so does one on two trainer ranks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from hybrid_util import patience
from stop_probe import HEAD, PHASES
from rlboost.stopping import exit_status

pytestmark = pytest.mark.e2e  # whole runs of `rlboost train`, stopped and resumed: `make test-e2e`

REPO = Path(__file__).resolve().parents[1]
PROBE = str(Path(__file__).resolve().parent / "stop_probe.py")
HYBRID = str(REPO / "configs" / "hybrid_smoke.yaml")
SMOKE = str(REPO / "configs" / "smoke.yaml")
QUIET = ["tracking.report=false", "tracking.loggers=[jsonl]"]
HYBRID_RUN = ["run.total_steps=2", "run.save_freq=1", "run.test_freq=1", "run.val_before_train=false",
              "rollout.hybrid.preempt_every_s=0", "rollout.hybrid.num_preemptible=1",
              "rollout.hybrid.offload.enabled=false", "data.max_response_length=192", *QUIET]
"""Two steps, each checkpointed and validated, one instance and no random preemptions: every phase happens
in each step. The hand-off must come in every step, with samples to move: the window stays at its 0.2 s
(the controller would shrink it) and is not gated (the gate may rightly keep a step colocated to its end,
as it did beside a busy process), and a step's rollout takes about 2.5x the window on a quiet machine
(at 64 tokens it took about the window itself, and the reserved worker could finish all it held first);
a busy machine only slows the rollout, not the window."""


def stopped(tmp_path: Path, run_dir: Path, phase: str, signals: str, config: str, *overrides: str):
    """`rlboost train` stopped by `signals` at `phase`; (exit status, console text, pids it had started)."""
    family = tmp_path / f"family-{phase}-{signals.replace(',', '-')}"
    family.unlink(missing_ok=True)  # a link's pids are its own: none left from another run
    done = subprocess.run([sys.executable, PROBE, phase, signals, str(family), "--", "train", config,
                           f"run.output_dir={run_dir}", *overrides],
                          cwd=REPO, capture_output=True, text=True, timeout=patience(300), start_new_session=True,
                          env=os.environ | {"PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])})
    pids = [int(p) for p in family.read_text().split()] if family.exists() else []
    return done.returncode, done.stdout + done.stderr, pids


def assert_clean_stop(status: int, out: str, pids: list[int], run_dir: Path, signal_name: str, phase: str) -> list[str]:
    """The one-line stop: its status, its line and the command that resumes, no traceback anywhere, nothing
    left running. Returns the resume command's arguments after `rlboost train`."""
    assert pids, f"{phase}: the probe never met its event (the run ended without it):\n{out[-3000:]}"
    assert status == exit_status(getattr(signal, signal_name)), (phase, status, out[-3000:])
    assert f"stopped by {signal_name}" in out, (phase, out[-3000:])
    log = (run_dir / "run.log").read_text() if (run_dir / "run.log").exists() else ""
    for text, where in ((out, "console"), (log, "run.log")):
        assert "Traceback" not in text and "KeyboardInterrupt" not in text, f"{phase}: a traceback in the {where}"
    assert_gone(pids, phase)
    [command] = [line.split("resume with:", 1)[1].split() for line in out.splitlines() if "resume with:" in line]
    assert command[:2] == ["rlboost", "train"] and f"run.output_dir={run_dir}" in command, command
    return command[2:]


def assert_gone(pids: list[int], what: str) -> None:
    deadline = time.monotonic() + patience(30)
    while left := [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]:
        assert time.monotonic() < deadline, f"{what}: processes of the stopped run still running: {left}"
        time.sleep(0.2)


def metrics_of(run_dir: Path) -> dict[int, dict]:
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {m["step"]: m for m in lines}


CHAIN = [(phase, ("SIGTERM", "SIGINT")[i % 2]) for i, phase in enumerate(PHASES)]  # SIGTERM first: during boot
CHAIN.insert(4, ("offloaded", "SIGINT,SIGTERM"))  # a second signal once the shutdown has begun


def test_a_stop_at_each_phase_of_a_hybrid_step_is_clean_and_the_run_resumes_after_each(tmp_path):
    """One run after another in one run folder: each stopped at the next event of CHAIN, each after the
    first started with the command the one before printed (a resume from the last whole checkpoint);
    the last runs to the end. Then the Ray head's GCS is killed from outside a run, in the seeding of
    its first step, in a folder of its own: a whole step is then still to run, which no run can finish
    without meeting the loss. (At the chain's end it could meet a run with nothing left to do: a
    link whose phase came a step late carries every later link with it, up to the last checkpoint.)"""
    run_dir = tmp_path / "run"
    overrides = HYBRID_RUN
    for phase, signals in CHAIN:
        status, out, pids = stopped(tmp_path, run_dir, phase, signals, HYBRID, *overrides)
        if "," in signals:
            assert_ended_at_once(status, out, pids, signals.split(",")[1])
            resume = [HYBRID, *overrides]  # ended at once, nothing printed: the same command resumes
        else:
            resume = assert_clean_stop(status, out, pids, run_dir, signals, phase)
        assert resume[0] == HYBRID
        overrides = resume[1:]
    done = subprocess.run([sys.executable, "-m", "rlboost.cli", "train", *resume], cwd=REPO, capture_output=True,
                          text=True, timeout=patience(300))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert sorted(step for step in metrics_of(run_dir) if step > 0) == [1, 2]

    head_dir = tmp_path / "head-lost"
    status, out, pids = stopped(tmp_path, head_dir, "seeding", HEAD, HYBRID, *HYBRID_RUN)
    assert assert_head_lost(status, out, pids, head_dir)[0] == HYBRID


def assert_ended_at_once(status: int, out: str, pids: list[int], second: str) -> None:
    """A second signal during the shutdown: the process ends at once, with the second signal's status,
    and takes every process it started with it; no traceback. The folder resumes as after any stop."""
    assert pids and status == exit_status(getattr(signal, second)), (status, out[-3000:])
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out[-3000:]
    assert_gone(pids, "the second signal")


def assert_head_lost(status: int, out: str, pids: list[int], run_dir: Path) -> list[str]:
    """The driver's Ray head lost from outside the run (its GCS killed mid-step): no Ray call can succeed
    any more, so the run ends at once, saying so in one line that names the cause and how to resume,
    status 2, with every process it started."""
    assert pids and status == 2, (status, out[-3000:])
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Ray head was lost" in errors[0] and "gcs_server" in errors[0], out[-3000:]
    assert "Traceback" not in out and "Traceback" not in (run_dir / "run.log").read_text(), out[-3000:]
    assert_gone(pids, "the lost head")
    [command] = [line.split("resume with:", 1)[1].split() for line in out.splitlines() if "resume with:" in line]
    return command[2:]


def test_a_run_on_two_trainer_ranks_stopped_mid_training_is_clean_and_resumes(tmp_path):
    """The ranks (Ray actors, FSDP2 over gloo) go with the stop; the run resumes from its checkpoint (the
    sharded checkpoint's exact resume is tests/test_trainer_sharded.py's). A colocated run stopped
    mid-step resumes to the uninterrupted metrics in tests/test_train.py."""
    common = ["run.total_steps=2", "run.save_freq=1", "trainer.world_size=2", *QUIET]
    run_dir = tmp_path / "run"
    status, out, pids = stopped(tmp_path, run_dir, "training", "SIGINT", SMOKE, *common)
    resume = assert_clean_stop(status, out, pids, run_dir, "SIGINT", "training")
    done = subprocess.run([sys.executable, "-m", "rlboost.cli", "train", *resume], cwd=REPO, capture_output=True,
                          text=True, timeout=patience(300))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert sorted(step for step in metrics_of(run_dir) if step > 0) == [1, 2]
