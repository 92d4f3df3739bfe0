"""`rlboost train` end to end: the run folder, learning on a learnable reward, exact resume after a
hard kill, the on-policy check, and clear errors for bad input before any work starts."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hybrid_util import patience
from progress_kills import kills_every
from rlboost.cli import main
from rlboost.data import arithmetic_rows, write_rows
from rlboost.rollout import Group, Sample
from rlboost.train import check_on_policy

REPO = Path(__file__).resolve().parents[1]
SMOKE = str(REPO / "configs" / "smoke.yaml")
QUIET = ["run.val_before_train=false", "tracking.report=false", "tracking.loggers=[jsonl]"]

DIGITS_REWARD = """
import os, time
from pathlib import Path

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    gate = os.environ.get("RLBOOST_TEST_BLOCK_AFTER")
    if gate and Path(gate).exists():  # lets a test kill the run mid-step, right after a checkpoint
        time.sleep(600)
    return sum(c.isdigit() for c in solution_str) / max(len(solution_str), 1)
"""


def metrics_of(run_dir: Path) -> dict[int, dict]:
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {m["step"]: m for m in lines}


def assert_rollout_served_the_trainers_weights(m: dict[int, dict], steps) -> None:
    """At every step the log-probs the rollout recorded are the trainer's own before its update: PPO's
    KL to the behaviour policy and the largest per-token probability gap stay at float noise. With a
    learning rate that moves the weights far in one step, a worker serving an older version (a skipped
    or partial pull) shows orders of magnitude above these bounds (numbers at each caller)."""
    for step in steps:
        assert abs(m[step]["actor/ppo_kl"]) < 1e-6, (step, m[step]["actor/ppo_kl"])
        assert m[step]["training/rollout_probs_diff_max"] < 1e-4, (step, m[step]["training/rollout_probs_diff_max"])


def train(tmp_path: Path, *overrides: str, name: str = "run") -> Path:
    out = tmp_path / name
    assert main(["train", SMOKE, f"run.output_dir={out}", *overrides]) == 0
    return out


def test_smoke_run_writes_the_whole_run_folder(tmp_path):
    run = train(tmp_path)
    assert (run / "config.yaml").read_text().count("tiny:qwen2") == 1  # the resolved config
    m = metrics_of(run)
    assert sorted(m) == [0, 1, 2] and "val/score/mean" in m[0] and "val/score/mean" in m[2]
    for key in ("critic/score/mean", "response_length/mean", "timing_s/gen", "timing_s/update_actor",
                "timing_s/step", "perf/throughput", "actor/pg_loss", "actor/grad_norm"):
        assert key in m[1] and key in m[2], key
    assert m[2]["timing_s/step"] >= m[2]["timing_s/gen"] + m[2]["timing_s/update_actor"]
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    ckpt = run / "checkpoints" / "global_step_2"
    assert json.loads((ckpt / "state.json").read_text())["global_step"] == 2
    assert (ckpt / "hf" / "model.safetensors").is_file() and (ckpt / "hf" / "tokenizer.json").is_file()
    report = run / "report"
    assert {p.name for p in report.iterdir()} >= {"report.md", "reward.png", "response_length.png",
                                                  "time_breakdown.png"}


def test_a_tiny_model_learns_a_learnable_reward(tmp_path):
    reward = tmp_path / "digits.py"
    reward.write_text(DIGITS_REWARD)
    run = train(tmp_path, f"reward.path={reward}", "run.total_steps=8", "trainer.lr=1e-2", "run.save_freq=0",
                "run.test_freq=0", "rollout.n=8", "data.max_response_length=16", *QUIET)
    scores = [metrics_of(run)[s]["critic/score/mean"] for s in range(1, 9)]
    # a random byte-level model writes ~4% digits; GRPO on this reward pushes that up fast
    assert scores[0] < 0.1
    assert min(scores[-2:]) > 3 * scores[0] and scores[-1] > 0.2, scores


@pytest.mark.e2e
def test_hybrid_training_with_preemptions_learns_like_colocated(tmp_path):
    """The same learning run with rollout on 1 reserved + 2 preemptible Ray workers, killed with
    SIGKILL at seeded token counts of the run (`progress_kills`) and replaced at once."""
    reward = tmp_path / "digits.py"
    reward.write_text(DIGITS_REWARD)
    common = [f"reward.path={reward}", "trainer.lr=1e-2", "run.save_freq=0", "rollout.n=8",
              "data.max_response_length=16", *QUIET]
    colocated = metrics_of(train(tmp_path, *common, "run.total_steps=1", name="colocated"))
    run = train(tmp_path, *common, "run.total_steps=8", "run.test_freq=4", "rollout.mode=hybrid",
                "rollout.hybrid.num_preemptible=2", "rollout.hybrid.seed_window_s=0.05", *kills_every(500))
    m = metrics_of(run)
    # every version the trainer published reached every worker that generated with it, joiners and
    # migrated samples included. Measured: |ppo_kl| at most 1.9e-8 and probs_diff_max at most 2.4e-7;
    # with workers that skip every pull after their first, ppo_kl 0.1 to 0.6 and probs_diff_max 0.04
    # to 0.13 from step 2 on (and no learning)
    assert_rollout_served_the_trainers_weights(m, range(1, 9))
    scores = [m[s]["critic/score/mean"] for s in range(1, 9)]
    assert scores[0] < 0.1
    assert min(scores[-2:]) > 3 * scores[0] and scores[-1] > 0.2, scores
    # same weights, same per-sample seeds: step 1 samples the very same responses as colocated rollout
    # (the loss is summed in the order groups arrive, which differs: float32 rounding, hence 1e-4)
    for key in ("critic/score/mean", "response_length/mean", "actor/pg_loss"):
        assert m[1][key] == pytest.approx(colocated[1][key], rel=1e-4), key
    # the kills, counted by the steps that met them: at least the two due at about the 930th and the
    # 1,650th to 1,720th token (the second is drawn from where the first landed), with both instances
    # of the pool serving; a kill due while the replacements boot has no victim
    preempted = sum(m[s]["spot/preemptions"] for s in m if s)
    assert preempted >= 2, preempted
    assert sum(m[s]["spot/joins"] for s in m if s) > 0
    # how much the instances generate, and in which steps, depends on when they boot and die on this
    # machine: only that they did
    assert sum(m[s]["rollout/preemptible_token_share"] for s in range(1, 9)) > 0
    for key in ("migration/samples", "migration/wasted_tokens", "timing_s/seed", "timing_s/wait_train",
                "timing_s/wait_remote", "spot/instances", "val/score/mean"):
        assert key in m[4], key


@pytest.mark.e2e
def test_histospec_changes_nothing_but_speed(tmp_path):
    """The same 4 steps (8 prompts, so each comes back every 2 steps) with and without HistoSpec: the
    same responses, rewards and losses; the speculative run reports its spec/* metrics."""
    common = ["run.total_steps=4", "data.train_size=8", "data.max_response_length=48", "engine.spec_max_batch=16",
              "rollout.temperature=0.7", *QUIET]
    plain = metrics_of(train(tmp_path, *common, name="plain"))
    spec = metrics_of(train(tmp_path, *common, "rollout.histospec.enabled=true", name="spec"))
    for step in range(1, 5):
        for key in ("critic/score/mean", "response_length/mean", "actor/pg_loss", "actor/grad_norm"):
            assert spec[step][key] == pytest.approx(plain[step][key], rel=1e-4, abs=1e-6), (step, key)
    assert spec[1]["spec/history_prompts"] == 0 and spec[4]["spec/history_prompts"] == 8
    assert sum(spec[s]["spec/verify_steps"] for s in range(1, 5)) > 0  # it did speculate
    assert "spec/verify_steps" not in plain[1]

    # the history is checkpointed: a run resumed after step 2 drafts from it at once
    train(tmp_path, *common, "rollout.histospec.enabled=true", "run.total_steps=2", "run.save_freq=2", name="resumed")
    m = metrics_of(train(tmp_path, *common, "rollout.histospec.enabled=true", name="resumed"))
    assert m[3]["spec/history_prompts"] == spec[3]["spec/history_prompts"] == 8
    assert m[3]["critic/score/mean"] == pytest.approx(spec[3]["critic/score/mean"], rel=1e-4)


@pytest.mark.e2e
def test_hybrid_histospec_and_histopipe_change_nothing_but_speed(tmp_path):
    """Hybrid rollout (1 reserved + 2 preemptible workers), 4 steps over 8 prompts so each comes back
    every 2 steps: with HistoSpec drafting on the workers from histories the manager sends, and
    HistoPipe ordering dispatch from the previous epoch's lengths, the responses, rewards and losses
    are those of the plain hybrid run; the spec/*, histopipe/* and tail metrics are reported."""
    common = ["run.total_steps=4", "data.train_size=8", "data.max_response_length=48", "engine.spec_max_batch=16",
              "rollout.temperature=0.7", "rollout.mode=hybrid", "rollout.hybrid.num_preemptible=2",
              "rollout.hybrid.seed_window_s=0.05", "trainer.lr=1e-2", *QUIET]
    plain = metrics_of(train(tmp_path, *common, name="plain"))
    both = metrics_of(train(tmp_path, *common, "rollout.histospec.enabled=true", "rollout.histopipe.enabled=true",
                            name="both"))
    # speculated tokens carry the log-probs of the weights just published too. The tiny model scores 0 on
    # arithmetic, so only weight decay moves the weights, hence the large learning rate. Measured:
    # |ppo_kl| at most 4.1e-8 and probs_diff_max at most 1.8e-7; with workers that skip every pull after
    # their first, |ppo_kl| 1.2e-5 to 7.9e-5 and probs_diff_max 1.0e-4 to 4.3e-4 from step 2 on
    for m in (plain, both):
        assert_rollout_served_the_trainers_weights(m, range(1, 5))
    for step in range(1, 5):
        for key in ("critic/score/mean", "response_length/mean", "actor/pg_loss", "actor/grad_norm"):
            assert both[step][key] == pytest.approx(plain[step][key], rel=1e-4, abs=1e-6), (step, key)
        assert "rollout/tail_s" in plain[step] and "histopipe/history_prompts" not in plain[step]
    assert both[1]["spec/history_prompts"] == 0 and both[4]["spec/history_prompts"] == 8
    assert both[4]["histopipe/history_prompts"] == 8
    assert both[1]["spec/verify_steps"] == 0  # no history yet: nothing to draft from
    assert sum(both[s]["spec/verify_steps"] for s in (3, 4)) > 0  # the workers drafted from what they were sent
    assert "spec/verify_steps" not in plain[1]


@pytest.mark.e2e
@pytest.mark.parametrize("how", ["SIGKILL", "SIGINT"])
def test_a_killed_or_stopped_run_resumes_to_the_same_metrics(tmp_path, how):
    """SIGKILL: a hard kill, no cleanup. SIGINT (Ctrl-C): a clean stop, exit status 130, a line naming
    the command that resumes; either way the resumed run continues exactly."""
    reward = tmp_path / "digits.py"
    reward.write_text(DIGITS_REWARD)
    common = [f"reward.path={reward}", "run.total_steps=4", "run.save_freq=2", "run.test_freq=2",
              "trainer.lr=1e-2", "tracking.report=false", "tracking.loggers=[jsonl]"]
    killed = tmp_path / "killed"
    gate = killed / "checkpoints" / "global_step_2" / "state.json"
    env = dict(os.environ, RLBOOST_TEST_BLOCK_AFTER=str(gate))
    proc = subprocess.Popen([sys.executable, "-m", "rlboost.cli", "train", SMOKE, f"run.output_dir={killed}",
                             *common], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + patience(120)
        while not gate.exists():  # step 3 blocks in its reward function once checkpoint 2 is complete
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "the run never wrote checkpoint 2"
            time.sleep(0.05)
        proc.send_signal(getattr(signal, how))  # SIGKILL: no cleanup, no final report
        output, _ = proc.communicate(timeout=patience(60))
    finally:
        proc.kill()
        proc.wait()
    assert sorted(metrics_of(killed)) == [0, 1, 2]
    if how == "SIGINT":
        assert proc.returncode == 130, output
        assert "Traceback" not in output and "KeyboardInterrupt" not in output, output
        assert f"the last checkpoint is {killed / 'checkpoints' / 'global_step_2'}" in output, output
        [command] = [line.split("resume with:", 1)[1].split() for line in output.splitlines() if "resume with:" in line]
        assert command[:3] == ["rlboost", "train", SMOKE] and f"run.output_dir={killed}" in command, command
        resume = command[2:]
    else:
        resume = [SMOKE, f"run.output_dir={killed}", *common]

    assert main(["train", *resume]) == 0  # run.resume=auto
    uninterrupted = train(tmp_path, *common, name="uninterrupted")

    got, want = metrics_of(killed), metrics_of(uninterrupted)
    assert sorted(got) == sorted(want) == [0, 1, 2, 3, 4]
    for step in want:
        for key, value in want[step].items():
            if key.startswith(("timing_s/", "perf/throughput", "cost/")):  # wall-clock dependent
                continue
            assert got[step][key] == pytest.approx(value, rel=1e-5, abs=1e-6), (step, key)
    # the cost meter's totals came back from checkpoint 2: the resumed run kept counting from them
    assert got[4]["cost/total_usd"] == pytest.approx(sum(got[s]["cost/usd"] for s in (1, 2, 3, 4)), rel=1e-9)


def test_check_on_policy_rejects_tokens_of_another_version():
    sample = Sample(uid="3:0:0", prompt_ids=[5], response_ids=[7, 8], logprobs=[-1.0, -1.0], versions=[2, 2],
                    finish_reason="stop", reward=1.0)
    group = Group(index=0, row_index=0, data_source="t", ground_truth=None, extra_info={}, samples=[sample])
    check_on_policy([group], version=2)
    sample.versions = [2, 1]
    with pytest.raises(RuntimeError, match=r"sample 3:0:0 carries tokens of weight versions \[1\]"):
        check_on_policy([group], version=2)


def test_training_on_veRL_files(tmp_path):
    write_rows(arithmetic_rows(16, seed=1, split="train", digits=1), tmp_path / "train.parquet")
    write_rows(arithmetic_rows(4, seed=1, split="eval", digits=1), tmp_path / "val.jsonl")
    run = train(tmp_path, f"data.train_files=[{tmp_path / 'train.parquet'}]",
                f"data.val_files=[{tmp_path / 'val.jsonl'}]", "run.total_steps=1", "run.save_freq=0",
                "tracking.report=false", "tracking.loggers=[jsonl]")
    assert "val/score/mean" in metrics_of(run)[1]


def run_cli(tmp_path, *args) -> tuple[int, str]:
    proc = subprocess.run([sys.executable, "-m", "rlboost.cli", "train", SMOKE, f"run.output_dir={tmp_path / 'r'}",
                           *QUIET, *args], capture_output=True, text=True, timeout=patience(150))
    return proc.returncode, proc.stdout + proc.stderr


def test_bad_input_is_a_clear_error_before_any_work(tmp_path, capsys):
    """Each check in the command's own process (no process boundary is under test here: the first case
    runs as the installed command, whose exit status and streams are the user's)."""
    import psutil

    bad = tmp_path / "bad.jsonl"
    row = {"data_source": "arithmetic", "prompt": [{"role": "user", "content": "1+1?"}],
           "reward_model": {"style": "rule", "ground_truth": "2"}}
    bad.write_text(json.dumps(row) + "\n" + json.dumps({k: v for k, v in row.items() if k != "reward_model"}) + "\n")
    cases = [
        (["trainer.lrr=1"], "unknown config key `trainer.lrr`. Did you mean `trainer.lr`?"),
        ([f"data.train_files=[{bad}]"], "bad.jsonl"),
        (["model.path=/no/such/model"], "/no/such/model"),
        (["data.max_prompt_length=8"], "data.max_prompt_length=8"),
        (["rollout.mode=hybird"], "rollout.mode='hybird'"),
        (["reward.path=/no/such/reward.py"], "/no/such/reward.py"),
        (["engine.spec_verify_curve=/no/such/gpu_check.json"], "cannot read a JSON from /no/such/gpu_check.json"),
        (["trainer.world_size=64"], "trainer.world_size=64 needs 64 CPU cores (one per rank)"),
        (["trainer.world_size=4", "trainer.shard_size=3"], "trainer.shard_size=3 must be 0"),
    ]
    code, out = run_cli(tmp_path, *cases[0][0])
    assert code == 2 and cases[0][1] in " ".join(out.split()) and "Traceback" not in out, out
    LATER = {f"data.train_files=[{bad}]", "data.max_prompt_length=8"}  # found in the rows, read once the run has its folder
    (tmp_path / "a-file").write_text("")
    cases += [
        ([f"run.output_dir={tmp_path / 'a-file' / 'run'}"], f"{tmp_path / 'a-file'} is a file, not a folder"),
        ([f"data.train_files=[{tmp_path / 'missing.parquet'}]"], "data.train_files: "),
    ]
    children = set(psutil.Process().children(recursive=True))
    for i, (args, message) in enumerate(cases):
        folder = tmp_path / f"r{i}"
        code = main(["train", SMOKE, f"run.output_dir={folder}", *QUIET, *args])
        captured = capsys.readouterr()
        out = captured.out + captured.err
        assert code == 2, (args, out)
        assert message in " ".join(out.split()), (args, out)
        assert "Traceback" not in out
        # found before the run began: not even its folder was made; the rest before any step ran
        assert folder.exists() == (args[0] in LATER), args  # found before the run began: not even its folder made
        assert not (folder / "metrics.jsonl").exists()  # and nothing ran
        assert set(psutil.Process().children(recursive=True)) <= children, args  # nothing left running
    assert main(["train", SMOKE, f"run.output_dir={tmp_path / 'r'}", *QUIET, f"data.train_files=[{bad}]"]) == 2
    out = capsys.readouterr().out
    assert "row 1" in out and "reward_model" in out


@pytest.mark.e2e
def test_a_crashing_reward_function_names_the_sample(tmp_path):
    reward = tmp_path / "crash.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                      "    raise KeyError('no such field')\n")
    code, out = run_cli(tmp_path, f"reward.path={reward}")
    assert code == 1 and "Traceback" not in out
    flat = " ".join(out.split())
    assert "sample 1:" in flat and "KeyError" in flat and "no such field" in flat

    run = train(tmp_path, f"reward.path={reward}", "reward.on_error=zero", "run.total_steps=1", *QUIET,
                name="zeroed")
    m = metrics_of(run)[1]
    assert m["reward/errors"] == 16 and m["critic/score/mean"] == 0.0  # 4 prompts x 4 responses
    assert m["reward/timeouts"] == 0


HANGING_REWARD = """
import os, time

with open(os.environ["RLBOOST_TEST_REWARD_PIDS"], "a") as pids:  # the reward workers, as they start
    pids.write(f"{os.getpid()}\\n")


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    time.sleep(3600)
"""


@pytest.mark.e2e
def test_a_hanging_reward_function_is_timed_out_and_leaves_no_worker(tmp_path, monkeypatch):
    """It froze the run: nothing timed it out. Now under on_error=raise the run ends with one line
    naming the sample, and under zero it trains on zeros, counting them; either way no reward worker
    is left (each hung one is killed and replaced, and the run's teardown ends the rest)."""
    import psutil

    reward, pids = tmp_path / "hang.py", tmp_path / "pids.txt"
    reward.write_text(HANGING_REWARD)
    monkeypatch.setenv("RLBOOST_TEST_REWARD_PIDS", str(pids))
    common = [f"reward.path={reward}", f"reward.timeout_s={patience(0.5):.2f}", "run.test_freq=0"]

    def running(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    def no_worker_left() -> bool:
        started = [int(p) for p in pids.read_text().split()]
        assert len(started) >= 4  # reward.num_workers (a replacement killed before its import: unrecorded)
        return not [pid for pid in started if running(pid)]

    code, out = run_cli(tmp_path, *common)
    assert code == 1 and "Traceback" not in out, out
    flat = " ".join(out.split())
    assert re.search(r"error: reward function compute_score ran past reward\.timeout_s=\S+ s on sample "
                     r"'sample 1:\d+:\d+ \(step:prompt:sample, training row \d+\)' \(data_source 'arithmetic'\)",
                     flat), out
    assert no_worker_left()

    pids.unlink()
    run = train(tmp_path, *common, "reward.on_error=zero", "run.total_steps=1", *QUIET, name="zeroed")
    m = metrics_of(run)[1]
    assert m["reward/errors"] == m["reward/timeouts"] == 16 and m["critic/score/mean"] == 0.0
    assert no_worker_left()


@pytest.mark.vllm
def test_colocated_training_on_the_vllm_backend(tmp_path):
    """engine.backend=vllm in a colocated run: the trainer's weights reach vLLM in place after every step
    (the behaviour log-probs of step 2 match the trainer's own recomputation, so PPO's KL stays at float
    noise), and every token is on-policy (the run checks it)."""
    # a large learning rate moves the weights far in one step: stale weights in vLLM would show at once
    run = train(tmp_path, "engine.backend=vllm", "model.path=tiny:qwen3", "trainer.lr=0.05", *QUIET)
    m = metrics_of(run)
    assert sorted(m) == [1, 2]
    # measured: ppo_kl at most 6e-8 with the weights reloaded; 6.6e-5 at step 2 when vLLM kept stale weights
    assert_rollout_served_the_trainers_weights(m, (1, 2))
    print(f"\nvLLM colocated: ppo_kl step 1 {m[1]['actor/ppo_kl']:.1e}, step 2 {m[2]['actor/ppo_kl']:.1e}")
