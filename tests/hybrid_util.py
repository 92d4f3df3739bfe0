"""Shared by the hybrid tests: a local fleet of tiny-model workers, a greedy workload, its reference
outputs from a plain in-process engine, and the invariant checks every hybrid test runs."""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from pathlib import Path

from rlboost.engine import EngineConfig, LLMEngine, SamplingParams
from rlboost.hybrid.config import HybridConfig
from rlboost.hybrid.fleet import Fleet
from rlboost.hybrid.manager import PREEMPTIBLE, RESERVED, RolloutManager, StepRun
from rlboost.hybrid.worker import WorkerSpec, read_ledger
from rlboost.models import ModelConfig, load_model
from rlboost.rollout import new_groups

MODEL = ModelConfig(path="tiny:qwen2")
ENGINE = EngineConfig(device="cpu", max_num_seqs=16, stream_interval=4)
MAX_TOKENS = 256
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
NUM_PROMPTS, N = 16, 4
STEP_LIMIT_S = 120.0
STEPS = itertools.count(1)  # each step's sample uids differ, so a worker's ledger tells steps apart


class Row:
    data_source, ground_truth, extra_info = "test", None, {}


def prompts() -> list[tuple[int, list[int], Row]]:
    return [(i, [3 + i, 40 + 2 * i, 7, 90 - i, 11], Row()) for i in range(NUM_PROMPTS)]


def reference() -> dict[str, tuple[list[int], list[float]]]:
    """Greedy outputs of the workload from one in-process engine: what every hybrid run must match."""
    engine = LLMEngine(load_model(MODEL).model, ENGINE)
    out = {}
    for g in new_groups(1, prompts(), N, run_seed=0):
        done = engine.generate([s.prompt_ids for s in g.samples], GREEDY)
        out.update({key(s.uid): (c.token_ids, c.logprobs) for s, c in zip(g.samples, done)})
    return out


def weights() -> dict:
    """The reference model's parameters: what the trainer would publish."""
    return {name: p.detach() for name, p in load_model(MODEL).model.named_parameters()}


def start_fleet(tmp: Path, num_preemptible: int, spec_overrides: dict | None = None, **cfg) -> tuple[Fleet, dict]:
    hybrid = HybridConfig(num_preemptible=num_preemptible, ledger_dir=str(tmp / "ledgers"), **cfg)
    # frequent heartbeats leave a wide margin under the short timeouts some tests set
    spec = dataclasses.replace(WorkerSpec(MODEL, ENGINE, eos_token_ids=[], heartbeat_interval_s=0.25),
                               **(spec_overrides or {}))
    fleet = Fleet(hybrid, spec, RolloutManager(hybrid))
    state = weights()
    fleet.publish(state, version=0)
    fleet.start(RESERVED, 1)
    fleet.start(PREEMPTIBLE, num_preemptible)
    fleet.wait_ready()
    return fleet, state


def run_step(fleet: Fleet, seed_window_s: float | None = 0.3, kills=(), how: str | None = None, version: int = 0):
    """One step of the workload; `kills` = [(seconds after start, index among live preemptible)]
    hard-kills at those moments. Returns (groups in arrival order, the StepRun)."""
    groups = new_groups(next(STEPS), prompts(), N, run_seed=0)
    run = fleet.manager.start_step(groups, GREEDY, version=version, seed_window_s=seed_window_s)

    def chaos():
        t0 = time.monotonic()
        for at, index in kills:
            time.sleep(max(0.0, at - (time.monotonic() - t0)))
            victims = fleet.killable()
            if victims:
                fleet.preempt(victims[index % len(victims)], how)

    killer = threading.Thread(target=chaos, daemon=True)
    killer.start()
    watchdog = threading.Timer(STEP_LIMIT_S, run._cancelled.set)  # a hang fails the test instead
    watchdog.start()
    try:
        out = list(run.groups())
    finally:
        watchdog.cancel()
    killer.join()
    return out, run


def check_invariants(out, run: StepRun, ref, ledger_dir: Path | None = None, version: int = 0) -> None:
    """Exactly once, on-policy, exact continuation (greedy == reference), bounded waste."""
    assert sorted(g.index for g in out) == list(range(NUM_PROMPTS))  # every group once
    samples = [s for g in out for s in g.samples]
    assert sorted(key(s.uid) for s in samples) == sorted(ref)  # every sample once
    for s in samples:
        tokens, logprobs = ref[key(s.uid)]
        assert s.finish_reason == "length" and len(s.response_ids) == MAX_TOKENS, s.uid
        assert s.response_ids == tokens, f"{s.uid} is not the uninterrupted greedy continuation"
        assert max(abs(a - b) for a, b in zip(s.logprobs, logprobs)) < 1e-4, s.uid
        assert s.versions == [version] * MAX_TOKENS, s.uid
    if ledger_dir is not None:  # tokens generated on a killed worker but never received
        interval = ENGINE.stream_interval
        for _, name, _ in run.stats.deaths:
            for request_id, generated in read_ledger(ledger_dir / f"{name}.ledger").items():
                if request_id.rpartition("#")[0] not in run.tracked:
                    continue  # a request of an earlier step
                lost = generated - run.stats.received[request_id]
                assert lost <= interval, f"{request_id} lost {lost} tokens on {name} (stream_interval {interval})"


def key(uid: str) -> str:
    """`group:sample` of a `step:group:sample` uid."""
    return uid.split(":", 1)[1]
