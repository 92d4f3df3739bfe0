"""`rlboost bench weights --patches` on a tiny model: its rows carry the fields the issue names, every
version reached by patch and from the base is bit-identical, and a part that cannot run is reported
instead of losing the rows measured before it."""

from __future__ import annotations

from rlboost.bench.weights import WeightsBenchConfig, bench_weights, render


def test_the_patch_rows_are_complete_and_bit_identical():
    cfg = WeightsBenchConfig(patches=True, patch_models=["tiny:qwen3"], lrs=[2e-5], steps=2, max_tokens=8,
                             prompts_per_step=2, links=[], fanout=[])
    result = bench_weights(cfg)
    rows = result["results"]
    assert {(r["dtype"], r["step"]) for r in rows} == {(d, s) for d in ("bfloat16", "float32") for s in (1, 2)}
    for r in rows:
        assert {"dtype", "lr", "step", "full_bytes", "patch_bytes", "from_base_bytes", "bit_identical"} <= set(r)
        # what moved the weights is reported beside what the move cost
        assert 0 <= r["groups_with_signal"] <= 1 and r["grad_norm"] >= 0 and r["reward_mean"] >= 0
        assert r["bit_identical"] and r["patch_mode"] == "patch" and r["joiner_mode"] == "from_base"
        assert r["full_bytes"] == (2 if r["dtype"] == "bfloat16" else 4) * rows[0]["full_bytes"] // 2
    assert result["errors"] == [] and render(result)
