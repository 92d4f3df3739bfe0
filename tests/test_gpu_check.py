"""`make gpu-check`'s logic on the CPU (tiny shape): it runs where a lent GPU machine stands (no OmegaConf, Ray or
rich), writes every documented figure beside its baseline, keeps to its budget and refuses bad input in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

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
    assert [row["batch"] for row in shape["verify"]] == [1, 4]
    for row in shape["verify"]:
        assert row["positions"] == [1, 2, 4] and row["plain_step_s"] > 0
        assert row["relative"] == pytest.approx([s / row["plain_step_s"] for s in row["step_s"]])
    assert shape["train"]["tokens_per_s"] > 0 and shape["train"]["seq_len"] == 16 + 16
    assert shape["weight_load"]["bytes"] == shape["weight_bytes"] and shape["weight_load"]["bytes_per_s"] > 0
    patch = result["patch"]  # applied bit for bit inside the check, or it fails
    assert patch["bytes"] == shape["weight_bytes"] and 0 < patch["changed_share"] <= 1 and patch["patch_bytes"] > 0
    assert "tiny decode b4" in proc.stdout and f"wrote {out}" in proc.stdout


def test_a_spent_budget_names_every_measurement_it_left_out(tmp_path, capsys):
    out = tmp_path / "gpu_check.json"
    assert gpu_check.main(["--quick", "--device", "cpu", "--budget-s", "0", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["shapes"] == [] and result["patch"] is None
    assert [s.split(":")[0] for s in result["skipped"]] == ["tiny", "patch encode/apply"]
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
