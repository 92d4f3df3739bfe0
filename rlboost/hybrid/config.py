"""Hybrid rollout configuration (`rollout.hybrid.*`): workers, the seeding window, balancing and
liveness (Ray and the weight store are the cluster's: `cluster.*`, `rlboost.cluster.config`). Plain
dataclasses: importing them loads neither Ray nor torch, so a config can be read and checked anywhere."""

from __future__ import annotations

import math

from dataclasses import dataclass, field

from rlboost.cluster.resources import INSTANCE_KINDS
from rlboost.policies.offload import OffloadConfig
from rlboost.spot.trace import TraceConfig

PREEMPT_WITH = ("instance", "process")
PROVIDERS = ("fixed", "trace", "ray_cluster")


@dataclass
class HybridConfig:
    num_reserved: int = 1
    """Rollout workers on the reserved resources; they generate during the seeding window, then the
    reserved resources train."""
    replace_reserved: bool = True
    """A reserved worker that dies (its process or node gone) is replaced at once, mid-step too, as the
    `fixed` provider replaces an instance; the step waits for the replacement when no other worker can
    take its samples. False: the step goes on without it, and fails when no worker is left."""
    num_preemptible: int = 2
    """Preemptible instances (one rollout worker each) at the start of the run, and the pool size the
    `fixed` provider keeps."""
    provider: str = "fixed"
    """Who decides which preemptible instances exist: `fixed` (keep num_preemptible, replacing killed
    ones at once), `trace` (follow the spot trace of `trace.*`), `ray_cluster` (the nodes of the Ray
    cluster at `cluster.ray_address` that carry a `preemptible` resource; more are asked of its
    autoscaler; a node Ray drains is a preemption notice)."""
    instances: str = "processes"
    """How a local run stands up preemptible instances: `processes` (worker processes of the local Ray
    node), `nodes` (one extra Ray node per instance, started on this machine, so a preemption can
    remove a whole node) or `hosts` (one Ray node per instance on an emulated host of its own, behind a
    rate-limited link: `cluster.hosts`; the run re-executes itself inside a room of network namespaces,
    and a preemption vanishes the whole host)."""
    gpus_per_worker: int = 0
    """GPUs each rollout worker owns (Ray `num_gpus`; Ray shows the worker those alone, in its
    CUDA_VISIBLE_DEVICES): 0 (Ray places no GPU for it: a CPU run, or on a one-machine GPU run the
    workers share the GPUs the machine shows them, engine.device deciding, as before this field), or
    exactly the GPUs its engine uses: 1, or engine.vllm_tensor_parallel_size with the vLLM backend (a
    placement group of that many GPUs on one host). Reserved workers share the reserved GPUs with the
    trainer ranks by time (`rlboost.cluster.placement`). A config asking for more GPUs than the hosts
    have is refused before any worker starts."""
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
    workers_per_process: int = 1
    """Rollout workers sharing one process (`rlboost.hybrid.worker_host`): 1, a process each (a
    preemption kills it). Above 1, a stand-in for benches of the control plane with emulated engines
    (hundreds of instances on one machine): a preempted worker is torn out of its shared process, not
    killed with it. Needs instances=processes, no GPUs and a provider other than ray_cluster."""
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
    max_unacked_reports: int = 2
    """Reports a worker may stream ahead of the manager taking them (Ray's streaming-generator
    backpressure): its engine waits while this many are in transit. A kill then loses at most
    (max_unacked_reports + 1) x engine.stream_interval tokens per request (invariant 4). 1 waits for
    every report's acknowledgement; 2 lets the next report be generated while one is in transit. 0
    turns backpressure off: no bound on the reports Ray drops with a dead worker."""
    notice_keep: bool = True
    """A preemption notice that says when the kill comes leaves the samples HistoPipe's history expects
    to finish before it on the instance (`rlboost.policies.notice`); the rest are taken back at once.
    False: every sample is taken back at the notice."""
    notice_margin_s: float = 2.0
    """What a noticed instance still holds this long before its kill is taken back then: the time an
    abort and its answer need; a sample stays only if expected to finish before that."""
    heartbeat_timeout_s: float = 15.0
    """A worker silent for this long is declared dead and fenced (a stuck worker, not only a dead one)."""
    call_timeout_s: float = 120.0
    """Limit on a control call to a worker (abort, weight load); a worker that misses it is declared dead."""
    preempt_every_s: float = 0.0
    """Chaos for tests and demos: mean seconds between hard kills of a random preemptible instance
    (a seeded Poisson process over the run; 0 never kills)."""
    preempt_every_tokens: float = 0.0
    """The same chaos on the run's progress instead of the clock: mean response tokens generated
    between kills, so they land at the same tokens of the run on a fast machine and a loaded one, and
    only while it generates (0: off; not with preempt_every_s)."""
    provider_tick_s: float = 0.1
    """How often the instance provider acts: launches, preemption notices, kills and the trace's
    events land at its first tick at or after they are due (a kill due at a token count too)."""
    preempt_with: str = "instance"
    """What a preemption (chaos, a trace, a test's kill) kills: `instance`, the whole instance at once, as
    a spot VM goes (its worker's process with instances=processes, its Ray node's whole process tree
    with nodes, its host vanishing, link silent first, with hosts); or `process`, the worker's process
    alone (SIGKILL, a crash: its node or host lives on until the fleet reaps the dead worker)."""
    respawn: bool = True
    """`fixed` provider: replace a killed instance at once (the new one joins mid-step once its weight
    pull verifies)."""
    launch_backoff_s: float = 1.0
    """After an instance fails to boot, its provider launches none for this long; each further failed
    boot in a row doubles the wait, up to launch_backoff_max_s, and one that boots resets it
    (`rlboost.policies.launch_backoff`): an instance that can never boot (a model missing on the
    instances, a Ray node that does not come up) is not asked for at every 0.1 s tick. 0: no backoff."""
    launch_backoff_max_s: float = 60.0
    """The longest wait between launches after failed boots (>= launch_backoff_s)."""
    failure_summary_s: float = 30.0
    """A failed boot or a provider error reaches the console as one warning line the first time its
    cause is seen (instance names and numbers aside: `rlboost.policies.failure_digest`); its repeats
    are counted and summarised in one line ("N more times in the last S s; next launch in T s") no
    sooner than this many seconds later, the wait doubling after each summary up to
    failure_summary_max_s. 0: every repeat is reported at the next tick."""
    failure_summary_max_s: float = 600.0
    """The longest wait between two summary lines of one cause (>= failure_summary_s); a cause quiet
    for longer is reported in full again if it comes back."""
    trace: TraceConfig = field(default_factory=TraceConfig)
    """The spot trace the `trace` provider replays."""
    offload: OffloadConfig = field(default_factory=OffloadConfig)
    """The adaptive offload controller: T_seed per step and the instance cap."""
    ledger_dir: str | None = None
    """Each worker appends its per-request token counts (generated after every engine step, sent with
    every report) to a file here (`rlboost.hybrid.token_ledger`), which outlives a hard kill of its
    process: the manager then counts a dead worker's tokens generated and never received exactly
    (`migration/wasted_tokens`), where without it only as far as the worker's last report. Needs a
    directory every instance and the manager can read (a local run's). Off by default."""

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
        if self.preempt_every_s > 0 and self.preempt_every_tokens > 0:
            raise ValueError("rollout.hybrid.preempt_every_s and preempt_every_tokens: choose one clock for the chaos")
        for name in ("seed_window_s", "preempt_every_s", "preempt_every_tokens", "report_delay_s", "launch_backoff_s",
                     "failure_summary_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"rollout.hybrid.{name} must be >= 0, got {getattr(self, name)}")
        for name in ("heartbeat_interval_s", "heartbeat_timeout_s", "call_timeout_s", "provider_tick_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"rollout.hybrid.{name} must be > 0, got {getattr(self, name)}")
        for first, most in (("launch_backoff_s", "launch_backoff_max_s"), ("failure_summary_s", "failure_summary_max_s")):
            if getattr(self, most) < getattr(self, first):
                raise ValueError(f"rollout.hybrid.{most} must be >= {first} ({getattr(self, first)}), "
                                 f"got {getattr(self, most)}")
        if self.heartbeat_timeout_s <= self.heartbeat_interval_s:
            raise ValueError("rollout.hybrid.heartbeat_timeout_s must exceed heartbeat_interval_s")
        if not isinstance(self.gpus_per_worker, int) or self.gpus_per_worker < 0:
            raise ValueError(f"rollout.hybrid.gpus_per_worker must be an integer >= 0, got {self.gpus_per_worker!r}")
        if self.gpus_per_worker and self.instances == "nodes":
            raise ValueError("rollout.hybrid.gpus_per_worker > 0 needs rollout.hybrid.instances=processes on one "
                             "machine (the Ray nodes instances=nodes starts offer no GPUs) or a cluster at "
                             "cluster.ray_address")
        if not isinstance(self.workers_per_process, int) or self.workers_per_process < 1:
            raise ValueError(f"rollout.hybrid.workers_per_process must be an integer >= 1, "
                             f"got {self.workers_per_process!r}")
        if self.workers_per_process > 1 and (self.instances != "processes" or self.gpus_per_worker
                                             or self.provider == "ray_cluster"):
            raise ValueError("rollout.hybrid.workers_per_process > 1 (emulated workers sharing a process) needs "
                             "rollout.hybrid.instances=processes, gpus_per_worker=0 and a provider other than "
                             "ray_cluster: a real engine needs a process of its own")
        if not isinstance(self.max_unacked_reports, int) or self.max_unacked_reports < 0:
            raise ValueError(f"rollout.hybrid.max_unacked_reports must be an integer >= 0 (0: no backpressure), "
                             f"got {self.max_unacked_reports!r}")
        if self.max_pending < 0:
            raise ValueError(f"rollout.hybrid.max_pending must be >= 0, got {self.max_pending}")
        if not 0 < self.plateau_tolerance <= 1:
            raise ValueError(f"rollout.hybrid.plateau_tolerance must be in (0, 1], got {self.plateau_tolerance}")
        if self.provider not in PROVIDERS:
            raise ValueError(f"rollout.hybrid.provider={self.provider!r}; choose one of {', '.join(PROVIDERS)}")
        for section in (self.trace, self.offload):
            section.validate()
        if not (self.notice_margin_s >= 0 and math.isfinite(self.notice_margin_s)):
            raise ValueError(f"rollout.hybrid.notice_margin_s must be a finite number >= 0, got {self.notice_margin_s}")
        if not 0 < self.manager_cpu_share < 1:
            raise ValueError(f"rollout.hybrid.manager_cpu_share must be in (0, 1), got {self.manager_cpu_share}")
        if self.worker_threads < 1:
            raise ValueError(f"rollout.hybrid.worker_threads must be >= 1, got {self.worker_threads}")
