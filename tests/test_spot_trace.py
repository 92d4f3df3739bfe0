"""Spot traces (parsing, the bundled Bamboo trace, windows, sampling, compression) and TraceReplay."""

from __future__ import annotations

import math

import pytest

from rlboost.spot import (BUNDLED_TRACE, SEGMENTS, ProgressClock, ReplayActions, SpotTrace, TraceConfig,
                          TraceReplay, load_trace)


def write(tmp_path, text: str):
    path = tmp_path / "trace.csv"
    path.write_text(text)
    return path


# --- parsing ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, line, words", [
    ("time,count\n0,1\n", 1, "header"),
    ("time_s,available_instances\n0,3\n60\n", 3, "2 columns"),
    ("time_s,available_instances\n0,3\n60,2,7\n", 3, "2 columns"),
    ("time_s,available_instances\n0,3\nsoon,2\n", 3, "not a number"),
    ("time_s,available_instances\n0,3\n60,many\n", 3, "not a number"),
    ("time_s,available_instances\n0,3\n60,-1\n", 3, ">= 0"),
    ("time_s,available_instances\n0,3\n60,2.5\n", 3, "whole number"),
    ("time_s,available_instances\n0,3\n60,2\n60,4\n", 4, "does not increase"),
    ("time_s,available_instances\n0,3\n60,2\n30,4\n", 4, "does not increase"),
    ("time_s,available_instances\n-5,3\n", 2, ">= 0"),
    ("time_s,available_instances\n0,3\n60,nan\n", 3, "whole number"),
    ("time_s,available_instances\n0,3\n60,inf\n", 3, "whole number"),
    ("time_s,available_instances\n0,3\nnan,2\n", 3, "finite"),
    ("time_s,available_instances\n0,3\n1e400,2\n", 3, "finite"),
])
def test_parse_errors_name_file_and_line(tmp_path, text, line, words):
    path = write(tmp_path, text)
    with pytest.raises(ValueError) as e:
        SpotTrace.from_csv(path)
    assert f"{path}:{line}:" in str(e.value)
    assert words in str(e.value)


def test_a_file_that_is_not_text_is_named_with_its_line(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_bytes(b"time_s,available_instances\n0,3\n60,\xff\xfe\n")
    with pytest.raises(ValueError, match="not UTF-8 text") as e:
        SpotTrace.from_csv(path)
    assert f"{path}:3:" in str(e.value)
    with pytest.raises(ValueError, match="cannot read the trace file") as e:
        SpotTrace.from_csv(tmp_path)  # a folder
    assert str(tmp_path) in str(e.value)


@pytest.mark.parametrize("text, words", [("", "empty"), ("\n\n", "empty"), ("time_s,available_instances\n", "no data")])
def test_empty_files_are_rejected_by_name(tmp_path, text, words):
    path = write(tmp_path, text)
    with pytest.raises(ValueError, match=words) as e:
        SpotTrace.from_csv(path)
    assert str(path) in str(e.value)


def test_parse_tolerates_spaces_and_blank_lines(tmp_path):
    trace = SpotTrace.from_csv(write(tmp_path, "time_s, available_instances\n0, 3\n\n60,5.0\n"))
    assert trace.times_s == (0.0, 60.0) and trace.counts == (3, 5)
    with_bom = (tmp_path / "excel.csv")
    with_bom.write_bytes(b"\xef\xbb\xbftime_s,available_instances\r\n0,3\r\n60,5\r\n")  # a spreadsheet's export
    assert SpotTrace.from_csv(with_bom) == trace


def test_available_at_is_a_step_function():
    trace = SpotTrace((10.0, 20.0, 30.0), (4, 2, 6))
    assert [trace.available_at(t) for t in (0, 9.9, 10, 19.9, 20, 30, 1e9)] == [4, 4, 4, 4, 2, 6, 6]
    assert trace.duration_s == 30.0


def test_stats_weigh_time_from_zero():
    # The first count holds before the first row; the last row has no duration but its drop counts.
    stats = SpotTrace((10.0, 20.0, 30.0), (4, 2, 1)).stats()
    assert stats["mean"] == pytest.approx((4 * 20 + 2 * 10) / 30)
    assert (stats["min"], stats["max"]) == (1, 4)
    assert (stats["preemption_events"], stats["instances_lost"], stats["additions"]) == (2, 3, 0)


# --- the bundled trace -----------------------------------------------------------------------------

def test_bundled_trace_matches_its_readme():
    stats = SpotTrace.from_csv(BUNDLED_TRACE).stats()
    assert stats["min"] == 10 and stats["max"] == 32
    assert stats["mean"] == pytest.approx(24.0, abs=0.05)
    assert (stats["preemption_events"], stats["instances_lost"], stats["additions"]) == (79, 167, 83)
    assert (BUNDLED_TRACE.parent / "LICENSE.bamboo").is_file()


@pytest.mark.parametrize("name, mean, low, high, preempted", [
    ("A", 29.2, 23, 32, 33), ("B", 27.9, 18, 32, 35), ("C", 16.9, 11, 24, 26),
])
def test_named_segments_match_the_readme_table(name, mean, low, high, preempted):
    start_h, end_h = SEGMENTS[name]
    stats = SpotTrace.from_csv(BUNDLED_TRACE).segment(start_h * 3600, end_h * 3600).stats()
    assert stats["mean"] == pytest.approx(mean, abs=0.05)
    assert (stats["min"], stats["max"], stats["instances_lost"]) == (low, high, preempted)


# --- windows, sampling, compression ----------------------------------------------------------------

def test_segment_is_rebased_and_keeps_the_count_in_force():
    full = SpotTrace.from_csv(BUNDLED_TRACE)
    start, end = 5 * 3600.0, 7 * 3600.0  # B: rows at both 18000 and 25200 (both increases)
    seg = full.segment(start, end)
    assert seg.times_s[0] == 0.0 and seg.duration_s == end - start
    for t in range(int(start), int(end), 30):
        assert seg.available_at(t - start) == full.available_at(t), t
    # The change at exactly end_s belongs to the next window; the closing row repeats the last count.
    assert seg.counts[-1] == full.available_at(end - 1) != full.available_at(end)
    mid = full.segment(start + 10, end)  # the count in force at a start between rows
    assert mid.counts[0] == full.available_at(start + 10)


def test_segment_to_the_end_keeps_the_final_drop():
    full = SpotTrace.from_csv(BUNDLED_TRACE)
    assert full.segment(0, full.duration_s) == full
    tail = full.segment(10 * 3600, 1e9)  # end clipped to the trace's end
    assert tail.duration_s == full.duration_s - 10 * 3600 and tail.counts[-1] == 10
    with pytest.raises(ValueError):
        full.segment(full.duration_s, full.duration_s + 10)


def test_sampling_floors_each_row():
    full = SpotTrace.from_csv(BUNDLED_TRACE)
    half = full.sampled(0.5)
    for t in full.times_s:
        assert half.available_at(t) == full.available_at(t) // 2, t
    assert SpotTrace((0.0, 1.0), (19, 23)).sampled(0.5).counts == (9, 11)
    assert SpotTrace((0.0,), (100,)).sampled(0.29).counts == (29,)  # not 28 from 28.999999999999996
    with pytest.raises(ValueError):
        full.sampled(0)


def test_regrouping_counts_the_same_gpus_in_bigger_instances():
    single_gpu = SpotTrace((0.0, 10.0, 20.0, 30.0), (15, 14, 7, 7))
    pairs = single_gpu.regrouped(1, 2)
    assert pairs.counts == (7, 3, 3)  # 15 GPUs make 7 pairs; 14 still 7, so that row merges
    assert pairs.times_s == (0.0, 20.0, 30.0)
    assert single_gpu.regrouped(8, 2).counts == (60, 56, 28, 28)  # 8-GPU VMs split into 2-GPU instances
    assert single_gpu.regrouped(2, 2) == single_gpu
    with pytest.raises(ValueError):
        single_gpu.regrouped(0, 2)


def test_compression_divides_time():
    full = SpotTrace.from_csv(BUNDLED_TRACE)
    fast = full.compressed(60)
    assert fast.duration_s == pytest.approx(full.duration_s / 60)
    assert fast.counts == full.counts
    for t in full.times_s:
        assert fast.available_at(t / 60) == full.available_at(t)
    assert fast.stats()["mean"] == pytest.approx(full.stats()["mean"])


# --- config and load_trace -------------------------------------------------------------------------

def test_load_trace_applies_window_sample_and_compression():
    full = SpotTrace.from_csv(BUNDLED_TRACE)
    c = load_trace(TraceConfig(segment="C"))  # defaults: 50% and 60 trace seconds per run second
    assert c.duration_s == pytest.approx(120.0)
    for t in range(8 * 3600, 10 * 3600, 60):
        assert c.available_at((t - 8 * 3600) / 60) == full.available_at(t) // 2
    window = load_trace(TraceConfig(start_h=8, end_h=10, segment="", sample=0.5, time_scale=60))
    assert window == c
    whole = load_trace(TraceConfig(sample=1, time_scale=1))
    assert whole == full
    # A segment overrides start_h/end_h.
    assert load_trace(TraceConfig(segment="C", start_h=1, end_h=2)) == c


def test_load_trace_reads_a_given_file(tmp_path):
    path = write(tmp_path, "time_s,available_instances\n0,8\n600,4\n1200,6\n")
    trace = load_trace(TraceConfig(path=str(path), sample=1, time_scale=60))
    assert trace.times_s == (0.0, 10.0, 20.0) and trace.counts == (8, 4, 6)
    with pytest.raises(ValueError, match=r"rollout\.hybrid\.trace\.start_h"):
        load_trace(TraceConfig(path=str(path), start_h=1))


@pytest.mark.parametrize("overrides, name", [
    ({"segment": "D"}, "segment"),
    ({"start_h": -1}, "start_h"),
    ({"start_h": 3, "end_h": 2}, "end_h"),
    ({"sample": 0}, "sample"),
    ({"sample": 1.5}, "sample"),
    ({"time_scale": 0}, "time_scale"),
    ({"notice_s": -1}, "notice_s"),
    ({"max_instances": -1}, "max_instances"),
])
def test_trace_config_validation_names_the_field(overrides, name):
    with pytest.raises(ValueError, match=rf"rollout\.hybrid\.trace\.{name}"):
        TraceConfig(**overrides).validate()
    TraceConfig().validate()
    TraceConfig(segment="A", start_h=3, end_h=2).validate()  # window fields are ignored with a segment


# --- TraceReplay -----------------------------------------------------------------------------------

def names(n: int, prefix: str = "p") -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


def test_replay_starts_up_to_available():
    replay = TraceReplay(SpotTrace((0.0, 100.0), (3, 5)), seed=0)
    assert replay.step(0, [], 0, None).start == 3
    assert replay.step(1, ["p0"], 1, None).start == 1  # starting instances count
    assert replay.step(2, names(3), 0, None).start == 0
    assert replay.step(100, names(3), 0, None).start == 2
    limited = TraceReplay(SpotTrace((0.0,), (10,)), seed=0, max_instances=4)
    assert limited.step(0, [], 0, None).start == 4


def test_replay_respects_the_cap():
    replay = TraceReplay(SpotTrace((0.0,), (5,)), seed=0)
    assert replay.step(0, [], 0, 2).start == 2
    assert replay.step(1, ["p0"], 1, 2).start == 0  # never beyond the cap, starting included
    acts = replay.step(2, ["p1", "p2", "p10"], 0, 2)
    assert acts.release == ["p10"] and acts.kill == [] and acts.start == 0  # the most recently numbered
    assert replay.preemptions == 0 and replay.releases == 1  # releasing is not a preemption
    again = replay.step(3, ["p1", "p2", "p10"], 0, 2)  # the runtime has not carried it out yet
    assert again.release == [] and again.kill == [] and again.start == 0
    assert replay.step(4, ["p1", "p2"], 0, 0).release == ["p1", "p2"]  # cap 0 gives all back


def test_replay_kills_exactly_the_decrease_with_seeded_victims():
    trace = SpotTrace((0.0, 10.0), (6, 2))
    running = names(6)

    def victims(seed, order=running):
        replay = TraceReplay(trace, seed=seed)
        assert replay.step(5, order, 0, None).kill == []
        acts = replay.step(10, order, 0, None)
        assert replay.preemptions == 4 and acts.start == 0 and acts.release == []
        return acts.kill

    first = victims(7)
    assert len(first) == len(set(first)) == 4 and set(first) <= set(running)
    assert victims(7) == first
    assert victims(7, list(reversed(running))) == first  # independent of the order the runtime lists them
    assert any(victims(seed) != first for seed in range(8, 20))


def test_replay_does_not_kill_twice_while_the_runtime_catches_up():
    replay = TraceReplay(SpotTrace((0.0, 10.0), (4, 2)), seed=1)
    killed = replay.step(10, names(4), 0, None).kill
    assert len(killed) == 2
    lagging = replay.step(10.1, names(4), 0, None)  # the killed ones are still listed
    assert lagging.kill == [] and lagging.start == 0 and replay.preemptions == 2
    survivors = [n for n in names(4) if n not in killed]
    assert replay.step(10.2, survivors, 0, None).kill == []


def test_replay_kills_and_releases_under_a_cap():
    replay = TraceReplay(SpotTrace((0.0, 10.0), (6, 4)), seed=3)
    acts = replay.step(10, names(6), 0, 3)
    assert len(acts.kill) == 2 and len(acts.release) == 1
    assert not set(acts.kill) & set(acts.release)
    assert replay.preemptions == 2 and replay.releases == 1


def test_notice_comes_ahead_and_the_kill_follows_at_the_decrease():
    replay = TraceReplay(SpotTrace((0.0, 100.0), (4, 1)), seed=2, notice_s=30)
    running = names(4)
    assert replay.step(60, running, 0, None).notify == []  # 100 is beyond 60 + 30
    acts = replay.step(70, running, 0, None)
    assert acts.kill == [] and len(acts.notify) == 3
    assert all(t == 100.0 for _, t in acts.notify)
    doomed = [n for n, _ in acts.notify]
    assert replay.notices == 3 and replay.preemptions == 0
    # Doomed instances are not noticed twice, and no replacement starts for them before they go.
    later = replay.step(85, running, 0, None)
    assert later.notify == [] and later.kill == [] and later.start == 0
    assert replay.step(99.9, running, 0, None).kill == []
    due = replay.step(100, running, 0, None)
    assert sorted(due.kill) == sorted(doomed) and due.notify == [] and due.start == 0
    assert replay.preemptions == 3 and replay.notices == 3


def test_notice_victims_are_seeded():
    def doomed(seed):
        replay = TraceReplay(SpotTrace((0.0, 100.0), (5, 2)), seed=seed, notice_s=30)
        return replay.step(80, names(5), 0, None).notify

    assert doomed(4) == doomed(4)
    assert any(doomed(seed) != doomed(4) for seed in range(5, 20))


def test_doomed_instances_are_not_double_counted():
    # Two drops inside one notice window: each doomed group is planned against the survivors only.
    replay = TraceReplay(SpotTrace((0.0, 100.0, 110.0), (5, 4, 2)), seed=5, notice_s=30)
    acts = replay.step(85, names(5), 0, None)
    at_100 = [n for n, t in acts.notify if t == 100.0]
    at_110 = [n for n, t in acts.notify if t == 110.0]
    assert len(at_100) == 1 and len(at_110) == 2 and not set(at_100) & set(at_110)
    assert replay.step(100, names(5), 0, None).kill == at_100
    alive = [n for n in names(5) if n not in at_100]
    assert sorted(replay.step(110, alive, 0, None).kill) == sorted(at_110)
    assert replay.preemptions == 3 and replay.notices == 3


def test_a_doomed_instance_that_disappears_is_forgotten():
    replay = TraceReplay(SpotTrace((0.0, 100.0), (3, 1)), seed=0, notice_s=30)
    doomed = [n for n, _ in replay.step(80, names(3), 0, None).notify]
    assert len(doomed) == 2
    gone, remaining = doomed
    still = [n for n in names(3) if n != gone]  # it died on its own before the kill time
    assert replay.step(90, still, 0, None).kill == []
    assert gone not in replay.doomed
    assert replay.step(100, still, 0, None).kill == [remaining]
    assert replay.preemptions == 1


def test_a_missed_notice_kills_at_once():
    # A step that jumps past the drop (or an instance that appeared after the notice) gets no warning.
    replay = TraceReplay(SpotTrace((0.0, 100.0), (3, 1)), seed=0, notice_s=30)
    acts = replay.step(150, names(3), 0, None)
    assert len(acts.kill) == 2 and acts.notify == []


def test_replay_rejects_time_going_back():
    replay = TraceReplay(SpotTrace((0.0,), (3,)), seed=0)
    replay.step(10, [], 0, None)
    with pytest.raises(ValueError):
        replay.step(9, [], 0, None)


def test_replay_over_a_compressed_segment_preempts_what_the_trace_loses():
    # Drive the replay the way a provider does (tick, instantly booted instances) over segment C.
    cfg = TraceConfig(segment="C", seed=11)
    trace = load_trace(cfg)
    replay = TraceReplay.from_config(cfg)
    running: list[str] = []
    next_id = 0
    tick = 0.1
    for k in range(math.ceil(trace.duration_s / tick)):
        now = k * tick
        acts = replay.step(now, running, 0, None)
        running = [n for n in running if n not in acts.kill and n not in acts.release]
        running += [f"p{next_id + i}" for i in range(acts.start)]
        next_id += acts.start
        assert len(running) == trace.available_at(now)
    assert replay.preemptions == trace.stats()["instances_lost"]


# --- the replay's clock tied to the run's progress ---------------------------------------------------

TICK_S = 0.1  # the provider's tick
STEP_TOKENS = 1600  # a showcase step: 64 samples of ~25 tokens
RUN_TOKENS = 20 * STEP_TOKENS


def play(tokens_per_wall_s: float, train_wall_s: float, progress: bool) -> list[tuple]:
    """The showcase's replay (segment B, 10%, time_scale 20, 50 tokens per run second) on a simulated
    machine that generates `tokens_per_wall_s` while a step generates, then trains `train_wall_s` with
    no token generated, ticked like the provider; started instances are running by the next tick.
    Returns (replay time, what, instance, tokens generated, phase) of every kill and start."""
    replay = TraceReplay(load_trace(TraceConfig(segment="B", sample=0.1, time_scale=20.0)), seed=0)
    clock = ProgressClock(50.0)
    running: list[str] = []
    events: list[tuple] = []
    wall, generated = 0.0, 0

    def tick(phase: str) -> None:
        for t, actions in replay.advance(clock() if progress else wall, running, 0, None):
            for name in actions.kill:
                running.remove(name)
                events.append((round(t, 6), "kill", name, generated, phase))
            for _ in range(actions.start):
                running.append(f"pree-{len(events)}")
                events.append((round(t, 6), "start", running[-1], generated, phase))

    tick("starting")  # the provider's first tick, before the run generates: the trace's first instances
    for _ in range(RUN_TOKENS // STEP_TOKENS):
        step = {"tokens": 0}
        clock.begin(lambda step=step: step["tokens"])
        train_left = train_wall_s
        while train_left > 0:
            wall += TICK_S
            if step["tokens"] < STEP_TOKENS:
                made = min(round(tokens_per_wall_s * TICK_S), STEP_TOKENS - step["tokens"])
                step["tokens"] += made
                generated += made
                phase = "generating"
            else:
                train_left -= TICK_S
                phase = "training"
            assert clock.tokens() == generated
            tick(phase)
    return events


def test_a_replay_on_progress_meets_the_same_events_at_the_same_tokens_on_a_slow_and_a_fast_machine():
    slow, fast = play(50, train_wall_s=20.0, progress=True), play(5000, train_wall_s=0.5, progress=True)
    assert [e[:3] for e in slow] == [e[:3] for e in fast]  # the same kills and starts of the same instances
    assert sum(e[1] == "kill" for e in slow) == 4  # segment B's four drops, all played...
    assert [e[0] for e in slow[:3]] == [0.0] * 3  # (its first instances before the run generates)
    for events, tokens_per_tick in ((slow, 50 * TICK_S), (fast, 5000 * TICK_S)):
        for t, _, _, generated, phase in events[3:]:
            # ...each at its token of the run (within the tick that crossed it) while the run generates
            assert 0 <= generated - t * 50.0 <= tokens_per_tick, (t, generated)
            assert phase == "generating"
    # On wall time the same fast machine has finished before the trace's first drop: no preemption.
    assert sum(e[1] == "kill" for e in play(5000, 0.5, progress=False)) == 0
    assert sum(e[1] == "kill" for e in play(50, 20.0, progress=False)) == 4


def test_advance_plays_every_change_a_coarse_tick_jumps_over():
    trace = SpotTrace(times_s=(0.0, 10.0, 11.0, 20.0), counts=(2, 1, 2, 2))
    jumped = TraceReplay(trace, seed=0)
    jumped.step(0.0, ["a", "b"], 0, None)
    assert jumped.step(15.0, ["a", "b"], 0, None) == ReplayActions()  # step alone sees 2 then 2: nothing
    replay = TraceReplay(trace, seed=0)
    replay.advance(0.0, ["a", "b"], 0, None)
    played = replay.advance(15.0, ["a", "b"], 0, None)
    assert [(t, len(a.kill), a.start) for t, a in played] == [(10.0, 1, 0), (11.0, 0, 1), (15.0, 0, 0)]
    assert replay.preemptions == 1


def test_a_progress_clock_adds_up_the_steps_and_never_goes_back():
    clock = ProgressClock(tokens_per_s=10.0)
    assert clock() == 0.0
    first = [0]
    clock.begin(lambda: first[0])
    first[0] = 30
    assert clock() == 3.0
    clock.begin(lambda: 5)  # the first step's 30 are folded in
    assert (clock.tokens(), clock()) == (35, 3.5)
    with pytest.raises(ValueError, match="tokens_per_s"):
        ProgressClock(0.0)
    with pytest.raises(ValueError, match="rollout.hybrid.trace.tokens_per_s"):
        TraceConfig(tokens_per_s=-1.0).validate()
