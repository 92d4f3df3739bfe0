"""RLBoost with bounded staleness in the simulator (`max_staleness` k > 0 on the rlboost policies,
`rlboost.sim.cluster`): the instances generate the next batch while the trainer trains, every token
the trainer takes is within the bound (the runtime's own StepState checks each one), every sample is
trained exactly once, k = 0 is the synchronous run, and `rlboost simulate` reports a row per bound."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

import rlboost.sim.cluster as cluster_module
from rlboost.policies.tail_share import KV_SHARE, tail_contexts
from rlboost.rollout.step_state import StepState
from rlboost.sim.batching import EngineState
from rlboost.sim.cluster import ClusterRun
from rlboost.sim.profile import ProfileConfig
from rlboost.sim.simulator import SimConfig, simulate
from rlboost.sim.step_trainer import StepTrainer
from rlboost.sim.workload import Workload, WorkloadConfig

SMALL = WorkloadConfig(prompts_per_step=32, median_response=1500, max_response=6000)
BASE = SimConfig(model="qwen3-8b", segment="A", duration_s=2400.0, workload=SMALL)


@pytest.fixture
def chunks(monkeypatch):
    """(step's version, chunk's version, tokens) of every chunk any StepState of the run accepted."""
    seen: list[tuple[int, int, int]] = []
    chunk = StepState.chunk

    def spy(self, worker, request_id, offset, count, version, *args, **kw):
        if worker in self.workers and self.workers[worker].alive and count:
            seen.append((self.version, version, count))
        return chunk(self, worker, request_id, offset, count, version, *args, **kw)

    monkeypatch.setattr(StepState, "chunk", spy)
    return seen


def test_ahead_of_the_trainer_every_token_is_within_one_version_and_some_are_stale(chunks):
    r = simulate(replace(BASE, max_staleness=1))
    assert chunks and all(0 <= step - version <= 1 for step, version, _ in chunks)
    stale = sum(n for step, version, n in chunks if version < step)
    assert stale > 0.05 * sum(n for *_, n in chunks)  # the instances did generate ahead
    moved = {reason for s in r.steps for reason, n in s.migrated.items() if n}
    assert {"refreshed", "seed_share"} <= moved  # new versions swapped in; the reserved took their share


def test_at_k_0_every_token_is_of_its_step_s_version_and_nothing_runs_ahead(chunks):
    r = simulate(BASE)
    assert chunks and all(step == version for step, version, _ in chunks)
    assert not any(s.migrated.get(reason) for s in r.steps for reason in ("refreshed", "seed_share", "fenced"))


@pytest.mark.parametrize(("k", "start_ahead"), [(1, "rollout_end"), (2, "rollout_end"), (1, "tail"), (2, "tail")])
def test_every_group_is_trained_exactly_once_by_its_own_step(k, start_ahead, monkeypatch):
    trained: list[tuple[int, int]] = []
    start = StepTrainer.start

    def spy(self, now, seconds_of):
        g, seconds = start(self, now, seconds_of)
        trained.append((self.totals.step, g))
        return g, seconds

    monkeypatch.setattr(StepTrainer, "start", spy)
    r = simulate(replace(BASE, max_staleness=k, start_ahead=start_ahead))
    assert [s.step for s in r.steps] == list(range(len(r.steps))) and len(r.steps) > 5
    groups = len(Workload(SMALL).step(0))
    for s in r.steps:
        assert sorted(g for step, g in trained if step == s.step) == list(range(groups)), s.step


def tail_checked(monkeypatch) -> list[tuple[int, int]]:
    """After every round of decisions while a batch started in a step's tail runs beside it: no engine holds
    more of the two than its max_num_seqs, nor plans on more than KV_SHARE of its KV cache (the step's
    samples at their longest, the batch ahead's at the step's mean), unless the batch ahead holds
    nothing there (the step comes
    first: its own samples may queue, the batch ahead's never). Returns (step's, batch ahead's) samples of
    each engine that held both at such a check."""
    shared: list[tuple[int, int]] = []
    decide = ClusterRun._decide

    def checked(self):
        decide(self)
        if self.ahead is None or not self.active:
            return
        step, ahead = self.step, self.ahead.state
        held_context, ahead_context = tail_contexts(self.prompt_len, self.prompt_len, self.work.cfg.max_response,
                                                    step.mean_response)
        for name, w in ahead.workers.items():
            if w.alive and ahead.holding(name):
                assert step.holding(name) + ahead.holding(name) <= self.max_running, (name, self.now)
                kv = step.holding(name) * held_context + ahead.holding(name) * ahead_context
                assert kv <= KV_SHARE * self.kv_tokens, (name, self.now)
                if step.holding(name):
                    shared.append((step.holding(name), ahead.holding(name)))

    monkeypatch.setattr(ClusterRun, "_decide", checked)
    return shared


def test_in_the_tail_the_batch_ahead_takes_only_the_slots_the_step_leaves_free(chunks, monkeypatch):
    shared = tail_checked(monkeypatch)
    end = simulate(replace(BASE, max_staleness=1, start_ahead="rollout_end"))
    tail = simulate(replace(BASE, max_staleness=1))  # the default
    assert shared and len(shared) > 10  # the two batches did share engines
    assert chunks and all(0 <= step - version <= 1 for step, version, _ in chunks)
    # the batch ahead starts before the step's rollout ends: more of it is made before its own step starts
    def mean_rollout(r):
        return sum(s.rollout_s for s in r.steps) / len(r.steps)

    assert mean_rollout(tail) < mean_rollout(end)


def test_a_step_s_samples_taken_back_in_its_tail_get_the_slots_the_batch_ahead_yields(monkeypatch):
    """With preemption notices on the scarce segment and engines of 32 slots, samples of a step come back
    in its tail and take slots the batch ahead held (it yields them), and still no engine holds more
    than it may."""
    tail_checked(monkeypatch)
    r = simulate(replace(BASE, segment="C", max_staleness=1, start_ahead="tail", notice_s=30.0,
                         profile=replace(ProfileConfig(), max_num_seqs=32)))
    assert sum(s.migrated.get("yielded", 0) for s in r.steps) > 0 and sum(s.preemptions for s in r.steps) > 0


def evictions_of(cfg: SimConfig, monkeypatch) -> tuple[int, float]:
    """(samples the engines evicted because their KV cache was full, tokens/s) of a simulated run."""
    evicted = [0]
    settle = EngineState._settle

    def counted(self):
        before = self.preemptions
        settle(self)
        evicted[0] += self.preemptions - before

    monkeypatch.setattr(EngineState, "_settle", counted)
    r = simulate(cfg)
    return evicted[0], r.throughput_tokens_per_s


def test_where_the_kv_cache_binds_the_tail_leaves_the_step_s_samples_their_cache(monkeypatch):
    """32B engines on long responses fit far fewer samples in their KV cache than max_num_seqs: counted in
    sequences alone, the batch ahead filled the cache in the step's tail and the engines evicted (and
    recomputed) three times as many samples as from the rollout's end, for less throughput. Counted in KV
    tokens too (`ahead_slots`), the tail evicts about as many as the rollout's end and runs faster."""
    cfg = SimConfig(model="qwen3-32b", segment="C", duration_s=3600.0, max_staleness=1,
                    workload=WorkloadConfig(prompts_per_step=64, median_response=3500, max_response=14336))
    end_evicted, end_rate = evictions_of(replace(cfg, start_ahead="rollout_end"), monkeypatch)
    tail_evicted, tail_rate = evictions_of(replace(cfg, start_ahead="tail"), monkeypatch)
    share = cluster_module.ahead_slots
    monkeypatch.setattr(cluster_module, "ahead_slots", lambda max_running, held, *kv: share(max_running, held))
    seqs_evicted, seqs_rate = evictions_of(replace(cfg, start_ahead="tail"), monkeypatch)
    assert end_evicted > 100  # the cache does bind
    assert tail_evicted < 1.5 * end_evicted < seqs_evicted and tail_rate > end_rate > seqs_rate


def test_overlap_pays_on_the_paper_s_abundant_segment():
    sync, ahead = simulate(BASE), simulate(replace(BASE, max_staleness=1))
    assert ahead.throughput_tokens_per_s > 1.03 * sync.throughput_tokens_per_s
    assert ahead.tokens_per_usd > 1.03 * sync.tokens_per_usd
    # part of each batch is generated before its step starts: the rollout left after the start is shorter
    def mean_rollout(r):
        return sum(s.rollout_s for s in r.steps) / len(r.steps)

    assert mean_rollout(ahead) < 0.9 * mean_rollout(sync)


def test_rlboost_simulate_reports_a_row_per_bound(tmp_path):
    from rlboost.cli import main

    out = tmp_path / "out.json"
    assert main(["simulate", "--models", "qwen3-8b", "--segments", "A", "--policies", "verl,rlboost", "--staleness",
                 "1,2", "duration_s=1200", "workload.prompts_per_step=32", "--json", str(out),
                 "--plots", str(tmp_path)]) == 0
    rows = [r for r in json.loads(out.read_text())["results"] if r["policy"] == "rlboost"]
    assert sorted((r["segment"], r["max_staleness"]) for r in rows) == [
        ("A", 0), ("A", 1), ("A", 2), ("avg", 0), ("avg", 1), ("avg", 2)]


@pytest.mark.parametrize("flag", ["1,x", "-1"])
def test_a_bad_staleness_list_is_one_line_and_exit_2(flag, capsys):
    from rlboost.cli import main

    assert main(["simulate", "--staleness", flag, "--models", "qwen3-8b"]) == 2
    err = capsys.readouterr().out.strip()
    assert err.startswith("error: --staleness") and "\n" not in err
