"""`make gpu-check`'s logic on the CPU (tiny shape): it runs where a lent GPU machine stands (no OmegaConf, Ray or
rich), writes every documented figure beside its baseline, keeps to its budget and refuses bad input in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlboost.bench import gpu_check

ROOT = Path(__file__).resolve().parents[1]
ABSENT_THERE = ("omegaconf", "ray", "rich", "pyarrow", "matplotlib")
"""Installed here, not on the lent GPU machine (its own Python: torch, transformers, safetensors, numpy)."""


def _run_as_on_the_gpu_machine(*args: str) -> subprocess.CompletedProcess:
    """`python -m rlboost.bench.gpu_check ARGS` with the packages that machine lacks made unimportable."""
    code = ("import runpy, sys\n"
            f"for name in {ABSENT_THERE!r}: sys.modules[name] = None  # import raises ImportError\n"
            f"sys.argv = ['gpu_check', *{list(args)!r}]\n"
            "runpy.run_module('rlboost.bench.gpu_check', run_name='__main__')\n")
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_the_quick_check_measures_every_figure_beside_its_baseline_without_ray_omegaconf_or_rich(tmp_path):
    out = tmp_path / "gpu_check.json"
    proc = _run_as_on_the_gpu_machine("--quick", "--device", "cpu", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["device"] == "cpu" and result["dtype"] == "float32" and result["skipped"] == []
    assert result["copy_bytes_per_s"] > 0 and result["matmul_flops"] > 0
    (shape,) = result["shapes"]
    assert shape["shape"] == "tiny" and shape["parameters"] > 0
    assert shape["weight_bytes"] == 4 * shape["parameters"]
    assert [row["batch"] for row in shape["decode"]] == [1, 4]
    for row in shape["decode"]:
        assert row["engine_tokens_per_s"] > 0 and row["roofline_tokens_per_s"] > 0
        assert row["engine_vs_roofline"] == pytest.approx(row["engine_tokens_per_s"] / row["roofline_tokens_per_s"])
        assert row["outputs_identical_to_hf"] == 1.0  # same greedy tokens as HF generate: the engine is right here
        assert len(row["hf_decode_s"]) == len(row["engine_decode_s"]) == 1
        # teacher-forced on the engine's output, HF's argmax is every engine token (fp32: no rounding to hide in)
        assert row["greedy_gap_max"] == pytest.approx(0, abs=1e-4) and row["greedy_agreement"] == 1.0
        assert row["logit_spread"] > 0
    assert [row["batch"] for row in shape["verify"]] == [1, 4]
    for row in shape["verify"]:
        assert row["positions"] == [1, 2, 4] and row["plain_step_s"] > 0
        assert row["relative"] == pytest.approx([s / row["plain_step_s"] for s in row["step_s"]])
    profile = shape["step_profile"]
    assert profile["launches"] > 10 and profile["launch_latency_s"] > 0 and 0 < profile["launch_bound_share"] <= 1
    assert shape["train"]["tokens_per_s"] > 0 and shape["train"]["seq_len"] == 16 + 16
    assert shape["weight_load"]["bytes"] == shape["weight_bytes"] and shape["weight_load"]["bytes_per_s"] > 0
    patch = result["patch"]  # applied bit for bit inside the check, or it fails
    assert patch["bytes"] == shape["weight_bytes"] and 0 < patch["changed_share"] <= 1 and patch["patch_bytes"] > 0
    assert "tiny decode b4" in proc.stdout and "tiny b1 step" in proc.stdout and f"wrote {out}" in proc.stdout


def test_a_spent_budget_names_every_measurement_it_left_out(tmp_path, capsys):
    out = tmp_path / "gpu_check.json"
    assert gpu_check.main(["--quick", "--device", "cpu", "--budget-s", "0", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["shapes"] == [] and result["patch"] is None
    assert [s.split(":")[0] for s in result["skipped"]] == ["tiny", "patch encode/apply"]
    assert result["errors"] == []
    assert all("gpu_check.budget_s" in s for s in result["skipped"])


@pytest.mark.parametrize("args, says", [
    (["--shapes", "llama-7b"], "error: --shapes: unknown shape 'llama-7b'"),
    (["--dtype", "bfloat17"], "error: --dtype: 'bfloat17' is not a torch dtype"),
    (["--device", "cuda:64"], "error: --device='cuda:64' but "),
])
def test_bad_input_is_one_line_and_exit_2_before_anything_runs(tmp_path, capsys, args, says):
    out = tmp_path / "gpu_check.json"
    assert gpu_check.main(["--json", str(out), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(says) and err.count("\n") == 1
    assert not out.exists()


def test_a_failing_section_is_recorded_and_the_others_are_still_measured(tmp_path, monkeypatch, capsys):
    """The first CUDA run of a path may break: the lease's other figures must still come back, with the failure
    named in the JSON and the exit status saying so."""
    def broken_train_row(*args):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(gpu_check, "train_row", broken_train_row)
    out = tmp_path / "gpu_check.json"
    assert gpu_check.main(["--quick", "--device", "cpu", "--json", str(out)]) == 1
    result = json.loads(out.read_text())
    (shape,) = result["shapes"]
    assert "train" not in shape and shape["decode"] and shape["verify"] and shape["weight_load"]
    assert result["patch"] is not None
    (error,) = result["errors"]
    assert error["what"] == "tiny trainer step" and error["error"].startswith("RuntimeError: CUDA error")
    assert "broken_train_row" in error["traceback"]
    captured = capsys.readouterr()
    assert "FAILED tiny trainer step" in captured.out
    assert "error: 1 measurement(s) failed: tiny trainer step: RuntimeError" in captured.err


def test_each_shape_is_written_as_it_is_measured(tmp_path):
    partials = []
    cfg = gpu_check.GpuCheckConfig(device="cpu", dtype="float32", shapes=["tiny", "tiny"], decode_batches=[1],
                                   verify_batches=[1], verify_positions=[1, 2], prompt_len=8, new_tokens=4,
                                   train_batch=1, train_response_len=8, timing_iters=2, repeats=1,
                                   patch_bucket_mb=0.5, hf_baseline=False)
    result = gpu_check.gpu_check(cfg, log=lambda line: None,
                                 progress=lambda partial: partials.append(json.loads(json.dumps(partial))))
    assert [len(p["shapes"]) for p in partials] == [1, 2]
    assert all(p["errors"] == [] and p["skipped"] == [] and p["elapsed_s"] > 0 for p in partials)
    assert result["shapes"] == partials[-1]["shapes"]


def test_the_greedy_gap_sees_an_engine_token_that_is_not_the_argmax():
    model = gpu_check.random_model("tiny", torch.float32, torch.device("cpu"))
    prompt = [5, 6, 7, 8]
    with torch.inference_mode():
        logits = model(torch.tensor([prompt])).logits[0, -1]
    right, wrong = int(logits.argmax()), int(logits.argmin())
    assert gpu_check.greedy_gap(model, [prompt], [[right]], torch.device("cpu"))["greedy_agreement"] == 1.0
    gap = gpu_check.greedy_gap(model, [prompt], [[wrong]], torch.device("cpu"))
    assert gap["greedy_gap_max"] == pytest.approx(float(logits.max() - logits.min()), rel=1e-4)
    assert gap["greedy_agreement"] == 0.0
