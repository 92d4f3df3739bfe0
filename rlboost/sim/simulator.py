"""Simulated RL training runs at cluster scale: RLBoost, its ablations and the baselines it is compared
with (docs/simulator.md, "Simulation model"; the core of `rlboost simulate`).

Contract: `simulate(SimConfig(...))` plays one policy on one model over one trace segment and returns
a `SimResult`: one `StepRecord` per training step, the live instances over time, throughput (response
tokens per second of wall time, each token counted once) and cost (CostMeter dollars, tokens per
dollar). Deterministic: the same config gives the same result. The hybrid policies run the
event-driven cluster of `rlboost.sim.cluster`, whose decisions are the project's real policy objects;
veRL is the calibrated `colocated_step` of `rlboost.sim.profile`. Pure: no clock inside the model
(only `SimResult.sim_s`, how long the simulation itself took), no torch, no Ray.

Policies:
- verl: colocated on the reserved node(s): rollout on all engines, then training on all GPUs, then
  the weight sync; no instances.
- verl2x: the same on twice the reserved nodes (twice the cost).
- disagg: StreamRL-style static split of the reserved GPUs into rollout and training GPUs, stream
  training, on-policy (the next rollout starts after the update); the split is swept.
- verl-async: veRL's fully-async mode: the same split, the rollout up to `max_staleness` versions
  ahead of the trainer with partial rollout (`rlboost.sim.async_baseline`); the split is swept.
- rlboost: reserved engines seed for T_seed, then train on streamed groups while spot instances
  (from the trace) finish the rollout; T_seed and the instance cap from the offload controller.
- rlboost-noseed: T_seed pinned at 0; the controller still sets the instance cap (only seeding is
  removed).
- rlboost-nomemory: the controller without its memory M[n].

`rlboost simulate` (`rlboost.sim.report`) prints the table of every policy, model and segment.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace

from rlboost.policies.offload import OffloadConfig, OffloadController
from rlboost.rollout.step_data import START_AHEAD
from rlboost.sim.async_baseline import async_steps
from rlboost.sim.cluster import ClusterRun
from rlboost.sim.records import StepRecord
from rlboost.sim.baselines import colocated_step
from rlboost.sim.profile import EngineProfile, ProfileConfig, TrainProfile, make_profiles
from rlboost.sim.speculation import SpecConfig, speculating
from rlboost.sim.specs import MODELS, WIRE_DTYPES
from rlboost.sim.workload import Workload, WorkloadConfig
from rlboost.spot.cost import CostConfig, CostMeter
from rlboost.spot.trace import SEGMENTS, SpotTrace, TraceConfig, load_trace

_PREFIX = "simulate"
POLICIES = ("verl", "verl2x", "disagg", "verl-async", "rlboost", "rlboost-noseed", "rlboost-nomemory")
MIGRATIONS = ("token", "recompute")
DISAGG_PILOT_STEPS = 3
"""disagg with rollout_gpus=0 picks its split from this many steps of every allowed split."""


def _sim_trace() -> TraceConfig:
    return TraceConfig(sample=0.5, time_scale=1.0, seed=0)


def _sim_offload() -> OffloadConfig:
    # The RLBoost artifact's controller at H100 scale: T_seed moves by a third of the wait difference
    # and never drops below 5 s, with no upper bound. The runtime's default bound of 120 s was chosen
    # for CPU test runs; a window of up to an hour never binds (a colocated rollout takes 5-16 min).
    return OffloadConfig(eta=3.0, min_seed_s=5.0, max_seed_s=3600.0)


@dataclass
class SimConfig:
    """One simulated run: a model, a policy, a trace segment and the cluster around them."""

    model: str = "qwen3-8b"
    """A model of rlboost.sim.specs.MODELS: qwen3-8b, qwen3-14b or qwen3-32b."""
    policy: str = "rlboost"
    """verl | verl2x | disagg | verl-async | rlboost | rlboost-noseed | rlboost-nomemory (module docstring)."""
    segment: str = "A"
    """Segment of the bundled trace: A (abundant), B (fluctuating), C (scarce), 2 hours each. Applies
    when `trace.path` is empty; a CSV of one's own is replayed from its start (or trace.start_h)."""
    trace: TraceConfig = field(default_factory=_sim_trace)
    """The trace replayed: the bundled Bamboo trace by default, with 50% of its instances (the
    paper's sampling) and real time (time_scale 1). Its `segment`, `seed` and `notice_s` are
    superseded by this config's `segment`, `seed` and `notice_s`; `path` takes any
    `time_s,available_instances` CSV; `max_instances` caps the instances."""
    reserved_nodes: int = 1
    """Reserved (on-demand) nodes of gpus_per_node H100s each; verl2x doubles it."""
    gpus_per_node: int = 8
    """GPUs of a reserved node."""
    gpus_per_instance: int = 2
    """GPUs of a spot instance (the paper rents 2xH100). It runs gpus_per_instance // tp engines; an
    instance too small for one engine of the model cannot serve it, and none is rented."""
    trace_gpus_per_instance: int = 0
    """GPUs behind one instance of the trace; the sampled trace's GPUs make floor(n x this /
    gpus_per_instance) spot instances (SpotTrace.regrouped). 0: 1 for the bundled Bamboo trace, whose
    rows count single-GPU p3.2xlarge VMs (so segment A offers 6.9 2xH100 instances on average, not
    14.4), and gpus_per_instance for a CSV of one's own (its rows count instances as rented here)."""
    duration_s: float = 7200.0
    """Steps start while the clock is below this (a segment is 2 hours); the step under way at that
    moment runs to its end, so the run covers the segment and throughput has no partial step."""
    instance_startup_s: float = 60.0
    """From the launch of a spot instance to its engines' start, before its weight pull: VM boot,
    container start and engine initialisation (CUDA context, CUDA-graph capture). About a minute on
    the clouds' GPU VMs with a cached image; the instance is billed from its launch."""
    link_gbps: float = 50.0
    """Bandwidth of a spot instance's link, Gbit/s: its weight pull (at join, and of every new version
    while it serves) takes the bytes it moves / this: the version's bytes (`wire_dtype`) times
    from_base_share at a join, patch_share at a refresh. So an instance serves instance_startup_s +
    bytes x from_base_share x 8 / (link_gbps x 1e9) after its launch. 50: the network of a 2-GPU
    cloud VM (the pulls are peer to peer, so they never queue on one link)."""
    wire_dtype: str = "bfloat16"
    """The dtype a weight version moves in (rlboost.sim.specs.WIRE_DTYPES), for the instances' pulls
    and the reserved engines' load alike: params x its bytes, as the weight store sizes a version.
    bfloat16: what the paper's systems send (2 bytes per parameter). float32: what rlboost's own
    trainer publishes today (its fp32 master parameters, 4 bytes; `weight_bytes_per_join` of
    `rlboost bench cluster`). veRL's colocated sync stays bf16 (its own in-place resharding)."""
    patch_share: float = 1.0
    """Share of a version's bytes (`wire_dtype`) a refresh moves: a puller that holds version v-1
    pulls the lossless sparse patch v-1 -> v (rlboost.sim.pulls). It applies to the instances that
    served v-1 and to the reserved engines' sync (they always hold v-1); an instance two or more
    versions behind pulls the whole version; veRL's colocated sync stays whole. 1.0: whole versions
    (full pulls, what the model always assumed). Measured so far on SmolLM2, bf16, lr 1e-6:
    0.005-0.03 per step (docs/simulator.md, "Weight patches")."""
    from_base_share: float = 1.0
    """Share of a version's bytes a joining instance moves: it loads the base model from its own disk
    (within instance_startup_s) and pulls the cumulative patch base -> v, or the whole version where
    that patch is larger (so at most 1). Constant over the run, though the real share grows with
    the steps; not measured yet (assumed ~0.05-0.15). 1.0: whole versions."""
    stream_interval: int = 8
    """Tokens per streamed chunk: a hard preemption loses the unstreamed tokens of each in-flight
    sample, fewer than this many (bounded waste: invariant 4 of docs/hybrid.md,
    "Invariants and the tests that check them")."""
    migration: str = "token"
    """What survives a preemption. token (RLBoost): every streamed token; the sample continues
    elsewhere after a re-prefill of prompt + tokens. recompute (the baseline the paper compares
    with): the sample restarts from scratch. Aborts (seed hand-off, rebalancing, notices, releases)
    return exact partial outputs either way."""
    share_with_pulling: bool = True
    """Instances pulling the step's weights get their share of its dispatch (JSQDispatcher's
    `incoming`), held by the manager until they serve: the RLBoost artifact deals every request of
    the step among its engines at the start. False: the engines ready first take everything they can
    hold (4 x 260 = the whole step on one reserved node) and late instances idle through the window."""
    max_pending: int = 4
    """Θ: samples queued per engine beyond its max_num_seqs batch (JSQDispatcher's cap)."""
    offload: OffloadConfig = field(default_factory=_sim_offload)
    """The offload controller (η, T_seed bounds, instance cap bounds, memory). Defaults: the RLBoost
    artifact's η = 3 and T_seed >= 5 s, T_seed <= 3600 s (the artifact sets no upper bound); not the
    runtime's defaults (η = 2, T_seed <= 120 s, chosen for CPU test runs)."""
    initial_seed_s: float = 60.0
    """T_seed of the first step (the controller adapts it from there)."""
    histopipe: bool = False
    """Dispatch in HistoPipe order (previous epoch's lengths; no effect in an epoch's first pass)."""
    notice_s: float = 0.0
    """Preemption notices (our addition): an instance is warned this many seconds before its kill;
    it gets no more work, and its samples are taken back before the kill, so the kill wastes nothing."""
    notice_keep: bool = True
    """With notices and HistoPipe's history: samples expected to finish before the kill stay on the
    instance until then (`rlboost.policies.notice`); False: every sample is taken back at the notice."""
    rollout_gpus: int = 0
    """disagg and verl-async: reserved GPUs that run rollout (a multiple of tp, the rest train); 0: try
    every split (disagg: on its first DISAGG_PILOT_STEPS steps) and run the best."""
    max_staleness: int = 0
    """k: how many versions behind the trainer a token may be generated (0: synchronous). verl-async:
    the rollout runs up to k versions ahead. rlboost: the instances generate the next batch while the
    trainer trains this one, swapping in each version the trainer publishes (rlboost.sim.cluster;
    one batch ahead, so a token is at most one version stale whatever k >= 1). verl, verl2x, disagg:
    0 only."""
    start_ahead: str = "tail"
    """rlboost, k >= 1: the next batch starts in the step's tail, or at its rollout's end (algorithm.start_ahead)."""
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    """Response lengths of every step (rlboost.sim.workload)."""
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    """The calibrated performance model (rlboost.sim.profile)."""
    histospec: SpecConfig = field(default_factory=SpecConfig)
    """Speculative decoding on every rollout engine of the run (rlboost.sim.speculation): tokens
    accepted per verify step (an input), draft length, the budget's batch bound. Off by default."""
    cost: CostConfig = field(default_factory=CostConfig)
    """Prices; its reserved_nodes is set from this config's (doubled for verl2x)."""
    seed: int = 0
    """Seeds the trace replay's choice of preemption victims (the one random draw of a run)."""

    def validate(self) -> None:
        """Raise ValueError naming the offending field."""
        if self.model not in MODELS:
            raise ValueError(f"{_PREFIX}.model={self.model!r}; valid: {', '.join(sorted(MODELS))}")
        if self.policy not in POLICIES:
            raise ValueError(f"{_PREFIX}.policy={self.policy!r}; valid: {', '.join(POLICIES)}")
        if self.max_staleness < 0:
            raise ValueError(f"{_PREFIX}.max_staleness must be >= 0, got {self.max_staleness}")
        if self.start_ahead not in START_AHEAD:
            raise ValueError(f"{_PREFIX}.start_ahead={self.start_ahead!r}; valid: {', '.join(START_AHEAD)}")
        if self.max_staleness and self.policy in ("verl", "verl2x", "disagg"):
            raise ValueError(f"{_PREFIX}.max_staleness={self.max_staleness}: policy {self.policy} is synchronous; "
                             "staleness applies to verl-async and the rlboost policies")
        if not self.trace.path and self.segment not in SEGMENTS:
            raise ValueError(f"{_PREFIX}.segment={self.segment!r}; valid: {', '.join(SEGMENTS)}")
        if self.migration not in MIGRATIONS:
            raise ValueError(f"{_PREFIX}.migration={self.migration!r}; valid: {', '.join(MIGRATIONS)}")
        for name in ("reserved_nodes", "gpus_per_node", "gpus_per_instance", "stream_interval"):
            if getattr(self, name) < 1:
                raise ValueError(f"{_PREFIX}.{name} must be >= 1, got {getattr(self, name)}")
        if self.trace_gpus_per_instance < 0:
            raise ValueError(f"{_PREFIX}.trace_gpus_per_instance must be >= 0, got {self.trace_gpus_per_instance}")
        if self.max_pending < 0:
            raise ValueError(f"{_PREFIX}.max_pending must be >= 0, got {self.max_pending}")
        if self.rollout_gpus < 0:
            raise ValueError(f"{_PREFIX}.rollout_gpus must be >= 0, got {self.rollout_gpus}")
        for name in ("duration_s", "instance_startup_s", "initial_seed_s", "notice_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{_PREFIX}.{name} must be finite and >= 0, got {value}")
        if not (math.isfinite(self.link_gbps) and self.link_gbps > 0):
            raise ValueError(f"{_PREFIX}.link_gbps must be finite and > 0 (Gbit/s), got {self.link_gbps}")
        if self.wire_dtype not in WIRE_DTYPES:
            raise ValueError(f"{_PREFIX}.wire_dtype={self.wire_dtype!r}; valid: {', '.join(WIRE_DTYPES)}")
        for name in ("patch_share", "from_base_share"):
            value = getattr(self, name)
            if not 0 < value <= 1:  # also refuses nan
                raise ValueError(f"{_PREFIX}.{name} must be in (0, 1] (a share of a version's bytes), got {value}")
        if self.duration_s <= 0:
            raise ValueError(f"{_PREFIX}.duration_s must be > 0, got {self.duration_s}")
        self.trace.validate()
        self.offload.validate()
        self.workload.validate()
        self.profile.validate()
        self.histospec.validate()
        self.cost.validate()


@dataclass
class SimResult:
    """What a simulated run did and cost."""

    config: SimConfig
    steps: list[StepRecord]
    timeline: list[tuple[float, int]]
    """(time, instances launched and not ended) at every change, from (0, 0)."""
    caps: list[tuple[float, int | None]]
    """(time, instance cap handed to the trace replay) whenever it changed (None: no cap)."""
    wall_s: float
    """Wall time of the run: the end of its last step."""
    tokens: int
    """Response tokens of all steps, each counted once (generated and trained)."""
    tokens_generated: int
    """Decode tokens of every engine: tokens + wasted + recomputed."""
    throughput_tokens_per_s: float
    """tokens / wall_s: the paper's throughput."""
    cost_usd: float
    """CostMeter total: reserved nodes for wall_s, instances for their lives (boot included)."""
    tokens_per_usd: float
    """tokens / cost_usd: the paper's cost efficiency."""
    preemptions: int
    """Instances hard-killed by the trace."""
    instance_seconds: float
    """Instance-seconds billed."""
    wasted_tokens: int
    recomputed_tokens: int
    migrations: int
    rollout_gpus: int
    """Reserved GPUs that generate (disagg: the chosen split)."""
    train_gpus: int
    """GPUs that train."""
    sim_s: float = 0.0
    """Seconds the simulation itself took (not part of the model)."""

    def relative_to(self, baseline: SimResult) -> dict[str, float]:
        """Throughput and cost efficiency as multiples of a baseline's (the paper reports both
        relative to veRL on the same model and segment)."""
        return {"throughput": self.throughput_tokens_per_s / baseline.throughput_tokens_per_s,
                "cost_efficiency": self.tokens_per_usd / baseline.tokens_per_usd}


def simulate(cfg: SimConfig) -> SimResult:
    """Run one simulated training run (see the module docstring)."""
    cfg.validate()
    t0 = time.perf_counter()
    if cfg.policy in ("verl", "verl2x"):
        result = _colocated(cfg, cfg.reserved_nodes * (2 if cfg.policy == "verl2x" else 1))
    elif cfg.policy == "disagg":
        result = _disagg(cfg)
    elif cfg.policy == "verl-async":
        result = _verl_async(cfg)
    else:
        result = _hybrid(cfg)
    result.sim_s = time.perf_counter() - t0
    return result


def _meter(cfg: SimConfig, nodes: int) -> CostMeter:
    return CostMeter(replace(cfg.cost, reserved_nodes=nodes))


def _result(cfg: SimConfig, steps: list[StepRecord], meter: CostMeter, timeline, caps, preemptions: int,
            rollout_gpus: int, train_gpus: int) -> SimResult:
    wall = steps[-1].end_s if steps else 0.0
    tokens = sum(s.tokens_trained for s in steps)
    return SimResult(
        config=cfg, steps=steps, timeline=list(timeline), caps=list(caps), wall_s=wall, tokens=tokens,
        tokens_generated=sum(s.tokens_generated for s in steps),
        throughput_tokens_per_s=tokens / wall if wall > 0 else 0.0, cost_usd=meter.usd,
        tokens_per_usd=tokens / meter.usd if meter.usd > 0 else 0.0, preemptions=preemptions,
        instance_seconds=sum(meter.instance_s.values()), wasted_tokens=sum(s.wasted_tokens for s in steps),
        recomputed_tokens=sum(s.recomputed_tokens for s in steps), migrations=sum(s.migrations for s in steps),
        rollout_gpus=rollout_gpus, train_gpus=train_gpus)


def _profiles(cfg: SimConfig) -> tuple[EngineProfile, TrainProfile]:
    """The run's rollout engine (speculating when cfg.histospec says so) and training profiles."""
    engine, train = make_profiles(cfg.model, cfg.profile)
    return speculating(engine, cfg.histospec), train


def _colocated(cfg: SimConfig, nodes: int) -> SimResult:
    """veRL: the calibrated colocated step (samples dealt round robin to every engine, rollout, then
    training on every GPU), then the weight sync to the engines."""
    engine, train = _profiles(cfg)
    gpus = nodes * cfg.gpus_per_node
    engines = gpus // engine.tp
    if engines < 1:
        raise ValueError(f"{cfg.model} needs tp={engine.tp} GPUs per engine; the reserved nodes have {gpus}")
    work = Workload(cfg.workload)
    meter = _meter(cfg, nodes)
    sync_s = train.weight_sync_s(cfg.profile.reserved_gbps)
    steps: list[StepRecord] = []
    t, k = 0.0, 0
    while t < cfg.duration_s:
        lengths = [length for group in work.step(k) for length in group]
        r = colocated_step(engine, train, lengths, cfg.workload.prompt_len, engines, gpus)
        wall = r["step_s"] + sync_s
        usd = meter.charge_step(wall, 0.0, r["tokens"])["cost/usd"]
        steps.append(StepRecord(
            step=k, start_s=t, end_s=t + wall, rollout_s=r["rollout_s"], train_s=r["train_s"], seed_s=0.0,
            reserved_rollout_s=r["rollout_s"], tokens_generated=r["tokens"], tokens_trained=r["tokens"],
            instances_start=0, instances_end=0, preemptions=0, migrations=0, wasted_tokens=0,
            recomputed_tokens=0, wait_train_s=0.0, wait_remote_s=0.0, usd=usd))
        t += wall
        k += 1
    return _result(cfg, steps, meter, [(0.0, 0)], [], 0, gpus, gpus)


def offered_instances(cfg: SimConfig) -> SpotTrace:
    """The spot instances the run's trace offers over time: its window, sampled, in instances of
    cfg.gpus_per_instance GPUs."""
    trace_cfg = replace(cfg.trace, segment="" if cfg.trace.path else cfg.segment, seed=cfg.seed,
                        notice_s=cfg.notice_s)
    trace_gpus = cfg.trace_gpus_per_instance or (cfg.gpus_per_instance if cfg.trace.path else 1)
    return load_trace(trace_cfg).regrouped(trace_gpus, cfg.gpus_per_instance)


def _cluster(cfg: SimConfig, *, rollout_gpus: int, train_gpus: int, colocated: bool, spot: bool,
             controller: OffloadController | None, seed_s: float, max_steps: int | None = None
             ) -> tuple[ClusterRun, list[StepRecord]]:
    engine, train = _profiles(cfg)
    trace = None
    if spot:
        trace = offered_instances(cfg)
    run = ClusterRun(cfg, engine=engine, train=train, workload=Workload(cfg.workload), rollout_gpus=rollout_gpus,
                     train_gpus=train_gpus, colocated=colocated, trace=trace, controller=controller,
                     seed_s=seed_s, meter=_meter(cfg, cfg.reserved_nodes), max_steps=max_steps)
    return run, run.run()


def _hybrid(cfg: SimConfig) -> SimResult:
    engine, _ = make_profiles(cfg.model, cfg.profile)
    gpus = cfg.reserved_nodes * cfg.gpus_per_node
    if gpus // engine.tp < 1:
        raise ValueError(f"{cfg.model} needs tp={engine.tp} GPUs per engine; the reserved nodes have {gpus}")
    if cfg.policy == "rlboost-noseed":
        # Only seeding is removed: T_seed is pinned at 0 (the reserved engines hand off as soon as an
        # instance serves the step) and the controller still caps the instances, from T_seed = 0.
        offload, seed_s = replace(cfg.offload, min_seed_s=0.0, max_seed_s=0.0), 0.0
    elif cfg.policy == "rlboost-nomemory":
        offload, seed_s = replace(cfg.offload, memory=False), cfg.initial_seed_s
    else:
        offload, seed_s = cfg.offload, cfg.initial_seed_s
    # N_resv in instance-equivalents of rollout throughput: reserved GPUs per instance's GPUs.
    controller = OffloadController(offload, seed_s, num_reserved=max(gpus // cfg.gpus_per_instance, 1),
                                   reserved_usd_per_s=replace(cfg.cost, reserved_nodes=cfg.reserved_nodes).reserved_usd_per_s(),
                                   instance_usd_per_s=cfg.cost.instance_usd_per_s())
    run, steps = _cluster(cfg, rollout_gpus=gpus, train_gpus=gpus, colocated=True, spot=True,
                          controller=controller if offload.enabled else None, seed_s=seed_s)
    return _result(cfg, steps, run.meter, run.spot.held.timeline, run.spot.caps, run.spot.preemptions, gpus, gpus)


def disagg_splits(cfg: SimConfig) -> list[int]:
    """The rollout GPU counts disagg may use: whole engines (multiples of tp), at least one GPU left
    to train."""
    engine, _ = make_profiles(cfg.model, cfg.profile)
    gpus = cfg.reserved_nodes * cfg.gpus_per_node
    return [r for r in range(engine.tp, gpus, engine.tp)]


def _split_choices(cfg: SimConfig) -> list[int]:
    """The rollout GPU counts a split policy (disagg, verl-async) tries: cfg.rollout_gpus alone when set,
    else every allowed split (`disagg_splits`); ValueError naming the field when none fits."""
    splits = disagg_splits(cfg)
    if not splits:
        raise ValueError(f"{cfg.policy}: {cfg.reserved_nodes * cfg.gpus_per_node} reserved GPUs cannot be split "
                         "into rollout engines and trainers")
    if cfg.rollout_gpus and cfg.rollout_gpus not in splits:
        raise ValueError(f"{_PREFIX}.rollout_gpus={cfg.rollout_gpus}; valid for {cfg.model}: "
                         f"{', '.join(map(str, splits))}")
    return [cfg.rollout_gpus] if cfg.rollout_gpus else splits


def _disagg(cfg: SimConfig) -> SimResult:
    gpus = cfg.reserved_nodes * cfg.gpus_per_node

    def pilot(r: int) -> float:
        _, steps = _cluster(cfg, rollout_gpus=r, train_gpus=gpus - r, colocated=False, spot=False,
                            controller=None, seed_s=0.0, max_steps=DISAGG_PILOT_STEPS)
        return sum(s.tokens_trained for s in steps) / steps[-1].end_s

    choices = _split_choices(cfg)
    rollout = choices[0] if len(choices) == 1 else max(choices, key=pilot)
    run, steps = _cluster(cfg, rollout_gpus=rollout, train_gpus=gpus - rollout, colocated=False, spot=False,
                          controller=None, seed_s=0.0)
    return _result(cfg, steps, run.meter, run.spot.held.timeline, run.spot.caps, 0, rollout, gpus - rollout)


def _verl_async(cfg: SimConfig) -> SimResult:
    """veRL's fully-async mode on the reserved node(s), at the split of cfg.rollout_gpus or, when 0, at
    the split of the highest throughput over the whole run (the baseline at its best, not a strawman)."""
    engine, train = _profiles(cfg)
    gpus = cfg.reserved_nodes * cfg.gpus_per_node
    choices = _split_choices(cfg)
    sync_s = train.weight_sync_s(cfg.profile.reserved_gbps)

    def run(rollout: int) -> tuple[list[StepRecord], CostMeter]:
        meter = _meter(cfg, cfg.reserved_nodes)
        steps = async_steps(engine, train, Workload(cfg.workload), meter, rollout_gpus=rollout,
                            train_gpus=gpus - rollout, max_staleness=cfg.max_staleness, sync_s=sync_s,
                            duration_s=cfg.duration_s)
        return steps, meter

    runs = {r: run(r) for r in choices}
    rollout = max(runs, key=lambda r: sum(s.tokens_trained for s in runs[r][0]) / runs[r][0][-1].end_s)
    steps, meter = runs[rollout]
    return _result(cfg, steps, meter, [(0.0, 0)], [], 0, rollout, gpus - rollout)


ASYNC_STALENESS = (1, 2, 4)
"""The staleness bounds `best_verl_async` tries (veRL's one-step-off is k = 1)."""


def best_verl_async(cfg: SimConfig) -> SimResult:
    """verl-async at its best: the max_staleness of ASYNC_STALENESS (and, within each, the split) of the
    highest throughput; the result's config says which k won."""
    runs = [simulate(replace(cfg, policy="verl-async", max_staleness=k)) for k in ASYNC_STALENESS]
    return max(runs, key=lambda r: r.throughput_tokens_per_s)


__all__ = ["ASYNC_STALENESS", "DISAGG_PILOT_STEPS", "MIGRATIONS", "POLICIES", "SimConfig", "SimResult", "StepRecord",
           "best_verl_async", "disagg_splits", "simulate"]
