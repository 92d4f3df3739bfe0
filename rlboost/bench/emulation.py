"""`rlboost bench emulation`: the simulator against the real control plane, a few RL steps run twice.

Contract: `run_check(CheckConfig(...))` runs `steps` RL steps of the REAL hybrid runtime
(`HybridRollout`: Fleet, RolloutManager, the OffloadController, a provider, real SIGKILLs, real weight
pulls) on rollout workers whose engine is emulated (`rlboost.sim.emulated`: it sleeps through the
profile's time, plugged in through the worker's engine factory),
with a stand-in trainer that stream-trains each finished group by sleeping its modelled training
time on the reserved GPUs and publishes new weights after every step. Then it runs
`rlboost.sim.simulator.simulate` on the matching `SimConfig` (same model profile, engines, scaled
workload, instances, T_seed behaviour) and returns both step by step, with the manager's CPU time.

Matching, one for one:
- the reserved node is `reserved_engines` engines at the model's tp, and trains on their GPUs;
  an instance is one engine (gpus_per_instance = tp);
- samples: prompt g, sample j of step k carries `workload_seed(k, g, j)`, so its emulated length is
  `Workload.step(k)[g][j]` of the scaled workload the simulator is given;
- the profile's max_num_seqs, the dispatcher's cap Θ, stream_interval, the initial T_seed and the
  offload controller's settings (in modelled seconds; the runtime's in wall seconds);
- instances: `fixed` is a constant trace of `instances` for the simulator and a FixedPool ready
  before the first step for the runtime (the controller's cap cannot go below it); `trace` replays
  the same compressed segment in both, the simulator's boot time set to the runtime's measured
  provisioning time (launch to verified weights);
- weight transfers take their real time in the emulation (a tiny model's bytes: milliseconds) and
  about none in the simulator (bandwidths of 1e6 Gb/s).

Every emulated step is checked: each group and sample exactly once, every token of the step's
version, each response the emulation's exact tokens for its seed (continuation across migrations)
and exactly the workload's length.

`rlboost bench emulation [--instances 4] [--steps 4] [--json PATH]` prints the comparison and the
manager's overhead per instance count (see docs/simulator.md, "Emulated engine");
`rlboost bench control-plane` (rlboost.bench.control_plane) runs it for the manager's CPU alone.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import tempfile
import time
from dataclasses import dataclass, replace

from rlboost.policies.offload import OffloadConfig
from rlboost.models.config import ModelConfig
from rlboost.sim.emulated import FIRST_TOKEN, EmulatedEngines, EmulationConfig, logprob_at, token_at, workload_seed
from rlboost.sim.profile import ProfileConfig
from rlboost.sim.specs import MODELS
from rlboost.sim.workload import Workload, WorkloadConfig
from rlboost.spot.cost import CostConfig
from rlboost.spot.trace import SEGMENTS, TraceConfig

EOS = 2
"""The stop token of the emulated responses (ids below FIRST_TOKEN never occur as content)."""
TINY_MODEL = "tiny:qwen2"
"""The model whose real weights stand in for the modelled model's bytes in every publish and pull."""
FAST_GBPS = 1e6
"""The simulator's weight-transfer bandwidths: the emulation's transfers are milliseconds."""
PROVIDERS = ("fixed", "trace")


@dataclass
class CheckConfig:
    """One emulated run and its simulated twin. Times are modelled seconds unless named wall."""

    model: str = "qwen3-8b"
    """The modelled model (rlboost.sim.specs.MODELS)."""
    instances: int = 4
    """Preemptible instances (one engine each): the fixed pool's size, or the trace's cap."""
    reserved_engines: int = 2
    """Engines of the reserved node; it trains on their GPUs (reserved_engines x tp)."""
    prompts: int = 16
    """Prompts per step."""
    samples: int = 8
    """Samples per prompt (the GRPO group)."""
    steps: int = 4
    """RL steps to run."""
    length_scale: float = 0.1
    """Scales the default workload's response lengths (median 3,500, cap 14,336 tokens): 0.1 makes a
    median of 350 and a cap of 1,434, and steps of 10-14 s at time_scale 1 with the defaults."""
    prompt_len: int = 512
    """Tokens of every prompt."""
    time_scale: float = 1.0
    """Wall seconds per modelled second of the emulation (1: modelled H100 speed)."""
    max_num_seqs: int = 16
    """Batch capacity of an engine (the profile's, the dispatcher's)."""
    max_pending: int = 4
    """Θ: samples queued per engine beyond its batch."""
    stream_interval: int = 8
    """Chunk size of every engine."""
    seed_window_s: float = 2.0
    """T_seed of the first step."""
    offload: bool = True
    """The offload controller adapts T_seed (and sets the cap); False keeps seed_window_s."""
    uncapped: bool = False
    """Keep the controller's instance cap from binding (its floor becomes `instances`), as it always
    is for a fixed pool: isolates the trace replay from the cap's decisions."""
    provider: str = "fixed"
    """`fixed` (a pool of `instances`, never killed) or `trace` (the compressed segment below)."""
    segment: str = "C"
    """trace: the bundled trace's segment (A, B, C). C (scarce) at trace_sample 0.25 swings between
    2 and 6 instances in its first 60 s at the default compression."""
    trace_sample: float = 0.25
    """trace: fraction of the trace's instances kept (the paper's is 0.5; 0.25 keeps a local run
    small), capped at `instances`."""
    trace_compression: float = 120.0
    """trace: trace seconds per modelled second (120 replays the 2-hour segment in 60 s)."""
    trace_path: str = ""
    """trace: a `time_s,available_instances` CSV of one's own instead of the bundled segment (its
    instances as they are: no sampling), capped at `instances`."""
    colocated: bool = False
    """No preemptible instance at all: the colocated baseline, on the same control plane."""
    worker: str = "rollout"
    """`rollout` (each worker holds the tiny model's skeleton: torch) or `light` (none: the worker's
    process never imports torch; what fits 64+ instances on one machine)."""
    seed: int = 0
    """Workload seed, and the trace replay's choice of victims."""

    def validate(self) -> None:
        if self.model not in MODELS:
            raise ValueError(f"model={self.model!r}; valid: {', '.join(sorted(MODELS))}")
        for name in ("instances", "reserved_engines", "prompts", "samples", "steps", "max_num_seqs",
                     "stream_interval", "prompt_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.provider not in PROVIDERS:
            raise ValueError(f"provider={self.provider!r}; valid: {', '.join(PROVIDERS)}")
        if self.segment not in SEGMENTS:
            raise ValueError(f"segment={self.segment!r}; valid: {', '.join(SEGMENTS)}")
        self.emulation().validate()

    def workload(self) -> WorkloadConfig:
        """The unscaled workload: the paper's distribution with this run's batch and prompt length."""
        return WorkloadConfig(prompts_per_step=self.prompts, samples_per_prompt=self.samples,
                              prompt_len=self.prompt_len, seed=self.seed)

    def emulation(self) -> EmulationConfig:
        return EmulationConfig(model=self.model, time_scale=self.time_scale, workload=self.workload(),
                               length_scale=self.length_scale, max_num_seqs=self.max_num_seqs,
                               stream_interval=self.stream_interval, worker=self.worker)

    def offload_config(self, scale: float = 1.0) -> OffloadConfig:
        """The controller's settings, times multiplied by `scale` (the runtime's clock is wall time).
        A fixed pool is fixed: the cap never binds (nor with `uncapped`)."""
        base = OffloadConfig(enabled=self.offload)
        floor = self.instances if self.provider == "fixed" or self.uncapped else base.min_instances
        return replace(base, min_seed_s=base.min_seed_s * scale, max_seed_s=base.max_seed_s * scale,
                       min_instances=floor)

    def trace_config(self, wall: bool) -> TraceConfig:
        """trace provider: the segment, compressed into modelled (or, `wall`, emulated wall) seconds."""
        compression = self.trace_compression / (self.time_scale if wall else 1.0)
        if self.trace_path:
            return TraceConfig(path=self.trace_path, sample=1.0, time_scale=compression, seed=self.seed,
                               max_instances=self.instances)
        return TraceConfig(segment=self.segment, sample=self.trace_sample, time_scale=compression,
                           seed=self.seed, max_instances=self.instances)

    def prices(self) -> tuple[float, float]:
        """$ per wall second of the reserved GPUs and of one instance, at the paper's prices per GPU
        (an 8xH100 node at cost.reserved_usd_per_hour, a 2xH100 instance at its spot price)."""
        cost, tp = CostConfig(), self.emulation().profiles()[0].tp
        per_s = 3600.0 * self.time_scale
        return (cost.reserved_usd_per_hour * self.reserved_engines * tp / 8 / per_s,
                cost.instance_usd_per_s() * 3600.0 * tp / 2 / per_s)


@dataclass
class EmulatedStep:
    """One emulated step; times in wall seconds."""

    step: int
    step_s: float
    """From the step's start to the new weights on the reserved workers (what the simulator's step lasts)."""
    rollout_s: float
    seed_s: float
    """T_seed of the step (the controller's, at the step's start)."""
    wait_train_s: float
    wait_remote_s: float
    train_s: float
    """The stand-in trainer's modelled compute (slept)."""
    instances: int
    """Preemptible workers admitted when the step started (what the runtime's controller counts)."""
    preemptions: int
    migrations: int
    cap: int | None
    """The instance cap the controller set after the step."""
    loop_cpu_s: float
    """CPU time of the manager's loop thread over the step's rollout."""
    driver_cpu_s: float
    """CPU time of the whole driver process over the step: the manager, Ray's client threads, the
    provider, the stand-in trainer, the publish."""
    tokens: int
    samples: int
    deaths: list = dataclasses.field(default_factory=list)
    """(seconds into the step, worker, why) of every worker declared dead during the step."""
    reports: int = 0
    """Worker reports the manager's loop handled in the step."""
    instance_s: float = 0.0
    """Instance-seconds (wall) the step held."""


@dataclass
class CheckResult:
    config: CheckConfig
    emulated: list[EmulatedStep]
    simulated: list[dict]
    """The simulator's StepRecords of the same steps, as dicts."""
    startup_s: float
    """Modelled seconds an instance took from launch to verified weights in the emulation (what the
    simulator's instance_startup_s was set to; 0 for a fixed pool, ready before the first step)."""
    boot_wall_s: float
    """Wall seconds from the start of the run to the first step (Ray, workers, first weights)."""
    wall_s: float
    memory: dict = dataclasses.field(default_factory=dict)
    """The workers' processes after the first step: mean RSS and private memory (MB), and how many
    have torch loaded (Linux /proc; empty elsewhere)."""

    def rows(self) -> list[dict]:
        """Per step: simulated and emulated step time (modelled seconds), the difference, overhead."""
        ts = self.config.time_scale
        out = []
        for e, s in zip(self.emulated, self.simulated):
            sim_s = s["end_s"] - s["start_s"]
            emu_s = e.step_s / ts
            out.append({"step": e.step, "sim_step_s": sim_s, "emu_step_s": emu_s, "diff": emu_s / sim_s - 1,
                        "sim_rollout_s": s["rollout_s"], "emu_rollout_s": e.rollout_s / ts,
                        "sim_seed_s": s["seed_s"], "emu_seed_s": e.seed_s / ts,
                        "sim_migrations": s["migrations"], "emu_migrations": e.migrations,
                        "sim_instances": s["instances_start"], "emu_instances": e.instances,
                        "sim_preemptions": s["preemptions"], "emu_preemptions": e.preemptions,
                        "sim_cap": s["cap"], "emu_cap": e.cap,
                        "loop_cpu_s": e.loop_cpu_s, "driver_cpu_s": e.driver_cpu_s,
                        # overhead: CPU seconds over the wall seconds they were spent in, at the run's
                        # speed (at time_scale 1, the modelled H100 speed)
                        "loop_share": e.loop_cpu_s / e.step_s, "loop_share_rollout": e.loop_cpu_s / e.rollout_s,
                        "driver_share": e.driver_cpu_s / e.step_s})
        return out

    def summary(self) -> dict:
        rows = self.rows()
        sim = sum(r["sim_step_s"] for r in rows)
        emu = sum(r["emu_step_s"] for r in rows)
        loop = sum(e.loop_cpu_s for e in self.emulated)
        return {"instances": self.config.instances, "steps": len(rows), "sim_total_s": sim, "emu_total_s": emu,
                "diff_total": emu / sim - 1, "max_abs_diff": max(abs(r["diff"]) for r in rows),
                "loop_share": loop / sum(e.step_s for e in self.emulated),
                "loop_share_rollout": loop / sum(e.rollout_s for e in self.emulated),
                "driver_share": sum(e.driver_cpu_s for e in self.emulated) / sum(e.step_s for e in self.emulated),
                "loop_cpu_per_step_s": sum(r["loop_cpu_s"] for r in rows) / len(rows),
                "samples_per_step": self.emulated[0].samples, "tokens_per_step": emu and sum(
                    e.tokens for e in self.emulated) / len(rows),
                "time_scale": self.config.time_scale, "worker": self.config.worker,
                "boot_wall_s": self.boot_wall_s, "wall_s": self.wall_s} | self.memory

    def to_json(self) -> dict:
        return {"config": dataclasses.asdict(self.config), "summary": self.summary(), "rows": self.rows(),
                "emulated": [dataclasses.asdict(e) for e in self.emulated], "simulated": self.simulated,
                "startup_s": self.startup_s}


# ---- the emulated run ------------------------------------------------------------------------------

def _groups(cfg: CheckConfig, step: int):
    from rlboost.rollout.sample import Group, Sample

    groups = []
    for g in range(cfg.prompts):
        prompt = [FIRST_TOKEN + (g * 7919 + i * 104729) % 30000 for i in range(cfg.prompt_len)]
        samples = [Sample(uid=f"{step}:{g}:{j}", prompt_ids=list(prompt), seed=workload_seed(step, g, j))
                   for j in range(cfg.samples)]
        groups.append(Group(index=g, row_index=g, data_source="emulated", ground_truth=None, extra_info={},
                            samples=samples))
    return groups


def check_step(groups: list, cfg: CheckConfig, emu: EmulationConfig, step: int) -> None:
    """Exactly once, on-policy, exact continuation, and the workload's lengths, for one step."""
    lengths = Workload(emu.lengths()).step(step)
    cap = emu.lengths().max_response
    if sorted(g.index for g in groups) != list(range(cfg.prompts)):
        raise RuntimeError(f"step {step}: groups {sorted(g.index for g in groups)} instead of each of "
                           f"{cfg.prompts} once")
    for g in groups:
        if sorted(s.uid for s in g.samples) != sorted(f"{step}:{g.index}:{j}" for j in range(cfg.samples)):
            raise RuntimeError(f"step {step} group {g.index}: samples are not each of its {cfg.samples} once")
        for s in g.samples:
            j = int(s.uid.rsplit(":", 1)[1])
            want = lengths[g.index][j]
            reason = "length" if want >= cap else "stop"
            if len(s.response_ids) != want or s.finish_reason != reason:
                raise RuntimeError(f"sample {s.uid}: {len(s.response_ids)} tokens ({s.finish_reason}), the workload "
                                   f"says {want} ({reason})")
            p0 = len(s.prompt_ids)
            expect = [token_at(s.seed, p0 + i, emu.vocab, frozenset({EOS})) for i in range(want)]
            if reason == "stop":
                expect[-1] = EOS
            if s.response_ids != expect:
                first = next(i for i, (a, b) in enumerate(zip(s.response_ids, expect)) if a != b)
                raise RuntimeError(f"sample {s.uid}: token {first} is not the emulation's (a broken continuation)")
            if s.logprobs != [logprob_at(s.seed, p0 + i) for i in range(want)]:
                raise RuntimeError(f"sample {s.uid}: log-probs misaligned with its tokens")
            if s.versions != [step] * want:
                raise RuntimeError(f"sample {s.uid}: tokens of versions {sorted(set(s.versions))} in step {step}")


@functools.cache
def _tiny_fingerprint() -> str:
    """The tiny model's architecture, which light workers (no skeleton of their own) report."""
    from rlboost.engine.protocol import weights_fingerprint
    from rlboost.models.loading import load_skeleton

    return weights_fingerprint(dict(load_skeleton(ModelConfig(path=TINY_MODEL)).named_parameters()))


@functools.cache
def _tiny_state() -> dict:
    from rlboost.models import ModelConfig, load_model

    return {name: p.detach().clone() for name, p in load_model(ModelConfig(path=TINY_MODEL)).model.named_parameters()}


def _weights(version: int) -> dict:
    """The tiny model's parameters, nudged per version so that every version's bytes (and checksum) differ."""
    return {name: t + 1e-3 * version for name, t in _tiny_state().items()}


def worker_memory(pids: list[int]) -> dict:
    """Mean RSS and private (unshared) memory in MB of the processes `pids`, and how many of them
    have torch's library mapped. Linux only (/proc); {} elsewhere or if none could be read."""
    rss, private, torch_loaded = [], [], 0
    for pid in pids:
        try:
            fields = {}
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    parts = line.split()
                    if len(parts) >= 2 and parts[1].isdigit():
                        fields[parts[0].rstrip(":")] = int(parts[1])
            with open(f"/proc/{pid}/maps") as f:
                torch_loaded += any("libtorch" in line for line in f)
        except OSError:
            continue
        rss.append(fields.get("Rss", 0) / 1024)
        private.append((fields.get("Private_Dirty", 0) + fields.get("Private_Clean", 0)) / 1024)
    if not rss:
        return {}
    return {"workers_measured": len(rss), "worker_rss_mb": sum(rss) / len(rss),
            "worker_private_mb": sum(private) / len(private), "workers_with_torch": torch_loaded}


def run_emulation(cfg: CheckConfig, log=None) -> tuple[list[EmulatedStep], float, float, float, dict]:
    """Run the steps on the real runtime with emulated workers. Returns (steps, modelled provisioning
    time of the instances that joined, wall seconds to the first step, wall seconds in all, the
    workers' memory after the first step)."""
    from rlboost.cluster.config import ClusterConfig, WeightsConfig
    from rlboost.cluster.ray_cluster import Cluster
    from rlboost.engine import EngineConfig, SamplingParams
    from rlboost.hybrid.config import HybridConfig
    from rlboost.hybrid.rollout import HybridRollout
    from rlboost.hybrid.worker import WorkerSpec
    from rlboost.models import ModelConfig

    cfg.validate()
    t_begin = time.monotonic()
    ts = cfg.time_scale
    emu = cfg.emulation()
    _, train = emu.profiles()
    train_gpus = cfg.reserved_engines * emu.profiles()[0].tp
    hybrid = HybridConfig(
        num_reserved=cfg.reserved_engines, num_preemptible=0 if cfg.colocated else cfg.instances,
        provider="fixed" if cfg.colocated else cfg.provider,
        seed_window_s=cfg.seed_window_s * ts, max_pending=cfg.max_pending, respawn=True,
        heartbeat_interval_s=1.0, heartbeat_timeout_s=30.0, call_timeout_s=300.0,
        trace=cfg.trace_config(wall=True), offload=cfg.offload_config(ts))
    hybrid.validate()
    cluster_cfg = ClusterConfig(weights=WeightsConfig(pull_timeout_s=300.0))
    spec = WorkerSpec(ModelConfig(path=TINY_MODEL),
                      EngineConfig(device="cpu", max_num_seqs=cfg.max_num_seqs, stream_interval=cfg.stream_interval),
                      eos_token_ids=[EOS], engine_factory=EmulatedEngines(emu, _tiny_fingerprint()))
    params = SamplingParams(temperature=1.0, max_tokens=emu.lengths().max_response)
    steps: list[EmulatedStep] = []
    provision: list[float] = []
    memory: dict = {}
    reserved_usd_per_s, instance_usd_per_s = cfg.prices()
    cluster = Cluster(cluster_cfg, hybrid.instances)
    rollout = None
    try:
        rollout = HybridRollout(hybrid, cluster, spec, _weights(0), version=0, seed=cfg.seed,
                                reserved_usd_per_s=reserved_usd_per_s, instance_usd_per_s=instance_usd_per_s)
        boot_wall = time.monotonic() - t_begin
        for k in range(cfg.steps):
            steps.append(_one_step(rollout, cfg, emu, train, train_gpus, params, k, provision))
            if k == 0:
                memory = worker_memory([h.pid for h in rollout.manager.alive()])
            if log:
                e = steps[-1]
                log(f"  step {k}: {e.step_s:.2f} s wall, rollout {e.rollout_s:.2f} s, T_seed {e.seed_s:.2f} s, "
                    f"{e.instances} instances, {e.preemptions} preempted, cap {e.cap}, {e.migrations} migrations, "
                    f"manager loop {e.loop_cpu_s:.2f} CPU s"
                    + "".join(f"\n    {t:.2f} s: {name} dead: {why}" for t, name, why in e.deaths))
    finally:
        if rollout is not None:
            rollout.close()
        cluster.shutdown()
    startup = (sum(provision) / len(provision) / ts) if provision else 0.0
    return steps, startup, boot_wall, time.monotonic() - t_begin, memory


def _one_step(rollout, cfg: CheckConfig, emu: EmulationConfig, train, train_gpus: int, params, k: int,
              provision: list[float]) -> EmulatedStep:
    ts = cfg.time_scale
    prompt_len = cfg.prompt_len
    groups = _groups(cfg, k)
    new_weights = _weights(k + 1)  # what the trainer's optimizer step will have made
    cpu0 = time.process_time()
    t0 = time.monotonic()
    stream = rollout.generate(groups, params, version=k, training=True)
    run = rollout.run
    run.training_may_start.wait()
    released = time.monotonic()
    deadline, compute = released, 0.0
    done = []
    for group in stream:
        # stream training: this group's modelled training time on the reserved GPUs, slept
        sequences = [prompt_len + len(s.response_ids) for s in group.samples]
        tokens = sum(sequences)
        context = sum(s * (s - 1) / 2.0 for s in sequences) / tokens
        seconds = train.train_s(tokens, train_gpus, context) * ts
        compute += seconds
        deadline = max(deadline, time.monotonic()) + seconds
        time.sleep(max(0.0, deadline - time.monotonic()))
        done.append(group)
    trained = time.monotonic()
    metrics = rollout.step_metrics(trained - t0)
    rollout.publish(new_weights, k + 1)
    end = time.monotonic()
    driver_cpu = time.process_time() - cpu0
    check_step(done, cfg, emu, k)  # between steps, not timed
    provision.extend(rollout.last_pulls.provision_s)
    return EmulatedStep(
        step=k, step_s=end - t0, rollout_s=metrics["timing_s/gen"], seed_s=metrics["rollout/seed_window_s"],
        wait_train_s=metrics["timing_s/wait_train"], wait_remote_s=metrics["timing_s/wait_remote"],
        train_s=compute, instances=int(metrics["spot/instances"]), preemptions=int(metrics["spot/preemptions"]),
        migrations=int(metrics["migration/samples"]),
        cap=int(metrics["spot/cap"]) if "spot/cap" in metrics else None, loop_cpu_s=run.loop_cpu_s,
        driver_cpu_s=driver_cpu, tokens=sum(len(s.response_ids) for g in done for s in g.samples),
        samples=sum(len(g.samples) for g in done), deaths=list(run.stats.deaths), reports=run.reports,
        instance_s=metrics["spot/instance_s"])


# ---- the simulated twin ----------------------------------------------------------------------------

def sim_config(cfg: CheckConfig, startup_s: float, trace_csv: str = ""):
    """The SimConfig matching `cfg` (see the module docstring); `trace_csv`: the constant trace of a
    fixed pool."""
    from rlboost.sim.simulator import SimConfig

    emu = cfg.emulation()
    tp = emu.profiles()[0].tp
    reserved_usd_per_s, instance_usd_per_s = cfg.prices()  # per wall second; the simulator's are per modelled one
    if cfg.provider == "fixed":
        trace = TraceConfig(path=trace_csv, sample=1.0, time_scale=1.0, seed=cfg.seed)
    else:
        trace = cfg.trace_config(wall=False)
    return SimConfig(
        model=cfg.model, policy="rlboost", segment=cfg.segment, trace=trace, reserved_nodes=1,
        gpus_per_node=cfg.reserved_engines * tp, gpus_per_instance=tp, instance_startup_s=startup_s,
        trace_gpus_per_instance=tp,  # the runtime's replay counts a trace row as one of its instances
        stream_interval=cfg.stream_interval, max_pending=cfg.max_pending, offload=cfg.offload_config(),
        initial_seed_s=cfg.seed_window_s, workload=emu.lengths(), seed=cfg.seed, duration_s=1.0,
        cost=CostConfig(reserved_usd_per_hour=reserved_usd_per_s * 3600 * cfg.time_scale,
                        instance_usd_per_hour={"spot-2xH100": instance_usd_per_s * 3600 * cfg.time_scale}),
        profile=replace(ProfileConfig(), max_num_seqs=cfg.max_num_seqs, reserved_gbps=FAST_GBPS,
                        spot_gbps=2 * FAST_GBPS))


def run_simulation(cfg: CheckConfig, startup_s: float) -> list[dict]:
    """The simulator's first `steps` steps of the matching run, as dicts of StepRecord."""
    from rlboost.sim.simulator import simulate

    with tempfile.TemporaryDirectory() as tmp:
        csv = os.path.join(tmp, "fixed.csv")
        duration = 30.0 * cfg.steps
        while True:
            if cfg.provider == "fixed":
                with open(csv, "w") as f:
                    f.write(f"time_s,available_instances\n0,{cfg.instances}\n{2 * duration:g},{cfg.instances}\n")
            sim = replace(sim_config(cfg, startup_s, csv), duration_s=duration)
            result = simulate(sim)
            if len(result.steps) >= cfg.steps:
                return [dataclasses.asdict(s) for s in result.steps[:cfg.steps]]
            duration *= 2


def run_check(cfg: CheckConfig, log=None) -> CheckResult:
    """The emulated run, then its simulated twin."""
    emulated, startup, boot_wall, wall, memory = run_emulation(cfg, log)
    simulated = run_simulation(cfg, startup if cfg.provider == "trace" else 0.0)
    return CheckResult(cfg, emulated, simulated, startup, boot_wall, wall, memory)


# ---- the command -----------------------------------------------------------------------------------

def table(results: list[CheckResult]) -> str:
    lines = ["| instances | step | simulated s | emulated s | difference | rollout sim / emu s | T_seed sim / emu s "
             "| instances at start sim / emu | preempted sim / emu | cap sim / emu | migrations sim / emu "
             "| manager loop CPU s | loop / step | loop / rollout | driver CPU / step |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        for row in r.rows():
            lines.append(
                f"| {r.config.instances} | {row['step']} | {row['sim_step_s']:.2f} | {row['emu_step_s']:.2f} "
                f"| {row['diff']:+.1%} | {row['sim_rollout_s']:.2f} / {row['emu_rollout_s']:.2f} "
                f"| {row['sim_seed_s']:.2f} / {row['emu_seed_s']:.2f} "
                f"| {row['sim_instances']} / {row['emu_instances']} "
                f"| {row['sim_preemptions']} / {row['emu_preemptions']} | {row['sim_cap']} / {row['emu_cap']} "
                f"| {row['sim_migrations']} / {row['emu_migrations']} "
                f"| {row['loop_cpu_s']:.3f} | {row['loop_share']:.1%} | {row['loop_share_rollout']:.1%} "
                f"| {row['driver_share']:.1%} |")
    lines += ["", "| instances | reserved engines | samples/step | worker (private MB) | time_scale | sim total s "
              "| emu total s | difference | worst step | manager loop CPU / step | loop / step time | loop / rollout "
              "| driver CPU / step time |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        s = r.summary()
        mem = f" ({s['worker_private_mb']:.0f})" if "worker_private_mb" in s else ""
        lines.append(f"| {s['instances']} | {r.config.reserved_engines} | {s['samples_per_step']} | {s['worker']}{mem} "
                     f"| {s['time_scale']:g} | {s['sim_total_s']:.1f} | {s['emu_total_s']:.1f} "
                     f"| {s['diff_total']:+.1%} "
                     f"| {s['max_abs_diff']:.1%} | {s['loop_cpu_per_step_s']:.2f} s | {s['loop_share']:.1%} "
                     f"| {s['loop_share_rollout']:.1%} | {s['driver_share']:.1%} |")
    return "\n".join(lines)


def scaled_config(instances: int, base: CheckConfig) -> CheckConfig:
    """The configuration of one instance count: 4 prompts and a quarter reserved engine per instance
    (at least the base's), so every engine carries about the same load at every scale."""
    return replace(base, instances=instances, prompts=max(base.prompts, 4 * instances),
                   reserved_engines=max(base.reserved_engines, instances // 4))


@dataclass
class EmulationBenchConfig(CheckConfig):
    """`rlboost bench emulation`: a CheckConfig run at each of several instance counts (scaled so that
    every engine carries about the same load: `scaled_config`)."""

    instances: list[int] = dataclasses.field(default_factory=lambda: [4])
    """Instance counts; each runs 4 prompts and a quarter reserved engine per instance."""
    worker: str = ""
    """`rollout` or `light`; empty: rollout up to 8 instances, light above (memory: docs/simulator.md)."""

    def checks(self) -> list[CheckConfig]:
        shared = {f.name: getattr(self, f.name) for f in dataclasses.fields(CheckConfig)
                  if f.name not in ("instances", "worker")}
        out = []
        for n in self.instances:
            cfg = replace(scaled_config(n, CheckConfig(**shared)), worker=self.worker or ("rollout" if n <= 8 else "light"))
            cfg.validate()
            out.append(cfg)
        return out


def bench_emulation(cfg: EmulationBenchConfig, log=None) -> dict:
    """Every instance count's emulated run and its simulated twin, step by step."""
    results = []
    for check in cfg.checks():
        if log:
            log(f"{check.instances} instances, {check.reserved_engines} reserved engines, {check.prompts} x "
                f"{check.samples} samples, {check.worker} workers, time_scale {check.time_scale:g}:")
        results.append(run_check(check, log))
    return {"config": dataclasses.asdict(cfg), "runs": [r.to_json() for r in results], "table": table(results)}


def render(result: dict) -> str:
    return result["table"]


__all__ = ["CheckConfig", "CheckResult", "EmulatedStep", "EmulationBenchConfig", "bench_emulation", "check_step",
           "render", "run_check", "run_emulation", "run_simulation", "scaled_config", "sim_config", "table"]
