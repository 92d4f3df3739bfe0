"""Hybrid rollout on vLLM workers, with real SIGKILLs: the same step, the same faults and the same
invariant checks as test_hybrid.py (exactly once, on-policy, greedy continuation equal to the
uninterrupted reference, bounded waste), with every worker, reserved and preemptible, running the
vLLM backend (`engine.backend=vllm`) chosen by config alone."""

from __future__ import annotations

import dataclasses

import pytest

from hybrid_util import ENGINE, after_tokens, check_invariants, kill, preemptible, reference, run_step, start_fleet
from rlboost.hybrid.handles import PREEMPTIBLE, RESERVED
from rlboost.models import ModelConfig

pytestmark = pytest.mark.vllm

MODEL = ModelConfig(path="tiny:qwen3")  # head_dim 32: a size vLLM's CPU attention supports
VLLM = dataclasses.replace(ENGINE, backend="vllm")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, monkeypatch_module):
    tmp = tmp_path_factory.mktemp("hybrid-vllm")
    monkeypatch_module.setenv("RLBOOST_CACHE", str(tmp / "cache"))  # the tiny model's folder, for the workers
    fleet, _ = start_fleet(tmp, num_preemptible=2, spec_overrides={"model": MODEL, "engine": VLLM})
    fleet.tmp = tmp
    yield fleet
    fleet.shutdown()


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def test_sigkilled_vllm_worker_loses_no_sample(fleet):
    for handle in fleet.handles():  # each worker process really runs vLLM's CPU kernels
        maps = open(f"/proc/{handle.pid}/maps").read()
        assert "/vllm/_C" in maps, f"{handle.name} (pid {handle.pid}) has not loaded vLLM"
    victim = preemptible(0)
    out, run = run_step(fleet, faults=[(after_tokens(victim, 60), kill(fleet, victim))])
    check_invariants(out, run, reference(MODEL), fleet.tmp / "ledgers", model=MODEL)
    assert run.stats.preemptions == 1 and run.stats.migrated["preempted"] > 0, run.stats
    assert run.stats.tokens_by_kind[RESERVED] > 0 and run.stats.tokens_by_kind[PREEMPTIBLE] > 0
