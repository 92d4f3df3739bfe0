"""Shared by the hybrid tests: a local fleet of tiny-model workers, a greedy workload, its reference
outputs from a plain in-process engine, different tensors at every weight version, and the invariant
checks every hybrid test runs. The fleet, the step with faults at exact events, the kills, the ledgers'
token counts and the load-scaled limits are the package's (`rlboost.hybrid.harness`); this module gives
them the tests' workload.

Stale weights: each version after the base moves every parameter by seeded noise (`version_weights`),
and `check_invariants` recomputes every sample with a plain forward pass of the model holding the
tensors published as the version the sample is tagged with. A worker serving any other version (a
skipped or half-applied pull, a joiner that never loaded) fails it by orders of magnitude.

These tests use real processes, real Ray and real kills, so some waits are unavoidable. None decides
a result: a fault fires when the step reaches a state (a token count, a hand-off), not after a
sleep (the seeding hand-off too: `run_step`'s window ends at an event, never after seconds), and
every limit on how long something may take (a worker's boot, a stalled step) is a
`patience` that grows with what the machine is doing beside the test."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch

from rlboost.cluster.config import ClusterConfig
from rlboost.cluster.resources import PREEMPTIBLE
from rlboost.engine import EngineConfig, LLMEngine, SamplingParams
from rlboost.hybrid import harness
from rlboost.hybrid.config import HybridConfig
from rlboost.hybrid.fleet import Fleet
from rlboost.hybrid.handles import WorkerHandle
from rlboost.hybrid.harness import (Fault, OwnClusterFleet, after_tokens, busiest, handed_off, kill, load_factor,
                                    patience, preemptible, reserved, reserved_streamed, wait_for)
from rlboost.hybrid.step_run import StepRun
from rlboost.hybrid.worker import WorkerSpec
from rlboost.models import ModelConfig, load_model
from rlboost.rollout import new_groups
from rlboost.trainer.logprobs import pad_batch

MODEL = ModelConfig(path="tiny:qwen2")
ENGINE = EngineConfig(device="cpu", max_num_seqs=16, stream_interval=4)
MAX_TOKENS = 128
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
NUM_PROMPTS, N = 16, 4
STEPS = itertools.count(1)  # each step's sample uids differ, so a worker's ledger tells steps apart


class Row:
    data_source, ground_truth, extra_info = "test", None, {}


def prompts() -> list[tuple[int, list[int], Row]]:
    return [(i, [3 + i, 40 + 2 * i, 7, 90 - i, 11], Row()) for i in range(NUM_PROMPTS)]


def reference(model: ModelConfig = MODEL) -> dict[str, tuple[list[int], list[float]]]:
    """Greedy outputs of the workload from one in-process engine: what every hybrid run must match.
    All samples in one batch (the engine's capacity at a time), made once per model and process:
    measured equal, token for token and log-prob for log-prob, to generating group by group, 11x faster."""
    cached = repr(model)  # the whole config: a model of the same path in another dtype is another reference
    if cached not in _REFERENCES:
        engine = LLMEngine(load_model(model).model, ENGINE)
        samples = [s for g in new_groups(1, prompts(), N, run_seed=0) for s in g.samples]
        done = engine.generate([s.prompt_ids for s in samples], GREEDY)
        _REFERENCES[cached] = {key(s.uid): (c.token_ids, c.logprobs) for s, c in zip(samples, done)}
    return _REFERENCES[cached]


_REFERENCES: dict[str, dict[str, tuple[list[int], list[float]]]] = {}


def weights(model: ModelConfig = MODEL) -> dict:
    """The reference model's parameters: what the trainer would publish."""
    return {name: p.detach() for name, p in load_model(model).model.named_parameters()}


@functools.cache
def base_weights() -> dict:
    """`weights()` of MODEL, read once: version 0 of every test fleet, the base joiners patch from."""
    return weights()


PERTURBATION = 0.01
"""Std of the seeded noise each version after the base adds to every parameter (the tiny model's are
drawn with std 0.1). Measured on this workload's greedy responses: a token's log-prob under the base
weights and under version 1 differ by up to 0.64 (0.26 on average), 4e5 times the float noise between
the engine and a plain forward pass (1.4e-6); 4 tokens in 10 stop being the greedy choice."""


def version_weights(version: int) -> dict:
    """What the trainer publishes as `version`: the base at 0, each later version the base plus noise
    seeded by the version, so no two versions share a tensor."""
    base = base_weights()
    if version == 0:
        return base
    noise = torch.Generator().manual_seed(version)
    return {name: p + PERTURBATION * torch.randn(p.shape, generator=noise) for name, p in base.items()}


def slow_loads(seconds: float) -> Callable[[WorkerSpec], object]:
    """An engine factory (`WorkerSpec.engine_factory`) whose engines take `seconds` more to load each
    version, as a large model's copy into GPU memory does: a pull stays in flight that long after its
    fetch, so a test can kill a worker in the middle of one. Built in a function so that Ray ships it by
    value (its workers cannot import the test modules)."""
    def build(spec: WorkerSpec):
        from rlboost.hybrid.worker import configured_engine

        engine = configured_engine(spec)
        load = engine.load_weights

        def slow_load(*args, **kwargs):
            time.sleep(seconds)
            return load(*args, **kwargs)

        engine.load_weights = slow_load
        return engine
    return build


def gated_pulls(gate: str) -> Callable[[WorkerSpec], object]:
    """An engine factory (`WorkerSpec.engine_factory`) for workers whose weight pulls, once asked for,
    fetch nothing until the file `gate` exists: a test holds a pull in flight across an event of its
    choosing (peers dying, say), then lets it go. The engine itself is the configured one; the hold is
    installed in the worker's own process (where the factory runs), so the fleet's code is untouched.
    Built in a function so that Ray ships it by value."""
    def build(spec: WorkerSpec):
        from rlboost.cluster import host_copy
        from rlboost.hybrid.worker import configured_engine

        pull = host_copy.HostCopy.pull

        def held_pull(self, *args, **kwargs):
            while not os.path.exists(gate):
                time.sleep(0.01)
            return pull(self, *args, **kwargs)

        host_copy.HostCopy.pull = held_pull
        return configured_engine(spec)
    return build


CLUSTER_KEYS = {f.name for f in dataclasses.fields(ClusterConfig)}


@contextlib.contextmanager
def local_ray(num_cpus: int = 2):
    """A Ray cluster of the test's own (`address="local"`: `ray.init()` alone would join the one
    /tmp/ray/ray_current_cluster names), shut down after, whatever happened."""
    import ray

    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        yield
    finally:
        ray.shutdown()


def receive_until(reader, handles, until: Callable[[dict[str, list]], bool],
                  got: dict[str, list] | None = None) -> dict[str, list]:
    """Receive from `reader` (a `ReportReader` or the manager's `RelayedReports`) into `got` (each handle's
    reports and closings, in order) until `until(got)`; returns it. A reader that brings nothing more
    fails the test after `patience(60)`."""
    got = {h.name: [] for h in handles} if got is None else got
    deadline = time.monotonic() + patience(60)
    while not until(got):
        assert time.monotonic() < deadline, {name: len(items) for name, items in got.items()}
        for h, report, why in reader.receive(0.05):
            got.setdefault(h.name, []).append(report if report is not None else why)
    return got


def streams_ended(got: dict[str, list]) -> bool:
    """Every stream in `got` (`receive_until`'s) has ended."""
    return all(items[-1:] == ["its stream ended"] for items in got.values())


def take_in_rounds(reader, handles, per_round: int = 15) -> tuple[dict[str, list], int, list]:
    """Every stream taken to its end in rounds, as steps take them: run, receive `per_round` more items,
    drain one handle (in turn), pause. Returns each handle's items and closings in order, the number of
    rounds, and what each `pause()` returned."""
    got: dict[str, list] = {h.name: [] for h in handles}
    rounds, paused = 0, []
    while not streams_ended(got):
        reader.run()
        before = sum(map(len, got.values()))
        receive_until(reader, handles, lambda g: sum(map(len, g.values())) >= before + per_round or streams_ended(g),
                      got)
        drained = handles[rounds % len(handles)]
        got[drained.name] += [r if r is not None else why for _, r, why in reader.drain(drained)]
        paused.append(reader.pause())  # between steps: what was taken stays for the next round
        rounds += 1
        assert rounds < 200, {name: len(items) for name, items in got.items()}
    return got, rounds, paused


def start_fleet(tmp: Path, num_preemptible: int, spec_overrides: dict | None = None,
                **cfg) -> tuple[OwnClusterFleet, dict]:
    """A fleet of 1 reserved and `num_preemptible` workers of the test model serving version 0, on a cluster
    of its own (`harness.start_fleet`; `cfg`: fields of HybridConfig and of ClusterConfig). Returns it and
    the weights it serves."""
    cfg.setdefault("call_timeout_s", patience(120))
    cluster_cfg = ClusterConfig(**{k: cfg.pop(k) for k in CLUSTER_KEYS & set(cfg)})
    hybrid = HybridConfig(num_preemptible=num_preemptible, ledger_dir=str(tmp / "ledgers"), **cfg)
    # frequent heartbeats leave a wide margin under the short timeouts some tests set
    spec = dataclasses.replace(WorkerSpec(MODEL, ENGINE, eos_token_ids=[], heartbeat_interval_s=0.25),
                               **(spec_overrides or {}))
    state = base_weights() if spec.model == MODEL else weights(spec.model)
    return harness.start_fleet(hybrid, spec, state, cluster_cfg), state


def advance(fleet: Fleet) -> int:
    """Publish the next version, with tensors of its own, and wait until every live worker serves it."""
    version = fleet.manifest.version + 1
    serving = {h.name for h in fleet.alive()}
    fleet.publish(version_weights(version), version)
    fleet.wait_ready(timeout_s=patience(120))  # returns at once too when every pull failed and was dropped
    dropped = [(h.name, h.fenced) for h in fleet.handles() if h.name in serving and not h.alive]
    assert not dropped, f"workers dropped while pulling version {version}: {dropped}"
    return version


@contextlib.contextmanager
def heartbeat_timeout(fleet: Fleet, seconds: float):
    """The manager's heartbeat timeout is `seconds` for the steps started inside (each step reads it
    when it starts), and what it was again after, whatever happened."""
    cfg = fleet.manager.cfg
    saved, cfg.heartbeat_timeout_s = cfg.heartbeat_timeout_s, seconds
    try:
        yield
    finally:
        cfg.heartbeat_timeout_s = saved


def run_step(fleet: Fleet, handoff: Callable[[StepRun], bool] | None = reserved_streamed, faults: list[Fault] = (),
             version: int | None = None, expected: Callable[[str], float | None] | None = None):
    """One step of the workload at `version` (default: the one the fleet serves) with `faults` at exact
    events (`harness.run_step`: the hand-off at `handoff`, a stalled step cancelled); `expected`: the
    lengths a history would expect (uid -> tokens). Returns (groups in arrival order, the StepRun)."""
    groups = new_groups(next(STEPS), prompts(), N, run_seed=0)
    version = fleet.manifest.version if version is None else version
    return harness.run_step(fleet.manager, groups, GREEDY, version, handoff, faults, expected=expected)


def refill(fleet: Fleet) -> None:
    """Back to the configured pool, every instance serving the current version."""
    fleet.replenish()
    fleet.wait_ready(timeout_s=patience(120))
    assert len(fleet.alive(PREEMPTIBLE)) == fleet.cfg.num_preemptible


def make_whole(fleet: Fleet) -> None:
    """A module's shared fleet after one of its tests, passed or failed, as the next test expects it, so
    that one test's failure never takes the tests after it: instances beyond the configured pool are
    killed, those the test killed and the manager has not found dead yet are declared so (else the
    next step would find them), and the pool is refilled at the version served."""
    for h in fleet.killable()[fleet.cfg.num_preemptible:]:
        fleet.preempt(h)
    for h in fleet.alive():
        if h.name in fleet.killed:
            fleet.fence(h.name, "test: killed by the test before")
    fleet.wait_ready(timeout_s=patience(120))  # applies the fences
    refill(fleet)


def check_invariants(out, run: StepRun, ref=None, ledger_dir: Path | None = None, version: int | None = None,
                     state: dict | None = None, model: ModelConfig = MODEL) -> int:
    """Exactly once, on-policy, exact continuation, bounded waste. Every sample is tagged with
    `version` (default: the step's) and recomputed with a plain forward pass of `state`, the tensors
    published as it (default: the base's, which some tests publish under every version): each token
    is their greedy choice and its recorded log-prob theirs at float noise (`check_served`). `ref`,
    where given: the base weights' outputs from an in-process engine, matched exactly. With the
    workers' ledgers: no request lost more than (max_unacked_reports + 1) x stream_interval tokens to a
    death (generated on the dead worker, never received: in its engine or in reports Ray carried), and
    the step's `wasted_tokens` is exactly what the ledgers say was lost. Returns the step's wasted
    tokens (with ledgers: as the ledgers count them)."""
    version = run.version if version is None else version
    assert sorted(g.index for g in out) == list(range(NUM_PROMPTS))  # every group once
    samples = [s for g in out for s in g.samples]
    assert len({key(s.uid) for s in samples}) == len(samples) == NUM_PROMPTS * N  # every sample once
    for s in samples:
        assert s.finish_reason == "length" and len(s.response_ids) == MAX_TOKENS, s.uid
        assert s.versions == [version] * MAX_TOKENS, s.uid
        if ref is not None:
            tokens, logprobs = ref[key(s.uid)]
            assert s.response_ids == tokens, f"{s.uid} is not the uninterrupted greedy continuation"
            assert max(abs(a - b) for a, b in zip(s.logprobs, logprobs)) < 1e-4, s.uid
    if state is None:  # the base of the fleet's model
        state = base_weights() if model == MODEL else weights(model)
    check_served(samples, state, model)
    if ledger_dir is None:
        return run.stats.wasted_tokens
    bound = (run.cfg.max_unacked_reports + 1) * ENGINE.stream_interval
    lost_in_all = 0
    reasons = {name: reason for _, name, reason in run.stats.deaths}
    for name, lost_by_request in harness.lost_to_deaths(run, ledger_dir).items():
        for request_id, lost in lost_by_request.items():
            assert lost <= bound, (f"{lost} tokens of {request_id} generated by {name} and never received "
                                   f"(bound {bound}), declared dead: {reasons[name]}")
            lost_in_all += max(0, lost)
    assert run.stats.wasted_tokens == lost_in_all, (run.stats.wasted_tokens, lost_in_all)
    return lost_in_all


LOGPROB_NOISE = 1e-4
"""How far a recorded log-prob may be from a plain forward pass's: float rounding (measured 1.4e-6
between the engine and the forward pass), far below what another version's weights move (PERTURBATION)."""


def check_served(samples, state: dict, model_cfg: ModelConfig = MODEL) -> None:
    """Every sample is what the weights `state` generate greedily: a forward pass of the model holding
    them, independent of the engine (its cache, batching, migrations and weight loading), finds each
    response token to be the most likely one (up to float noise) and its log-prob the one recorded."""
    model = load_model(model_cfg).model
    with torch.no_grad():
        for name, p in model.named_parameters():  # tied weights appear once
            p.copy_(state[name])
        batch = pad_batch([s.prompt_ids for s in samples], [s.response_ids for s in samples])
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
        predicting = torch.gather(torch.log_softmax(logits, -1), 1,
                                  batch["predict_pos"][..., None].expand(-1, -1, logits.shape[-1]))
        chosen = predicting.gather(-1, batch["response_ids"][..., None]).squeeze(-1)
        best = predicting.max(-1).values
    for b, s in enumerate(samples):
        n = len(s.response_ids)
        recorded = torch.tensor(s.logprobs)
        off = (chosen[b, :n] - recorded).abs().max().item()
        assert off < LOGPROB_NOISE, (f"{s.uid}: recorded log-probs are up to {off:.2e} from the weights of version "
                                     f"{s.versions[0]} (stale weights?)")
        behind = (best[b, :n] - chosen[b, :n]).max().item()
        assert behind < LOGPROB_NOISE, f"{s.uid}: a token {behind:.2e} below the greedy choice of its version's weights"


def key(uid: str) -> str:
    """`group:sample` of a `step:group:sample` uid."""
    return uid.split(":", 1)[1]


__all__ = ["ENGINE", "MODEL", "WorkerHandle", "advance", "after_tokens", "base_weights", "busiest", "check_invariants",
           "check_served", "gated_pulls", "handed_off", "kill", "load_factor", "make_whole", "patience", "preemptible",
           "reference", "refill", "reserved", "reserved_streamed", "run_step", "start_fleet", "version_weights",
           "wait_for"]
