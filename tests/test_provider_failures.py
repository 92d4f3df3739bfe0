"""Provider failures on real Ray and real worker processes: an instance that can never boot is asked
for less and less often (the launch backoff), and the console of the run gets one line for the
cause and a summary, not a line per attempt; a tick that fails at every turn is told the same way.

The provider's turns are taken by the test at scripted monotonic times, each once the boot it
started has ended, so what is asked for and what is printed depend on no wall-clock window."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from hybrid_util import ENGINE, patience, wait_for
from rlboost.cluster.config import ClusterConfig
from rlboost.cluster.ray_cluster import Cluster
from rlboost.hybrid.config import HybridConfig
from rlboost.hybrid.fleet import Fleet
from rlboost.hybrid.manager import RolloutManager
from rlboost.hybrid.providers import FixedPool, TraceProvider
from rlboost.hybrid.worker import WorkerSpec
from rlboost.models import ModelConfig
from rlboost.run_log import run_log
from rlboost.spot import SpotTrace, TraceReplay

pytestmark = pytest.mark.e2e  # providers starting real instances: `make test-e2e`

MISSING = "/nowhere/model"


def missing_model_engine():
    """An engine factory failing in the worker's process as a model missing on the instance does. A
    real missing path fails the same way, after ~10 s of importing torch per attempt on a busy
    machine; this fails at once. Built in a function so that Ray ships it by value (its workers
    cannot import the test modules)."""
    def build(spec):
        raise FileNotFoundError(f"no model at {spec.model.path} on this instance")
    return build


@pytest.fixture(scope="module")
def fleet():
    """A fleet on a Ray of its own, with no worker: every instance it boots fails in its constructor.
    The module's tests share it (Ray's start is most of their time); they start no instance that lives."""
    cfg = HybridConfig(num_preemptible=1, launch_backoff_s=1.0, launch_backoff_max_s=2.0, failure_summary_s=5.0,
                       failure_summary_max_s=60.0, call_timeout_s=patience(60))
    spec = WorkerSpec(ModelConfig(path=MISSING), ENGINE, eos_token_ids=[], engine_factory=missing_model_engine())
    cluster = Cluster(ClusterConfig(), cfg.instances)
    try:
        fleet = Fleet(cfg, spec, RolloutManager(cfg, cluster.cfg.weights), cluster)
        try:
            yield fleet
        finally:
            fleet.shutdown()
    finally:
        cluster.shutdown()


def test_an_instance_that_cannot_boot_is_asked_for_less_often_and_its_cause_told_once(fleet, tmp_path):
    pool = FixedPool(fleet, size=1, preempt_every=0.0, seed=0, respawn=True)
    console = io.StringIO()
    launched_at = []
    with run_log(tmp_path / "run.log", Console(file=console, width=400)):
        for turn in range(15):  # every 0.5 s for 7 s
            now = turn * 0.5
            asked = pool.launches
            pool.turn(now)
            if pool.launches > asked:
                launched_at.append(now)
                wait_for(lambda: fleet.starting == 0, 30, f"the boot asked for at {now} s to end")
    # Failures are taken at the turn after their launch: waits of 1, 2, then 2 s (the cap), where the
    # pool used to relaunch at every turn
    assert launched_at == [0.0, 1.5, 4.0, 6.5]
    assert len(fleet.boot_failures) == 4 and fleet.starting == 0 and pool.errors == []
    why = f"failed to start: FileNotFoundError: no model at {MISSING} on this instance"
    assert console.getvalue().splitlines() == [
        f"warning: an instance failed to boot: RuntimeError: rollout worker pree-1 (preemptible) {why}; "
        "next launch in 1.0 s",
        # 5 s after that line, the two failures since (at 2.0 and 4.5 s), the latest as it was
        f"warning: an instance failed to boot: RuntimeError: rollout worker pree-3 (preemptible) {why} "
        "(2 more times in the last 5.0 s; next launch in 1.0 s)"]
    assert (tmp_path / "run.log").read_text().count("an instance failed to boot") == 2


def test_a_tick_that_fails_at_every_turn_is_told_once_then_summarised(fleet, tmp_path):
    clock = ScriptedClock(0.0)
    provider = TraceProvider(fleet, TraceReplay(SpotTrace(times_s=(0.0,), counts=(0,)), seed=0), clock=clock)
    console = io.StringIO()
    with run_log(tmp_path / "run.log", Console(file=console, width=400)):
        clock.t = 10.0
        provider.turn(0.0)
        clock.t = 4.0  # a clock that goes back: the replay refuses it at every tick
        for turn in range(1, 21):
            provider.turn(turn * 0.1)
        provider.turn(6.0)  # the summary is due 5 s after the first line (at 0.1 s)
    assert len(provider.errors) == 21
    went_back = "provider TraceProvider: a tick failed: ValueError: TraceReplay.step: time went back from 10.0 to 4.0"
    assert console.getvalue().splitlines() == [f"warning: {went_back}",
                                               f"warning: {went_back} (20 more times in the last 5.9 s)"]


class ScriptedClock:
    """A provider's schedule clock, set by the test."""

    def __init__(self, t: float):
        self.t = t

    def __call__(self) -> float:
        return self.t
