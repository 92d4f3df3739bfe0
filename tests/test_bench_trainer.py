"""`rlboost bench trainer`: memory, time and gradient per world size, each world size on a Ray of its
own (the bench's own `Cluster`, so it runs in a process that holds no Ray)."""

from __future__ import annotations

import json

import pytest

from rlboost.cli import main
from rlboost.models import load_model

from test_trainer_sharded import POLICY

pytestmark = pytest.mark.e2e  # trainer ranks at several world sizes: `make test-e2e`


def test_bench_trainer_writes_memory_time_and_gradient_per_world_size(tmp_path):
    out = tmp_path / "bench.json"
    assert main(["bench", "trainer", "--world-sizes", "1,2", "--model", "tiny:qwen2", "--steps", "1",
                 "--json", str(out)]) == 0
    results = json.loads(out.read_text())["results"]
    assert [r["world_size"] for r in results] == [1, 2]
    for r in results:
        assert set(r) == {"world_size", "param_grad_optim_bytes_per_rank", "step_s", "grad_max_rel_diff_vs_world1"}
        assert r["step_s"] > 0 and r["grad_max_rel_diff_vs_world1"] <= 1e-5
    one, two = (r["param_grad_optim_bytes_per_rank"] for r in results)
    params = list(load_model(POLICY).model.parameters())
    # fp32 weights, gradients and AdamW's two moments, plus its 4-byte step counter per tensor
    assert one == 16 * sum(p.numel() for p in params) + 4 * len(params)
    assert two <= 0.55 * one
