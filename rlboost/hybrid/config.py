"""Hybrid rollout configuration (`rollout.hybrid.*`): workers, the seeding window, balancing, liveness,
the weight store and Ray's security settings. Plain dataclasses: importing them loads neither Ray nor
torch, so a config can be read and checked anywhere."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from rlboost.policies.offload import OffloadConfig
from rlboost.spot.trace import TraceConfig

LOOPBACK = "127.0.0.1"


@dataclass
class WeightsConfig:
    bucket_mb: float = 64.0
    """Size of one published bucket; a bucket is the unit of transfer and of checksumming."""
    pull_timeout_s: float = 120.0
    """A pull that has not completed in this long fails (the worker is retried or dropped)."""
    pull_retries: int = 2
    """Failed pulls retried per worker and version before the worker is dropped."""

    def validate(self) -> None:
        if self.bucket_mb <= 0:
            raise ValueError(f"rollout.hybrid.weights.bucket_mb must be > 0, got {self.bucket_mb}")
        if self.pull_timeout_s <= 0:
            raise ValueError(f"rollout.hybrid.weights.pull_timeout_s must be > 0, got {self.pull_timeout_s}")
        if self.pull_retries < 0:
            raise ValueError(f"rollout.hybrid.weights.pull_retries must be >= 0, got {self.pull_retries}")


@dataclass
class RaySecurityConfig:
    auth_token: bool = True
    """Ray token authentication: every call to a Ray server must carry the cluster's token (a random
    one per run unless RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH names one). Off only for debugging."""
    bind_host: str = LOOPBACK
    """The IP address of the local Ray node. 127.0.0.1 (the default) keeps every Ray server on the
    loopback interface; change only to run across machines: any other address is the one Ray
    advertises, and its servers then listen on all interfaces (Ray cannot bind a single external IP)."""
    worker_niceness: int = 0
    """How much lower than the driver's the priority of the worker processes (the rollout engines) runs in
    the Ray rlboost starts (their `nice` increment); a cluster at
    `ray_address` keeps its own (`RAY_worker_niceness` in its nodes' environment). Ray's own default is 15,
    so that its daemons and the driver come first; at 15 any ordinary busy process (a data loader, a
    reward sandbox, another job) takes nearly all their CPU: beside two busy processes on 2 cores, a fleet
    of 4 tiny workers booted in 204 s instead of 16 and a step took 36 s instead of 1.8
    (tests/test_bench_worker_priority.py). Raise it only where the workers stand in for other machines'
    accelerators on the trainer's CPU (the showcase), so the trainer in the driver comes first."""

    def validate(self) -> None:
        """Raise ValueError naming the offending field."""
        if not 0 <= self.worker_niceness <= 19:  # the config loader has already checked it is an integer
            raise ValueError(f"rollout.hybrid.ray.worker_niceness must be an integer from 0 to 19 (a process "
                             f"may not raise its own priority), got {self.worker_niceness!r}")
        if not isinstance(self.auth_token, bool):
            raise ValueError(f"rollout.hybrid.ray.auth_token must be true or false, got {self.auth_token!r}")
        try:
            ip = ipaddress.ip_address(str(self.bind_host))
        except ValueError:
            raise ValueError(f"rollout.hybrid.ray.bind_host must be an IP address (Ray takes no host names), "
                             f"got {self.bind_host!r}") from None
        if ip.is_unspecified:
            raise ValueError(f"rollout.hybrid.ray.bind_host={self.bind_host!r} is not an address other machines "
                             f"can reach; give this machine's IP (Ray then listens on all interfaces) "
                             f"or {LOOPBACK}")
        if ip.is_loopback and str(ip) != LOOPBACK:
            raise ValueError(f"rollout.hybrid.ray.bind_host={self.bind_host!r}: Ray keeps its servers on the "
                             f"loopback interface only for {LOOPBACK}; use that")

    @property
    def loopback(self) -> bool:
        return self.bind_host == LOOPBACK



INSTANCE_KINDS = ("processes", "nodes")
PREEMPT_WITH = ("sigkill", "node")
PROVIDERS = ("fixed", "trace", "ray_cluster")


@dataclass
class HybridConfig:
    num_reserved: int = 1
    """Rollout workers on the reserved resources; they generate during the seeding window, then the
    reserved resources train."""
    num_preemptible: int = 2
    """Preemptible instances (one rollout worker each) at the start of the run, and the pool size the
    `fixed` provider keeps."""
    provider: str = "fixed"
    """Who decides which preemptible instances exist: `fixed` (keep num_preemptible, replacing killed
    ones at once), `trace` (follow the spot trace of `trace.*`), `ray_cluster` (the nodes of the Ray
    cluster at `ray_address` that carry a `preemptible` resource; more are asked of its autoscaler)."""
    ray_address: str = ""
    """Empty: start a local Ray on this machine. Otherwise the address of a running cluster to join."""
    instances: str = "processes"
    """How a local run stands up preemptible instances: `processes` (worker processes of the local Ray
    node) or `nodes` (one extra Ray node per instance, started on this machine, so a preemption can
    remove a whole node)."""
    seed_window_s: float = 2.0
    """T_seed: seconds at the start of a step during which the reserved workers generate too. The
    offload controller tunes it; 0 hands every sample to the preemptible workers at once."""
    max_pending: int = 4
    """Θ: samples a worker may hold queued beyond its batch capacity (engine.max_num_seqs); more wait
    in the manager, where they can still go to whichever worker frees up first."""
    share_with_pulling: bool = True
    """Preemptible workers pulling the step's weights get their share of its dispatch, held in the
    manager until they serve it (the paper's artifact deals every request among its engines at the
    step's start). False: the workers ready first take all they can hold, and one seconds late idles
    until the seeding hand-off."""
    plateau_tolerance: float = 0.9
    """A worker's throughput plateaus at the smallest batch size reaching this fraction of its best
    measured tokens/s; an idle worker takes the executing samples beyond that batch size."""
    worker_threads: int = 1
    """torch threads per worker process."""
    heartbeat_interval_s: float = 1.0
    """An idle worker reports at least this often."""
    manager_cpu_share: float = 0.02
    """The rollout manager's loop paces its turns so that its own CPU stays near this share of the
    time (turns 20-200 ms apart): with many workers a turn costs more, so turns come further apart
    and each handles more reports."""
    report_delay_s: float = 0.05
    """How long a worker may hold a report that carries only finished requests' last chunks, waiting
    for its next report: fewer reports for the manager, at no risk to a token (those chunks never
    grow). A report with a full chunk never waits. 0 sends every report at once."""
    heartbeat_timeout_s: float = 15.0
    """A worker silent for this long is declared dead and fenced (a stuck worker, not only a dead one)."""
    call_timeout_s: float = 120.0
    """Limit on a control call to a worker (abort, weight load); a worker that misses it is declared dead."""
    preempt_every_s: float = 0.0
    """Chaos for tests and demos: mean seconds between hard kills of a random preemptible instance
    (a seeded Poisson process over the run; 0 never kills)."""
    preempt_with: str = "sigkill"
    """How chaos kills: `sigkill` the worker's process, or `node`: remove its Ray node and kill its
    processes (needs instances=nodes)."""
    respawn: bool = True
    """`fixed` provider: replace a killed instance at once (the new one joins mid-step once its weight
    pull verifies)."""
    trace: TraceConfig = field(default_factory=TraceConfig)
    """The spot trace the `trace` provider replays."""
    offload: OffloadConfig = field(default_factory=OffloadConfig)
    """The adaptive offload controller: T_seed per step and the instance cap."""
    weights: WeightsConfig = field(default_factory=WeightsConfig)
    """The weight store: bucket size, pull timeout and retries."""
    ray: RaySecurityConfig = field(default_factory=RaySecurityConfig)
    """Ray's token authentication and the address its servers listen on (127.0.0.1 by default)."""
    ledger_dir: str | None = None
    """Diagnostics: each worker appends its per-request generated-token counts after every engine
    step to a file here, so a test can measure tokens lost to a kill exactly. Off by default."""

    def validate(self) -> None:
        """Raise ValueError naming the offending field."""
        if self.num_reserved < 1:
            raise ValueError(f"rollout.hybrid.num_reserved must be >= 1 (the step must be able to finish "
                             f"without preemptible instances), got {self.num_reserved}")
        if self.num_preemptible < 0:
            raise ValueError(f"rollout.hybrid.num_preemptible must be >= 0, got {self.num_preemptible}")
        if self.instances not in INSTANCE_KINDS:
            raise ValueError(f"rollout.hybrid.instances={self.instances!r}; choose one of {', '.join(INSTANCE_KINDS)}")
        if self.preempt_with not in PREEMPT_WITH:
            raise ValueError(f"rollout.hybrid.preempt_with={self.preempt_with!r}; choose one of {', '.join(PREEMPT_WITH)}")
        if self.preempt_with == "node" and self.instances != "nodes":
            raise ValueError("rollout.hybrid.preempt_with=node needs rollout.hybrid.instances=nodes")
        for name in ("seed_window_s", "preempt_every_s", "report_delay_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"rollout.hybrid.{name} must be >= 0, got {getattr(self, name)}")
        for name in ("heartbeat_interval_s", "heartbeat_timeout_s", "call_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"rollout.hybrid.{name} must be > 0, got {getattr(self, name)}")
        if self.heartbeat_timeout_s <= self.heartbeat_interval_s:
            raise ValueError("rollout.hybrid.heartbeat_timeout_s must exceed heartbeat_interval_s")
        if self.max_pending < 0:
            raise ValueError(f"rollout.hybrid.max_pending must be >= 0, got {self.max_pending}")
        if not 0 < self.plateau_tolerance <= 1:
            raise ValueError(f"rollout.hybrid.plateau_tolerance must be in (0, 1], got {self.plateau_tolerance}")
        if self.provider not in PROVIDERS:
            raise ValueError(f"rollout.hybrid.provider={self.provider!r}; choose one of {', '.join(PROVIDERS)}")
        if self.provider == "ray_cluster" and not self.ray_address:
            raise ValueError("rollout.hybrid.provider=ray_cluster needs rollout.hybrid.ray_address (a running cluster)")
        for section in (self.trace, self.offload, self.weights, self.ray):
            section.validate()
        if not 0 < self.manager_cpu_share < 1:
            raise ValueError(f"rollout.hybrid.manager_cpu_share must be in (0, 1), got {self.manager_cpu_share}")
        if self.worker_threads < 1:
            raise ValueError(f"rollout.hybrid.worker_threads must be >= 1, got {self.worker_threads}")
