"""The weight-transport seam (issue 46 item 2): the routes a worker's copy may take to a version are ordered
by one pure rule; every route of a pull shares the pull's one limit, so a pull ends by it, with the weights
or with one line; a patch part that cannot be fetched hands over to the next route; parts spilled from a
full object store are brought back; and the store keeps no version for a worker that has moved on from it
(tests/test_weight_patches.py checks each route's bytes bit for bit)."""

from __future__ import annotations

import ast
import dataclasses
import gc
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
import ray
import torch

import rlboost
from hybrid_util import patience
from rlboost.cluster.config import WeightsConfig
from rlboost.cluster.host_copy import HostCopy
from rlboost.cluster.publisher import Publisher
from rlboost.cluster.weights import PullTimeout, WeightError
from rlboost.policies.weight_routes import Offer, routes

MB = 2**20
STORE_MB = 100
"""The test Ray's object store: small enough that a few versions fill it."""


@pytest.fixture(scope="module", autouse=True)
def small_store_ray():
    ray.init(address="local", num_cpus=1, include_dashboard=False, logging_level="ERROR",
             object_store_memory=STORE_MB * MB)
    yield
    ray.shutdown()


def model(seed: int = 0) -> dict:
    """40 MB of fp32 weights (20 MB on the wire in bf16), in 4 MB buckets."""
    g = torch.Generator().manual_seed(seed)
    return {f"w{i}": torch.randn(MB, generator=g) for i in range(10)}


def moved(state: dict, seed: int) -> dict:
    g = torch.Generator().manual_seed(1000 + seed)
    return {n: t + 1e-3 * torch.randn(t.shape, generator=g) for n, t in state.items()}


def versions(count: int, **weights) -> tuple[Publisher, list]:
    publisher, state, out = Publisher(WeightsConfig(bucket_mb=4, **weights), "bfloat16"), model(), []
    for v in range(count):
        out.append(publisher.publish(list(state.items()), v).manifest)
        state = moved(state, v)
    return publisher, out


@ray.remote(num_cpus=0)  # never takes the CPU a later task needs
def never():
    time.sleep(3600)


@ray.remote(num_cpus=0)
def fails():
    raise OSError("the node holding it is gone")


# ---- the rule -------------------------------------------------------------------------------------

def test_routes_go_by_the_fewest_bytes_then_by_the_least_local_work():
    full, patch, base = Offer("full", 100), Offer("patch", 30), Offer("from_base", 30)
    assert routes([full, patch]) == [patch, full]
    assert routes([full, base]) == [base, full]
    assert routes([full, base, patch]) == [patch, base, full]  # a tie: the patch needs no disk
    assert routes([Offer("from_base", 0), full]) == [Offer("from_base", 0), full]  # the base itself: nothing to fetch
    assert routes([Offer("peers", 100), full]) == [full, Offer("peers", 100)]  # a new kind: after the known ones on a tie
    assert routes([Offer("patch", 120), full]) == [full, Offer("patch", 120)]  # bytes decide, not the name


def test_a_worker_takes_the_route_the_rule_puts_first():
    _, ms = versions(3)
    worker = HostCopy()
    assert [worker.pull(m, m.fingerprint, patience(30)).result.mode for m in ms] == ["full", "patch", "patch"]
    joiner = HostCopy(load_base=model)
    reached = joiner.pull(ms[2], ms[2].fingerprint, patience(30))
    assert reached.result.mode == "from_base" and reached.result.nbytes == ms[2].patch_from_base().nbytes


# ---- one limit --------------------------------------------------------------------------------------

@pytest.fixture
def fetches(monkeypatch) -> list[float]:
    """The deadline of every fetch a pull makes (`weights.fetch`, as every transport reaches it), and each
    route a pull tries, in order ("route:<mode>")."""
    from rlboost.cluster import weights
    from rlboost.cluster.transports import TRANSPORTS, patch

    seen: list = []

    def recorded(refs, deadline, what, _fetch=weights.fetch):
        seen.append(deadline)
        return _fetch(refs, deadline, what)

    monkeypatch.setattr(weights, "fetch", recorded)
    monkeypatch.setattr(patch, "fetch", recorded)
    for mode, transport in TRANSPORTS.items():
        def reach(m, copy, deadline, _reach=transport.reach, _mode=mode):
            seen.append(f"route:{_mode}")
            return _reach(m, copy, deadline)
        monkeypatch.setattr(transport, "reach", reach)
    return seen


def test_a_pull_ends_by_its_limit_when_a_patch_never_arrives(fetches):
    """The patch's parts never come: the pull ends when its limit is spent, in one line naming the route,
    and does not start the full pull over with a limit of its own (which made its wait twice the limit):
    the patch was the only route tried, and its fetch had the pull's own deadline."""
    _, (m0, m1) = versions(2)
    worker = HostCopy()
    worker.pull(m0, m0.fingerprint, patience(30))
    patch = m1.patch_from(0, m0.checksum)
    m1.patches = [dataclasses.replace(patch, parts=[never.remote()] + patch.parts[1:])]
    limit = 2.0
    fetches.clear()
    t0 = time.monotonic()
    with pytest.raises(PullTimeout) as e:
        worker.pull(m1, m1.fingerprint, limit)
    t1 = time.monotonic()
    route, deadline = fetches
    assert route == "route:patch" and t0 + limit <= deadline <= t1 + limit  # the pull's one: its start + limit
    message = str(e.value)
    assert "\n" not in message and "timed out after 2s by patch" in message and "did not arrive" in message, message
    assert worker.held is None and worker.arrays is None  # nothing half-reached to build on
    reached = worker.pull(dataclasses.replace(m1, patches=[]), m1.fingerprint, patience(30))
    assert reached.result.mode == "full"  # the next pull starts afresh


def test_a_full_pull_that_cannot_finish_ends_by_its_limit_in_one_line(fetches):
    _, (m0,) = versions(1)
    m0.buckets = [dataclasses.replace(m0.buckets[0], ref=never.remote())] + m0.buckets[1:]
    t0 = time.monotonic()
    with pytest.raises(PullTimeout) as e:
        HostCopy().pull(m0, m0.fingerprint, 1.5)
    route, deadline = fetches  # the first bucket never came: nothing after it was asked for
    assert route == "route:full" and t0 + 1.5 <= deadline <= time.monotonic() + 1.5
    assert str(e.value) == "pull of version 0 timed out after 1.5s by full (0 of 5 buckets arrived)"


def test_a_patch_part_that_cannot_be_fetched_hands_over_to_the_full_pull():
    _, (m0, m1) = versions(2)
    worker = HostCopy()
    worker.pull(m0, m0.fingerprint, patience(30))
    patch = m1.patch_from(0, m0.checksum)
    m1.patches = [dataclasses.replace(patch, parts=patch.parts[:-1] + [fails.remote()])]
    reached = worker.pull(m1, m1.fingerprint, patience(30))
    assert reached.result.mode == "full" and reached.result.nbytes == m1.nbytes
    assert "the patch from v0 was not usable" in reached.result.note and "could not be fetched" in reached.result.note
    assert "\n" not in reached.result.note


# ---- the store --------------------------------------------------------------------------------------

def test_parts_spilled_from_a_full_store_are_brought_back_within_the_limit():
    _, (m0, m1) = versions(2)
    worker = HostCopy()
    worker.pull(m0, m0.fingerprint, patience(30))
    filler = [ray.put(np.ones(10 * MB, np.uint8)) for _ in range(STORE_MB // 10 + 2)]  # pushes v1 out to disk
    reached = worker.pull(m1, m1.fingerprint, patience(30))
    assert reached.result.mode == "patch"
    assert [b.crc32 for b in m1.buckets] == [zlib.crc32(a) for a in reached.weights.arrays]
    del filler


def test_the_store_keeps_of_a_version_only_what_its_workers_fetched():
    """A worker holds a record of the version it serves, not its manifest: once the fleet moves on (a new
    version published, the old manifest dropped), the old version's buckets and patches leave the store;
    only what the worker itself fetched stays (its node serves it to peers until its next pull). So a
    long run keeps the versions being pulled plus one fetch per worker, never every version a worker
    still serves in full."""
    _, (m0, m1) = versions(2)
    worker = HostCopy()
    worker.pull(m0, m0.fingerprint, patience(30))
    worker.pull(m1, m1.fingerprint, patience(30))  # by patch: it fetched only the parts from v0
    fetched = {r.hex() for r in m1.patch_from(0, m0.checksum).parts}
    rest = {b.ref.hex() for b in m1.buckets} | {r.hex() for p in m1.patches for r in p.parts} - fetched
    assert rest <= live()  # while the fleet offers v1
    del m0, m1  # the fleet moved on
    gc.collect()
    assert not rest & live(), f"{len(rest & live())} objects of v1 still in the store for a worker serving it"
    assert worker.held.version == 1 and worker.fetched  # what it fetched it keeps, for peers


def live() -> set[str]:
    """Object ids in this process's reference table."""
    return {k.decode() if isinstance(k, bytes) else k
            for k in ray._private.worker.global_worker.core_worker.get_all_reference_counts()}


def test_no_pull_waits_on_the_objects_it_fetches():
    """`ray.wait(fetch_local=True)` asks for each object on its own and pins none: with the store full,
    restored objects push each other out and it never ends (ray-project/ray#18415; a patch pull sat so for
    over 1,000 s). The weight path fetches with `ray.get` (one bundle, pinned as it lands) only."""
    root = Path(rlboost.__file__).parent / "cluster"
    for path in [root / "weights.py", root / "host_copy.py", *sorted((root / "transports").glob("*.py"))]:
        calls = [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call)
                 and isinstance(n.func, ast.Attribute) and n.func.attr == "wait"
                 and isinstance(n.func.value, ast.Name) and n.func.value.id == "ray"]
        assert not calls, f"{path.name} calls ray.wait on line {calls[0].lineno}"


def test_a_fetch_that_fails_is_a_weight_error_in_one_line():
    from rlboost.cluster.weights import fetch

    with pytest.raises(WeightError) as e:
        fetch([fails.remote()], time.monotonic() + patience(30), "the parts")
    assert not isinstance(e.value, PullTimeout) and str(e.value).startswith("the parts could not be fetched: ")
    assert "\n" not in str(e.value)
