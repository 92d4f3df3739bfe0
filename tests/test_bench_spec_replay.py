"""`rlboost bench spec --record / --replay` on a tiny model: real GRPO steps recorded as histories, each
step one epoch of the prompts, then replayed with every drafter; a bad recording is one error line."""

from __future__ import annotations

import json

import pytest

from rlboost.bench.grpo import chat_prompts
from rlboost.bench.spec import SpecBenchConfig, bench_spec, render
from rlboost.cli import main
from rlboost.data import DatasetError, read_rows, task_rows
from rlboost.histospec.recording import read_recording
from rlboost.histospec.replay import FORWARDED, VARIANTS
from rlboost.models import ModelConfig, load_model
from rlboost.rewards import compute_score
from rlboost.rewards.config import RewardConfig
from rlboost.rewards.loading import load_reward_fn


def test_record_then_replay_a_tiny_model(tmp_path, capsys):
    path = tmp_path / "histories.jsonl"
    cfg = SpecBenchConfig(model="tiny:qwen2", prompts=2, max_tokens=6, temperatures=[1.0, 0.6], record_epochs=2,
                          record=str(path))
    result = bench_spec(cfg)
    groups = read_recording(path)
    # per temperature: 2 steps x 2 prompts, the showcase's 8 samples each, every prompt in every step
    assert [(g.run, g.step) for g in groups] == [(run, s) for run in ("T=1", "T=0.6") for s in (1, 1, 2, 2)]
    assert all(len(g.responses) == 8 and all(1 <= len(r) <= 6 for r in g.responses) for g in groups)
    assert groups[0].prompt == groups[2].prompt != groups[1].prompt
    rows = result["replay"]
    assert [(r["run"], r["epoch"], r["drafter"]) for r in rows] == [
        (run, e, d) for run in ("T=1", "T=0.6") for e in (0, 1) for d in VARIANTS]
    for r in rows:  # every recorded token is replayed, one decode step at most per token
        assert r["tokens"] == sum(len(x) for g in groups if g.run == r["run"] and g.step == r["epoch"] + 1
                                  for x in g.responses)
        assert r["steps"] <= r["plain_steps"] and r["accepted"] <= r["drafted"]
    assert render(result).row_count == len(rows)
    with pytest.raises(DatasetError, match="the file exists"):
        bench_spec(cfg)
    # the replay alone, from the command line
    assert main(["bench", "spec", "--replay", str(path), "--json", str(tmp_path / "out.json")]) == 0
    assert "accepted/verify" in capsys.readouterr().out
    # with a verify curve: each row's speed-up at each batch, projected and said to be
    curve = tmp_path / "gpu_check.json"
    curve.write_text(json.dumps({"shapes": [{"shape": "tiny", "verify": [
        {"batch": 1, "positions": [1, 9], "relative": [1.0, 1.0]}]}]}))  # free verification: speed-up = advance
    assert main(["bench", "spec", "--replay", str(path), "--verify-curve", str(curve), "--batches", "1,8",
                 "--json", str(tmp_path / "projected.json")]) == 0
    out = capsys.readouterr().out
    assert "projected b1" in out and "projected b8" in out and "a projection" in out and "not measured" in out
    projected = json.loads((tmp_path / "projected.json").read_text())["replay"]
    for r in projected:
        assert r["projected_speedup"]["1"] == pytest.approx((r["accepted"] + r["steps"]) / r["steps"])
    assert main(["bench", "spec", "--verify-curve", str(curve)]) == 2  # only a replay projects
    assert "--verify-curve: only a replay" in capsys.readouterr().out


def test_record_from_a_verl_dataset_with_the_built_in_reward(tmp_path, capsys):
    """`--data`: the first `--prompts` rows of a veRL dataset (gsm8k's schema as veRL's preprocessing
    writes it) are recorded, scored by the built-in reward; each step's reward is logged."""
    data = tmp_path / "gsm8k.jsonl"
    rows = [{"data_source": "openai/gsm8k", "ability": "math",
             "prompt": [{"role": "user", "content": f"Sam has {i} apples and buys {i + 2} more. How many? "
                                                    'Let\'s think step by step and output the final answer after "####".'}],
             "reward_model": {"style": "rule", "ground_truth": str(2 * i + 2)}} for i in range(3)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = tmp_path / "histories.jsonl"
    logged = []
    bench_spec(SpecBenchConfig(model="tiny:qwen2", prompts=2, max_tokens=4, temperatures=[1.0], record_epochs=1,
                               record=str(path), data=str(data)), log=logged.append)
    tokenizer = load_model(ModelConfig(path="tiny:qwen2")).tokenizer
    assert [list(g.prompt) for g in read_recording(path)] == chat_prompts(tokenizer, read_rows(data)[:2])
    assert len(logged) == 1 and logged[0].startswith("T=1 step 1: reward 0.000")
    # --reward: a veRL reward file instead
    reward = tmp_path / "quarter.py"
    reward.write_text("def score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.25\n")
    logged.clear()
    bench_spec(SpecBenchConfig(model="tiny:qwen2", prompts=1, max_tokens=2, temperatures=[1.0], record_epochs=1,
                               record=str(tmp_path / "h2.jsonl"), data=str(data), reward=f"{reward}:score"),
               log=logged.append)
    assert logged[0].startswith("T=1 step 1: reward 0.250, groups with signal 0%")
    # both are the recorder's: the timed bench refuses them, in one line
    for flag, value in (("--data", data), ("--reward", reward)):
        assert main(["bench", "spec", flag, str(value)]) == 2
        assert f"{flag}: only --record uses it" in capsys.readouterr().out


def test_record_from_a_reasoning_gym_task_scored_by_its_checker(tmp_path, capsys, monkeypatch):
    """`--data reasoning_gym:NAME`: that task's first train rows (data.seed's), each response scored by the
    dataset's own checker; a misspelt dataset is one line before any model loads."""
    scored = []
    import rlboost.bench.spec_replay as spec_replay

    def spy(**call):
        scored.append(call)
        return compute_score(**call)

    monkeypatch.setattr(spec_replay, "compute_score", spy)
    path = tmp_path / "histories.jsonl"
    bench_spec(SpecBenchConfig(model="tiny:qwen2", prompts=2, max_tokens=3, temperatures=[1.0], record_epochs=1,
                               record=str(path), data="reasoning_gym:word_sorting"))
    tokenizer = load_model(ModelConfig(path="tiny:qwen2")).tokenizer
    rows = task_rows("reasoning_gym:word_sorting", 2, 0, "train")
    assert [list(g.prompt) for g in read_recording(path)] == chat_prompts(tokenizer, rows)
    assert len(scored) == 16 and {c["data_source"] for c in scored} == {"reasoning_gym/word_sorting"}
    assert {c["ground_truth"] for c in scored} == {r.ground_truth for r in rows}
    assert main(["bench", "spec", "--record", str(tmp_path / "x.jsonl"), "--data", "reasoning_gym:word_sortng"]) == 2
    assert "--data=reasoning_gym:word_sortng: reasoning-gym has no dataset" in capsys.readouterr().out


def test_the_shaped_math_reward_pays_for_the_number_and_the_form():
    fn = load_reward_fn(RewardConfig(path="examples/rewards/math_shaped.py"))
    score = lambda text: fn(data_source="openai/gsm8k", solution_str=text, ground_truth="72", extra_info=None)
    assert score("48 + 24 = 72\n#### 72") == 1.0
    assert score("so 1,000 - 928 = 72.\n#### 72") == 1.0
    assert score("she sold 72 clips") == 0.5          # the right number, not in the asked form
    assert score("#### 71") == 0.1                     # the form, a wrong number
    assert score("#### 72 clips and then 5") == 0.0    # the form must end the response; last number wrong
    assert score("no idea") == 0.0


def test_a_bad_recording_is_one_line_and_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"step": 1, "prompt": [1], "responses": [[2, 3]]}\n{"step": "x"}\n')
    assert main(["bench", "spec", "--replay", str(bad)]) == 2
    out = capsys.readouterr().out
    assert "bad.jsonl:2: `step` must be an int >= 0" in out and "Traceback" not in out


def test_replay_over_instances_reports_local_and_forwarded_siblings(tmp_path, capsys):
    path = tmp_path / "histories.jsonl"
    a, b = [40, 41, 42, 43, 44, 45], [60, 61, 62, 63, 40, 41, 42, 43, 44, 45]
    path.write_text(json.dumps({"step": 1, "prompt": [90, 91, 92], "responses": [a, b]}) + "\n")
    out = tmp_path / "out.json"
    assert main(["bench", "spec", "--replay", str(path), "--instances", "2", "--stream-interval", "4",
                 "--min-order", "2", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["config"] | {"recording": ""} == {"recording": "", "instances": 2, "stream_interval": 4,
                                                    "sibling_tokens_per_step": 16384, "min_order": 2,
                                                    "suffix_tree_tokens": 8}
    rows = {r["drafter"]: r for r in result["replay"]}
    assert set(rows) == set(VARIANTS + FORWARDED)
    # a and b on two engines: b drafts a's tail (after its 40 41 42) only when a is forwarded
    assert rows["suffix:siblings"]["accepted"] == 0 < rows["suffix:siblings+forwarded"]["accepted"]
    assert "2 instances" in capsys.readouterr().out
    assert main(["bench", "spec", "--replay", str(path), "--instances", "0"]) == 2
    assert "--instances must be >= 1, got 0" in capsys.readouterr().out
    assert main(["bench", "spec", "--replay", str(path), "--suffix-tree-tokens", "0"]) == 2
    assert "--suffix-tree-tokens must be >= 1, got 0" in capsys.readouterr().out
    assert main(["bench", "spec", "--replay", str(path), "--min-order", "24"]) == 2
    assert "--min-order must be < 24" in capsys.readouterr().out
    # checked before a recording starts, not after its hours of GRPO steps
    out = tmp_path / "never.jsonl"
    assert main(["bench", "spec", "--model", "tiny:qwen2", "--record", str(out), "--stream-interval", "0"]) == 2
    assert capsys.readouterr().out == "error: --stream-interval must be >= 1, got 0\n" and not out.exists()
