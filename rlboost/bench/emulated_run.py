"""The emulated half of the emulation check: `steps` RL steps of the REAL hybrid runtime
(`HybridRollout`: Fleet, RolloutManager, the OffloadController, a provider, real SIGKILLs, real weight
pulls) on rollout workers whose engine is emulated (`rlboost.sim.emulated`: it sleeps through the
profile's time, plugged in through the worker's engine factory), with a stand-in trainer that
stream-trains each finished group by sleeping its modelled training time on the reserved GPUs and
publishes new weights after every step.

Contract: `run_emulation(CheckConfig(...))` returns the run step by step (`EmulatedStep`, wall
seconds), with the manager's CPU time; every step is checked (`check_step`): each group and sample
exactly once, every token of the step's version, each response the emulation's exact tokens for its
seed (continuation across migrations) and exactly the workload's length. The simulated twin and the
comparison are `rlboost.bench.emulation`'s."""

from __future__ import annotations

import dataclasses
import functools
import time
from dataclasses import dataclass

from rlboost.bench.emulation_config import EOS, TINY_MODEL, CheckConfig
from rlboost.hybrid.config import HybridConfig
from rlboost.models.config import ModelConfig
from rlboost.sim.emulated import FIRST_TOKEN, EmulatedEngines, EmulationConfig, logprob_at, token_at, workload_seed
from rlboost.sim.workload import Workload


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
    relay_cpu_s: float
    """CPU time of the report relay's process over the step's rollout (`rlboost.hybrid.report_relay`)."""
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
    preemptible_share: float = 0.0
    """Share of the step's generated tokens that the preemptible workers generated."""

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
    """Exactly once, on-policy (or within cfg.max_staleness), exact continuation, and the workload's
    lengths, for one step."""
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
            if len(s.versions) != want or not all(step - cfg.max_staleness <= v <= step for v in s.versions):
                raise RuntimeError(f"sample {s.uid}: tokens of versions {sorted(set(s.versions))} in step {step} "
                                   f"(max_staleness {cfg.max_staleness})")


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


def runtime_config(cfg: CheckConfig) -> HybridConfig:
    """The runtime's settings for the emulated run: its times in wall seconds, modelled ones x time_scale.
    The workers' reporting clocks are modelled seconds too, as every other time here: at time_scale 12 an
    idle worker's heartbeat every wall second would be 12 a modelled second, and 64 idle reserved
    engines' heartbeats a sixth of the reports the manager handles at 256 instances."""
    ts, defaults = cfg.time_scale, HybridConfig()
    return HybridConfig(
        num_reserved=cfg.reserved_engines, num_preemptible=0 if cfg.colocated else cfg.instances,
        provider="fixed" if cfg.colocated else cfg.provider,
        seed_window_s=cfg.seed_window_s * ts, max_pending=cfg.max_pending, respawn=True,
        heartbeat_interval_s=defaults.heartbeat_interval_s * ts, heartbeat_timeout_s=30.0 * ts,
        report_delay_s=defaults.report_delay_s * ts, call_timeout_s=300.0,
        workers_per_process=cfg.workers_per_process,
        trace=cfg.trace_config(wall=True), offload=cfg.offload_config(ts))


def run_emulation(cfg: CheckConfig, log=None) -> tuple[list[EmulatedStep], float, float, float, dict]:
    """Run the steps on the real runtime with emulated workers. Returns (steps, modelled provisioning
    time of the instances that joined, wall seconds to the first step, wall seconds in all, the
    workers' memory after the first step)."""
    from rlboost.cluster.config import ClusterConfig, WeightsConfig
    from rlboost.cluster.ray_cluster import Cluster
    from rlboost.engine import EngineConfig, SamplingParams
    from rlboost.hybrid.rollout import HybridRollout
    from rlboost.hybrid.worker import WorkerSpec
    from rlboost.models import ModelConfig

    cfg.validate()
    t_begin = time.monotonic()
    ts = cfg.time_scale
    emu = cfg.emulation()
    _, train = emu.profiles()
    train_gpus = cfg.reserved_engines * emu.profiles()[0].tp
    hybrid = runtime_config(cfg)
    hybrid.validate()
    cluster_cfg = ClusterConfig(weights=WeightsConfig(pull_timeout_s=300.0))
    spec = WorkerSpec(ModelConfig(path=TINY_MODEL),
                      EngineConfig(device="cpu", max_num_seqs=cfg.max_num_seqs, stream_interval=cfg.stream_interval),
                      eos_token_ids=[EOS], heartbeat_interval_s=hybrid.heartbeat_interval_s,
                      engine_factory=EmulatedEngines(emu, _tiny_fingerprint()))
    params = SamplingParams(temperature=1.0, max_tokens=emu.lengths().max_response)
    steps: list[EmulatedStep] = []
    provision: list[float] = []
    memory: dict = {}
    reserved_usd_per_s, instance_usd_per_s = cfg.prices()
    cluster = Cluster(cluster_cfg, hybrid.instances)
    rollout = None
    try:
        rollout = HybridRollout(hybrid, cluster, spec, _weights(0), version=0, seed=cfg.seed,
                                reserved_usd_per_s=reserved_usd_per_s, instance_usd_per_s=instance_usd_per_s,
                                max_staleness=cfg.max_staleness, start_ahead=cfg.start_ahead)
        boot_wall = time.monotonic() - t_begin
        for k in range(cfg.steps):
            steps.append(_one_step(rollout, cfg, emu, train, train_gpus, params, k, provision))
            if k == 0:
                memory = worker_memory(sorted({h.pid for h in rollout.fleet.alive()}))  # hosted workers share one
            if log:
                e = steps[-1]
                log(f"  step {k}: {e.step_s:.2f} s wall, rollout {e.rollout_s:.2f} s, T_seed {e.seed_s:.2f} s, "
                    f"{e.instances} instances, {e.preemptions} preempted, cap {e.cap}, {e.migrations} migrations, "
                    f"manager loop {e.loop_cpu_s:.2f} CPU s, relay {e.relay_cpu_s:.2f} CPU s"
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
    ahead = rollout.ahead  # the run started ahead of this step (max_staleness > 0), with its groups
    groups = ahead.groups_list if ahead is not None else _groups(cfg, k)
    new_weights = _weights(k + 1)  # what the trainer's optimizer step will have made
    cpu0 = time.process_time()
    t0 = time.monotonic()
    following = (lambda: _groups(cfg, k + 1)) if cfg.max_staleness and k + 1 < cfg.steps else None
    stream = rollout.generate(groups, params, version=k, training=True, next_batch=following)
    run = rollout.run
    run.training_may_start.wait()
    released = time.monotonic()
    deadline, compute = released, 0.0
    done = []
    for group in stream:
        # stream training: this group's modelled training time on the reserved GPUs, slept
        seconds = train.sequences_s([prompt_len + len(s.response_ids) for s in group.samples], train_gpus) * ts
        compute += seconds
        deadline = max(deadline, time.monotonic()) + seconds
        time.sleep(max(0.0, deadline - time.monotonic()))
        done.append(group)
    trained = time.monotonic()
    metrics = rollout.finish_step(trained - t0)
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
        relay_cpu_s=run.relay_cpu_s, driver_cpu_s=driver_cpu,
        tokens=sum(len(s.response_ids) for g in done for s in g.samples),
        samples=sum(len(g.samples) for g in done), deaths=list(run.stats.deaths), reports=run.reports,
        instance_s=metrics["spot/instance_s"], preemptible_share=metrics["rollout/preemptible_token_share"])
