"""Several rollout workers in one process (rlboost.hybrid.worker_host): each addressed as its own actor,
a dropped one failing like a dead actor while the others serve on, the config's refusals, and the real
control plane on shared processes."""

from __future__ import annotations

import pickle

import pytest

from rlboost.engine.sampling_params import SamplingParams
from rlboost.hybrid.handles import HostedActor, end_actor
from rlboost.hybrid.worker_host import HostedInstance, WorkerDropped, WorkerHost

EOS = 2
PROMPT = [5] * 64


class Recorded:
    """An actor method stand-in that records its `.options(...)` and `.remote(...)`."""

    def __init__(self, log: list, name: str, options: dict | None = None):
        self.log, self.name, self.opts = log, name, options or {}

    def options(self, **options):
        return Recorded(self.log, self.name, self.opts | options)

    def remote(self, *args):
        self.log.append((self.name, self.opts, args))
        return f"ref-{len(self.log)}"


class RecordingHost:
    """A WorkerHost's actor handle stand-in (picklable, as the relay receives it)."""

    def __init__(self):
        self.log: list = []

    def __getattr__(self, method):
        if method.startswith("_"):
            raise AttributeError(method)
        return Recorded(self.log, method)


def test_a_hosted_worker_is_called_as_its_own_actor_would_be():
    host = RecordingHost()
    actor = HostedActor(host, "pree-3")
    assert actor.pull.remote("manifest", 30.0, stage=True) == "ref-1"
    assert host.log[-1] == ("call", {}, ("pree-3", "pull", ("manifest", 30.0), {"stage": True}))
    actor.stream.options(num_returns="streaming", _generator_backpressure_num_objects=2).remote()
    assert host.log[-1] == ("stream", {"num_returns": "streaming", "_generator_backpressure_num_objects": 2},
                            ("pree-3",))
    actor.ping.remote()
    assert host.log[-1] == ("call", {}, ("pree-3", "ping", (), {}))
    end_actor(actor)  # ended: torn out of its host, the process kept
    assert host.log[-1] == ("drop", {}, ("pree-3",))
    copy = pickle.loads(pickle.dumps(actor))  # it travels to the report relay's process
    assert copy.name == "pree-3" and isinstance(copy.host, RecordingHost)
    with pytest.raises(AttributeError):
        actor.__wrapped__  # noqa: B018 - dunders are never a worker's call


def light_spec(heartbeat_s: float = 0.05):
    from rlboost.bench.emulated_run import _tiny_fingerprint
    from rlboost.engine import EngineConfig
    from rlboost.hybrid.worker import WorkerSpec
    from rlboost.models import ModelConfig
    from rlboost.sim.emulated import EmulatedEngines, EmulationConfig
    from rlboost.sim.workload import WorkloadConfig

    workload = WorkloadConfig(prompts_per_step=4, samples_per_prompt=8, prompt_len=len(PROMPT))
    emulation = EmulationConfig(workload=workload, length_scale=1 / 16, max_num_seqs=16, time_scale=0.02,
                                worker="light")
    return WorkerSpec(ModelConfig(path="tiny:qwen2"), EngineConfig(device="cpu"), eos_token_ids=[EOS],
                      heartbeat_interval_s=heartbeat_s, engine_factory=EmulatedEngines(emulation, _tiny_fingerprint()))


def test_a_dropped_worker_fails_like_a_dead_actor_and_its_process_mates_serve_on():
    host = WorkerHost()
    spec = light_spec()
    infos = [host.add(name, spec) for name in ("a", "b")]
    assert infos[0].pid == infos[1].pid and host.names() == ["a", "b"]  # one process, two workers
    request = [("r", PROMPT, SamplingParams(max_tokens=200, seed=7), len(PROMPT))]
    for name in ("a", "b"):
        host.call(name, "submit", (request,), {})
    streams = {name: host.stream(name) for name in ("a", "b")}
    assert next(streams["a"]).chunks and next(streams["b"]).chunks
    host.drop("a")
    with pytest.raises(WorkerDropped, match="rollout worker a was torn out"):
        next(streams["a"])  # its next report never leaves: the stream fails as a killed worker's does
    with pytest.raises(WorkerDropped):
        host.call("a", "ping", (), {})
    assert next(streams["b"]).chunks and host.call("b", "ping", (), {}) == infos[1].pid
    assert host.names() == ["b"]


def test_a_hosted_instance_ends_once_whichever_way_it_ends():
    host = RecordingHost()
    instance = HostedInstance("pree-1", HostedActor(host, "pree-1"), {"resources": {"preemptible": 1}})
    assert instance.options() == {"resources": {"preemptible": 1}} and instance.poll() is None
    instance.booted(123, "node")
    instance.preempt()
    instance.crash(123)
    instance.end()
    assert [entry[0] for entry in host.log] == ["drop"] and instance.poll() == -9


@pytest.mark.parametrize("overrides, says", [
    ({"workers_per_process": 0}, "workers_per_process must be an integer >= 1"),
    ({"workers_per_process": 4, "instances": "nodes"}, "needs rollout.hybrid.instances=processes"),
    ({"workers_per_process": 4, "gpus_per_worker": 1}, "gpus_per_worker=0"),
    ({"workers_per_process": 4, "provider": "ray_cluster"}, "other than ray_cluster"),
])
def test_the_config_refuses_sharing_where_a_real_engine_would_run(overrides, says):
    from rlboost.hybrid.config import HybridConfig

    with pytest.raises(ValueError, match=says):
        HybridConfig(**overrides).validate()
    HybridConfig(workers_per_process=4).validate()


def test_the_emulation_shares_processes_only_in_a_fixed_pool():
    from rlboost.bench.emulation import CheckConfig

    CheckConfig(workers_per_process=4).validate()
    with pytest.raises(ValueError, match="1 unless provider=fixed"):
        CheckConfig(workers_per_process=4, provider="trace").validate()


@pytest.mark.e2e
def test_the_real_control_plane_runs_on_shared_processes():
    # The real runtime (Ray, the manager, its relay, pulls of real bytes) on light emulated workers two to
    # a process: run_emulation's own check asserts every group and sample exactly once, on-policy, the
    # exact tokens and the workload's lengths.
    from rlboost.bench.emulation import CheckConfig
    from rlboost.bench.emulated_run import run_emulation

    cfg = CheckConfig(instances=4, reserved_engines=2, prompts=8, samples=4, steps=2, length_scale=1 / 48,
                      max_num_seqs=8, seed_window_s=1.0, worker="light", workers_per_process=2)
    steps, _, _, _, memory = run_emulation(cfg)
    assert [s.samples for s in steps] == [32, 32] and all(s.reports > 0 for s in steps)
    assert steps[0].migrations > 0  # the seeding hand-off moved samples between shared processes
    assert memory["workers_measured"] == 3  # 2 reserved workers in one process, 4 instances in two
