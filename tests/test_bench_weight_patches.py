"""`rlboost bench weights --patches` on a tiny model: its rows carry the fields the issue names, every
version reached by patch and from the base is bit-identical, and a part that cannot run is reported
instead of losing the rows measured before it."""

from __future__ import annotations

import pytest

from rlboost.bench.weights import WeightsBenchConfig, bench_weights, render

pytestmark = pytest.mark.e2e  # a bench of weight patches over training steps: `make test-e2e`


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


def test_saved_versions_let_the_links_rerun_without_the_steps(tmp_path, monkeypatch):
    import torch

    from rlboost.bench import weight_patches

    cfg = WeightsBenchConfig(patches=True, patch_models=["tiny:qwen3"], lrs=[2e-5], steps=2, max_tokens=8,
                             prompts_per_step=2, links=[], fanout=[], versions_dir=str(tmp_path / "versions"))
    kept = {}
    real = weight_patches.byte_rows

    def recording(*args, **kwargs):
        rows, versions = real(*args, **kwargs)
        kept.update(versions)
        return rows, versions

    monkeypatch.setattr(weight_patches, "byte_rows", recording)
    assert len(bench_weights(cfg)["results"]) == 4
    assert sorted(kept) == [0, 1, 2]
    about = {"model": "tiny:qwen3", "lr": 2e-5, "steps": 2, "seed": 0}
    loaded = weight_patches.load_versions(cfg.versions_dir, weight_patches.saved_steps(cfg.versions_dir, about))
    for step, weights in kept.items():  # the bytes the links publish: the bf16 cast of the trainer's weights
        assert all(torch.equal(loaded[step][n], t.to(torch.bfloat16)) for n, t in weights.items())
    # a second run takes them instead of training again
    monkeypatch.setattr(weight_patches, "byte_rows", lambda *a, **k: pytest.fail("trained again"))
    assert bench_weights(cfg)["results"] == []
    with pytest.raises(ValueError, match="holds the versions of .* not of .*'steps': 3"):
        weight_patches.saved_steps(cfg.versions_dir, {**about, "steps": 3})
    assert weight_patches.saved_steps(str(tmp_path / "none"), about) is None


def test_bad_flags_are_one_line_before_anything_starts(tmp_path, capsys):
    from rlboost.cli import main

    (tmp_path / "about.json").write_text('{"model": "tiny:llama", "lr": 1e-6, "steps": 20, "seed": 0, "steps_kept": [0]}')
    for argv, message in ((["--links", "fast"], "error: --links='fast' is not a link rate"),
                          (["--versions-dir", str(tmp_path)], f"error: --versions-dir {tmp_path} holds the versions of")):
        assert main(["bench", "weights", "--patches", "--fanout", "", *argv]) == 2
        out = capsys.readouterr().out
        assert out.startswith(message) and len(out.strip().splitlines()) == 1, out
