"""The emulation check's configuration (`rlboost bench emulation`, `rlboost.bench.emulation`): one
emulated run of the real hybrid runtime and its simulated twin, matched one for one (the matching is
described in `rlboost.bench.emulation`'s docstring). Torch-free and Ray-free."""

from __future__ import annotations

from dataclasses import dataclass, replace

from rlboost.policies.offload import OffloadConfig
from rlboost.sim.emulated import EmulationConfig
from rlboost.rollout.step_data import START_AHEAD
from rlboost.sim.specs import MODELS
from rlboost.sim.workload import WorkloadConfig
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
    workers_per_process: int = 1
    """rollout.hybrid.workers_per_process: emulated workers sharing one process (above 1: what fits 256
    instances and their reserved engines on one machine; a fixed pool only: a trace's preemption would
    tear a worker out of its process, not kill one)."""
    seed: int = 0
    """Workload seed, and the trace replay's choice of victims."""
    max_staleness: int = 0
    """algorithm.max_staleness of the runtime and the simulator's twin (docs/staleness.md): with k > 0
    the instances generate the next step's batch while the stand-in trainer trains."""
    start_ahead: str = "tail"
    """algorithm.start_ahead of both (with max_staleness >= 1): the next batch from the step's tail (the
    default), or from its rollout's end (`rollout_end`)."""

    def validate(self) -> None:
        if self.model not in MODELS:
            raise ValueError(f"model={self.model!r}; valid: {', '.join(sorted(MODELS))}")
        if self.max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {self.max_staleness}")
        if self.start_ahead not in START_AHEAD:
            raise ValueError(f"start_ahead={self.start_ahead!r}; valid: {', '.join(START_AHEAD)}")
        for name in ("instances", "reserved_engines", "prompts", "samples", "steps", "max_num_seqs",
                     "stream_interval", "prompt_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.provider not in PROVIDERS:
            raise ValueError(f"provider={self.provider!r}; valid: {', '.join(PROVIDERS)}")
        if self.workers_per_process < 1 or (self.workers_per_process > 1 and self.provider != "fixed"):
            raise ValueError(f"workers_per_process must be >= 1, and 1 unless provider=fixed (a shared process "
                             f"emulates no kill), got {self.workers_per_process} with provider={self.provider}")
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
