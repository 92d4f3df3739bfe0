"""`rlboost bench engine --backends`: every backend decodes the same greedy batches, side by side."""

import json
import re

import pytest

from rlboost.cli import main


def bench(tmp_path, backends, *more):
    path = tmp_path / "bench.json"
    rc = main(["bench", "engine", "--model", "tiny:qwen3", "--backends", backends, "--batches", "1,3",
               "--prompt-len", "6", "--new-tokens", "5", "--repeats", "2", "--device", "cpu", "--json", str(path),
               *more])
    assert rc == 0
    return json.loads(path.read_text())


def check(result, backends):
    assert result["backends"] == backends and result["batches"] == [1, 3]
    for name in backends:
        assert set(result["decode_tokens_per_s"][name]) == {"1", "3"}
        assert all(v > 0 for v in result["decode_tokens_per_s"][name].values())
        assert all(len(s) == 2 for s in result["samples_decode_s"][name].values())
        assert result["startup_s"][name] > 0 and result["weight_swap_s"][name] >= 0
        assert result["greedy_identical_to_hf"][name] == {"1": 1.0, "3": 1.0}, name
    assert result["decode_vs_rlboost"]["rlboost"] == {"1": 1.0, "3": 1.0}
    partial = result["partial_swap"]  # 2% of the bytes changed, by default
    assert 0 < partial["bytes_named"] <= 0.02 * partial["model_bytes"] and partial["tensors_named"] > 0
    for name in backends:
        assert result["partial_swap_s"][name] >= 0 and len(result["samples_swap_s"][name]["partial"]) == 2
        # what reached the backend: the tensors named; for vLLM, the whole fused layers they fall in
        assert (partial["bytes_reloaded"][name] >= partial["bytes_named"] if name == "vllm"
                else partial["bytes_reloaded"][name] == partial["bytes_named"]), name


def test_bench_backends_rlboost_and_hf(tmp_path, capsys):
    check(bench(tmp_path, "rlboost,hf"), ["rlboost", "hf"])
    assert "weight swap" in capsys.readouterr().out


@pytest.mark.vllm
def test_bench_backends_with_vllm(tmp_path, capfd, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the bench's log goes to outputs/bench/ under the working directory
    check(bench(tmp_path, "rlboost,vllm,hf"), ["rlboost", "vllm", "hf"])
    # vLLM's log lines go to the bench's log, as Ray's do, not to the console
    console = "".join(capfd.readouterr())
    assert not re.search(r"(INFO|WARNING) \d\d-\d\d \d\d:\d\d:\d\d \[", console), console
    assert "Loading safetensors checkpoint shards" not in console
    log = (tmp_path / "outputs" / "bench" / "engine.log").read_text()
    assert "rlboost.vllm: (vllm." in log and "Resolved architecture" in log
    # a full swap logs it once, for the rotary table; a partial swap leaves most layers as they are
    # on purpose and must not report each as failed
    assert log.count("Failed to load weights") <= 2, log


def test_bench_backends_unknown_name(tmp_path):
    with pytest.raises(ValueError, match=r"--backends: unknown \['sglang'\]"):
        bench(tmp_path, "rlboost,sglang")


def test_bench_backends_partial_share_out_of_range(tmp_path):
    with pytest.raises(ValueError, match=r"--partial-share: .* got 1.5"):
        bench(tmp_path, "rlboost", "--partial-share", "1.5")
