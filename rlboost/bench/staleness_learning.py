"""The learning half of `rlboost bench staleness` (rows `part: "learning"`, docs/staleness.md): does
training on tokens up to k versions old learn as well as the synchronous step?

Contract: `learning_runs(cfg)` runs `rlboost train` once per (bound k, seed) of `cfg` as a user would
(its own process; the showcase's config unless `learning_config` names another), every run with the
same steps and overrides but `algorithm.max_staleness=k` and `run.seed=seed`, each in its own folder
under `learning_dir`; and yields one row per run, read from the run's `metrics.jsonl`
(`learning_row`):
- `k`, `seed`, `steps`: the run; `wall_s`: the process's wall time, start-up included;
- `val_first`, `val_last`: the held-out score (`val/score/mean`) before the first step (step 0) and
  at the last evaluation;
- `reward_first`, `reward_last`: the training batch's mean score at the first and the last step;
- `ess_mean`: the mean over steps of the behaviour weights' effective sample size (`actor/ess`);
- `staleness_mean`, `staleness_max`: tokens' versions behind the step that trained them
  (`staleness/mean` averaged over steps, `staleness/max` over the run);
- `preemptions`, `migrated`: what the spot market did to the run.

On one 2-core machine the real engines share the trainer's cores, so `wall_s` says nothing about
what overlap buys (the emulated rows do); it is here so that a run's cost is on record. A run that
fails stops the bench with its console's last lines; a stopped bench stops its run cleanly (SIGTERM:
the run's own clean stop, a second one at once) and leaves no process behind.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from rlboost.configs import SHOWCASE
from rlboost.stopping import StopOnSignal
from rlboost.tracking.report_data import ESS, METRICS_FILE, STALENESS, STALENESS_MAX, read_metrics

STOP_GRACE_S = 120.0
"""How long a stopped bench lets its run stop cleanly before the second signal ends it at once."""


def train_command(config: str, k: int, seed: int, steps: int, run_dir: Path, overrides: list[str]) -> list[str]:
    """The `rlboost train` command line of one learning run: the bound and seed last, so they win."""
    return [sys.executable, "-m", "rlboost.cli", "train", config or str(SHOWCASE), *overrides,
            f"run.total_steps={steps}", f"run.output_dir={run_dir}", "run.resume=disable",
            f"algorithm.max_staleness={k}", f"run.seed={seed}"]


def learning_row(run_dir: Path, k: int, seed: int, wall_s: float) -> dict:
    """One run's row (the module docstring) from its folder. Raises ValueError naming what the run's
    metrics lack (a run without an evaluation, or one that trained no step)."""
    rows = read_metrics(run_dir / METRICS_FILE)  # the report's reader: merged lines, a cut-off last line skipped
    trained = [(step, m) for step, m in rows.items() if step >= 1]
    evals = [(step, m) for step, m in rows.items() if "val/score/mean" in m]
    if not trained:
        raise ValueError(f"{run_dir / METRICS_FILE}: no trained step")
    if not evals:
        raise ValueError(f"{run_dir / METRICS_FILE}: no evaluation (val/score/mean); the learning rows need "
                         "run.val_before_train and run.test_freq")

    def mean(key: str) -> float:
        values = [m[key] for _, m in trained if key in m]
        return sum(values) / len(values) if values else float("nan")

    (first_eval, first), (last_eval, last) = evals[0], evals[-1]
    return {"part": "learning", "k": k, "seed": seed, "steps": trained[-1][0], "wall_s": wall_s,
            "val_first": first["val/score/mean"], "val_first_step": first_eval,
            "val_last": last["val/score/mean"], "val_last_step": last_eval,
            "reward_first": trained[0][1].get("critic/score/mean", float("nan")),
            "reward_last": trained[-1][1].get("critic/score/mean", float("nan")),
            "ess_mean": mean(ESS), "staleness_mean": mean(STALENESS),
            "staleness_max": max((m.get(STALENESS_MAX, 0.0) for _, m in trained), default=0.0),
            "preemptions": sum(m.get("spot/preemptions", 0.0) for _, m in trained),
            "migrated": sum(m.get("migration/samples", 0.0) for _, m in trained)}


def run_train(command: list[str], console_log: Path) -> float:
    """Run one `rlboost train` to its end, its console to `console_log`; return its wall seconds.
    Raises RuntimeError with the console's last lines if it fails; stops it cleanly if this is stopped."""
    console_log.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    # a SIGTERM or Ctrl-C of the bench (StopRequested, KeyboardInterrupt) stops the run first; a second
    # one ends the bench and everything it started at once
    with open(console_log, "w") as out, StopOnSignal():
        # its own session: the signals below reach the run and everything it started
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait()
        except BaseException:
            _stop(proc)
            raise
    if code != 0:
        tail = "\n".join(console_log.read_text(errors="replace").splitlines()[-20:])
        raise RuntimeError(f"`{' '.join(command[2:])}` exited {code}; its console ({console_log}) ends:\n{tail}")
    return time.monotonic() - start


def _stop(proc: subprocess.Popen) -> None:
    """The run's clean stop (SIGTERM); past the grace, the second signal (the run kills what it started),
    then the whole session."""
    for signum, grace in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGTERM, 30.0), (signal.SIGKILL, 30.0)):
        try:
            os.killpg(proc.pid, signum)
        except ProcessLookupError:
            return
        try:
            proc.wait(grace)
            if signum != signal.SIGKILL:
                os.killpg(proc.pid, signal.SIGKILL)  # whatever the run left in its session
            return
        except subprocess.TimeoutExpired:
            continue
        except ProcessLookupError:
            return


def learning_runs(config: str, bounds: list[int], seeds: list[int], steps: int, learning_dir: str,
                  overrides: list[str], log=None) -> Iterator[dict]:
    """Each (k, seed) run's row, k by k, each seed in turn (the module docstring)."""
    for k in bounds:
        for seed in seeds:
            run_dir = Path(learning_dir) / f"k{k}_seed{seed}"
            shutil.rmtree(run_dir, ignore_errors=True)  # the bench's own folder: a rerun starts afresh
            command = train_command(config, k, seed, steps, run_dir, overrides)
            if log:
                log(f"learning: max_staleness {k}, seed {seed}, {steps} steps -> {run_dir}")
            wall_s = run_train(command, run_dir / "console.log")
            yield learning_row(run_dir, k, seed, wall_s)


__all__ = ["learning_row", "learning_runs", "run_train", "train_command"]
