"""Lossless weight patches (issue 25): a version reached by a patch, from the version before or from the
run's base, is bit for bit the version a full pull gives, on every bucket layout; a worker further
behind, a torn or corrupted patch, or another base falls back to a full pull and never serves other
bytes; patches that would not pay are not offered."""

from __future__ import annotations

import dataclasses
import zlib

import numpy as np
import pytest
import ray
import torch

from hybrid_util import patience
from rlboost.cluster import patches
from rlboost.cluster import weights as ws
from rlboost.cluster.config import WeightsConfig
from rlboost.cluster.host_copy import HostCopy, base_reader
from rlboost.cluster.publisher import Publisher
from rlboost.models import ModelConfig, tiny_model


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    ray.init(address="local", num_cpus=1, include_dashboard=False, logging_level="ERROR")
    yield
    ray.shutdown()


# ---- the encoding ---------------------------------------------------------------------------------

@pytest.mark.parametrize("itemsize", [1, 2, 4, 8])
@pytest.mark.parametrize("share", [0.0, 1e-4, 0.005, 0.05, 0.6, 1.0])
def test_a_patch_turns_old_into_new_bit_for_bit(itemsize, share):
    rng = np.random.default_rng(int(share * 1e4) + itemsize)
    old = rng.integers(0, 256, 40_000 * itemsize, dtype=np.uint8)
    new = old.copy().view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[itemsize])
    where = np.sort(rng.choice(new.size, int(share * new.size), replace=False))
    new[where] ^= rng.integers(1, 2**(8 * min(itemsize, 4)) - 1, where.size, dtype=np.uint64).astype(new.dtype)
    new = new.view(np.uint8)
    patch = patches.encode(old, new, itemsize)
    buf = old.copy()
    changed = patches.apply(buf, patch)
    assert np.array_equal(buf, new)
    assert np.array_equal(changed, where)
    assert patches.changed_share(old, new, itemsize) == pytest.approx(where.size / (old.size // itemsize))
    if share <= 0.005:  # sparse changes: the patch is a small fraction of the bucket
        assert len(patch) < max(0.02 * old.nbytes, 200)


def test_both_position_encodings_are_used():
    old = np.zeros(100_000, dtype=np.uint8)
    sparse, dense = old.copy(), old.copy()
    sparse[::1000] = 1
    dense[::10] = 1
    assert patches.encode(old, sparse, 1)[6] == 0 and patches.encode(old, dense, 1)[6] == 1  # gaps, bitmap


def test_a_malformed_patch_is_refused_by_name():
    old = np.arange(4000, dtype=np.uint8)
    new = old.copy()
    new[::7] += 1
    patch = patches.encode(old, new, 1)
    for bad, why in ((b"junk", "shorter than its header"), (b"XXXXX" + patch[5:], "bad header"),
                     (patch[:-5], "torn"), (patch[:40] + bytes([patch[40] ^ 0xFF]) + patch[41:], "torn|outside")):
        with pytest.raises(patches.PatchError, match=why):
            patches.apply(old.copy(), bad)
    with pytest.raises(patches.PatchError, match="does not fit"):
        patches.apply(np.zeros(10, dtype=np.uint8), patch)


# ---- versions through the store -------------------------------------------------------------------

def params(seed=0, family="qwen2"):
    return {n: p.detach().clone() for n, p in tiny_model(family, seed=seed).named_parameters()}


def step(state: dict, lr: float, seed: int) -> dict:
    """An Adam-like update: every element moves by about lr (sign of a random gradient)."""
    g = torch.Generator().manual_seed(seed)
    return {n: t - lr * torch.sign(torch.randn(t.shape, generator=g)) for n, t in state.items()}


def full_bytes(m) -> list[np.ndarray]:
    return ws.pull(m, m.fingerprint, timeout_s=patience(15)).arrays


def assert_bit_identical(reached, m):
    assert [zlib.crc32(a) for a in reached.weights.arrays] == [b.crc32 for b in m.buckets]
    for a, b in zip(reached.weights.arrays, full_bytes(m)):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("bucket_mb", [64.0, 0.02, 0.001])  # one bucket; several; every tensor over the limit
def test_a_worker_reaches_every_version_by_patch_bit_for_bit(bucket_mb):
    publisher = Publisher(WeightsConfig(bucket_mb=bucket_mb), "bfloat16")
    worker, state = HostCopy(), params()
    modes, before = [], state
    for v in range(4):
        m = publisher.publish(list(state.items()), v).manifest
        assert all(s.dtype == "torch.bfloat16" for b in m.buckets for s in b.tensors)  # the wire dtype
        reached = worker.pull(m, m.fingerprint, timeout_s=patience(15))
        assert_bit_identical(reached, m)
        modes.append(reached.result.mode)
        if v:
            assert 0 < reached.result.nbytes == publisher.stats.patch_bytes < 0.5 * m.nbytes
            # exactly the tensors whose bf16 bits moved are named for the engine to reload
            prev = {n: t.to(torch.bfloat16) for n, t in before.items()}
            moved = {n for n, t in state.items() if not torch.equal(t.to(torch.bfloat16).view(torch.int16),
                                                                      prev[n].view(torch.int16))}
            assert reached.changed == moved and moved
        before = state
        state = step(state, 1e-5, seed=v)
    assert modes == ["full", "patch", "patch", "patch"]


def test_a_worker_two_versions_behind_pulls_in_full():
    publisher = Publisher(WeightsConfig(bucket_mb=0.02), "bfloat16")
    worker, state, ms = HostCopy(), params(), []
    for v in range(4):
        ms.append(publisher.publish(list(state.items()), v).manifest)
        if v == 1:
            worker.pull(ms[1], ms[1].fingerprint, 30)
        state = step(state, 1e-5, v)
    m1, m3 = ms[1], ms[3]
    assert m3.patch_from(2, ms[2].checksum) is not None and m3.patch_from(1, m1.checksum) is None
    reached = worker.pull(m3, m3.fingerprint, 30)
    assert reached.result.mode == "full" and reached.changed is None
    assert_bit_identical(reached, m3)
    # a worker still at the base (two versions behind too) takes the patch from the base
    at_base = HostCopy()
    at_base.pull(ms[0], ms[0].fingerprint, 30)
    reached = at_base.pull(m3, m3.fingerprint, 30)
    assert reached.result.mode == "patch" and reached.result.nbytes == m3.patch_from_base().nbytes
    assert_bit_identical(reached, m3)


def test_a_corrupted_patch_falls_back_to_a_full_pull():
    publisher = Publisher(WeightsConfig(bucket_mb=0.02), "bfloat16")
    worker, state = HostCopy(), params()
    m0 = publisher.publish(list(state.items()), 0).manifest
    worker.pull(m0, m0.fingerprint, 30)
    m1 = publisher.publish(list(step(state, 1e-5, 1).items()), 1).manifest
    patch = m1.patch_from(0, m0.checksum)
    # a well-formed patch whose values are wrong: decodes fine, only the bucket's checksum can tell
    i = max(range(len(patch.parts)), key=lambda k: patch.sizes[k])
    other = patches.encode(full_bytes(m0)[i], _flip_one(full_bytes(m1)[i]), m1.buckets[i].itemsize)
    parts = list(patch.parts)
    parts[i] = ray.put(np.frombuffer(other, dtype=np.uint8))
    m1.patches = [dataclasses.replace(patch, parts=parts)]
    reached = worker.pull(m1, m1.fingerprint, 30)
    assert reached.result.mode == "full" and "checksum" in reached.result.note
    assert_bit_identical(reached, m1)


def _flip_one(flat: np.ndarray) -> np.ndarray:
    out = flat.copy()
    out[len(out) // 2] ^= 0x01
    return out


def test_a_joiner_reaches_the_version_from_its_base():
    publisher = Publisher(WeightsConfig(bucket_mb=0.02), "bfloat16")
    base = params()
    state = base
    for v in range(3):
        m = publisher.publish(list(state.items()), v).manifest
        state = step(state, 1e-5, v)
    assert m.from_base and m.patch_from_base().from_checksum != m.checksum
    joiner = HostCopy(load_base=lambda: base)
    reached = joiner.pull(m, m.fingerprint, 30)
    assert reached.result.mode == "from_base" and reached.changed is None
    assert reached.result.nbytes == publisher.stats.from_base_bytes < 0.5 * m.nbytes
    assert_bit_identical(reached, m)
    # at the base itself nothing travels
    fresh = Publisher(WeightsConfig(bucket_mb=0.02), "bfloat16")
    m0 = fresh.publish(list(base.items()), 0).manifest
    at_base = HostCopy(load_base=lambda: base).pull(m0, m0.fingerprint, 30)
    assert at_base.result.mode == "from_base" and at_base.result.nbytes == 0
    assert_bit_identical(at_base, m0)


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_a_base_read_in_the_serving_dtype_is_the_runs_base(family):
    # a worker reads its base in the dtype it serves (nothing cast twice, half the bytes to build): the
    # bytes must be those of the trainer's fp32 model cast at publish, or every join pulls in full
    model = ModelConfig(path=f"tiny:{family}")
    m = Publisher(WeightsConfig(bucket_mb=0.02), "bfloat16").publish(
        list(base_reader(model)().items()), 0).manifest
    reached = HostCopy(base_reader(dataclasses.replace(model, dtype="bfloat16"))).pull(m, m.fingerprint, 30)
    assert reached.result.mode == "from_base" and reached.result.nbytes == 0, reached.result.note


def test_a_resumed_run_offers_its_joiners_a_patch_from_the_model_on_their_disk():
    # a run resumed at step 3 publishes its checkpoint's weights first: its base is still the model
    base = params()
    state = base
    for v in range(3):
        state = step(state, 1e-5, v)
    reads = []
    resumed = Publisher(WeightsConfig(bucket_mb=0.02), "bfloat16", load_base=lambda: reads.append(1) or base)
    m3 = resumed.publish(list(state.items()), 3).manifest
    m4 = resumed.publish(list(step(state, 1e-5, 3).items()), 4).manifest
    assert len(reads) == 1  # read once, when the run's first version is not the base
    for m in (m3, m4):
        reached = HostCopy(load_base=lambda: base).pull(m, m.fingerprint, 30)
        assert reached.result.mode == "from_base" and 0 < reached.result.nbytes < 0.5 * m.nbytes
        assert_bit_identical(reached, m)
    # without a reader the run's first version is its base, which no instance's disk holds: full pulls
    plain = Publisher(WeightsConfig(bucket_mb=0.02), "bfloat16")
    plain.publish(list(state.items()), 3)
    m4 = plain.publish(list(step(state, 1e-5, 3).items()), 4).manifest
    reached = HostCopy(load_base=lambda: base).pull(m4, m4.fingerprint, 30)
    assert reached.result.mode == "full" and "is not the run's base" in reached.result.note
    assert_bit_identical(reached, m4)


def test_a_joiner_whose_base_is_not_the_runs_is_never_served_from_it():
    publisher = Publisher(WeightsConfig(bucket_mb=0.02), "bfloat16")
    state = params(seed=0)
    for v in range(2):
        m = publisher.publish(list(state.items()), v).manifest
        state = step(state, 1e-5, v)
    joiner = HostCopy(load_base=lambda: params(seed=1))  # the same architecture, other weights on its disk
    reached = joiner.pull(m, m.fingerprint, 30)
    assert reached.result.mode == "full" and "is not the run's base" in reached.result.note
    assert_bit_identical(reached, m)
    unreadable = HostCopy(load_base=lambda: (_ for _ in ()).throw(OSError("no such file: /models/x")))
    reached = unreadable.pull(m, m.fingerprint, 30)
    assert reached.result.mode == "full" and "could not be read: no such file" in reached.result.note


def test_patches_that_would_not_pay_are_not_offered():
    # fp32 on the wire: every element moves, and its patch is larger than the 5% allowed
    publisher = Publisher(WeightsConfig(bucket_mb=0.02, max_patch_share=0.05), None)
    worker, state = HostCopy(), params()
    m0 = publisher.publish(list(state.items()), 0).manifest
    worker.pull(m0, m0.fingerprint, 30)
    m1 = publisher.publish(list(step(state, 1e-5, 1).items()), 1).manifest
    assert m1.patches == [] and not m1.patching and not m1.from_base
    assert publisher.stats.changed_share > 0.99 and publisher.stats.patch_bytes > 0.05 * m1.nbytes
    reached = worker.pull(m1, m1.fingerprint, 30)
    assert reached.result.mode == "full" and worker.arrays is None  # and it keeps no copy it cannot use
    assert_bit_identical(reached, m1)


def test_without_patches_nothing_is_kept():
    publisher = Publisher(WeightsConfig(bucket_mb=0.02, patches=False), "bfloat16")
    state = params()
    publisher.publish(list(state.items()), 0)
    m1 = publisher.publish(list(step(state, 1e-5, 1).items()), 1).manifest
    assert m1.patches == [] and not m1.patching and publisher._prev is None


def test_a_published_version_does_not_change_when_the_trainer_updates_its_tensors_in_place():
    publisher = Publisher(WeightsConfig(bucket_mb=64.0), None)
    state = params()
    m0 = publisher.publish(list(state.items()), 0).manifest
    with torch.no_grad():
        for t in state.values():
            t.add_(1.0)
    m1 = publisher.publish(list(state.items()), 1).manifest
    assert m1.checksum != m0.checksum and publisher.stats.changed_share == 1.0
