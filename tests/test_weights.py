"""The weight store (invariant 5): a pulled version is bitwise the published one, and a corrupted,
torn, foreign or late version is an error before anything could be loaded."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import ray
import torch

from hybrid_util import patience
from rlboost.cluster import weights as ws
from rlboost.models import tiny_model


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    # address="local": a Ray of its own, never the one another run on this machine recorded in
    # /tmp/ray/ray_current_cluster (ray.init() without an address joins that one)
    ray.init(address="local", num_cpus=1, include_dashboard=False, logging_level="ERROR")
    yield
    ray.shutdown()


def params(family="qwen2", seed=0, dtype=torch.float32):
    return {n: p.detach() for n, p in tiny_model(family, seed=seed, dtype=dtype).named_parameters()}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pull_returns_the_published_tensors_bitwise(dtype):
    state = params(dtype=dtype)
    manifest = ws.publish(state, version=3, bucket_mb=0.02)  # ~20 KB buckets: several of them
    assert len(manifest.buckets) > 3
    assert manifest.nbytes == sum(t.numel() * t.element_size() for t in state.values())
    pulled = ws.pull(manifest, ws.fingerprint(state), timeout_s=patience(5))
    assert set(pulled) == set(state)
    for name, t in state.items():
        assert pulled[name].dtype == t.dtype and pulled[name].shape == t.shape
        assert torch.equal(pulled[name].view(torch.uint8), t.contiguous().view(torch.uint8)), name


def test_the_version_checksum_tells_versions_apart():
    a, b = params(seed=0), params(seed=1)
    assert ws.fingerprint(a) == ws.fingerprint(b)  # same architecture...
    assert ws.publish(a, 1).checksum != ws.publish(b, 1).checksum  # ...other weights
    assert ws.publish(a, 1).checksum == ws.publish(a, 2).checksum


def tamper(manifest, bucket: int, flat: np.ndarray):
    buckets = list(manifest.buckets)
    buckets[bucket] = dataclasses.replace(buckets[bucket], ref=ray.put(flat))
    return dataclasses.replace(manifest, buckets=buckets)


def test_a_corrupted_bucket_fails_its_checksum():
    state = params()
    manifest = ws.publish(state, 1, bucket_mb=0.02)
    flat = ray.get(manifest.buckets[2].ref).copy()
    flat[len(flat) // 2] ^= 0x10  # one flipped bit
    with pytest.raises(ws.WeightError, match="checksum"):
        ws.pull(tamper(manifest, 2, flat), ws.fingerprint(state), timeout_s=patience(5))


def test_a_torn_bucket_fails_its_checksum():
    state = params()
    manifest = ws.publish(state, 1, bucket_mb=0.02)
    torn = ray.get(manifest.buckets[1].ref)[:-8].copy()
    with pytest.raises(ws.WeightError, match="checksum"):
        ws.pull(tamper(manifest, 1, torn), ws.fingerprint(state), timeout_s=patience(5))


def test_weights_of_another_architecture_are_refused():
    manifest = ws.publish(params("llama"), 1)
    with pytest.raises(ws.WeightError, match="is for model .* serves model"):
        ws.pull(manifest, ws.fingerprint(params("qwen2")), timeout_s=patience(5))


def test_a_pull_that_cannot_complete_times_out():
    @ray.remote
    def never():
        import time
        time.sleep(60)

    state = params()
    manifest = ws.publish(state, 1, bucket_mb=0.02)
    stuck = dataclasses.replace(manifest, buckets=[dataclasses.replace(manifest.buckets[0], ref=never.remote())]
                                + manifest.buckets[1:])
    with pytest.raises(ws.WeightError, match="timed out"):
        ws.pull(stuck, ws.fingerprint(state), timeout_s=0.5)


def test_a_pull_fetches_what_arrives_within_half_of_rays_pull_timeout_at_once():
    """Ray asks again for an object not there after its pull timeout, and the sender then sends all of
    it again: a group of buckets must arrive well within it (tests/in_room/room_weight_pull.py)."""
    mib, sizes = 2**20, [64 * 2**20] * 4 + [2**20]
    assert ws.window_bytes(0, 0.0, 10.0) == 0.0  # nothing measured yet: one bucket
    assert ws.next_group(sizes, 0, 0.0) == 1
    at_100mbit = ws.window_bytes(64 * mib, 64 * mib * 8 / 1e8, 10.0)  # 62.5 MB: under a bucket
    assert at_100mbit == pytest.approx(1e8 / 8 * 5) and ws.next_group(sizes, 1, at_100mbit) == 2
    at_1gbit = ws.window_bytes(64 * mib, 64 * mib * 8 / 1e9, 10.0)  # 625 MB: the rest at once
    assert ws.next_group(sizes, 1, at_1gbit) == len(sizes)
    assert ws.next_group(sizes, 3, 65 * mib) == 5  # a small last bucket joins the one before
    assert ws.next_group(sizes, 4, 10 * 64 * mib) == 5


def test_config_errors_name_the_field():
    for field, value in (("bucket_mb", 0), ("pull_timeout_s", -1), ("pull_retries", -1)):
        with pytest.raises(ValueError, match=f"cluster.weights.{field}"):
            ws.WeightsConfig(**{field: value}).validate()
