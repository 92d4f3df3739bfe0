"""The emulated engine (rlboost.sim.emulated) and the simulator-against-emulation check
(rlboost.bench.emulation): pace, content, exact continuation, chunking, the engine contract and its
errors (the engine's own classes), the rollout worker built on it, and a small end-to-end run of the
real control plane against the simulator."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from rlboost.engine import EngineBackend, EngineStateError, InvalidRequestError
from rlboost.engine.sampling_params import SamplingParams
from rlboost.sim.emulated import EmulatedEngine, EmulatedEngines, EmulationConfig, logprob_at, token_at, workload_seed
from rlboost.sim.batching import engine_rollout
from rlboost.sim.workload import Workload, WorkloadConfig

EOS = 2
PROMPT = [5] * 64


class FakeClock:
    """A wall clock that only moves when the engine sleeps."""

    def __init__(self):
        self.t = 1000.0
        self.slept = 0

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.t += seconds
        self.slept += 1


def config(**overrides) -> EmulationConfig:
    workload = WorkloadConfig(prompts_per_step=4, samples_per_prompt=8, prompt_len=len(PROMPT))
    return EmulationConfig(**({"workload": workload, "length_scale": 1 / 16, "max_num_seqs": 16} | overrides))


def fake_engine(cfg: EmulationConfig | None = None, eos=(EOS,)) -> tuple[EmulatedEngine, FakeClock]:
    clock = FakeClock()
    return EmulatedEngine(cfg or config(), eos, clock=clock.now, sleep=clock.sleep), clock


def params(seed: int, max_tokens: int | None = None, **kw) -> SamplingParams:
    """max_tokens: the workload's cap by default (a truncated length runs to max_tokens)."""
    return SamplingParams(max_tokens=max_tokens or config().lengths().max_response, seed=seed, **kw)


def run_all(engine: EmulatedEngine) -> tuple[dict, dict]:
    """Step until idle; returns request -> tokens and request -> (finish reason, log-probs)."""
    tokens, ends = {}, {}
    while engine.has_unfinished():
        for c in engine.step():
            got = tokens.setdefault(c.request_id, [])
            assert c.offset == len(got), "chunks must be contiguous"
            assert 1 <= len(c.token_ids) <= engine.config.stream_interval
            got += c.token_ids
            ends.setdefault(c.request_id, [None, []])[1].extend(c.logprobs)
            if c.finished:
                ends[c.request_id][0] = c.finish_reason
    return tokens, ends


def test_pace_is_the_profile_to_the_float():
    # A batch submitted together runs exactly as the simulator's engine_rollout says, at time_scale x.
    cfg = config(time_scale=2.5)
    engine, clock = fake_engine(cfg)
    seeds = [workload_seed(0, g, j) for g in range(4) for j in range(8)]
    for i, s in enumerate(seeds):
        engine.add(f"r{i}", PROMPT, params(s))
    t0 = clock.t
    tokens, _ = run_all(engine)
    lengths = [length for group in Workload(cfg.lengths()).step(0) for length in group]
    expected = engine_rollout(cfg.profiles()[0], lengths, len(PROMPT)).seconds
    assert clock.t - t0 == pytest.approx(expected * 2.5, rel=1e-9)
    assert sorted(map(len, tokens.values())) == sorted(lengths)
    # never more than stream_interval decode steps per step(): a sleep per step, a report per step
    assert clock.slept >= max(lengths) / cfg.stream_interval


class LateClock(FakeClock):
    """A wall clock whose every sleep wakes `late` seconds after it was due, as a loaded machine's does."""

    def __init__(self, late: float):
        super().__init__()
        self.late = late

    def sleep(self, seconds: float) -> None:
        super().sleep(seconds + self.late)


def test_late_wake_ups_are_not_carried_into_the_next_sleep():
    # The deadlines are absolute: however late each wake-up, the run ends one wake-up late, not one per
    # step; a run that slept relative durations would end `slept` wake-ups late.
    cfg = config(time_scale=0.25)
    clock = LateClock(late=0.01)
    engine = EmulatedEngine(cfg, (EOS,), clock=clock.now, sleep=clock.sleep)
    seeds = [workload_seed(1, g, j) for g in range(2) for j in range(8)]
    for i, s in enumerate(seeds):
        engine.add(f"r{i}", PROMPT, params(s))
    t0 = clock.t
    run_all(engine)
    lengths = [length for group in Workload(cfg.lengths()).step(1)[:2] for length in group]
    expected = engine_rollout(cfg.profiles()[0], lengths, len(PROMPT)).seconds * 0.25
    assert clock.slept > 10
    assert expected <= clock.t - t0 <= expected + clock.late + 1e-9


def test_pace_in_real_time():
    # The real clock: the engine sleeps to its deadlines, never ahead of the model, and computes little.
    # How late a loaded machine wakes it is no property of the engine (the fake clocks above test that a
    # late wake-up is not carried), so nothing here bounds the wall time from above.
    cfg = config(time_scale=0.25)
    engine = EmulatedEngine(cfg, (EOS,))
    seeds = [workload_seed(1, g, j) for g in range(2) for j in range(8)]
    for i, s in enumerate(seeds):
        engine.add(f"r{i}", PROMPT, params(s))
    t0, cpu0 = time.monotonic(), time.process_time()
    run_all(engine)
    wall, cpu = time.monotonic() - t0, time.process_time() - cpu0
    lengths = [length for group in Workload(cfg.lengths()).step(1)[:2] for length in group]
    expected = engine_rollout(cfg.profiles()[0], lengths, len(PROMPT)).seconds * 0.25
    assert expected > 1.0
    assert wall >= expected * 0.99  # never ahead of the model
    assert cpu < 0.2 * expected  # it sleeps, it does not compute


def test_lengths_content_and_finish_reasons():
    cfg = config()
    engine, _ = fake_engine(cfg)
    cap = cfg.lengths().max_response
    grid = Workload(cfg.lengths()).step(3)
    for g in range(4):
        for j in range(8):
            engine.add(f"{g}:{j}", PROMPT, params(workload_seed(3, g, j), max_tokens=cap))
    tokens, ends = run_all(engine)
    truncated = 0
    for g in range(4):
        for j in range(8):
            rid, want, seed = f"{g}:{j}", grid[g][j], workload_seed(3, g, j)
            assert len(tokens[rid]) == want
            reason, logprobs = ends[rid]
            assert logprobs == [logprob_at(seed, len(PROMPT) + i) for i in range(want)]
            body = [token_at(seed, len(PROMPT) + i, cfg.vocab, frozenset({EOS})) for i in range(want)]
            if want >= cap:  # the workload truncated it: no stop token, ends at max_tokens
                truncated += 1
                assert reason == "length" and tokens[rid] == body
            else:
                assert reason == "stop" and tokens[rid] == body[:-1] + [EOS]
                assert EOS not in tokens[rid][:-1]
    assert len({len(t) for t in tokens.values()}) > 10  # lengths really vary


def long_seed(engine: EmulatedEngine, at_least: int) -> int:
    """A workload seed whose response is at least `at_least` tokens and not truncated."""
    cap = engine.config.lengths().max_response
    return next(s for s in (workload_seed(0, g, j) for g in range(4) for j in range(8))
                if at_least <= engine.lengths(s)[0] < cap)


def test_max_tokens_and_no_stop_ids_end_with_length():
    engine, _ = fake_engine()
    seed = long_seed(engine, 30)
    natural = engine.lengths(seed)[0]
    engine.add("short", PROMPT, params(seed, max_tokens=natural - 5))
    engine.add("ignored", PROMPT, params(seed, max_tokens=natural + 20, ignore_eos=True))
    engine.add("own-stop", PROMPT, params(seed, max_tokens=natural + 20, ignore_eos=True, stop_token_ids=(1,)))
    tokens, ends = run_all(engine)
    assert len(tokens["short"]) == natural - 5 and ends["short"][0] == "length"
    assert len(tokens["ignored"]) == natural + 20 and ends["ignored"][0] == "length"
    assert len(tokens["own-stop"]) == natural and tokens["own-stop"][-1] == 1 and ends["own-stop"][0] == "stop"
    # the same seed writes the same tokens whatever ends it
    assert tokens["short"] == tokens["own-stop"][:natural - 5]


@pytest.mark.parametrize("cut_after_steps", [1, 3, 7])
def test_abort_and_resubmit_continues_exactly(cut_after_steps):
    seeds = [workload_seed(2, 0, j) for j in range(8)]
    whole, _ = fake_engine()
    for j, s in enumerate(seeds):
        whole.add(f"s{j}", PROMPT, params(s, max_tokens=400))
    reference, ref_ends = run_all(whole)

    first, _ = fake_engine()
    for j, s in enumerate(seeds):
        first.add(f"s{j}", PROMPT, params(s, max_tokens=400))
    streamed: dict[str, list[int]] = {}
    for _ in range(cut_after_steps + 1):  # a prefill, then decode steps
        for c in first.step():
            streamed.setdefault(c.request_id, []).extend(c.token_ids)
    partials = first.abort([f"s{j}" for j in range(8)])
    assert not first.has_unfinished() and partials
    second, _ = fake_engine()
    for rid, p in partials.items():
        assert p.token_ids[:len(streamed.get(rid, []))] == streamed.get(rid, [])  # the partial extends the stream
        assert p.logprobs == ref_ends[rid][1][:len(p.token_ids)]
        # what the manager does: prompt + partial, max_tokens reduced, the original prompt length
        second.add(rid, p.prompt_token_ids + p.token_ids, params(p.seed, max_tokens=400 - len(p.token_ids)),
                   prompt_len=len(PROMPT))
    rest, rest_ends = run_all(second)
    for rid, p in partials.items():
        assert p.token_ids + rest[rid] == reference[rid], rid
        assert p.logprobs + rest_ends[rid][1] == ref_ends[rid][1]
        assert rest_ends[rid][0] == ref_ends[rid][0]


def test_a_garbled_continuation_is_refused():
    engine, _ = fake_engine()
    seed = workload_seed(0, 1, 1)
    engine.add("a", PROMPT, params(seed))
    engine.step()
    engine.step()
    partial = engine.abort(["a"])["a"]
    assert partial.token_ids
    garbled = partial.token_ids[:-1] + [partial.token_ids[-1] + 1]
    with pytest.raises(InvalidRequestError, match="not an exact continuation"):
        engine.add("a#2", PROMPT + garbled, params(seed), prompt_len=len(PROMPT))
    engine.add("a#3", PROMPT + partial.token_ids, params(seed), prompt_len=len(PROMPT))


def test_chunks_hold_at_most_stream_interval_and_progress_counts_unstreamed():
    engine, _ = fake_engine(config(stream_interval=5))
    engine.add("x", PROMPT, params(workload_seed(0, 2, 2)))
    engine.add("y", PROMPT, params(workload_seed(0, 2, 3)))
    engine.step()  # prefill
    assert engine.last_step == (2, True) and engine.num_running == 2
    chunks = engine.step()
    assert engine.last_step == (2, False) and engine.last_decode_steps == 5
    assert [len(c.token_ids) for c in chunks] == [5, 5]
    assert engine.progress() == {"x": 5, "y": 5}
    engine.add("z", PROMPT, params(workload_seed(0, 2, 4)))  # a busy engine admits at the next step boundary
    engine.step()
    assert engine.progress()["x"] == 6 and engine.progress()["z"] == 0
    while engine.has_unfinished():
        assert all(len(c.token_ids) <= 5 for c in engine.step())


def test_weights_sleep_and_state_errors():
    engine, _ = fake_engine()
    engine.load_weights(None, 3)
    assert engine.weight_version == 3
    engine.add("a", PROMPT, params(workload_seed(0, 0, 0)))
    with pytest.raises(EngineStateError):
        engine.load_weights(None, 4)
    with pytest.raises(EngineStateError):
        engine.sleep()
    with pytest.raises(InvalidRequestError):
        engine.add("a", PROMPT, params(1))
    engine.abort(["a"])
    engine.sleep()
    with pytest.raises(EngineStateError):
        engine.add("b", PROMPT, params(1))
    engine.wake()
    engine.add("b", PROMPT, params(1))
    chunks = run_all(engine)[0]
    assert chunks["b"] and engine.weight_version == 3


def test_partial_load_into_the_skeleton_copies_only_the_names():
    import torch

    from rlboost.models import ModelConfig, load_model

    skeleton = load_model(ModelConfig(path="tiny:qwen3", seed=0)).model
    v1 = {n: p.detach().clone() for n, p in skeleton.named_parameters()}
    v2 = {n: p.detach().clone() for n, p in load_model(ModelConfig(path="tiny:qwen3", seed=5)).model.named_parameters()}
    clock = FakeClock()
    engine = EmulatedEngine(config(), (EOS,), model=skeleton, clock=clock.now, sleep=clock.sleep)
    named = ["model.layers.0.mlp.up_proj.weight", "lm_head.weight"]  # tied: the embedding, by its head's name
    engine.load_weights(v2, 2, names=named)
    for name, param in skeleton.named_parameters():
        moved = name in ("model.layers.0.mlp.up_proj.weight", "model.embed_tokens.weight")
        assert torch.equal(param, (v2 if moved else v1)[name]), name
    with pytest.raises(ValueError, match=r"names \['model.nope'\] are not parameters"):
        engine.load_weights(v2, 3, names=["model.nope"])
    assert engine.weight_version == 2


def test_seeds_outside_the_workload_still_draw_from_it():
    cfg = config()
    engine, _ = fake_engine(cfg)
    draws = [engine.lengths(seed)[0] for seed in range(2000)]
    assert draws == [engine.lengths(seed)[0] for seed in range(2000)]  # pure functions of the seed
    assert 1 <= min(draws) and max(draws) <= cfg.lengths().max_response
    median = sorted(draws)[1000]
    assert 0.8 * cfg.lengths().median_response <= median <= 1.2 * cfg.lengths().median_response


def test_the_emulated_engine_implements_the_engine_contract():
    engine, _ = fake_engine(config())
    assert isinstance(engine, EngineBackend)
    engine.add("a", PROMPT, params(4))
    with pytest.raises(InvalidRequestError):  # the engine's own class: callers catch one error for every backend
        engine.add("a", PROMPT, params(4))
    with pytest.raises(EngineStateError):
        engine.load_weights(None, 1)


@pytest.mark.parametrize("worker", ["rollout", "light"])
def test_rollout_worker_runs_on_the_emulated_engine(worker):
    # The one RolloutWorker class (in-process), its engine built by the emulation's factory: stream,
    # submit, abort, and a pull of real published bytes.
    from rlboost.bench.emulated_run import _tiny_fingerprint
    from rlboost.engine import EngineConfig
    from rlboost.hybrid.worker import RolloutWorker, WorkerSpec
    from rlboost.models import ModelConfig

    factory = EmulatedEngines(config(time_scale=0.02, worker=worker), _tiny_fingerprint() if worker == "light" else "")
    spec = WorkerSpec(ModelConfig(path="tiny:qwen2"), EngineConfig(device="cpu"), eos_token_ids=[EOS],
                      heartbeat_interval_s=0.1, engine_factory=factory)
    worker_ = RolloutWorker(spec)
    assert type(worker_.engine).__name__ == "EmulatedEngine" and worker_.info().max_running == 16
    # it reports the modelled engine's KV cache: where a step's tail bounds the next batch
    assert worker_.info().kv_tokens == int(factory.config.profiles()[0].kv_capacity_tokens) > 0
    assert worker_.fingerprint == _tiny_fingerprint()  # with or without a skeleton: the run's model
    sp = SamplingParams(max_tokens=1000, seed=long_seed(worker_.engine, 64))
    worker_.submit([("a", PROMPT, sp, len(PROMPT)), ("b", PROMPT, SamplingParams(max_tokens=200, seed=7), len(PROMPT))])
    got: dict[str, list[int]] = {}
    stream = worker_.stream()
    while len(got.get("a", [])) < 16:
        for c in next(stream).chunks:
            got.setdefault(c.request_id, []).extend(c.token_ids)
    partials = worker_.abort(["a"])
    assert partials["a"].token_ids[:len(got["a"])] == got["a"]
    assert worker_.engine.progress().keys() == {"b"}


def test_a_light_rollout_worker_never_imports_torch():
    # The worker's module, the emulated engine, the messages and manifest it unpickles, and a pull's
    # verification: none of them loads torch.
    code = ("import sys; import rlboost.hybrid.worker, rlboost.sim.emulated, rlboost.hybrid.wire, "
            "rlboost.cluster.manifest, rlboost.cluster.weights; "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.e2e
def test_simulated_and_emulated_steps_agree(monkeypatch):
    # The real control plane (Ray, manager, controller, fixed pool, light workers, pulls of real bytes)
    # on emulated engines, against the simulator on the same configuration. check_step, run inside,
    # asserts every group and sample exactly once, on-policy, exact tokens and the workload's lengths.
    import ray

    from rlboost.bench.emulation import CheckConfig, run_check

    taken_here = []  # report-stream items taken in this (the manager's) process: the relay's job, not ours
    take = ray.ObjectRefGenerator.__next__
    monkeypatch.setattr(ray.ObjectRefGenerator, "__next__", lambda gen: taken_here.append(1) or take(gen))
    cfg = CheckConfig(instances=2, reserved_engines=1, prompts=8, samples=4, steps=2, length_scale=1 / 48,
                      max_num_seqs=8, seed_window_s=1.0, worker="light")
    result = run_check(cfg)
    assert [e.samples for e in result.emulated] == [32, 32]
    # the manager's loop handled reports, all taken off their streams by the report relay's process
    assert all(e.reports > 0 and e.relay_cpu_s > 0 for e in result.emulated) and taken_here == []
    assert all(e.migrations > 0 for e in result.emulated[:1])  # the seeding hand-off moved samples
    assert result.memory.get("workers_with_torch", 0) == 0  # the light workers stayed torch-free
    for row in result.rows():
        assert abs(row["diff"]) < 0.25, row  # the benchmark's target is 10%; a noisy machine gets 25%
    assert abs(result.summary()["diff_total"]) < 0.15
