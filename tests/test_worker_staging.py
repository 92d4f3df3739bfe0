"""A rollout worker swaps a new version in between tokens (bounded staleness, docs/staleness.md): a pull
with `stage` on a busy engine keeps the verified version staged while the engine goes on generating
on the one it serves; the staged version swaps in once the engine is idle (after an abort that empties
it, or before a submit to an idle engine); every token carries the version that made it; two
versions staged in a row end bit for bit at the newer one (no torn weights: the parameters changed by
either patch are reloaded). In-process workers, weights through a local Ray's object store."""

from __future__ import annotations

import pytest
import ray
import torch

from rlboost.cluster.config import WeightsConfig
from rlboost.cluster.publisher import Publisher
from rlboost.engine import EngineConfig, SamplingParams
from rlboost.hybrid.worker import RolloutWorker, WorkerSpec
from rlboost.models import ModelConfig

PROMPT = [5, 6, 7, 8]
GREEDY = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    ray.init(address="local", num_cpus=1, include_dashboard=False, logging_level="ERROR")
    yield
    ray.shutdown()


@pytest.fixture
def setup():
    """A worker at version 0, a publisher in its serving dtype (patches on), and version 0's state."""
    spec = WorkerSpec(ModelConfig(path="tiny:qwen2"), EngineConfig(device="cpu", max_num_seqs=4, stream_interval=4),
                      eos_token_ids=[], heartbeat_interval_s=60.0)
    worker = RolloutWorker(spec)
    publisher = Publisher(WeightsConfig(bucket_mb=0.02), spec.engine.serving_dtype(spec.model.dtype))
    state = {n: p.detach().clone() for n, p in worker.engine.model.named_parameters()}
    worker.pull(publisher.publish(list(state.items()), 0).manifest, 30)
    return worker, publisher, state


def moved(state: dict, seed: int, share: float = 0.3) -> dict:
    """A new version where about `share` of the tensors changed (the others bit for bit the same)."""
    g = torch.Generator().manual_seed(seed)
    return {n: t + 0.05 * torch.randn(t.shape, generator=g) if torch.rand((), generator=g) < share else t.clone()
            for n, t in state.items()}


def steps(worker: RolloutWorker, n: int) -> list:
    chunks = []
    for _ in range(n):
        chunks += worker.engine.step()
    return chunks


def test_a_busy_worker_stages_a_version_and_swaps_it_in_between_tokens(setup):
    worker, publisher, state = setup
    worker.submit([("a#1", PROMPT, GREEDY, len(PROMPT))])
    before = steps(worker, 6)
    s1 = moved(state, 1)
    result = worker.pull(publisher.publish(list(s1.items()), 1).manifest, 30, stage=True)
    assert result.version == 1 and worker.staged.version == 1 and worker.engine.weight_version == 0
    during = steps(worker, 6)  # still version 0: a request's tokens never change weights under it
    assert {c.weight_version for c in before + during} == {0}
    partials = worker.abort(["a#1"], then_load=1)
    assert worker.engine.weight_version == 1 and worker.staged is None
    held = list(partials["a#1"].token_ids)
    assert held and partials["a#1"].weight_version == 0
    worker.submit([("a#2", PROMPT + held, GREEDY, len(PROMPT))])
    after = steps(worker, 4)
    assert after and {c.weight_version for c in after} == {1}


def test_two_versions_staged_in_a_row_end_bit_for_bit_at_the_newer(setup):
    worker, publisher, state = setup
    worker.submit([("a#1", PROMPT, GREEDY, len(PROMPT))])
    steps(worker, 3)
    s1 = moved(state, 1)
    s2 = moved(s1, 2)  # changes other tensors than 1 did: loading only 1 -> 2's would leave 0 -> 1's
    worker.pull(publisher.publish(list(s1.items()), 1).manifest, 30, stage=True)
    worker.pull(publisher.publish(list(s2.items()), 2).manifest, 30, stage=True)
    assert worker.staged.version == 2 and worker.engine.weight_version == 0
    worker.abort(["a#1"])
    assert worker.engine.weight_version == 2
    for name, p in worker.engine.model.named_parameters():
        assert torch.equal(p.detach(), s2[name].to(p.dtype)), name


def test_an_idle_worker_swaps_a_staged_version_in_before_new_work(setup):
    worker, publisher, state = setup
    worker.submit([("a#1", PROMPT, GREEDY, len(PROMPT))])
    steps(worker, 2)
    worker.pull(publisher.publish(list(moved(state, 3).items()), 1).manifest, 30, stage=True)
    while worker.engine.has_unfinished():  # the request runs to its end on version 0
        assert {c.weight_version for c in worker.engine.step()} <= {0}
    assert worker.staged is not None
    worker.submit([("b#1", PROMPT, GREEDY, len(PROMPT))])
    assert worker.engine.weight_version == 1 and {c.weight_version for c in steps(worker, 6)} == {1}


def test_without_stage_a_busy_worker_refuses_the_version_and_keeps_its_own(setup):
    worker, publisher, state = setup
    worker.submit([("a#1", PROMPT, GREEDY, len(PROMPT))])
    steps(worker, 2)
    with pytest.raises(Exception, match="load_weights"):
        worker.pull(publisher.publish(list(moved(state, 4).items()), 1).manifest, 30)
    assert worker.engine.weight_version == 0 and worker.staged is None
