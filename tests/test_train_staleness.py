"""`algorithm.max_staleness` in `rlboost train` (docs/staleness.md): the instances start the next batch
in a step's tail (`algorithm.start_ahead=tail`) or once its rollout is over, and go on while the
trainer trains; every token trained is within the bound (the loop checks each one, and a violation
fails the run); a new version swaps in between tokens on the instances; no batch is taken ahead of an
evaluation; a checkpoint keeps the prompt order as of the steps trained. The publish is placed at an
event (the batch ahead has tokens), not after a sleep."""

from __future__ import annotations

import contextlib
import json
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from hybrid_util import wait_for
from rlboost.hybrid.harness import reports_held
from rlboost.cli import main
from rlboost.hybrid.rollout import HybridRollout
from rlboost.rollout import Sample
from rlboost.train import Run, check_on_policy

REPO = Path(__file__).resolve().parents[1]
SMOKE = str(REPO / "configs" / "smoke.yaml")


def metrics_of(run_dir: Path) -> dict[int, dict]:
    return {m["step"]: m for m in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}


def place_publishes(monkeypatch, kill: bool = False, clock_moved: list[int] | None = None) -> list[bool]:
    """Each batch ahead starts with its instances' reports held (the manager reads none of their tokens,
    as from a reader fallen behind; they generate until backpressure stops them), so none of its samples
    can finish before its trainer publishes, however slow the machine: the trainer's new version lands
    while the instances hold samples of the batch ahead, as on a cluster where training takes longer.
    With `kill`, the first such publish hard-kills one of them first. Each publish releases the reports
    once the instances have the new version (a refresh decided while they held samples). Returns, per
    publish, whether a batch was ahead. A run with a progress clock appends to `clock_moved` how far it
    moved while the batch ahead's first 8 tokens came in."""
    publish, starter = HybridRollout.publish, HybridRollout._ahead_starter
    clock_moved = [] if clock_moved is None else clock_moved
    waited, killed, holds = [], [], contextlib.ExitStack()

    def held_starter(self, next_batch, params, version):
        start, build = starter(self, next_batch, params, version)
        if start is None:
            return None, None

        def held_start():
            for h in self.fleet.killable():
                holds.enter_context(reports_held(self.fleet, h.name))
            start()
        return held_start, build

    def placed(self, weights, version):
        # events of the run, waited for; the limits only bound a hang and stretch with the machine's load
        with holds:
            wait_for(lambda: self.ahead is not None or self._ahead_error is not None or self.run.on_done is None, 60,
                     "the batch ahead to start")
            waited.append(self.ahead is not None)
            if self.ahead is None:
                return publish(self, weights, version)
            held = [h for h in self.fleet.killable() if self.ahead.state.holding(h.name)]
            assert held and not self.ahead.state.done  # the reports held: nothing of it could finish
            if kill and not killed:
                self.fleet.preempt(held[0], by="the test")
                killed.append(held.pop(0).name)
            publish(self, weights, version)
            wait_for(lambda: all(h.version == version or not h.alive for h in held), 60,
                     "the instances to pull the new version")
        if self.progress is not None:
            # the run's progress (the trace's and the chaos's clock) goes on with the batch ahead's tokens
            # as they come, while this step's rollout, over, adds none: 8 more tokens ahead move it by 8
            # at least (the clock read first, so tokens that land between the two reads only add)
            before, tokens = self.progress.tokens(), self.ahead.tokens()
            wait_for(lambda: self.ahead.tokens() >= tokens + 8 or self.ahead.state.done, 60,
                     "8 more tokens of the batch ahead")
            if not self.ahead.state.done:
                clock_moved.append(self.progress.tokens() - before)

    monkeypatch.setattr(HybridRollout, "_ahead_starter", held_starter)
    monkeypatch.setattr(HybridRollout, "publish", placed)
    return waited


AHEAD = ["rollout.mode=hybrid", "rollout.hybrid.num_preemptible=2", "rollout.hybrid.seed_window_s=0.05",
         "algorithm.max_staleness=1", "trainer.loss=decoupled", "rollout.n=8", "trainer.lr=1e-2", "run.save_freq=0",
         "run.val_before_train=false", "tracking.report=false", "tracking.loggers=[jsonl]"]


@pytest.mark.e2e
def test_one_batch_ahead_stays_within_the_bound_and_swaps_versions_between_tokens(tmp_path, monkeypatch):
    clock_moved: list[int] = []
    ahead = place_publishes(monkeypatch, clock_moved=clock_moved)
    out = tmp_path / "run"
    # The chaos on the run's progress (seeded: its first kill lies past the run's tokens) gives the run
    # its progress clock, which must count the batch ahead's tokens as they come
    assert main(["train", SMOKE, f"run.output_dir={out}", "run.total_steps=5", "run.test_freq=3",
                 "data.max_response_length=360", "rollout.histopipe.enabled=true",
                 "rollout.hybrid.preempt_every_tokens=1e9", "algorithm.start_ahead=rollout_end", *AHEAD]) == 0
    m = metrics_of(out)
    # steps 1, 2 and 4 handed the rollout their successor; step 3 did not (an evaluation follows it)
    assert ahead == [True, True, False, True, False]
    assert clock_moved and all(moved >= 8 for moved in clock_moved), clock_moved
    assert all(m[step]["spot/preemptions"] == 0 for step in m)
    for step in range(1, 6):
        assert m[step]["staleness/max"] <= 1, step  # and check_on_policy refused any token past it
    for step in (2, 3, 5):  # generated ahead: tokens of the version before the step's
        assert m[step]["staleness/mean"] > 0, step
    assert m[1]["staleness/max"] == m[4]["staleness/max"] == 0  # nothing ran ahead of these
    # the new version reached instances in the middle of the batch ahead: they swapped it in between
    # tokens and the samples went on there
    assert sum(m[s]["migration/refreshed"] for s in (2, 3, 5)) > 0
    assert 0 < m[5]["actor/ess"] <= 1 + 1e-6 and "val/score/mean" in m[3] and "val/score/mean" in m[5]  # float32 sums
    # each step's responses became history once, when it was the step's, not when it started ahead:
    # by step 5, those of steps 1 to 4 (4 prompts each, all different)
    assert [m[s]["histopipe/history_prompts"] for s in range(1, 6)] == [0, 4, 8, 12, 16]


@pytest.mark.e2e
def test_an_instance_killed_while_it_generates_ahead_loses_no_sample(tmp_path, monkeypatch):
    """A hard kill of an instance holding samples of the batch ahead, placed at an event (the batch has
    tokens, the trainer is about to publish): its samples continue elsewhere from their last streamed
    token, every sample is trained once (the ledger refuses any other) and within the bound."""
    ahead = place_publishes(monkeypatch, kill=True)
    out = tmp_path / "run"
    assert main(["train", SMOKE, f"run.output_dir={out}", "run.total_steps=3", "run.test_freq=0",
                 "data.max_response_length=360", "algorithm.start_ahead=rollout_end", *AHEAD]) == 0
    m = metrics_of(out)
    assert ahead[0] and sorted(m) == [1, 2, 3]
    # the kill hit the batch ahead of step 2: counted by step 2, whose samples it held
    assert m[2]["spot/preemptions"] == 1 and m[2]["migration/preempted"] > 0
    assert all(m[s]["staleness/max"] <= 1 for s in m) and m[2]["staleness/mean"] > 0


def hold_tails(monkeypatch, kill: bool = False) -> list[dict]:
    """With start_ahead=tail: each step's tail, held open at events. When the next batch's run is built
    (the step has nothing left to place), every instance's reports are held, so neither batch's tokens
    reach the manager and the step cannot end; they are read again once the batch ahead holds samples on
    an instance that runs samples of the step too (a dispatch decision, no token needed). With `kill`,
    the first such instance is hard-killed first, holding samples of both batches. Returns, per tail:
    what the step had left when the batch ahead was built, and the shared instance's samples of each."""
    starter = HybridRollout._ahead_starter
    tails: list[dict] = []

    def held_starter(self, next_batch, params, version):
        start, build = starter(self, next_batch, params, version)
        if build is None:
            return start, build
        def held_build():  # in the loop thread of the step under way
            step = self.manager.current
            succ = build()
            tail = {"done": step.state.done, "pending": len(step.state.pending), "run": succ}
            tails.append(tail)
            holds = contextlib.ExitStack()
            for h in self.fleet.killable():
                holds.enter_context(reports_held(self.fleet, h.name))

            def release():  # events of the run, waited for: the limit only bounds a hang
                with holds:
                    def shared():
                        return [h for h in self.fleet.killable()
                                if succ.state.holding(h.name) and step.state.holding(h.name)]
                    wait_for(lambda: shared() or step.state.done, 60, "the batch ahead on an instance of the step")
                    both = shared()
                    if both:
                        tail["shared"] = (step.state.holding(both[0].name), succ.state.holding(both[0].name))
                        if kill and not any("killed" in t for t in tails):
                            tail["killed"] = both[0].name
                            self.fleet.preempt(both[0], by="the test")
            threading.Thread(target=release, daemon=True).start()
            return succ
        return start, held_build

    monkeypatch.setattr(HybridRollout, "_ahead_starter", held_starter)
    return tails


@pytest.mark.e2e
def test_the_next_batch_fills_the_free_slots_of_the_step_s_tail(tmp_path, monkeypatch):
    tails = hold_tails(monkeypatch)
    out = tmp_path / "run"
    assert main(["train", SMOKE, f"run.output_dir={out}", "run.total_steps=3", "run.test_freq=0",
                 "data.max_response_length=360", "algorithm.start_ahead=tail", *AHEAD]) == 0
    m = metrics_of(out)
    # step 1 handed its tail to step 2's batch (step 2's, adopted later, may be over before its trainer
    # comes: then step 3's batch starts at its rollout's end)
    assert tails and tails[0]["run"].groups_list[0].samples[0].uid.startswith("2:"), tails
    for tail in tails:
        assert not tail["done"] and tail["pending"] == 0  # built in the tail: nothing left to place
        assert tail["shared"][0] > 0 and tail["shared"][1] > 0  # both batches on one instance at once
    # generated in step 1's tail at version 0, trained at 1: within the bound (check_on_policy refuses any other)
    assert 0 < m[2]["staleness/mean"] and all(m[s]["staleness/max"] <= 1 for s in m)
    assert all(m[s]["spot/preemptions"] == 0 for s in m)


@pytest.mark.e2e
def test_a_kill_in_the_tail_loses_no_sample_of_either_batch_and_counts_once(tmp_path, monkeypatch):
    """A hard kill of an instance holding samples of a step and of the batch started in its tail: each
    batch's samples continue elsewhere from their last streamed token, every sample is trained once (the
    ledgers refuse any other) and within the bound, and the preemption is the step's alone."""
    tails = hold_tails(monkeypatch, kill=True)
    out = tmp_path / "run"
    assert main(["train", SMOKE, f"run.output_dir={out}", "run.total_steps=3", "run.test_freq=0",
                 "data.max_response_length=360", "algorithm.start_ahead=tail", *AHEAD]) == 0
    m = metrics_of(out)
    assert tails[0].get("killed"), tails
    assert sorted(m) == [1, 2, 3]
    assert m[1]["spot/preemptions"] == 1 and m[1]["migration/preempted"] > 0  # the step's: it ran the tail
    assert m[2]["spot/preemptions"] == 0 and m[2]["migration/preempted"] > 0  # the batch ahead's moved too
    assert all(m[s]["staleness/max"] <= 1 for s in m)


@pytest.mark.parametrize(("override", "why"), [
    ("algorithm.max_staleness=1", "algorithm.max_staleness=1 runs rollout ahead of the trainer on preemptible workers: "
                                  "it needs rollout.mode=hybrid"),
    ("algorithm.max_staleness=-1", "algorithm.max_staleness must be >= 0"),
    ("algorithm.start_ahead=soon", "algorithm.start_ahead='soon'; choose one of rollout_end, tail")])
def test_a_bound_the_run_cannot_keep_is_one_line_and_exit_2(override, why, tmp_path, capsys):
    assert main(["train", SMOKE, f"run.output_dir={tmp_path / 'run'}", override]) == 2
    out = capsys.readouterr()
    assert why in out.out + out.err and "Traceback" not in out.out + out.err
    assert not (tmp_path / "run").exists()  # found before anything started


def test_a_token_past_the_bound_stops_the_run():
    s = Sample(uid="3:0:0", prompt_ids=[1], response_ids=[4, 5, 6], logprobs=[0.0] * 3, versions=[1, 2, 3])
    group = SimpleNamespace(samples=[s])
    check_on_policy([group], version=3, max_staleness=2)
    with pytest.raises(RuntimeError, match=r"weight versions \[1\] but this step's weights are version 4 "
                                           r"\(algorithm.max_staleness=2\)"):
        check_on_policy([group], version=4, max_staleness=2)


class _Loader:
    def __init__(self):
        self.position, self.epoch = 0, 0

    def next_batch(self):
        rows = [(self.position + i, SimpleNamespace(data_source="t", ground_truth="1", extra_info={}))
                for i in range(2)]
        self.position += 2
        return rows

    def state_dict(self):
        return {"epoch": self.epoch, "position": self.position}


def test_a_batch_taken_ahead_is_the_next_step_s_and_not_in_the_checkpoint_s_prompt_order():
    cfg = SimpleNamespace(rollout=SimpleNamespace(n=2), run=SimpleNamespace(seed=0, total_steps=4, test_freq=0),
                          algorithm=SimpleNamespace(max_staleness=1))
    run = Run.__new__(Run)  # the batch bookkeeping needs only these parts
    run.cfg, run.loader, run.train_set, run.val_set = cfg, _Loader(), SimpleNamespace(ids=[[i] for i in range(99)]), \
        SimpleNamespace(rows=[])
    run.prefetched = None
    first = run.batch(1)
    assert run.loader_state() == {"epoch": 0, "position": 2}
    ahead = run.prefetcher(2)()  # the rollout takes step 2's batch during step 1
    assert run.loader_state() == {"epoch": 0, "position": 2}  # a checkpoint of step 1 resumes at batch 2
    assert run.batch(2) is ahead and run.loader_state() == {"epoch": 0, "position": 4}
    assert [g.row_index for g in first] == [0, 1] and [g.row_index for g in ahead] == [2, 3]
    assert run.may_run_ahead(1) and not run.may_run_ahead(4)  # never past the last step
    assert ahead[0].samples[0].uid == "2:0:0"  # the samples are step 2's (their seeds too)
