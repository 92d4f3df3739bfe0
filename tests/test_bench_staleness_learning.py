"""The learning rows of `rlboost bench staleness` (rlboost.bench.staleness_learning): a run's row read
from its metrics, the learning runs' configs refused before anything runs, a failed run reported with
its console's last lines, and a stopped run's whole session ended."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from hybrid_util import patience, wait_for

from rlboost.bench.staleness import StalenessBenchConfig, render
from rlboost.cli import main
from rlboost.bench.staleness_learning import _stop, learning_row, run_train, train_command


def write_metrics(run_dir, steps):
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in steps))


def test_a_runs_row_reads_its_evaluations_weights_and_staleness(tmp_path):
    # written out of order, as a resumed run's file may be: the row goes by step
    write_metrics(tmp_path, [
        {"step": 2, "critic/score/mean": 0.5, "actor/ess": 0.8, "staleness/mean": 1.0, "staleness/max": 2.0,
         "spot/preemptions": 1.0, "migration/samples": 5.0, "val/score/mean": 0.25},
        {"step": 0, "val/score/mean": 0.125},
        {"step": 1, "critic/score/mean": 0.1, "actor/ess": 1.0, "staleness/mean": 0.0, "staleness/max": 0.0,
         "spot/preemptions": 0.0, "migration/samples": 3.0},
    ])
    row = learning_row(tmp_path, k=2, seed=1, wall_s=12.0)
    assert row == {"part": "learning", "k": 2, "seed": 1, "steps": 2, "wall_s": 12.0,
                   "val_first": 0.125, "val_first_step": 0, "val_last": 0.25, "val_last_step": 2,
                   "reward_first": 0.1, "reward_last": 0.5, "ess_mean": pytest.approx(0.9),
                   "staleness_mean": 0.5, "staleness_max": 2.0, "preemptions": 1.0, "migrated": 8.0}
    assert "| 2 | 1 | 2 | 0.125 | 0.250 |" in render({"results": [row]})


def test_a_run_without_an_evaluation_is_refused_by_what_it_lacks(tmp_path):
    write_metrics(tmp_path, [{"step": 1, "critic/score/mean": 0.1}])
    with pytest.raises(ValueError, match="no evaluation"):
        learning_row(tmp_path, k=0, seed=0, wall_s=1.0)


@pytest.mark.parametrize("fields, said", [
    ({"parts": ["emulated", "learned"]}, "parts=emulated,learned: each of emulated, learning"),
    ({"parts": ["learning"], "learning_seeds": []}, "at least one each"),
    ({"parts": ["learning"], "learning_steps": 0}, "learning_steps must be >= 1"),
])
def test_the_benchs_own_fields_are_refused_by_name(fields, said):
    with pytest.raises(ValueError, match=said.replace("[", r"\[")):
        StalenessBenchConfig(**fields).validate()


@pytest.mark.parametrize("override, said", [
    ("trainer.nope=1", "unknown config key `trainer.nope`"),
    ("rollout.mode=colocated", "needs rollout.mode=hybrid"),
])
def test_a_learning_run_the_train_command_would_refuse_is_refused_before_anything_runs(override, said, tmp_path,
                                                                                       capsys):
    runs = tmp_path / "runs"
    code = main(["bench", "staleness", "--parts", "learning", "--learning-overrides", override,
                 "--learning-dir", str(runs)])
    out = capsys.readouterr()
    assert code == 2 and said in out.out + out.err and "Traceback" not in out.out + out.err
    assert not runs.exists()  # nothing started


def test_the_bound_and_seed_come_last_so_they_win(tmp_path):
    command = train_command("", 2, 1, 5, tmp_path, ["algorithm.max_staleness=0", "run.seed=9"])
    assert command[-2:] == ["algorithm.max_staleness=2", "run.seed=1"]
    assert command[4].endswith("showcase.yaml") and "run.total_steps=5" in command


def test_a_failed_run_is_reported_with_its_consoles_last_lines(tmp_path):
    command = [sys.executable, "-c", "import sys; print('first'); print('what went wrong'); sys.exit(3)"]
    with pytest.raises(RuntimeError, match="exited 3(.|\n)*what went wrong"):
        run_train(command, tmp_path / "console.log")


def test_a_stopped_run_gets_its_clean_stop_and_leaves_nothing_behind(tmp_path):
    # the run traps its first SIGTERM (as `rlboost train` does: a clean stop) and has a child of its own
    ready = tmp_path / "ready"
    script = ("import signal, subprocess, sys, time, pathlib\n"
              "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
              f"signal.signal(signal.SIGTERM, lambda *a: (pathlib.Path({str(tmp_path / 'stopped')!r}).touch(), "
              "sys.exit(143)))\n"
              f"pathlib.Path({str(ready)!r}).write_text(str(child.pid))\n"
              "time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    # an event: the run says it is up (the limit only bounds a hang, stretched by the machine's load)
    wait_for(lambda: (ready.exists() and ready.read_text()) or proc.poll() is not None, 60, "the run to come up")
    assert proc.poll() is None, "the run ended before it came up"
    child = int(ready.read_text())
    _stop(proc)
    assert proc.returncode == 143 and (tmp_path / "stopped").exists()  # its clean stop ran
    wait_for(lambda: not alive(child), 30, "the run's own child to be killed with it")


def alive(pid: int) -> bool:
    """A process that exists and is not a zombie (a killed orphan stays one until init reaps it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.e2e
def test_a_bench_stopped_by_sigterm_stops_its_run_and_says_so(tmp_path):
    """`rlboost bench staleness --parts learning` given SIGTERM while its run trains: the run gets its
    clean stop, the bench exits 143 with one line, and no process of either is left."""
    runs = tmp_path / "runs"
    bench = subprocess.Popen(
        [sys.executable, "-m", "rlboost.cli", "bench", "staleness", "--parts", "learning", "--learning-config",
         str(Path(__file__).resolve().parents[1] / "configs" / "smoke.yaml"), "--learning-bounds", "0",
         "--learning-seeds", "0", "--learning-steps", "1000", "--learning-dir", str(runs)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        # an event: the run has trained a step (its metrics file has a line)
        metrics = runs / "k0_seed0" / "metrics.jsonl"
        wait_for(lambda: metrics.exists() and metrics.read_text().strip() or bench.poll() is not None, 120,
                 "the learning run's first step")
        assert bench.poll() is None, bench.stdout.read()
        started = psutil.Process(bench.pid).children(recursive=True)  # the run (its own session) and its own
        assert started
        bench.terminate()
        out, _ = bench.communicate(timeout=patience(150))  # its clean stop; the limit only bounds a hang
        assert bench.returncode == 143, out
        assert "stopped by SIGTERM" in out and "Traceback" not in out
        console = (runs / "k0_seed0" / "console.log").read_text()
        assert "stopped by SIGTERM" in console  # the run's own clean stop, with how to resume it
        assert not [p.pid for p in started if alive(p.pid)]
    finally:
        if bench.poll() is None:
            os.killpg(bench.pid, signal.SIGKILL)

