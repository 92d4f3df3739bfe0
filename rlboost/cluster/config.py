"""The cluster's config (`cluster.*`, a top-level section of the run's config): where Ray runs, how
it is secured, and how the weight store packs and serves a version. Plain dataclasses: importing them
loads neither Ray nor torch, so a config can be read and checked anywhere."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from rlboost.cluster.hosts import HostEntry, expand_hosts

LOOPBACK = "127.0.0.1"


@dataclass
class WeightsConfig:
    bucket_mb: float = 64.0
    """Size of one published bucket; a bucket is the unit of transfer and of checksumming."""
    pull_timeout_s: float = 120.0
    """A pull that has not completed in this long fails (the worker is retried or dropped)."""
    pull_retries: int = 2
    """Failed pulls retried per worker and version before the worker is dropped."""
    patches: bool = True
    """Publish each version also as lossless patches (`rlboost.cluster.patches`): from the version before,
    for workers serving it, and from the run's base, for instances joining with the base model on their
    own disk. A worker applies one in place and checks every bucket's checksum: bit-identical to a full
    pull. Costs the publisher two more copies of the model in host memory (the last version, the base)
    and each patching worker one (the version it serves)."""
    max_patch_share: float = 0.5
    """A patch larger than this share of the full version is not offered (workers pull in full). bf16
    weights at RL learning rates change in a few percent of places; fp32 weights after an Adam step
    change nearly everywhere, but only in their low bytes (docs/weights.md has measured shares)."""
    join_from_base: bool = True
    """An instance joining the run reads the base model (`model.path`) from its own disk and pulls only
    the patch from it, where one is offered; otherwise the whole version."""

    def validate(self) -> None:
        if self.bucket_mb <= 0:
            raise ValueError(f"cluster.weights.bucket_mb must be > 0, got {self.bucket_mb}")
        if self.pull_timeout_s <= 0:
            raise ValueError(f"cluster.weights.pull_timeout_s must be > 0, got {self.pull_timeout_s}")
        if self.pull_retries < 0:
            raise ValueError(f"cluster.weights.pull_retries must be >= 0, got {self.pull_retries}")
        if not 0 <= self.max_patch_share <= 1:
            raise ValueError(f"cluster.weights.max_patch_share must be in [0, 1], got {self.max_patch_share}")


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
            raise ValueError(f"cluster.ray.worker_niceness must be an integer from 0 to 19 (a process "
                             f"may not raise its own priority), got {self.worker_niceness!r}")
        if not isinstance(self.auth_token, bool):
            raise ValueError(f"cluster.ray.auth_token must be true or false, got {self.auth_token!r}")
        try:
            ip = ipaddress.ip_address(str(self.bind_host))
        except ValueError:
            raise ValueError(f"cluster.ray.bind_host must be an IP address (Ray takes no host names), "
                             f"got {self.bind_host!r}") from None
        if ip.is_unspecified:
            raise ValueError(f"cluster.ray.bind_host={self.bind_host!r} is not an address other machines "
                             f"can reach; give this machine's IP (Ray then listens on all interfaces) "
                             f"or {LOOPBACK}")
        if ip.is_loopback and str(ip) != LOOPBACK:
            raise ValueError(f"cluster.ray.bind_host={self.bind_host!r}: Ray keeps its servers on the "
                             f"loopback interface only for {LOOPBACK}; use that")

    @property
    def loopback(self) -> bool:
        return self.bind_host == LOOPBACK


@dataclass
class ClusterConfig:
    """The Ray a run's trainer ranks and rollout workers share, and its weight store."""

    ray_address: str = ""
    """Empty: start a local Ray on this machine. Otherwise the address of a running cluster to join
    (its nodes then offer the `reserved` and `preemptible` resources themselves), as `host:port` of its
    GCS. Checked before the run loads anything (`rlboost.cluster.address`): something must answer there,
    and with `ray.auth_token` the cluster must refuse calls without a token."""
    ray: RaySecurityConfig = field(default_factory=RaySecurityConfig)
    """The local Ray's token authentication, the address its servers listen on (127.0.0.1 by default)
    and its workers' priority."""
    weights: WeightsConfig = field(default_factory=WeightsConfig)
    """The weight store: bucket size, pull timeout and retries."""
    hosts: list[HostEntry] = field(default_factory=lambda: [
        HostEntry(kind="reserved", name="res-0", cpus=2), HostEntry(kind="preemptible", count=4, link="1gbit")])
    """The hosts of `rollout.hybrid.instances=hosts` (`rlboost.cluster.hosts`): many hosts on this
    machine, each in network namespaces of its own behind a rate-limited link. The first is reserved
    (driver, Ray's head, trainer); preemptible ones boot when the run asks for an instance."""

    def validate(self) -> None:
        """Raise ValueError naming the offending field."""
        self.ray.validate()
        self.weights.validate()
        expand_hosts(self.hosts)
