"""What a user sees of `rlboost train`: one line per event, none of Ray's raw paragraphs, a clean stop on
SIGTERM that shuts every worker down and names the command that resumes, and the base config named in
the first line. Real processes, real kills, a real signal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from progress_kills import kills_every
from hybrid_util import patience
from rlboost.cli import base_config
from rlboost.configs import SHOWCASE

REPO = Path(__file__).resolve().parents[1]
HYBRID_SMOKE = str(REPO / "configs" / "hybrid_smoke.yaml")
RAY_PARAGRAPHS = ("(raylet)", "A worker died or was killed", "Worker exit type", "has been marked dead")


class Lines:
    """A process's output, read by a thread as it comes."""

    def __init__(self, stream):
        self.lines: list[str] = []
        self._thread = threading.Thread(target=lambda: self.lines.extend(iter(stream.readline, "")), daemon=True)
        self._thread.start()

    def text(self) -> str:
        self._thread.join(timeout=patience(30))
        return "".join(self.lines)


def wait_for(condition, what: str, proc: subprocess.Popen, limit_s: float) -> None:
    deadline = time.monotonic() + limit_s
    while not condition():
        assert proc.poll() is None, f"the run ended (status {proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"no {what} within {limit_s:.0f} s"
        time.sleep(0.1)


@pytest.mark.e2e
def test_a_hybrid_run_shows_events_not_rays_messages_and_stops_cleanly_on_sigterm(tmp_path):
    run_dir = tmp_path / "run"
    # kills at seeded token counts, the first due at about the 930th token: in step 1's generation
    # (some 2,000 tokens), so that its line names the samples it migrated
    argv = [sys.executable, "-m", "rlboost.cli", "train", HYBRID_SMOKE, f"run.output_dir={run_dir}",
            "run.total_steps=500", *kills_every(500), "tracking.report=false", "tracking.loggers=[console,jsonl]"]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    out, err = Lines(proc.stdout), Lines(proc.stderr)
    family: set[int] = set()
    try:
        # a preemption's line on the console, and Ray's paragraph about that worker's death in the log
        wait_for(lambda: any("preempted by the seeded random preemptions" in line and "samples migrated" in line
                             for line in out.lines), "preemption line", proc, patience(300))
        log = run_dir / "run.log"
        death = "A worker died or was killed"
        wait_for(lambda: (log.exists() and death in log.read_text())
                 or any(death in line for line in out.lines + err.lines), "Ray worker-death message", proc,
                 patience(120))
        family = {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
        assert family, "the run started no worker processes"
        proc.send_signal(signal.SIGTERM)
        status = proc.wait(timeout=patience(120))
    finally:
        for pid in [proc.pid, *family]:  # whatever happened above, nothing of this run outlives the test
            try:
                os.killpg(pid, signal.SIGKILL) if pid == proc.pid else os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        proc.wait()
    stdout, stderr = out.text(), err.text()
    for paragraph in RAY_PARAGRAPHS:
        assert paragraph not in stdout + stderr, f"{paragraph!r} reached the console:\n{stdout}{stderr}"
    assert death in log.read_text()  # it went to the run's log instead
    assert status == 143, stdout + stderr  # 128 + SIGTERM, as a shell reports it
    assert "Traceback" not in stdout + stderr and "KeyboardInterrupt" not in stdout + stderr, stdout + stderr
    assert stdout.splitlines()[0] == f"config: {HYBRID_SMOKE} with {len(argv) - 5} override(s)"
    assert "stopped by SIGTERM" in stdout and f"run.output_dir={run_dir}" in stdout, stdout
    # every worker and Ray process of the run went with it
    deadline = time.monotonic() + patience(30)
    while (left := [pid for pid in family if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]):
        assert time.monotonic() < deadline, f"processes of the stopped run still running: {left}"
        time.sleep(0.2)


@pytest.mark.parametrize(("config", "overrides", "base"), [
    (None, [], SHOWCASE),
    (None, ["run.output_dir=outputs/x"], SHOWCASE),  # `make demo`: the showcase in a folder of its own
    (None, ["data.train_files=[gsm8k.parquet]"], None),  # another task: not on top of the showcase's
    (None, ["run.total_steps=3", "reward.path=my_reward.py"], None),
    ("my.yaml", ["data.train_files=[a.parquet]"], "my.yaml"),
])
def test_without_a_config_file_the_base_is_the_showcase_only_for_its_own_task(config, overrides, base):
    chosen, line = base_config(config, overrides)
    assert chosen == base
    assert line.startswith("config: ") and (("showcase" in line) == (base == SHOWCASE))
    if base is None:
        assert "built-in defaults" in line and "colocated" in line
