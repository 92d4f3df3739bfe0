"""The trainer at world size 2: two FSDP2 ranks (Ray actors, gloo on CPU) train to the world-1 update.

Real parts throughout: a local Ray with token authentication, rank actors in a placement group, a
torch.distributed gloo group, FSDP2-sharded tiny models. The world-1 reference is the in-process
`Trainer` on the same groups with the same (padded-batch) log-prob path."""

from __future__ import annotations

import copy
import os
import random
import signal
import time

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlboost.checkpoint import load_checkpoint, save_checkpoint
from rlboost.cluster.config import ClusterConfig, WeightsConfig
from rlboost.cluster.ray_setup import listening_addresses
from rlboost.cluster.ray_cluster import Cluster
from rlboost.cluster.host_copy import HostCopy
from rlboost.cluster.weights import pull
from rlboost.models import ModelConfig, load_model
from rlboost.trainer import LOSS_AGG_MODES, Trainer, TrainerConfig
from rlboost.trainer.ranks import TrainerGroup, TrainerRankError, check_world_size

from hybrid_util import patience
from rank_faults import alive, kill_rank_before_pass
from test_trainer import MAX_RESPONSE, make_groups

pytestmark = pytest.mark.e2e  # trainer ranks as Ray actors: `make test-e2e`

POLICY = ModelConfig(path="tiny:qwen2", seed=3)
REFERENCE = ModelConfig(path="tiny:qwen2", seed=4)  # another model, so that the KL term is not zero
# An update this small leaves fp32 weights of size ~0.1 exactly where they were: the ranks' weights
# stay those of the world-1 reference across the many steps one pair of ranks takes.
STILL = dict(lr=1e-12, weight_decay=0.0, grad_clip=0.0, device="cpu")


@pytest.fixture(scope="module")
def cluster():
    # logical CPUs for two groups of two ranks: a module-scoped group stays up (idle) while a test
    # starts a group of its own
    cluster = Cluster(ClusterConfig(), num_cpus=4)
    try:
        yield cluster
    finally:
        cluster.shutdown()


def trainer_kwargs():
    return dict(temperature=0.8, max_response_length=MAX_RESPONSE, total_optimizer_steps=100)


def world1_grads(groups, kl_coef: float, **cfg) -> list[dict[str, torch.Tensor]]:
    """The gradient each optimizer step of the in-process trainer sees, by parameter name."""
    ref = load_model(REFERENCE).model if kl_coef else None
    trainer = Trainer(load_model(POLICY).model, TrainerConfig(kl_coef=kl_coef, share_prompt=False, **STILL, **cfg),
                      ref_model=ref, **trainer_kwargs())
    grads = []
    trainer.optimizer.register_step_pre_hook(
        lambda *_: grads.append({n: p.grad.clone() for n, p in trainer.model.named_parameters()}))
    trainer.train_step(copy.deepcopy(groups), len(groups))
    return grads


def max_rel_diff(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> float:
    """Largest difference relative to each tensor's scale (an element near zero has no precision of its own)."""
    assert got.keys() == want.keys()
    return max(((got[n] - want[n]).abs().max() / want[n].abs().max().clamp(min=1e-30)).item() for n in want)


@pytest.fixture(scope="module", params=[0.0, 0.1], ids=["no-kl", "kl"])
def group(request, cluster):
    g = TrainerGroup(TrainerConfig(world_size=2, kl_coef=request.param, **STILL), POLICY,
                     ref_model=REFERENCE if request.param else None, cluster=cluster, **trainer_kwargs())
    g.capture_grads()
    try:
        yield g, request.param
    finally:
        g.close()


DEALINGS = {
    "round-robin": None,
    "seeded-random": lambda seed: (lambda i, rng=random.Random(seed): rng.randrange(2)),
    "all-to-rank-1": lambda seed: (lambda i: 1),  # rank 0 only ever runs dummy passes
}


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_two_ranks_give_the_world_1_gradient(group, mode):
    """Every loss mode, with and without KL, several arrival orders and dealings, micro-batches of one
    and two groups, one mini-batch and several, with and without TIS: each optimizer step sees the
    world-1 gradient."""
    trainers, kl_coef = group
    groups = make_groups(num_groups=5, n=3, seed=11)
    cases = [(1, 0, "round-robin", 0, 0.0), (2, 0, "seeded-random", 1, 0.0), (1, 2, "all-to-rank-1", 2, 0.0),
             (2, 2, "seeded-random", 3, 0.0), (1, 0, "seeded-random", 4, 1.2)]  # the last with TIS
    for micro, mini, dealing, seed, tis_cap in cases:
        arrival = groups[:]
        random.Random(seed).shuffle(arrival)  # groups finish in any order
        want = world1_grads(arrival, kl_coef, loss_agg_mode=mode, micro_batch_groups=micro, mini_batch_groups=mini,
                            tis_cap=tis_cap)
        trainers.reconfigure(loss_agg_mode=mode, micro_batch_groups=micro, mini_batch_groups=mini, tis_cap=tis_cap)
        make_deal = DEALINGS[dealing]
        trainers.deal = make_deal(seed) if make_deal else (lambda i: i % 2)
        metrics = trainers.train_step(copy.deepcopy(arrival), len(arrival))
        got = trainers.take_captured()
        assert len(got) == len(want) == metrics["actor/optimizer_steps"] == (3 if mini else 1)
        for g, w in zip(got, want):
            assert max_rel_diff(g, w) <= 1e-5, (micro, mini, dealing, tis_cap)
        if tis_cap:
            assert 0 < metrics["actor/tis_clipfrac"] < 1  # some tokens truncated, or the case proves little


def test_the_metrics_are_the_world_1_metrics(group):
    trainers, kl_coef = group
    groups = make_groups(num_groups=4, n=3, seed=12)
    trainers.reconfigure(loss_agg_mode="token-mean", micro_batch_groups=1, mini_batch_groups=2, tis_cap=0.0)
    trainers.deal = lambda i: i % 2
    got = trainers.train_step(copy.deepcopy(groups), len(groups))
    trainers.take_captured()
    ref = load_model(REFERENCE).model if kl_coef else None
    world1 = Trainer(load_model(POLICY).model, TrainerConfig(kl_coef=kl_coef, share_prompt=False, micro_batch_groups=1,
                                                             mini_batch_groups=2, **STILL),
                     ref_model=ref, **trainer_kwargs())
    want = world1.train_step(copy.deepcopy(groups), len(groups))
    assert got.keys() == want.keys()
    for key in want:
        assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-7), key


def test_a_world_size_the_cluster_cannot_place_is_refused():
    with pytest.raises(ValueError, match=r"trainer.world_size=3 needs 3 CPUs \(one per rank\) but the Ray cluster has 2"):
        check_world_size(TrainerConfig(world_size=3), "cpu", {"CPU": 2.0, "reserved": 100.0})
    with pytest.raises(ValueError, match="trainer.world_size=2 needs 2 GPUs"):
        check_world_size(TrainerConfig(world_size=2), "cuda", {"CPU": 16.0, "GPU": 1.0})
    with pytest.raises(ValueError, match="trainer.shard_size=3 must be 0 .* or a divisor of trainer.world_size=4"):
        TrainerConfig(world_size=4, shard_size=3).validate()
    with pytest.raises(ValueError, match="trainer.world_size must be >= 1"):
        TrainerConfig(world_size=0).validate()


# SGD-like Adam: with eps far above the gradients, Adam's first update is lr * grad / eps, continuous in
# the gradient (at the default eps it is lr * sign(grad), which float rounding can flip near zero)
MOVING = dict(lr=1e-2, eps=1.0, grad_clip=0.0, device="cpu")


def test_weights_published_from_shards_equal_world_1_bucket_by_bucket(cluster):
    """One step at world 2 and at world 1 on the same groups: the version each publishes holds the same
    tensors (checksums verified by the pull), and no rank held more than one bucket while publishing."""
    groups = make_groups(num_groups=4, n=3, seed=13)
    world1 = Trainer(load_model(POLICY).model, TrainerConfig(share_prompt=False, micro_batch_groups=2, **MOVING),
                     **trainer_kwargs())
    before = {n: p.detach().clone() for n, p in world1.model.named_parameters()}
    world1.train_step(copy.deepcopy(groups), len(groups))
    want = world1.weights()
    bucket_mb = 0.05  # ~52 KB: the tiny model (~180 KB) goes out in several buckets
    trainers = TrainerGroup(TrainerConfig(world_size=2, micro_batch_groups=2, **MOVING), POLICY, cluster=cluster,
                            **trainer_kwargs())
    try:
        trainers.train_step(copy.deepcopy(groups), len(groups))
        manifest = trainers.publish(1, WeightsConfig(bucket_mb=bucket_mb, patches=False))
        got = pull(manifest, manifest.fingerprint, timeout_s=patience(30))
        assert manifest.version == 1 and len(manifest.buckets) > 2
        assert set(got) == set(want)
        for name in want:
            torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-7)
        assert max((want[n] - before[n]).abs().max().item() for n in want) > 1e-4  # the step moved them
        # one bucket's array plus the one tensor being gathered into it: never the whole model
        sizes = [t.numel() * t.element_size() for t in want.values()]
        assert 0 < trainers.last_publish_peak_bytes <= bucket_mb * 2**20 + max(sizes) < sum(sizes)
        # with patches, in bf16 on the wire: a worker holding v1 reaches v2 by a patch, bit for bit
        store = WeightsConfig(bucket_mb=bucket_mb)
        v1 = trainers.publish(1, store, "bfloat16")
        worker = HostCopy()
        worker.pull(v1, v1.fingerprint, timeout_s=patience(30))
        trainers.train_step(copy.deepcopy(groups), len(groups))
        v2 = trainers.publish(2, store, "bfloat16")
        reached = worker.pull(v2, v2.fingerprint, timeout_s=patience(30))
        assert reached.result.mode == "patch" and reached.changed
        full = pull(v2, v2.fingerprint, timeout_s=patience(30))
        assert all(torch.equal(reached.weights[n].view(torch.int16), full[n].view(torch.int16)) for n in full)
    finally:
        trainers.close()


def test_sharded_checkpoints_resume_at_the_same_and_at_another_world_size(cluster, tmp_path):
    """A checkpoint after one step, then the second step: resumed at world 2 it gives the uninterrupted
    run's metrics; the same checkpoint resumes at world 1 (2 -> 1), and a world-1 checkpoint at world 2
    (1 -> 2), each to the metrics of the run that never stopped. The hf/ folder loads with transformers."""
    first, second = make_groups(num_groups=4, n=3, seed=21), make_groups(num_groups=4, n=3, seed=22)
    cfg = dict(micro_batch_groups=2, mini_batch_groups=2, lr_warmup_steps=2, lr_schedule="cosine", **MOVING)
    kwargs = trainer_kwargs() | {"total_optimizer_steps": 8}

    def world1() -> Trainer:
        return Trainer(load_model(POLICY).model, TrainerConfig(share_prompt=False, **cfg), **kwargs)

    def world2() -> TrainerGroup:
        return TrainerGroup(TrainerConfig(world_size=2, **cfg), POLICY, cluster=cluster, **kwargs)

    def close_to(got: dict, want: dict, rel: float) -> None:
        assert got.keys() == want.keys()
        for key in want:
            assert got[key] == pytest.approx(want[key], rel=rel, abs=1e-7), key

    trainers = world2()
    try:
        trainers.train_step(copy.deepcopy(first), 4)
        saved2 = save_checkpoint(tmp_path / "two", 1, trainers, None, {})
        want2 = trainers.train_step(copy.deepcopy(second), 4)
    finally:
        trainers.close()
    one = world1()
    one.train_step(copy.deepcopy(first), 4)
    saved1 = save_checkpoint(tmp_path / "one", 1, one, None, {})
    want1 = one.train_step(copy.deepcopy(second), 4)
    close_to(want2, want1, rel=1e-4)  # the two uninterrupted runs agree to float rounding
    assert want1["actor/lr"] != cfg["lr"]  # mid warm-up / cosine: the scheduler's state matters

    exported = AutoModelForCausalLM.from_pretrained(saved2 / "hf")  # a normal from_pretrained folder
    after_first = world1()
    load_checkpoint(saved1, after_first)
    for name, p in after_first.model.named_parameters():
        torch.testing.assert_close(exported.get_parameter(name), p.detach(), rtol=1e-5, atol=1e-7)

    resumed = world2()  # 2 -> 2
    try:
        load_checkpoint(saved2, resumed)
        close_to(resumed.train_step(copy.deepcopy(second), 4), want2, rel=1e-5)
    finally:
        resumed.close()
    back = world1()  # 2 -> 1
    load_checkpoint(saved2, back)
    close_to(back.train_step(copy.deepcopy(second), 4), want2, rel=1e-4)
    up = world2()  # 1 -> 2
    try:
        load_checkpoint(saved1, up)
        close_to(up.train_step(copy.deepcopy(second), 4), want1, rel=1e-4)
    finally:
        up.close()


def test_the_ranks_listen_on_loopback_only_in_a_local_run(cluster):
    """A local run's Ray advertises 127.0.0.1: rank 0's rendezvous store (torch's TCPStore listens on
    every interface unless handed a bound socket), the gloo pairs and Ray's own servers in the rank
    processes all listen on 127.0.0.1, also once a step has run its collectives."""
    trainers = TrainerGroup(TrainerConfig(world_size=2, **STILL), POLICY, cluster=cluster, **trainer_kwargs())
    try:
        trainers.train_step(make_groups(num_groups=2, n=2, seed=3), 2)
        by_rank = [listening_addresses(info["pid"]) for info in trainers.info]
        assert all(by_rank), by_rank
        assert {ip.removeprefix("::ffff:") for entries in by_rank for ip, _, _ in entries} == {"127.0.0.1"}, by_rank
    finally:
        trainers.close()


def test_a_rank_killed_mid_step_fails_the_step_naming_rank_and_step(cluster, monkeypatch):
    """Rank 1 is SIGKILLed as the driver is about to dispatch the first micro-batch pass of step 2, which
    rank 0 then runs, meeting the dead rank in a collective: the step fails at once with an error naming
    rank 1 and step 2, the ranks are torn down, and the group refuses further work."""
    groups = make_groups(num_groups=4, n=3, seed=31)
    killer = kill_rank_before_pass(monkeypatch, rank=1, before_pass=3)
    trainers = TrainerGroup(TrainerConfig(world_size=2, **MOVING), POLICY, cluster=cluster, **trainer_kwargs())
    try:
        trainers.train_step(copy.deepcopy(groups), 4, step=1)
        assert killer.passes == {id(trainers): 2} and not killer.killed  # 4 groups, 2 ranks, 1 group a pass
        pids = [info["pid"] for info in trainers.info]
        started = time.monotonic()
        with pytest.raises(TrainerRankError, match=r"trainer rank 1 of 2 died at step 2 \(training\)"):
            trainers.train_step(copy.deepcopy(groups), 4, step=2)
        assert killer.killed == [pids[1]]
        assert time.monotonic() - started < patience(30)  # bounded: no waiting out a collective timeout
        deadline = time.monotonic() + patience(30)
        while any(alive(pid) for pid in pids):  # rank 0, stuck in the collective, was ended too
            assert time.monotonic() < deadline, [pid for pid in pids if alive(pid)]
            time.sleep(0.1)
        with pytest.raises(TrainerRankError, match="torn down: trainer rank 1 of 2 died at step 2"):
            trainers.train_step(copy.deepcopy(groups), 4, step=3)
    finally:
        trainers.close()


def test_a_frozen_rank_fails_the_step_naming_it(cluster):
    """Rank 1 is frozen (SIGSTOP) between steps: it never answers again, and rank 0 waits for it in its
    first collective. The driver does not wait forever: once no call has answered for
    trainer.call_timeout_s, the step fails naming the ranks that owe an answer, and they are ended."""
    groups = make_groups(num_groups=4, n=3, seed=31)
    trainers = TrainerGroup(TrainerConfig(world_size=2, **MOVING), POLICY, cluster=cluster, **trainer_kwargs())
    pids = [info["pid"] for info in trainers.info]
    try:
        trainers.train_step(copy.deepcopy(groups), 4, step=1)
        trainers.config.call_timeout_s = 5.0  # read by the driver at each wait; the frozen rank answers never
        os.kill(pids[1], signal.SIGSTOP)
        with pytest.raises(TrainerRankError, match=r"trainer ranks? (0, )?1 of 2 answered nothing for 5 s at step 2 "
                                                   r"\(training\): hung or stopped \(trainer.call_timeout_s\)"):
            trainers.train_step(copy.deepcopy(groups), 4, step=2)
        deadline = time.monotonic() + patience(30)
        while any(alive(pid) for pid in pids):  # both ended, the frozen one included
            assert time.monotonic() < deadline, [pid for pid in pids if alive(pid)]
            time.sleep(0.1)
    finally:
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGCONT)
        trainers.close()


def test_the_wait_on_ranks_is_limited_by_config():
    assert TrainerConfig().call_timeout_s == 1800.0
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=f"trainer.call_timeout_s must be a number of seconds > 0, got {bad}"):
            TrainerConfig(call_timeout_s=bad).validate()


def test_an_hsdp_mesh_gives_the_world_1_gradient_too(cluster):
    """trainer.shard_size=1 at world 2: a (replicate=2, shard=1) mesh, each rank a whole replica whose
    gradients FSDP2 all-reduces across replicas; the update is still world 1's."""
    groups = make_groups(num_groups=5, n=3, seed=51)
    want = world1_grads(groups, 0.0, micro_batch_groups=1, mini_batch_groups=2)
    trainers = TrainerGroup(TrainerConfig(world_size=2, shard_size=1, micro_batch_groups=1, mini_batch_groups=2,
                                          **STILL), POLICY, cluster=cluster, **trainer_kwargs())
    try:
        trainers.capture_grads()
        trainers.train_step(copy.deepcopy(groups), len(groups))
        got = trainers.take_captured()
        assert len(got) == len(want) == 3
        for g, w in zip(got, want):
            assert max_rel_diff(g, w) <= 1e-5
        per_rank = trainers.state_bytes()
    finally:
        trainers.close()
    params = list(load_model(POLICY).model.parameters())
    assert per_rank == [16 * sum(p.numel() for p in params) + 4 * len(params)] * 2  # replicas: nothing sharded
