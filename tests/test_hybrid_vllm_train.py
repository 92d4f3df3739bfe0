"""Hybrid training runs to the end on vLLM workers (`engine.backend=vllm`, reserved and preemptible),
with real SIGKILLs and the migrations they cause: the hybrid smoke run, shortened. Issue 26: the
reserved worker died at step 1 ("CPU Generator does not use offset") when the samples of killed
instances reached it at once, and the run ended in a traceback.

Where the kills land is the seeded chaos of `rollout.hybrid.preempt_every_s` (wall time from the
provider's start: with seed 0 and 2 s, at about 3.7 and 3.8 s), so the step is made long enough that
they land while it generates on any machine that runs these tests: 128 samples of up to 256 tokens,
10-20 s of generation on this 2-core machine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlboost.cli import main

pytestmark = pytest.mark.vllm

REPO = Path(__file__).resolve().parents[1]
VLLM = ["engine.backend=vllm", "model.path=tiny:qwen3"]  # head_dim 32: a size vLLM's CPU attention supports
QUIET = ["run.val_before_train=false", "tracking.report=false", "tracking.loggers=[jsonl]"]


def metrics_of(run_dir: Path) -> dict[int, dict]:
    return {m["step"]: m for m in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}


def samples_trained(m: dict) -> int:
    """The samples a step trained on: its response tokens over their mean length."""
    return round(m["perf/response_tokens"] / m["response_length/mean"])


def test_hybrid_smoke_run_on_vllm_migrates_and_loses_nothing(tmp_path, capsys):
    batch, n = 16, 8
    assert main(["train", str(REPO / "configs" / "hybrid_smoke.yaml"), *VLLM, *QUIET, f"run.output_dir={tmp_path}",
                 "run.total_steps=1", f"data.train_batch_size={batch}", f"rollout.n={n}",
                 "data.max_response_length=256", "rollout.hybrid.preempt_every_s=2.0"]) == 0
    out = capsys.readouterr().out
    assert "Traceback" not in out and "rese-1 lost" not in out, out
    [m] = [m for step, m in metrics_of(tmp_path).items() if step == 1]
    assert m["spot/preemptions"] >= 1, m  # a real SIGKILL of an instance that held samples
    assert m["migration/preempted"] >= 1 and m["migration/samples"] >= m["migration/preempted"], m
    assert samples_trained(m) == batch * n  # every sample, migrated or not, trained exactly once
    # the migrated samples were finished on the step's weights: behaviour log-probs at float noise
    assert abs(m["actor/ppo_kl"]) < 1e-6 and m["training/rollout_probs_diff_max"] < 1e-4, m
    print(f"\nvLLM hybrid smoke: {m['spot/preemptions']:.0f} preemptions, {m['migration/samples']:.0f} samples migrated "
          f"({m['migration/preempted']:.0f} off killed instances), {samples_trained(m)} trained, "
          f"ppo_kl {m['actor/ppo_kl']:.1e}")
