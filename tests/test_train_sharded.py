"""`rlboost train` with `trainer.world_size=2`: two FSDP2 ranks on Ray behind colocated and hybrid
rollout, the world-1 run's metrics, a rank SIGKILLed mid-step and the run resumed, a run with a listener
beyond loopback stopped at start-up (bad world sizes are refused in tests/test_train.py's bad-input test)."""

from __future__ import annotations

import socket

import psutil
import pytest
import ray

from rlboost.cli import main
from rank_faults import kill_rank_before_pass
from test_train import QUIET, SMOKE, assert_rollout_served_the_trainers_weights, metrics_of, train

pytestmark = pytest.mark.e2e  # training runs on trainer ranks: `make test-e2e`

# one padded batch per micro-batch at every world size, so the two runs compute the same sums
PADDED = ["trainer.share_prompt=false", "trainer.micro_batch_groups=1"]
COMPARED = ("critic/score/mean", "response_length/mean", "actor/pg_loss", "actor/grad_norm", "actor/entropy",
            "actor/lr", "critic/advantages/mean")


def close_to(got: dict, want: dict, keys=COMPARED, rel: float = 1e-4) -> None:
    for key in keys:
        assert got[key] == pytest.approx(want[key], rel=rel, abs=1e-6), key


def test_colocated_training_at_world_2_is_world_1s(tmp_path):
    """The same run at world 1 and 2 (same data, seeds, sampled responses): the same metrics step by
    step, and a sharded checkpoint with one DCP file per rank next to a normal HF folder."""
    common = [*PADDED, "run.total_steps=3", "run.save_freq=3", "trainer.kl_coef=0.05", *QUIET]
    one = metrics_of(train(tmp_path, *common, name="one"))
    run = train(tmp_path, *common, "trainer.world_size=2", name="two")
    two = metrics_of(run)
    assert sorted(two) == sorted(one) == [1, 2, 3]
    for step in (1, 2, 3):
        close_to(two[step], one[step], keys=COMPARED + ("actor/kl_loss",))
    ckpt = run / "checkpoints" / "global_step_3"
    assert sorted(p.name for p in (ckpt / "dcp").glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    assert (ckpt / "hf" / "model.safetensors").is_file() and (ckpt / "hf" / "config.json").is_file()


def test_hybrid_training_at_world_2(tmp_path):
    """Hybrid rollout (1 reserved, 1 preemptible worker) with the ranks on the same Ray: the workers
    serve each version the ranks publish from their shards (the on-policy check passes every step, and
    the rollout's log-probs are the trainer's own), and step 1 samples and trains exactly as colocated
    world 1."""
    common = [*PADDED, "run.total_steps=2", "run.save_freq=0", "trainer.lr=1e-2", *QUIET]
    colocated = metrics_of(train(tmp_path, *common, "run.total_steps=1", name="colocated"))
    m = metrics_of(train(tmp_path, *common, "trainer.world_size=2", "rollout.mode=hybrid",
                         "rollout.hybrid.num_preemptible=1", "rollout.hybrid.seed_window_s=0.05", name="hybrid"))
    assert sorted(m) == [1, 2]
    # the version the ranks published from their shards is what the workers served. The tiny model scores
    # 0 on arithmetic, so only weight decay moves the weights, hence the large learning rate. Measured:
    # |ppo_kl| at most 3.9e-8 and probs_diff_max at most 4.5e-8; with workers that skip every pull after
    # their first, ppo_kl 8.6e-6 and probs_diff_max 3.0e-5 at step 2 (only the KL bound catches that)
    assert_rollout_served_the_trainers_weights(m, (1, 2))
    close_to(m[1], colocated[1])
    assert m[2]["actor/optimizer_steps"] == 1 and "spot/instances" in m[2]


def test_a_rank_killed_mid_step_stops_the_run_and_resume_continues(tmp_path, monkeypatch, capfd):
    """Rank 1 is SIGKILLed as the driver is about to dispatch the first micro-batch pass of step 3 (4
    groups per step dealt to 2 ranks: 2 passes a step, so the 5th pass). The run stops with an error
    naming rank 1 and step 3, keeps checkpoint 2 and metrics up to step 2; `run.resume=auto` then
    finishes with the uninterrupted run's metrics."""
    common = [*PADDED, "run.total_steps=4", "run.save_freq=2", "run.test_freq=2", "trainer.world_size=2", *QUIET]
    killed = tmp_path / "killed"
    killer = kill_rank_before_pass(monkeypatch, rank=1, before_pass=5)
    code = main(["train", SMOKE, f"run.output_dir={killed}", *common])
    monkeypatch.undo()
    out = "".join(capfd.readouterr())
    flat = " ".join(out.split())
    assert len(killer.killed) == 1
    assert code == 1 and "Traceback" not in out, out
    assert "trainer rank 1 of 2 died at step 3 (training)" in flat, out
    assert sorted(metrics_of(killed)) == [1, 2]

    assert main(["train", SMOKE, f"run.output_dir={killed}", *common]) == 0  # run.resume=auto
    uninterrupted = metrics_of(train(tmp_path, *common, name="uninterrupted"))
    got = metrics_of(killed)
    assert sorted(got) == sorted(uninterrupted) == [1, 2, 3, 4]
    for step in (3, 4):
        close_to(got[step], uninterrupted[step], rel=1e-5)


def test_a_local_run_that_listens_beyond_loopback_stops_at_start_up(tmp_path, capfd):
    """The start-up check runs once Ray and the ranks are up: a socket of this run's driver process
    listening on every interface (never accepting: nothing can reach it) stops the run before its
    first step, with one line naming the process and the address, and no Ray left behind."""
    with socket.socket() as exposed:
        exposed.bind(("0.0.0.0", 0))
        exposed.listen()
        port = exposed.getsockname()[1]
        code = main(["train", SMOKE, f"run.output_dir={tmp_path / 'r'}", "trainer.world_size=2",
                     "run.total_steps=1", *QUIET])
    out = "".join(capfd.readouterr())
    flat = " ".join(out.split())
    assert code == 2 and "Traceback" not in out, out
    assert "cluster.ray.bind_host=127.0.0.1 but these listen beyond loopback: " in flat, out
    assert f"on 0.0.0.0:{port}" in flat and psutil.Process().name() in flat, out
    assert not ray.is_initialized() and not (tmp_path / "r" / "metrics.jsonl").exists()

