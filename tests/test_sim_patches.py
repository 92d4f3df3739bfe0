"""Weight patches in the simulator (issue 25): a refresh (a puller holding v-1) moves `patch_share` of
the version's bytes, a join `from_base_share`, a puller two or more versions behind the whole
version; the defaults (1.0, 1.0) are full pulls; shares outside (0, 1] are refused naming the key."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from rlboost.cli import main
from rlboost.sim.cluster import ClusterRun
from rlboost.sim.patch_table import main as table_main
from rlboost.sim.patch_table import markdown, rows
from rlboost.sim.profile import make_profiles
from rlboost.sim.pulls import PullTimes
from rlboost.sim.simulator import SimConfig, simulate
from rlboost.sim.workload import WorkloadConfig

from test_sim_link import constant_trace, joins_seen

TRAIN = make_profiles("qwen3-8b")[1]


def test_the_share_follows_what_the_puller_holds():
    pulls = PullTimes(full_s=100.0, patch_share=0.01, from_base_share=0.1)
    assert pulls.seconds(4, 5) == pytest.approx(1.0)     # a refresh: the patch v-1 -> v
    assert pulls.seconds(None, 5) == pytest.approx(10.0)  # a joiner: the cumulative patch base -> v
    assert pulls.seconds(3, 5) == 100.0                   # two versions behind: the whole version
    assert pulls.seconds(None, 0) == pytest.approx(10.0)  # a constant share, version 0 included
    assert pulls.longest_planned_s == pytest.approx(10.0)


def late_s_of_steady_steps(cfg: SimConfig, sync_s: float) -> list[float]:
    """How long after each step's start the instances that served the step before got work (their
    refresh minus the reserved sync), over the steps that kept their instances; and checks that the
    next step starts `sync_s` after the trainer's last group."""
    r = simulate(cfg)
    steady = [s for s in r.steps[1:] if s.instances_start == s.instances_end == 2]
    assert len(steady) >= 3
    for s in r.steps:
        assert s.wait_remote_s == pytest.approx((s.end_s - sync_s) - (s.start_s + s.rollout_s), abs=1e-6)
    return [s.rollout_s - s.remote_s for s in steady]


def test_a_refresh_with_a_patch_of_one_percent_is_a_hundred_times_shorter(tmp_path):
    # Two instances serve every step; each new version reaches them as a refresh. At 10 Gbit/s the
    # whole 8B version takes 13.1 s against 0.66 s on the reserved engines' 200 Gbit/s: the instances
    # get their share of each step that much later than the step's start.
    base = SimConfig(trace=constant_trace(tmp_path, 2), duration_s=1500, link_gbps=10.0,
                     offload=replace(SimConfig().offload, gate_handoff=False))
    link_s, reserved_s = TRAIN.weight_sync_s(10.0), TRAIN.weight_sync_s(200.0)
    full = late_s_of_steady_steps(base, reserved_s)
    patched = late_s_of_steady_steps(replace(base, patch_share=0.01), 0.01 * reserved_s)
    assert full == pytest.approx([link_s - reserved_s] * len(full), rel=1e-6)
    assert patched == pytest.approx([0.01 * (link_s - reserved_s)] * len(patched), rel=1e-6)
    assert min(full) / max(patched) == pytest.approx(100.0, rel=1e-6)


@pytest.mark.parametrize("patch_share, from_base_share", [(0.01, 0.1), (0.01, 1.0), (1.0, 0.1)])
def test_a_joiner_pulls_the_from_base_share_whatever_the_patch(tmp_path, monkeypatch, patch_share, from_base_share):
    # Two instances launched at the step's start (one step): what the controller weighs is the boot
    # plus the cumulative patch from the base, never the per-step patch.
    cfg = SimConfig(trace=constant_trace(tmp_path, 2), duration_s=1.0, link_gbps=1.0, instance_startup_s=60.0,
                    patch_share=patch_share, from_base_share=from_base_share)
    assert joins_seen(monkeypatch, cfg) == [pytest.approx(60.0 + from_base_share * TRAIN.weight_sync_s(1.0), rel=1e-9)]


def test_an_instance_two_versions_behind_pulls_the_whole_version(tmp_path, monkeypatch):
    # Steps of 4 s (8 short prompts, the reserved engines take everything) against a 131 s version
    # at 1 Gbit/s: while one pull runs, dozens of versions come out, so every pull after the join
    # starts two or more versions behind and moves the whole version, not the 1% patch.
    arrivals = []
    original = ClusterRun._pulled

    def pulled(self, name, version):
        arrivals.append((self.now, version, self.published))
        return original(self, name, version)

    monkeypatch.setattr(ClusterRun, "_pulled", pulled)
    cfg = SimConfig(trace=constant_trace(tmp_path, 1), duration_s=400.0, link_gbps=1.0, instance_startup_s=60.0,
                    patch_share=0.01, from_base_share=0.5, share_with_pulling=False,
                    offload=replace(SimConfig().offload, enabled=False),
                    workload=WorkloadConfig(prompts_per_step=8, distribution="fixed", median_response=300))
    simulate(cfg)
    full_s = TRAIN.weight_sync_s(1.0)
    assert len(arrivals) == 3
    assert arrivals[0][0] == pytest.approx(60.0 + 0.5 * full_s, rel=1e-9)  # the join, from the base
    for (t0, held, target), (t1, version, _) in zip(arrivals, arrivals[1:]):
        assert version == target and target - held >= 2  # it held a version two or more behind
        assert t1 - t0 == pytest.approx(full_s, rel=1e-9)


def test_the_defaults_are_full_pulls():
    # every result published before the knobs existed still holds (docs/simulator.md: simcmp over the JSON)
    cfg = SimConfig()
    assert (cfg.patch_share, cfg.from_base_share) == (1.0, 1.0)


@pytest.mark.parametrize("name", ["patch_share", "from_base_share"])
@pytest.mark.parametrize("value", [0.0, -0.1, 1.5, math.nan, math.inf])
def test_a_share_outside_zero_to_one_is_refused_naming_the_key(name, value):
    with pytest.raises(ValueError, match=rf"^simulate\.{name} must be in \(0, 1\]"):
        SimConfig(**{name: value}).validate()


def test_the_command_refuses_a_bad_share_in_one_line(tmp_path, capsys):
    for override, message in [
            ("patch_share=0", "error: simulate.patch_share must be in (0, 1] (a share of a version's bytes), got 0.0"),
            ("from_base_share=2", "error: simulate.from_base_share must be in (0, 1] (a share of a version's bytes), "
                                  "got 2.0"),
            ("patch_share=nan", "error: patch_share must be a finite number, got nan"),
            ("from_base_share=inf", "error: from_base_share must be a finite number, got inf")]:
        assert main(["simulate", override, "--plots", str(tmp_path)]) == 2
        captured = capsys.readouterr()
        assert "Traceback" not in captured.out + captured.err
        errors = [line for line in (captured.out + captured.err).splitlines() if line.startswith("error:")]
        assert errors == [message], override


def test_the_docs_table_runs_both_pulls_with_the_shares_given(capsys):
    # `python -m rlboost.sim.patch_table` makes docs/simulator.md's table: each row is rlboost against
    # veRL on the same segment, with full pulls and with the shares it was given.
    base = SimConfig(duration_s=600.0)
    table = rows(base, [10.0], 0.01, 0.1, ["qwen3-8b"], "A")
    assert [(r["pulls"], r["patch_share"], r["from_base_share"]) for r in table] == [("full", 1.0, 1.0),
                                                                                      ("patches", 0.01, 0.1)]
    verl = simulate(replace(base, policy="verl"))
    for r in table:
        shares = {"patch_share": r["patch_share"], "from_base_share": r["from_base_share"]}
        run = simulate(replace(base, link_gbps=10.0, **shares))
        assert r["throughput_rel_verl"] == run.relative_to(verl)["throughput"] == r["segments"]["A"]
        assert r["join_pull_s"] == pytest.approx(r["from_base_share"] * TRAIN.weight_sync_s(10.0))
        assert r["refresh_s"] == pytest.approx(r["patch_share"] * TRAIN.weight_sync_s(10.0))
    assert markdown(table).splitlines()[2].startswith("| qwen3-8b | 10 Gbit/s | full | 60 + 13.1 s | 13.1 s |")
    assert markdown(table).splitlines()[3].startswith("| qwen3-8b | 10 Gbit/s | patches 0.01 / 0.1 | 60 + 1.31 s | 0.13 s |")


@pytest.mark.parametrize("argv, message", [(["--patch-share", "2"], "error: simulate.patch_share must be in (0, 1]"),
                                           (["--links", "fast"], "error: --links: 'fast' is not a number of Gbit/s"),
                                           (["--links", "0"], "error: simulate.link_gbps must be finite and > 0")])
def test_the_docs_table_refuses_bad_input_before_any_run_in_one_line(argv, message, capsys, monkeypatch):
    monkeypatch.setattr("rlboost.sim.patch_table.evaluate", lambda *a, **k: pytest.fail("ran before refusing"))
    assert table_main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.splitlines()) == 1 and captured.err.startswith(message)
