"""Hybrid rollout with real processes and real kills (SIGKILL of worker processes), each fault fired at
an exact event of the step (a worker's token count, the hand-off): every sample finishes exactly
once, on-policy, as the exact continuation of its tokens under the weights of the version it is
tagged with, with bounded waste; a fenced or frozen worker's late tokens are dropped; the step
finishes without preemptible workers at all. The fleet moves to a new version, with tensors of its
own, before each SIGKILL step and serves it in the tests after, so the samples that migrate, and
the replacements that join, are checked against the weights of their version. The step's decisions
themselves are tested without Ray in test_step_state.py."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time

import pytest

from hybrid_util import (ENGINE, advance, after_tokens, busiest, check_invariants, handed_off, heartbeat_timeout, key,
                         kill, make_whole, patience, preemptible, reference, refill, run_step, start_fleet,
                         version_weights, wait_for)
from rlboost.hybrid.handles import PREEMPTIBLE, RESERVED
from rlboost.hybrid.harness import reports_held, reserved
from rlboost.hybrid.token_ledger import read_ledger


@pytest.fixture(scope="module")
def shared_fleet(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hybrid")
    fleet, _ = start_fleet(tmp, num_preemptible=3)
    fleet.tmp = tmp
    yield fleet
    fleet.shutdown()


@pytest.fixture
def fleet(shared_fleet):
    yield shared_fleet
    make_whole(shared_fleet)


@pytest.mark.e2e
def test_unkilled_step_matches_the_single_engine(fleet):
    from rlboost.cluster.ray_setup import non_loopback_listeners

    assert os.environ.get("RAY_AUTH_MODE") == "token"  # the run's Ray demands its token
    assert fleet.manifest.version == 0  # the base weights, whose outputs `reference()` has
    out, run = run_step(fleet)
    assert non_loopback_listeners() == []  # nothing of it, workers included, listens beyond 127.0.0.1
    check_invariants(out, run, reference(), state=fleet.served())
    assert run.stats.migrated["seed_handoff"] > 0  # the reserved worker handed its partial samples over
    assert run.stats.tokens_by_kind[RESERVED] > 0 and run.stats.tokens_by_kind[PREEMPTIBLE] > 0
    assert run.stats.deaths == []


# `make test`'s short hybrid run with a real kill: seed 0 (the rest of the module is `make test-e2e`'s)
@pytest.mark.parametrize("seed", [0, pytest.param(1, marks=pytest.mark.e2e)])
def test_sigkilled_workers_lose_no_sample(fleet, seed):
    advance(fleet)  # the migrated samples are then checked against weights no other version has
    # two instances killed once each has streamed a (seeded) number of tokens
    rng = random.Random(seed)
    victims = rng.sample(range(3), 2)
    faults = [(after_tokens(preemptible(i), rng.randrange(8, 200)), kill(fleet, preemptible(i))) for i in victims]
    out, run = run_step(fleet, faults=faults)
    check_invariants(out, run, ledger_dir=fleet.tmp / "ledgers", state=fleet.served())
    assert run.stats.preemptions == 2 and run.stats.migrated["preempted"] > 0, run.stats
    assert run.stats.in_flight_at_preemption > 0
    assert any(t.migrations >= 1 for t in run.tracked.values())
    assert fleet.meter.live == len(fleet.killable()) + fleet.starting == 1  # the killed are billed no more


@pytest.mark.e2e
def test_a_noticed_instance_keeps_what_it_finishes_before_the_kill_at_its_deadline(fleet):
    """A real preemption notice, then a real SIGKILL when its deadline comes (a cloud's warning and its
    kill). The history expects the even samples of each group to end at their true lengths (at the base
    weights) and the odd ones never to end: on the noticed instance the even ones that have started stay,
    to finish at its measured speed before the kill, and the rest move at once; whatever is left `notice_margin_s`
    (scaled with the machine's load) before the kill is taken back then. Nothing is wasted, and every
    sample ends exactly once with the exact tokens of its version. The kill lands at the deadline, in
    the step or after it when the step ended first."""
    lengths = {k: len(tokens) for k, (tokens, _) in reference().items()}
    noticed = {}
    margin = patience(2.0)  # an abort's round trip, on this machine as loaded as it is
    seconds = 3 * margin

    def expected(uid: str) -> float:
        return 1e9 if int(uid.rsplit(":", 1)[1]) % 2 else lengths[key(uid)]

    def mixed(run) -> str | None:
        """The busiest instance holding samples of both kinds (the warning needs some of each on it):
        the busiest alone sometimes holds only even ones."""
        kinds = {n: {int(uid.rsplit(":", 1)[1]) % 2 for uid in w.assigned}
                 for n, w in list(run.state.workers.items()) if w.kind == PREEMPTIBLE and w.alive}
        both = [n for n in sorted(kinds) if kinds[n] == {0, 1}]
        return max(both, key=lambda n: len(run.state.workers[n].assigned)) if busiest(run) and both else None

    def warn(run):
        noticed["name"] = name = mixed(run)
        noticed["held"] = sorted(run.state.workers[name].assigned)
        noticed["kill_at"] = time.monotonic() + seconds
        fleet.notice(name, seconds)

    def deadline(run) -> bool:
        return "kill_at" in noticed and time.monotonic() >= noticed["kill_at"]

    saved, fleet.manager.cfg.notice_margin_s = fleet.manager.cfg.notice_margin_s, margin
    try:
        out, run = run_step(fleet, faults=[
            (lambda run: handed_off(run) and (b := mixed(run)) and after_tokens(lambda _: b, 8)(run), warn),
            (deadline, kill(fleet, lambda run: noticed["name"]))], expected=expected)
    finally:
        fleet.manager.cfg.notice_margin_s = saved
    check_invariants(out, run, state=fleet.served())
    odd = [uid for uid in noticed["held"] if int(uid.rsplit(":", 1)[1]) % 2]
    assert odd and len(odd) < len(noticed["held"]), noticed  # some of each kind were on the instance
    assert 0 < run.stats.kept_through_notice <= len(noticed["held"]) - len(odd)  # even ones (started, fitting) stayed
    assert run.stats.migrated["noticed"] >= len(odd)  # the odd ones moved at the notice
    assert run.stats.wasted_tokens == 0  # what stayed finished, or was taken back, before the kill
    if run.stats.preemptions == 0:  # the step ended before the deadline: the kill comes now
        wait_for(lambda: deadline(run), 60, "the notice's deadline")
        fleet.preempt(fleet.worker(noticed["name"]))


@pytest.mark.e2e
def test_a_fenced_worker_cannot_contribute(fleet):
    # fence the busiest instance once it has streamed 16 tokens after the hand-off; it keeps streaming
    fenced = {}

    def fence(run):
        fenced["name"] = busiest(run)
        fleet.fence(fenced["name"], "test: declared dead while alive")

    out, run = run_step(fleet, faults=[(lambda run: (b := busiest(run)) and after_tokens(lambda _: b, 16)(run), fence)])
    check_invariants(out, run, state=fleet.served())
    assert run.stats.fenced_tokens_dropped > 0  # it did send more, and all of it was dropped
    dead = [h for h in fleet.handles() if not h.alive]
    assert [h.name for h in dead] == [fenced["name"]] and dead[0].streaming  # still streaming


@pytest.mark.e2e
def test_what_a_worker_sent_before_a_death_found_by_other_means_is_received(fleet):
    """The manager may learn of a death from a failed call, the node table or a fence while reports the
    worker sent before it stopped wait unread (a turn can be 200 ms away, and a fast engine streams
    several reports in that time). Those tokens count (invariant 4). Here the manager's reader skips the
    busiest instance's stream until the instance has sent as many chunks more than the manager has read
    as backpressure lets it (max_unacked_reports); then the instance is frozen (SIGSTOP: it sends nothing
    more) and fenced. Held, the instance must stop once that many reports wait unread (plus the one its
    `yield` blocks on, already in its ledger), however long it is held: it is given a while (the bound
    can only be missed, never falsely broken, on a slow machine) before it is frozen; the most it had
    unread in that while shows it did run ahead. The freeze comes after that while whatever the
    instance holds then, or before it once the instance holds no sample: the balancer may have moved
    its samples to instances gone idle meanwhile (an abort's answer brings their tokens), and a step
    waiting for an unread count that can no longer come would never end, while one that ended before
    the freeze would test nothing (beside a busy machine the while is patience's many seconds)."""
    interval, ahead = ENGINE.stream_interval, fleet.manager.cfg.max_unacked_reports
    victim = {}
    hold_s = patience(1.0)
    held = contextlib.ExitStack()

    def hold_its_stream(run):
        h = victim["h"] = fleet.worker(busiest(run))
        # the reader's round running when the hold begins is over once a round without it starts
        held.enter_context(reports_held(fleet, h.name, held=lambda: victim.setdefault("held", time.monotonic())))

    def unread(run) -> dict[str, int]:
        sent = read_ledger(fleet.tmp / "ledgers" / f"{victim['h'].name}.ledger").sent
        received = dict(run.stats.received)
        return {rid: n - received.get(rid, 0) for rid, n in sent.items() if rid.rpartition("#")[0] in run.tracked}

    def held_long_enough(run) -> bool:
        """The while is over, or the victim holds no sample any more: the balancer moved them all to
        instances gone idle, and the step may end before the while does (a busy machine's patience)."""
        if "held" not in victim:
            return False
        victim["most"] = max(victim.get("most", 0), max(unread(run).values(), default=0))
        state = run.state.workers.get(victim["h"].name)
        return state is None or not state.assigned or time.monotonic() - victim["held"] >= hold_s

    def freeze_and_fence(run):
        os.kill(victim["h"].pid, signal.SIGSTOP)
        victim["sent"] = read_ledger(fleet.tmp / "ledgers" / f"{victim['h'].name}.ledger").sent
        victim["unread"] = unread(run)
        fleet.fence(victim["h"].name, "test: found dead by other means than its stream")

    try:
        out, run = run_step(fleet, faults=[
            # after the hand-off: its answers would bring the victim's tokens along with the samples
            (lambda run: handed_off(run) and (b := busiest(run)) and after_tokens(lambda _: b, 8)(run),
             hold_its_stream),
            (held_long_enough, freeze_and_fence)])
    finally:
        held.close()
        if "h" in victim:
            fleet.preempt(victim["h"])  # frozen and fenced: end it
    check_invariants(out, run, state=fleet.served())
    [(_, name, reason)] = run.stats.deaths
    assert name == victim["h"].name and reason.startswith("test:"), run.stats.deaths
    unread_at_freeze = victim["unread"]
    # it ran ahead as far as backpressure lets it (counted while held, that can include reports the reader
    # had taken but the step not yet applied: more, never less), and after the hold no further
    assert victim["most"] >= ahead * interval, victim["most"]
    assert max(unread_at_freeze.values(), default=0) <= (ahead + 1) * interval, unread_at_freeze
    lost = {rid: n - run.stats.received[rid] for rid, n in victim["sent"].items()
            if rid.rpartition("#")[0] in run.tracked}
    assert lost and max(lost.values()) <= interval, lost  # at most the one report Ray was still carrying


@pytest.mark.e2e
def test_a_frozen_worker_is_fenced_and_its_late_tokens_dropped(fleet):
    """SIGSTOP freezes a busy instance: Ray still counts it alive and its stream just goes quiet. Missed
    heartbeats and an unanswered ping get it declared dead; SIGCONT once it is lets it stream again,
    and all of it is dropped."""
    frozen = {}

    def freeze(run):
        frozen["h"] = fleet.worker(busiest(run))
        os.kill(frozen["h"].pid, signal.SIGSTOP)

    def thaw(run):
        os.kill(frozen["h"].pid, signal.SIGCONT)

    try:
        with heartbeat_timeout(fleet, patience(2.0)):  # a limit the load beside stretches
            out, run = run_step(fleet, faults=[(lambda run: busiest(run) is not None, freeze),
                                               (lambda run: "h" in frozen and not frozen["h"].alive, thaw)])
    finally:
        if "h" in frozen:
            os.kill(frozen["h"].pid, signal.SIGCONT)
    check_invariants(out, run, state=fleet.served())
    [(_, name, reason)] = run.stats.deaths
    assert name == frozen["h"].name and reason.startswith("no sign of life"), run.stats.deaths
    assert run.stats.fenced_tokens_dropped > 0


@pytest.mark.e2e
def test_all_preemptible_workers_dying_mid_step(fleet):
    kill_all = (handed_off, lambda run: [fleet.preempt(h) for h in fleet.killable()])
    out, run = run_step(fleet, faults=[kill_all])
    check_invariants(out, run, ledger_dir=fleet.tmp / "ledgers", state=fleet.served())
    assert run.stats.preemptions == 3 and run.stats.fallback
    assert run.stats.tokens_by_kind[RESERVED] > 0  # the reserved worker took the work back


@pytest.mark.e2e
def test_a_worker_at_another_weight_version_gets_no_work(fleet):
    """Invariant 1: only workers holding the step's version generate. One preemptible worker is frozen
    (SIGSTOP) when the next version, with tensors of its own, is published: its pull cannot finish, so
    it must stay idle through the step (a token of its old weights would fail the check), and serve
    again once it has pulled."""
    stale = sorted(fleet.alive(PREEMPTIBLE), key=lambda h: h.name)[0]
    before = fleet.manifest.version
    os.kill(stale.pid, signal.SIGSTOP)
    try:
        fleet.publish(version_weights(before + 1), version=before + 1)  # returns without waiting for preemptible pulls
        out, run = run_step(fleet)
        check_invariants(out, run, state=fleet.served())
        assert run.version == before + 1
        assert stale.alive and stale.version == before and stale.pull is not None
        assert run.stats.tokens_by_worker[stale.name] == 0 and run.stats.tokens_by_kind[PREEMPTIBLE] > 0
    finally:
        os.kill(stale.pid, signal.SIGCONT)
    fleet.wait_ready(timeout_s=patience(120))
    assert stale.version == before + 1 and stale.checksum == fleet.manifest.checksum


@pytest.mark.e2e
def test_zero_preemptible_workers(fleet):
    for h in fleet.alive(PREEMPTIBLE):
        fleet.preempt(h)
    out, run = run_step(fleet)  # the kills are found out during the step, as a real preemption would be
    check_invariants(out, run, state=fleet.served())
    assert run.stats.tokens_by_kind[PREEMPTIBLE] == 0
    # the window may close before a kill is found out (a loaded machine): whatever was handed to a
    # dead instance came back as a preemption and finished on the reserved worker
    assert run.stats.migrated["seed_handoff"] <= run.stats.migrated["preempted"]
    fleet.reap()
    assert fleet.alive(PREEMPTIBLE) == []
    out, run = run_step(fleet)
    check_invariants(out, run, state=fleet.served())
    assert run.stats.seed_s == pytest.approx(run.stats.rollout_s)  # nobody to hand off to: no switch



def sigkill(fleet, worker):
    return lambda run: os.kill(fleet.worker(worker(run)).pid, signal.SIGKILL)


@pytest.mark.e2e
def test_a_sigkilled_reserved_worker_is_replaced_and_the_step_finishes(fleet):
    """Issue 26 item 6. With no instance left, the reserved worker is SIGKILLed once it has streamed 16
    tokens: its replacement boots, pulls the step's version and finishes every sample from its last
    received token; nothing lost, waste as the ledgers count it."""
    version = advance(fleet)
    for h in fleet.killable():
        fleet.preempt(h)
    fleet.reap()
    [dead] = fleet.alive(RESERVED)
    out, run = run_step(fleet, handoff=None, faults=[(after_tokens(reserved, 16), sigkill(fleet, reserved))])
    check_invariants(out, run, ledger_dir=fleet.tmp / "ledgers", state=fleet.served())
    assert [name for _, name, _ in run.stats.deaths if name == dead.name] == [dead.name]
    [replacement] = fleet.alive(RESERVED)
    assert replacement.name != dead.name and replacement.version == version
    assert run.stats.tokens_by_worker[replacement.name] > 0 and run.stats.migrated["preempted"] > 0
    refill(fleet)
    out, run = run_step(fleet)  # the replacement seeds the next step as the reserved worker
    check_invariants(out, run, state=fleet.served())
    assert run.stats.tokens_by_worker[replacement.name] > 0 and run.stats.deaths == []

@pytest.mark.e2e
def test_the_timings_are_final_when_the_trainer_has_its_last_group(fleet, monkeypatch):
    """The trainer stops reading after its last group (it never resumes the generator), and the
    controller reads the step's timings right then: they must be final, whatever the loop thread is
    still doing. The loop is held once it has handed out the last group, until the timings were read,
    to make the race certain."""
    import threading

    from rlboost.hybrid.step_run import StepRun

    from rlboost.rollout.step_data import GroupDone

    execute = StepRun._execute
    handed = []
    all_out, timings_read = threading.Event(), threading.Event()

    def held_execute(run, commands):
        commands = list(commands)
        execute(run, commands)
        handed.extend(c for c in commands if isinstance(c, GroupDone))
        if len(handed) == len(run.groups_by_index) and not all_out.is_set():
            all_out.set()  # the trainer has every group; the loop thread lags behind it until the timings are read
            timings_read.wait(patience(60))

    monkeypatch.setattr(StepRun, "_execute", held_execute)
    from hybrid_util import GREEDY, N, STEPS, prompts
    from rlboost.rollout import new_groups

    groups = new_groups(next(STEPS), prompts(), N, run_seed=0)
    run = fleet.manager.start_step(groups, GREEDY, version=fleet.manifest.version, seed_window_s=0.3)
    stream = run.groups()
    try:
        got = [next(stream) for _ in groups]  # as the trainer reads: exactly as many as there are groups
        stats = run.stats
        assert run.thread.is_alive()  # still held: what follows reads the timings mid-race
        assert stats.rollout_s > 0 and stats.remote_start_s is not None and stats.rollout_s >= stats.remote_start_s
        assert stats.tail_s >= 0 and stats.seed_s > 0
        remote_s, waited = run.state.remote_timings(end=run.t0 + stats.rollout_s + 0.5)
        assert remote_s >= 0 and waited == pytest.approx(0.5)
    finally:
        timings_read.set()
    run.wait()
    assert run.loop_cpu_s > 0 and not run.thread.is_alive()
    check_invariants(got, run, state=fleet.served())
