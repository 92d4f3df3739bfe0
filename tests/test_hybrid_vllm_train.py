"""Hybrid training runs to the end on vLLM workers (`engine.backend=vllm`, reserved and preemptible),
with real SIGKILLs and the migrations they cause: the hybrid smoke run and the showcase, both
shortened. Issue 26: the reserved worker died at step 1 ("CPU Generator does not use offset") when
the samples of killed instances reached it at once, and the run ended in a traceback."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from progress_kills import kills_every
from rlboost.cli import main

pytestmark = pytest.mark.vllm

REPO = Path(__file__).resolve().parents[1]
VLLM = ["engine.backend=vllm", "model.path=tiny:qwen3"]  # head_dim 32: a size vLLM's CPU attention supports
QUIET = ["run.val_before_train=false", "tracking.report=false", "tracking.loggers=[jsonl]"]
DIGITS_REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return sum(c.isdigit() for c in solution_str) / max(len(solution_str), 1)
"""
"""A reward a random tiny model's samples differ on (the built-in one scores them all 0, so GRPO would
leave the weights as they are and a stale worker could not show)."""


def metrics_of(run_dir: Path) -> dict[int, dict]:
    return {m["step"]: m for m in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}


def samples_trained(m: dict) -> int:
    """The samples a step trained on: its response tokens over their mean length."""
    return round(m["perf/response_tokens"] / m["response_length/mean"])


def test_hybrid_smoke_run_on_vllm_migrates_and_loses_nothing(tmp_path, capsys):
    """The kills land at seeded token counts of the run (`progress_kills`: with seed 0 and one per
    2,000 tokens on average, the first two due at about the 3,700th and the 6,600th token) into the
    fixed pool's instances, which serve from the step's start: 128 samples of up to 256 tokens, some
    30,000 tokens, so both kills come while the instances hold samples, on a fast machine as on a
    loaded one. Two steps: the second samples from the weights the first trained, which every vLLM
    worker must have pulled (one that kept the old weights shows in `actor/ppo_kl` and the log-prob
    difference)."""
    batch, n, mean_tokens = 16, 8, 2000
    reward = tmp_path / "digits.py"
    reward.write_text(DIGITS_REWARD)
    assert main(["train", str(REPO / "configs" / "hybrid_smoke.yaml"), *VLLM, *QUIET, f"run.output_dir={tmp_path}",
                 f"reward.path={reward}", "trainer.lr=1e-2",
                 "run.total_steps=2", f"data.train_batch_size={batch}", f"rollout.n={n}",
                 "data.max_response_length=256", *kills_every(mean_tokens)]) == 0
    out = capsys.readouterr().out
    assert "Traceback" not in out and "rese-1 lost" not in out, out
    # the chaos's SIGKILLs of instances that held samples, not another death (a machine short of
    # memory has Ray kill workers too)
    chaos = rf"preempted by the seeded random preemptions \(one per ~{mean_tokens} tokens\)"
    kills = re.findall(chaos + r": (\d+) samples migrated", out)
    assert sum(map(int, kills)) >= 1, out
    metrics = metrics_of(tmp_path)
    assert sorted(metrics) == [1, 2]
    m = metrics[1]
    assert m["spot/preemptions"] >= 2 and m["migration/preempted"] >= 1, m
    assert m["migration/samples"] >= m["migration/preempted"], m
    for step in metrics.values():
        assert samples_trained(step) == batch * n  # every sample, migrated or not, trained exactly once
        # sampled from the step's weights, migrated samples included: behaviour log-probs at float noise
        assert abs(step["actor/ppo_kl"]) < 1e-6 and step["training/rollout_probs_diff_max"] < 1e-4, step
    with capsys.disabled():  # the measured numbers, beside the test's name
        print(f"\nvLLM hybrid smoke: {m['spot/preemptions']:.0f} preemptions, {m['migration/samples']:.0f} "
              f"samples migrated ({m['migration/preempted']:.0f} off killed instances), {samples_trained(m)} trained, "
              f"ppo_kl {m['actor/ppo_kl']:.1e}")


@pytest.mark.bench
def test_the_showcase_on_vllm_runs_to_the_end(tmp_path, capsys):
    """A larger run of what the smoke run above checks in CI (7 minutes and ~7 GB free on a 2-core
    machine: past CI's time budget; `make bench-vllm` runs it).

    The showcase (SmolLM2, GRPO on its shaped reward, its spot-trace replay on the run's progress),
    shortened to its evaluation and one step, with one instance: 5% of the trace's instances
    (`trace.sample=0.05`: one, none from replay second 324 to 348, then one again) instead of 10% (up
    to three), since a vLLM engine of SmolLM2 on a CPU holds about 2.5 GB. 8.3 generated tokens per
    replay second (the showcase's 35 put the drop at step 9) put the trace's kill at the run's 2,689th
    token: about 700 tokens into step 1, after the evaluation's ~2,000 gave the instance its boot
    (about 50 s here), while it generates most of the step."""
    assert main(["train", "engine.backend=vllm", "run.total_steps=1", "run.save_freq=0", "run.test_freq=0",
                 "tracking.report=false", "tracking.loggers=[jsonl]", "rollout.hybrid.trace.sample=0.05",
                 "rollout.hybrid.trace.tokens_per_s=8.3", f"run.output_dir={tmp_path}"]) == 0
    out = capsys.readouterr().out
    assert "Traceback" not in out and "rese-1 lost" not in out, out
    # the trace's SIGKILL, not another death (a machine short of memory has Ray kill workers too)
    [killed] = re.findall(r"instance pree-\d+ preempted by the trace: (\d+) samples migrated", out)
    m = metrics_of(tmp_path)
    assert sorted(m) == [0, 1], sorted(m)
    assert samples_trained(m[1]) == 64  # 8 prompts x 8: nothing lost
    assert int(killed) >= 1 and m[1]["migration/preempted"] == int(killed), (killed, m[1])
    assert m[1]["training/rollout_probs_diff_max"] < 1e-3  # the migrated samples' log-probs are vLLM's, on-policy
    with capsys.disabled():
        print(f"\nvLLM showcase, 1 step: {killed} samples migrated off the killed instance, "
              f"{m[1]['migration/samples']:.0f} in all")
