"""Shared by the hybrid tests: a local fleet of tiny-model workers, a greedy workload, its reference
outputs from a plain in-process engine, different tensors at every weight version, faults scripted at
exact events of a step, and the invariant checks every hybrid test runs.

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
import math
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

from rlboost.cluster.config import ClusterConfig
from rlboost.cluster.ray_cluster import Cluster
from rlboost.cluster.resources import PREEMPTIBLE, RESERVED
from rlboost.engine import EngineConfig, LLMEngine, SamplingParams
from rlboost.hybrid.config import HybridConfig
from rlboost.hybrid.fleet import Fleet
from rlboost.hybrid.handles import WorkerHandle
from rlboost.hybrid.manager import RolloutManager
from rlboost.hybrid.step_run import StepRun
from rlboost.hybrid.token_ledger import ledger_path, read_ledger
from rlboost.hybrid.worker import WorkerSpec
from rlboost.models import ModelConfig, load_model
from rlboost.rollout import new_groups
from rlboost.trainer.logprobs import pad_batch

MODEL = ModelConfig(path="tiny:qwen2")
ENGINE = EngineConfig(device="cpu", max_num_seqs=16, stream_interval=4)
MAX_TOKENS = 256
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
NUM_PROMPTS, N = 16, 4
STALL_S = 60.0
"""A step that makes no progress (no token arrives) for this long, times the machine's load, is hung."""
STEPS = itertools.count(1)  # each step's sample uids differ, so a worker's ledger tells steps apart


def load_factor() -> float:
    """How much slower than an idle machine things may run now: the runnable processes per core over
    the last minute (at least 1)."""
    return max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))


def patience(seconds: float) -> float:
    """A limit of `seconds` on an idle machine, stretched by the load beside the test."""
    return seconds * 2 * load_factor()


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Until `predicate()` holds, failing after `patience(timeout_s)`."""
    deadline = time.monotonic() + patience(timeout_s)
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


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


class OwnClusterFleet(Fleet):
    """A test's fleet on a cluster of its own: its shutdown ends the cluster too, as each test module
    starts fleets one after another in one process. It remembers the tensors it published as each
    version, which `check_invariants` recomputes samples with."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.published: dict[int, dict] = {}

    def publish(self, state, version: int):
        self.published[version] = state
        return super().publish(state, version)

    def served(self) -> dict:
        """The tensors of the version the fleet serves now."""
        return self.published[self.manifest.version]

    def shutdown(self) -> None:
        try:
            super().shutdown()
        finally:
            self.cluster.shutdown()


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


CLUSTER_KEYS = {f.name for f in dataclasses.fields(ClusterConfig)}


def start_fleet(tmp: Path, num_preemptible: int, spec_overrides: dict | None = None, **cfg) -> tuple[Fleet, dict]:
    """A fleet of 1 reserved and `num_preemptible` workers serving version 0, on a cluster of its own
    (`cfg`: fields of HybridConfig and of ClusterConfig); shut down again, cluster included, if any
    part of it fails to start, so a failure never leaves Ray running for the tests after it."""
    cfg.setdefault("call_timeout_s", patience(120))
    cluster_cfg = ClusterConfig(**{k: cfg.pop(k) for k in CLUSTER_KEYS & set(cfg)})
    hybrid = HybridConfig(num_preemptible=num_preemptible, ledger_dir=str(tmp / "ledgers"), **cfg)
    # frequent heartbeats leave a wide margin under the short timeouts some tests set
    spec = dataclasses.replace(WorkerSpec(MODEL, ENGINE, eos_token_ids=[], heartbeat_interval_s=0.25),
                               **(spec_overrides or {}))
    cluster = Cluster(cluster_cfg, hybrid.instances)
    fleet = OwnClusterFleet(hybrid, spec, RolloutManager(hybrid, cluster_cfg.weights), cluster)
    try:
        state = base_weights() if spec.model == MODEL else weights(spec.model)
        fleet.publish(state, version=0)
        fleet.start(RESERVED, 1)
        fleet.start(PREEMPTIBLE, num_preemptible)
        fleet.wait_ready(timeout_s=patience(120))
    except BaseException:
        fleet.shutdown()
        raise
    return fleet, state


Fault = tuple[Callable[[StepRun], bool], Callable[[StepRun], None]]
"""(when, what): `what(run)` is done once, as soon as `when(run)` holds. Both run in the test's thread
while the step's loop changes what they read, so they read copies (`list(d.items())`, made in one
piece by C code under the GIL), never iterate a live dict in Python."""


def after_tokens(worker: Callable[[StepRun], str | None], tokens: int) -> Callable[[StepRun], bool]:
    """When the worker `worker(run)` names has streamed at least `tokens` tokens in the step."""
    return lambda run: (name := worker(run)) is not None and run.stats.tokens_by_worker[name] >= tokens


def preemptible(index: int) -> Callable[[StepRun], str | None]:
    """The `index`-th preemptible worker of the step (by name), once the step knows it."""
    def name(run: StepRun) -> str | None:
        names = sorted(n for n, w in list(run.state.workers.items()) if w.kind == PREEMPTIBLE)
        return names[index] if index < len(names) else None
    return name


def busiest(run: StepRun) -> str | None:
    """The live preemptible worker holding the most samples, once one holds any after the hand-off."""
    if not run.stats.migrated["seed_handoff"] and run.state.seeding:
        return None
    held = {n: len(w.assigned) for n, w in list(run.state.workers.items()) if w.kind == PREEMPTIBLE and w.alive}
    return max(sorted(held), key=held.get) if held and max(held.values()) > 0 else None


def handed_off(run: StepRun) -> bool:
    return run.stats.migrated["seed_handoff"] > 0 and not run.state.seeding


def kill(fleet: Fleet, worker: Callable[[StepRun], str | None], how: str | None = None) -> Callable[[StepRun], None]:
    def act(run: StepRun) -> None:
        fleet.preempt(fleet.manager.table.workers[worker(run)], how)
    return act


def reserved_streamed(run: StepRun) -> bool:
    """When the reserved worker has streamed its first tokens: each of its samples then has nearly all of
    its MAX_TOKENS to go, so a hand-off at this event finds every one of them still running."""
    return run.stats.tokens_by_kind[RESERVED] > 0


def advance(fleet: Fleet) -> int:
    """Publish the next version, with tensors of its own, and wait until every live worker serves it."""
    version = fleet.manifest.version + 1
    serving = {h.name for h in fleet.manager.table.alive()}
    fleet.publish(version_weights(version), version)
    fleet.wait_ready(timeout_s=patience(120))  # returns at once too when every pull failed and was dropped
    dropped = [(h.name, h.fenced) for h in fleet.manager.table.handles() if h.name in serving and not h.alive]
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
             version: int | None = None):
    """One step of the workload at `version` (default: the one the fleet serves) with `faults` scripted
    at exact events. The seeding window has no length: it ends when `handoff(run)` holds (None: no
    window, every worker generates to the end, as in an evaluation), so the hand-off happens at an
    event of the step, never after some time. Returns
    (groups in arrival order, the StepRun). A step with no progress for `patience(STALL_S)` is
    cancelled: a hang fails the test instead of blocking the suite."""
    groups = new_groups(next(STEPS), prompts(), N, run_seed=0)
    version = fleet.manifest.version if version is None else version
    run = fleet.manager.start_step(groups, GREEDY, version=version,
                                   seed_window_s=None if handoff is None else math.inf)
    done = threading.Event()
    if handoff is not None:
        faults = [(handoff, lambda run: run.end_seed_window()), *faults]

    def script():
        pending = list(faults)
        while pending and not done.is_set():
            for fault in [f for f in pending if f[0](run)]:
                pending.remove(fault)
                fault[1](run)
            time.sleep(0.002)

    def watchdog():
        seen, since = -1, time.monotonic()
        while not done.wait(0.5):
            progress = sum(run.stats.received.values())
            if progress != seen:
                seen, since = progress, time.monotonic()
            elif time.monotonic() - since > patience(STALL_S):
                run._cancelled.set()
                return

    threads = [threading.Thread(target=script, daemon=True), threading.Thread(target=watchdog, daemon=True)]
    for t in threads:
        t.start()
    try:
        out = list(run.groups())
    finally:
        done.set()
        for t in threads:
            t.join()
    run.wait()
    return out, run


def refill(fleet: Fleet) -> None:
    """Back to the configured pool, every instance serving the current version."""
    fleet.replenish()
    fleet.wait_ready(timeout_s=patience(120))
    assert len(fleet.manager.table.alive(PREEMPTIBLE)) == fleet.cfg.num_preemptible


def make_whole(fleet: Fleet) -> None:
    """A module's shared fleet after one of its tests, passed or failed, as the next test expects it, so
    that one test's failure never takes the tests after it: instances beyond the configured pool are
    killed, those the test killed and the manager has not found dead yet are declared so (else the
    next step would find them), and the pool is refilled at the version served."""
    table = fleet.manager.table
    for h in fleet.killable()[fleet.cfg.num_preemptible:]:
        fleet.preempt(h)
    for h in table.alive():
        if h.name in fleet.killed:
            table.fence(h.name, "test: killed by the test before")
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
    for _, name, reason in run.stats.deaths:
        for request_id, generated in read_ledger(ledger_path(ledger_dir, name)).generated.items():
            if request_id.rpartition("#")[0] not in run.tracked:
                continue  # a request of an earlier step
            lost = generated - run.stats.received[request_id]  # an abort's answer brings tokens never sent
            assert lost <= bound, (f"{lost} tokens of {request_id} generated by {name} and never received "
                                   f"(bound {bound}), declared dead: {reason}")
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
           "check_served", "handed_off", "kill", "load_factor", "make_whole", "patience", "preemptible", "reference", "refill",
           "reserved_streamed", "run_step", "start_fleet", "version_weights"]
