"""The `rlboost` command: bench engine writes its JSON, generate streams text, bad input exits 2."""

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from hybrid_util import patience
from rlboost.cli import main

BENCH_KEYS = {"engine_tokens_per_s", "hf_generate_tokens_per_s", "roofline_tokens_per_s", "batch", "device",
              "engine_vs_roofline", "engine_vs_hf"}


def test_bench_engine_writes_json(tmp_path, capsys):
    path = tmp_path / "bench.json"
    rc = main(["bench", "engine", "--model", "tiny:llama", "--batch", "4", "--prompt-len", "8",
               "--new-tokens", "6", "--device", "cpu", "--compare-cpu-linear", "--repeats", "2", "--json", str(path)])
    assert rc == 0
    result = json.loads(path.read_text())
    assert BENCH_KEYS <= set(result)
    assert result["batch"] == 4 and result["device"] == "cpu"
    assert result["engine_tokens_per_s"] > 0 and result["roofline_tokens_per_s"] > 0
    assert result["engine_vs_hf"] == pytest.approx(result["engine_tokens_per_s"] / result["hf_generate_tokens_per_s"])
    assert result["outputs_identical_to_hf"] == 1.0  # both decoded the same greedy batch
    assert result["engine_torch_linear_tokens_per_s"] > 0
    assert len(result["samples"]["engine"]["decode_s"]) == 2 and len(result["samples"]["matmul_flops"]) == 2
    assert "HF generate" in capsys.readouterr().out


def test_generate_streams_an_answer(capsys):
    rc = main(["generate", "engine.stream_interval=2", "--prompt", "What is the capital of France?",
               "--max-tokens", "12"])
    assert rc == 0
    assert "Paris" in capsys.readouterr().out


@pytest.mark.vllm
def test_generate_on_the_vllm_backend(capsys):
    rc = main(["generate", "engine.backend=vllm", "engine.device=cpu", "engine.max_model_len=512",
               "--prompt", "What is the capital of France?", "--max-tokens", "12"])
    assert rc == 0
    assert "Paris" in capsys.readouterr().out


def test_config_errors_exit_2_with_the_key(capsys):
    rc = main(["generate", "engine.max_num_seq=4", "--prompt", "hi"])
    assert rc == 2
    out = capsys.readouterr().out
    assert "unknown config key `engine.max_num_seq`" in out and "max_num_seqs" in out


def test_console_script_is_installed():
    script = Path(sys.executable).parent / "rlboost"
    out = subprocess.run([str(script), "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "bench" in out.stdout and "generate" in out.stdout


@pytest.mark.bench
def test_bench_engine_default_workload(tmp_path):
    """The README's benchmark: SmolLM2 fp32, batch 32, 64 new tokens. Ratios measured in one run (a speed
    benchmark: `make bench`, not CI; outputs equal to HF's are checked by the ordinary engine tests)."""
    path = tmp_path / "bench.json"
    assert main(["bench", "engine", "--json", str(path)]) == 0
    r = json.loads(path.read_text())
    print(f"\nengine {r['engine_tokens_per_s']:.0f} tok/s, HF generate {r['hf_generate_tokens_per_s']:.0f} tok/s "
          f"({r['engine_vs_hf']:.2f}x), roofline {r['roofline_tokens_per_s']:.0f} tok/s "
          f"({r['engine_vs_roofline']:.0%})")
    assert r["outputs_identical_to_hf"] == 1.0
    assert r["engine_vs_hf"] > 1.0


CONFIGS = Path(__file__).parent.parent / "configs"


def error_lines(capsys) -> list[str]:
    """The lines the command printed that report an error; a traceback fails the test."""
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    return [line for line in (captured.out + captured.err).splitlines() if line.startswith("error:")]


@pytest.mark.parametrize("override, message", [
    ("engine.backend=vllm", "error: engine.backend=vllm needs vLLM, which is not installed here: pip install vllm"),
    ("engine.device=cuda", "error: engine.device='cuda' but CUDA is not available on this machine"),
    ("trainer.device=cuda:0", "error: trainer.device='cuda:0' but CUDA is not available on this machine"),
])
def test_a_backend_or_device_this_machine_lacks_exits_2_before_anything_starts(override, message, tmp_path, capsys,
                                                                             monkeypatch):
    """Found by `checks.validate`, not by the engine's or trainer's constructor half-way into the start."""
    import importlib.util

    import torch

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else find_spec(name, *a))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the same on a GPU machine
    assert main(["train", str(CONFIGS / "smoke.yaml"), override, f"run.output_dir={tmp_path / 'run'}"]) == 2
    [line] = error_lines(capsys)
    assert line.startswith(message), line
    assert not (tmp_path / "run" / "config.yaml").exists()


def test_a_number_that_is_not_finite_exits_2_naming_its_key(tmp_path, capsys):
    assert main(["train", str(CONFIGS / "smoke.yaml"), "trainer.lr=inf", f"run.output_dir={tmp_path}"]) == 2
    assert error_lines(capsys) == ["error: trainer.lr must be a finite number, got inf"]
    assert main(["simulate", "duration_s=nan", "--plots", str(tmp_path)]) == 2
    assert error_lines(capsys) == ["error: duration_s must be a finite number, got nan"]
    assert main(["bench", "weights", "--bucket-mb", "nan"]) == 2  # argparse's float takes nan and inf
    assert error_lines(capsys) == ["error: --bucket-mb must be a finite number, got nan"]



def bench_float_flags() -> list[tuple[str, str, str]]:
    """(bench, flag, value) for every number flag of every `rlboost bench` (its config's float fields, one
    bad item in a list of floats): the flags are the config's fields, which the dotted-config walk of
    test_config does not reach."""
    import dataclasses
    import typing

    from rlboost.cli import BENCHES, _bench_parts

    cases = []
    for name in BENCHES:
        config, _, _ = _bench_parts(name)
        hints = typing.get_type_hints(config)
        for f in dataclasses.fields(config):
            flag = "--" + f.name.replace("_", "-")
            if hints[f.name] in (float, float | None):
                cases.append((name, flag, "{}"))
            elif hints[f.name] == list[float]:
                cases.append((name, flag, "1.0,{}"))
    return cases


def test_every_number_flag_of_every_bench_refuses_nan_and_inf(capsys, monkeypatch):
    from rlboost import cli

    cases = bench_float_flags()
    parts = cli._bench_parts
    monkeypatch.setattr(cli, "_bench_parts", lambda name: (parts(name)[0], lambda *a, **k: pytest.fail(
        f"bench {name} ran with a number that is not finite"), parts(name)[2]))
    assert {"spec", "hybrid", "weights", "regret", "cluster"} <= {name for name, _, _ in cases}
    assert len(cases) >= 15
    for name, flag, value in cases:
        for bad in ("nan", "inf"):
            assert main(["bench", name, flag, value.format(bad)]) == 2, (name, flag, bad)
            assert error_lines(capsys) == [f"error: {flag} must be a finite number, got {bad}"], (name, flag, bad)

BAD_TRACES = {
    "random bytes": (random.Random(0).randbytes(300), "not UTF-8 text"),
    "a negative count": (b"time_s,available_instances\n0,3\n60,-1\n", "3: available_instances must be >= 0"),
    "a malformed row": (b"time_s,available_instances\n0,3\n60;2\n", "3: expected 2 columns"),
    "times not increasing": (b"time_s,available_instances\n0,3\n60,2\n30,1\n", "4: time_s 30 does not increase"),
}


@pytest.fixture(params=list(BAD_TRACES), ids=list(BAD_TRACES))
def bad_trace(request, tmp_path) -> tuple[Path, str]:
    """A trace file with something wrong in it, and what its error says after `FILE:`."""
    content, message = BAD_TRACES[request.param]
    path = tmp_path / "trace.csv"
    path.write_bytes(content)
    return path, message


def test_a_bad_trace_file_exits_2_naming_it_in_simulate(bad_trace, tmp_path, capsys):
    path, message = bad_trace
    assert main(["simulate", f"trace.path={path}", "--plots", str(tmp_path / "plots")]) == 2
    [line] = error_lines(capsys)
    assert line.startswith(f"error: {path}:") and message in line


def test_a_bad_trace_file_exits_2_naming_it_before_a_hybrid_run_starts(bad_trace, tmp_path, capsys, monkeypatch):
    import rlboost.assembly

    def past_validation(*args, **kwargs):
        raise AssertionError("the run went past its validation (data, model, Ray) with a bad trace file")

    for step in ("load_datasets", "load_model", "start_cluster"):
        monkeypatch.setattr(rlboost.assembly, step, past_validation)
    path, message = bad_trace
    assert main(["train", str(CONFIGS / "hybrid_smoke.yaml"), "rollout.hybrid.provider=trace",
                 f"rollout.hybrid.trace.path={path}", f"run.output_dir={tmp_path / 'run'}"]) == 2
    [line] = error_lines(capsys)
    assert line.startswith(f"error: {path}:") and message in line


def test_an_unreachable_ray_address_exits_2_in_one_line_before_ray(capsys):
    """Not minutes of Ray's retries and a traceback: the address is checked before data, model or Ray."""
    import socket
    import time

    import ray

    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start = time.monotonic()
    rc = main(["train", "configs/hybrid_smoke.yaml", f"cluster.ray_address=127.0.0.1:{port}"])
    assert rc == 2 and time.monotonic() - start < patience(15)  # Ray's own retries take minutes
    captured = capsys.readouterr()
    lines = captured.out.strip().splitlines()  # the config banner, then the error
    assert lines[-1] == f"error: cluster.ray_address=127.0.0.1:{port}: nothing answers there (connection refused)"
    assert len(lines) == 2 and "Traceback" not in captured.out + captured.err
    assert not ray.is_initialized()


def test_a_step_that_cannot_finish_ends_the_run_in_one_line_exit_2(tmp_path, capsys, monkeypatch):
    """What the hybrid step raises when no rollout worker is left (issue 26: it escaped as a traceback)."""
    import rlboost.train
    from rlboost.rollout.step_data import StepError

    def no_worker_left(*args, **kwargs):
        raise StepError("no rollout worker left at weight version 0: rese-1: it died: RuntimeError: boom")

    monkeypatch.setattr(rlboost.train, "train", no_worker_left)
    assert main(["train", str(CONFIGS / "hybrid_smoke.yaml"), "trainer.lr=2e-6", f"run.output_dir={tmp_path}"]) == 2
    out = capsys.readouterr().out
    assert "Traceback" not in out
    error, kept, resume = out.strip().splitlines()[-4:-1]
    assert error == ("error: the step could not finish: no rollout worker left at weight version 0: rese-1: it "
                     "died: RuntimeError: boom")
    assert kept.startswith("every worker was shut down; no checkpoint was written yet")
    assert resume == (f"resume with:  rlboost train {CONFIGS / 'hybrid_smoke.yaml'} trainer.lr=2e-6 "
                      f"run.output_dir={tmp_path}")
