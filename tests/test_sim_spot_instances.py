"""The simulator's books of instances (`rlboost.sim.spot_instances`) show the trace replay what the
runtime's trace provider shows it (`rlboost.hybrid.providers.TraceProvider`: the instances the
manager admitted by name, those still booting as a count): a drop of the trace kills booted instances
only, and a boot in progress holds its slot."""

from __future__ import annotations

from rlboost.sim.pulls import PullTimes
from rlboost.sim.spot_instances import SpotInstances
from rlboost.spot.trace import SpotTrace, TraceReplay


def books(times, counts) -> SpotInstances:
    return SpotInstances(TraceReplay(SpotTrace(times, counts), seed=0), PullTimes(1.0, 0.1, 0.5))


def test_a_drop_while_instances_boot_kills_none_and_no_more_are_launched():
    spot = books([0.0, 10.0], [2, 0])
    assert spot.decide(0.0, cap=None).start == 2
    launched = [spot.launch(0.0) for _ in range(2)]
    assert spot.decide(5.0, cap=None).start == 0  # the two booting hold their slots
    dropped = spot.decide(10.0, cap=None)
    assert dropped.kill == [] and dropped.start == 0  # neither is the market's to take yet
    launched[0].booted = True
    # booted, it is exposed: the drop (availability 0) takes it; the one still booting stays
    assert spot.decide(11.0, cap=None).kill == [launched[0].name]


def test_what_the_replay_sees_is_what_the_runtime_shows_it(monkeypatch):
    seen = []
    spot = books([0.0], [3])
    monkeypatch.setattr(spot.replay, "step", lambda now, running, starting, cap: seen.append((running, starting)))
    a, b, c = (spot.launch(0.0) for _ in range(3))
    b.booted = True
    spot.decide(1.0, cap=None)
    assert seen == [([b.name], 2)]  # TraceProvider.tick: replay.advance(now, running names, fleet.starting, cap)


def test_the_twin_of_a_run_whose_instances_boot_for_longer_than_a_step_keeps_them():
    # `rlboost bench staleness`'s trace rows: instances that boot for 20 s against steps of about 15 s.
    # Shown the booting instances by name, the replay killed three of them in the first step (drops the
    # run never had), the offload rule on short-lived markets fired and the twin held none from then on.
    from rlboost.bench.emulation import run_simulation
    from rlboost.bench.emulation_config import CheckConfig

    steps = run_simulation(CheckConfig(provider="trace", steps=4), startup_s=20.0)
    assert all(s["instances_start"] > 0 for s in steps), [s["instances_start"] for s in steps]
