"""Simulator performance profiles: model shapes, the decode closed forms, the engine event loop, the
calibration against veRL's published Qwen3-8B throughput."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from rlboost.sim.baselines import CALIBRATION_TARGET, colocated_run, colocated_step
from rlboost.sim.batching import KV_WATERMARK, engine_rollout
from rlboost.sim.profile import EngineProfile, ProfileConfig, TrainProfile, make_profiles
from rlboost.sim.specs import GPUSpec, H100, MODELS, ModelSpec

# --- model shapes ---


@pytest.mark.parametrize("name, published", [("qwen3-8b", 8.2e9), ("qwen3-14b", 14.8e9), ("qwen3-32b", 32.8e9)])
def test_params_match_the_published_sizes(name, published):
    assert MODELS[name].params == pytest.approx(published, rel=0.01)


def test_qwen3_8b_counts_by_hand():
    m = MODELS["qwen3-8b"]
    embed = 151936 * 4096
    attention = 4096 * 4096 * 2 + 4096 * 1024 * 2 + 2 * 128
    mlp = 3 * 4096 * 12288
    assert m.params == 2 * embed + 36 * (attention + mlp + 2 * 4096) + 4096
    assert m.matmul_params == embed + 36 * (attention - 2 * 128 + mlp) + 36 * 2 * 128
    assert m.weight_bytes == 2 * m.params
    assert m.kv_bytes_per_token() == 2 * 36 * 8 * 128 * 2 == 147456
    assert m.flops_per_token(0) == 2 * m.matmul_params
    assert m.flops_per_token(1000) - m.flops_per_token(0) == pytest.approx(4 * 36 * 32 * 128 * 1000)


# --- the decode step and its closed forms ---


def slow_advance(engine, batch, context, steps):
    return sum(engine.step_s(batch, context + k * batch) for k in range(steps))


# An 8B engine on one GPU (the default runs it at tp=2, as the RLBoost artifact does).
TP1 = ProfileConfig(tp={"qwen3-8b": 1})


def test_step_is_memory_bound_at_small_batch_and_compute_bound_at_large():
    engine = EngineProfile(MODELS["qwen3-8b"], H100, TP1)
    cfg = engine.cfg
    weight_read = MODELS["qwen3-8b"].matmul_weight_bytes / (H100.hbm_bytes_per_s * cfg.mem_efficiency)
    assert engine.step_s(1, 0) == pytest.approx(cfg.step_overhead_s + weight_read)
    compute = 512 * 2 * MODELS["qwen3-8b"].matmul_params / (H100.peak_flops * cfg.compute_mfu_decode)
    assert engine.step_s(512, 512) == pytest.approx(cfg.step_overhead_s + compute, rel=1e-3)
    default, _ = make_profiles("qwen3-8b")  # tp=2: each GPU reads half the weights
    assert default.tp == 2
    assert default.step_s(1, 0) == pytest.approx(default.overhead_s + weight_read / 2)
    assert engine.step_s(1, 100_000) > engine.step_s(1, 0)  # reading the KV cache costs time


def test_tensor_parallel_adds_all_reduce_latency_and_splits_the_reads():
    cfg = ProfileConfig(tp={"qwen3-8b": 2})
    engine = EngineProfile(MODELS["qwen3-8b"], H100, cfg)
    single = EngineProfile(MODELS["qwen3-8b"], H100, TP1)
    assert engine.tp == 2
    assert engine.overhead_s == pytest.approx(cfg.step_overhead_s + 2 * 36 * cfg.tp_allreduce_s)
    assert engine.step_s(1, 0) - engine.overhead_s == pytest.approx((single.step_s(1, 0) - single.overhead_s) / 2)


# A GPU with little compute for its bandwidth: batch 1 starts memory-bound and turns compute-bound as
# attention FLOPs outgrow KV bytes, the crossover opposite to an H100's.
WEAK = GPUSpec("weak", hbm_bytes_per_s=3.35e12, peak_flops=5e12, memory_bytes=80e9)

ADVANCE_CASES = [
    ("qwen3-8b", H100, 1, 512, 1),
    ("qwen3-8b", H100, 1, 512, 14000),
    ("qwen3-8b", H100, 128, 128 * 512, 3000),
    ("qwen3-8b", H100, 400, 400 * 20, 2000),  # compute-bound first, memory-bound after the crossover
    ("qwen3-8b", H100, 512, 0, 5),  # compute-bound throughout
    ("qwen3-32b", H100, 256, 256 * 3000.5, 777),
    ("qwen3-8b", WEAK, 1, 0, 20000),  # memory-bound first, compute-bound after
    ("qwen3-14b", WEAK, 3, 10, 1),
]


@pytest.mark.parametrize("name, gpu, batch, context, steps", ADVANCE_CASES)
def test_advance_equals_the_sum_of_steps(name, gpu, batch, context, steps):
    engine = EngineProfile(MODELS[name], gpu, ProfileConfig())
    assert engine.advance_s(batch, context, steps) == pytest.approx(slow_advance(engine, batch, context, steps),
                                                                    rel=1e-9)


def test_advance_covers_both_crossovers():
    # The cases above must exercise both orders of the two regimes, or the test proves less than it says.
    def bound(engine, batch, context):
        memory = engine._mem0 + engine._mem1 * context
        compute = engine._comp_per_sample * batch + engine._comp1 * context
        return "memory" if memory >= compute else "compute"

    h100 = EngineProfile(MODELS["qwen3-8b"], H100, ProfileConfig())
    assert (bound(h100, 400, 8000), bound(h100, 400, 8000 + 1999 * 400)) == ("compute", "memory")
    weak = EngineProfile(MODELS["qwen3-8b"], WEAK, ProfileConfig())
    assert (bound(weak, 1, 0), bound(weak, 1, 19999)) == ("memory", "compute")


def test_advance_of_nothing_is_free_and_is_additive():
    engine, _ = make_profiles("qwen3-14b")
    assert engine.advance_s(64, 1000, 0) == 0.0
    whole = engine.advance_s(64, 64 * 900, 5000)
    parts = engine.advance_s(64, 64 * 900, 1234) + engine.advance_s(64, 64 * 900 + 1234 * 64, 5000 - 1234)
    assert whole == pytest.approx(parts, rel=1e-12)
    with pytest.raises(ValueError):
        engine.step_s(0, 0)


def test_steps_within_inverts_advance():
    rng = random.Random(7)
    for name, gpu in [("qwen3-8b", H100), ("qwen3-32b", H100), ("qwen3-8b", WEAK)]:
        engine = EngineProfile(MODELS[name], gpu, ProfileConfig())
        for _ in range(40):
            batch = rng.randint(1, 512)
            context = batch * rng.uniform(0, 8000)
            seconds = rng.uniform(0, 120)
            k = engine.steps_within(batch, context, seconds)
            assert engine.advance_s(batch, context, k) <= seconds < engine.advance_s(batch, context, k + 1)


def test_steps_within_edges():
    engine, _ = make_profiles("qwen3-8b")
    first = engine.step_s(8, 4000)
    assert engine.steps_within(8, 4000, 0.0) == 0
    assert engine.steps_within(8, 4000, first * 0.999) == 0
    assert engine.steps_within(8, 4000, -1.0) == 0
    exact = engine.advance_s(8, 4000, 321)
    assert engine.steps_within(8, 4000, exact) == 321


def test_prefill():
    engine = EngineProfile(MODELS["qwen3-8b"], H100, TP1)
    assert engine.prefill_s(0) == 0.0
    one = engine.prefill_s(512)
    # Batched prompts share one weight read and one overhead.
    assert engine.prefill_s(8 * 512, sequences=8) < 8 * one
    # Longer causal attention: one sequence of 4096 costs more than eight of 512.
    assert engine.prefill_s(4096) > engine.prefill_s(4096, sequences=8)
    # Prefilling after an existing context attends to it.
    assert engine.prefill_s(512, context_before=8000) > one
    # Large prefills are compute-bound at prefill_mfu.
    big = engine.prefill_s(1_000_000, sequences=1000)
    flops = 2 * MODELS["qwen3-8b"].matmul_params * 1_000_000
    assert big == pytest.approx(flops / (H100.peak_flops * engine.cfg.prefill_mfu), rel=0.05)


def test_max_batch():
    engine, _ = make_profiles("qwen3-8b")
    m = MODELS["qwen3-8b"]
    capacity = (2 * 80e9 - m.weight_bytes) * engine.cfg.kv_memory_fraction / m.kv_bytes_per_token()  # tp=2
    assert engine.kv_capacity_tokens == pytest.approx(capacity)
    assert engine.max_batch(5000) == int(capacity // 5000) < engine.cfg.max_num_seqs
    assert engine.max_batch(10) == engine.cfg.max_num_seqs == 256  # the artifact's max_num_seqs
    tiny_gpu = GPUSpec("tiny", 3.35e12, 989e12, memory_bytes=10e9)
    assert EngineProfile(m, tiny_gpu, ProfileConfig(tp={})).tp == 4  # fallback: weights <= half the memory
    assert EngineProfile(m, tiny_gpu, TP1).max_batch(1000) == 0  # tp=1: the weights do not fit


def test_a_model_without_a_configured_tp_gets_one_its_weights_fit():
    llama70 = ModelSpec("llama-3-70b", layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128,
                        intermediate=28672, vocab=128256)
    assert llama70.params == pytest.approx(70.6e9, rel=0.01)
    assert EngineProfile(llama70, H100, ProfileConfig()).tp == 4  # 141 GB of weights in half of 4 x 80 GB


def test_tokens_per_s_grows_with_batch():
    engine, _ = make_profiles("qwen3-8b")
    speeds = [engine.tokens_per_s(b, 4096) for b in (1, 8, 64, 256)]
    assert speeds == sorted(speeds)
    assert 80 < speeds[0] < 200  # single-stream 8B decode on an H100: ~100-150 tokens/s in vLLM


def test_default_tp_and_spot_layout():
    cfg = ProfileConfig()
    assert cfg.tp == {"qwen3-8b": 2, "qwen3-14b": 2, "qwen3-32b": 2}  # the artifact runs 8B at tp=2
    for name in MODELS:
        engine, _ = make_profiles(name)
        assert engine.tp <= 2  # one engine fits a 2xH100 spot instance
        assert engine.max_batch(512 + 14336) >= 1  # a capped sample fits


# --- training and weight transfer ---


def test_train_s():
    _, train = make_profiles("qwen3-8b")
    m, cfg = MODELS["qwen3-8b"], ProfileConfig()
    expected = 1e6 * 5 * 2 * m.matmul_params / (8 * H100.peak_flops * cfg.train_mfu)
    assert train.train_s(1e6, 8) == pytest.approx(expected)
    assert train.train_s(1e6, 16) == pytest.approx(expected / 2)
    assert train.train_s(2e6, 8) == pytest.approx(2 * expected)
    assert train.train_s(1e6, 8, context=3000) > expected
    assert train.train_s(0, 8) == 0.0
    with pytest.raises(ValueError):
        train.train_s(1e6, 0)


def test_weight_sync_s():
    _, train = make_profiles("qwen3-8b")
    assert train.weight_sync_s(50.0) == pytest.approx(MODELS["qwen3-8b"].weight_bytes * 8 / 50e9)
    assert train.weight_sync_s(200.0) == pytest.approx(train.weight_sync_s(50.0) / 4)
    with pytest.raises(ValueError):
        train.weight_sync_s(0)


def test_make_profiles_names_the_valid_models():
    with pytest.raises(ValueError, match="qwen3-14b, qwen3-32b, qwen3-8b"):
        make_profiles("llama-70b")
    engine, train = make_profiles("qwen3-32b")
    assert isinstance(engine, EngineProfile) and isinstance(train, TrainProfile)


@pytest.mark.parametrize("field, value", [("mem_efficiency", 0.0), ("train_mfu", 1.5), ("step_overhead_s", -1.0),
                                          ("reserved_gbps", 0.0), ("max_num_seqs", 0), ("tp", {"qwen3-8b": 0})])
def test_config_is_validated(field, value):
    with pytest.raises(ValueError, match=field):
        make_profiles("qwen3-8b", replace(ProfileConfig(), **{field: value}))


# --- one engine's rollout, against a step-by-step reference ---


def reference_rollout(engine, lengths, prompt_len):
    """engine_rollout's rules played one decode step at a time, with every sample's context explicit."""
    capacity = engine.kv_capacity_tokens
    waiting = [[length, 0] for length in lengths]  # [length, tokens made]
    running = []  # [length, tokens made, start order]
    seconds, order, preemptions = 0.0, 0, 0
    admit = True
    while waiting or running:
        if admit:
            new = 0
            while waiting and len(running) < engine.cfg.max_num_seqs:
                length, made = waiting[0]
                total = sum(prompt_len + r[1] for r in running)
                if running and total + prompt_len + made + len(running) + 1 > (1 - KV_WATERMARK) * capacity:
                    break
                waiting.pop(0)
                running.append([length, made, order])
                order += 1
                if made:
                    seconds += engine.prefill_s(prompt_len + made)
                else:
                    new += 1
            if new:
                seconds += engine.prefill_s(new * prompt_len, sequences=new)
            admit = False
        total = sum(prompt_len + r[1] for r in running)
        if total + len(running) > capacity:
            victim = max(running, key=lambda r: r[2])
            running.remove(victim)
            waiting.insert(0, [victim[0], victim[1]])
            preemptions += 1
            continue
        seconds += engine.step_s(len(running), total)
        for r in running:
            r[1] += 1
        finished = [r for r in running if r[1] == r[0]]
        running = [r for r in running if r[1] < r[0]]
        admit = bool(finished)
    return seconds, preemptions


def test_engine_rollout_of_one_sample():
    engine, _ = make_profiles("qwen3-8b")
    result = engine_rollout(engine, [1000], 512)
    assert result.seconds == pytest.approx(engine.prefill_s(512) + engine.advance_s(1, 512, 1000))
    assert (result.preemptions, result.max_running) == (0, 1)
    assert engine_rollout(engine, [], 512).seconds == 0.0


def test_engine_rollout_matches_the_step_by_step_reference_with_slots_freeing():
    engine = EngineProfile(MODELS["qwen3-8b"], H100, ProfileConfig(max_num_seqs=3))
    lengths = [40, 7, 19, 19, 3, 55, 1, 30]
    result = engine_rollout(engine, lengths, 64)
    seconds, preemptions = reference_rollout(engine, lengths, 64)
    assert result.seconds == pytest.approx(seconds, rel=1e-9)
    assert (result.preemptions, preemptions, result.max_running) == (0, 0, 3)


def test_engine_rollout_matches_the_reference_when_the_kv_cache_overflows():
    # Memory for the weights plus ~700 tokens of KV: the samples must take turns and get evicted.
    m = MODELS["qwen3-8b"]
    gpu = GPUSpec("small", H100.hbm_bytes_per_s, H100.peak_flops, memory_bytes=m.weight_bytes + 700 * 147456)
    engine = EngineProfile(m, gpu, replace(TP1, kv_memory_fraction=1.0))
    rng = random.Random(3)
    lengths = [rng.randint(1, 300) for _ in range(12)]
    result = engine_rollout(engine, lengths, 32)
    seconds, preemptions = reference_rollout(engine, lengths, 32)
    assert result.preemptions == preemptions > 0
    assert result.seconds == pytest.approx(seconds, rel=1e-9)


def test_engine_rollout_rejects_a_sample_that_can_never_fit():
    m = MODELS["qwen3-8b"]
    gpu = GPUSpec("small", H100.hbm_bytes_per_s, H100.peak_flops, memory_bytes=m.weight_bytes + 100 * 147456)
    engine = EngineProfile(m, gpu, replace(TP1, kv_memory_fraction=1.0))
    with pytest.raises(ValueError, match="does not fit"):
        engine_rollout(engine, [200], 32)


# --- the colocated (veRL) step and the calibration ---


def test_colocated_step_composes_rollout_and_training():
    engine, train = make_profiles("qwen3-8b")
    rng = random.Random(0)
    lengths = [rng.randint(1, 14336) for _ in range(64)]
    result = colocated_step(engine, train, lengths, 512, engines=4, gpus=8)
    # veRL's SPMD rollout: each engine decodes a contiguous quarter of the batch
    slowest = max(engine_rollout(engine, lengths[16 * e:16 * (e + 1)], 512).seconds for e in range(4))
    assert result["rollout_s"] == pytest.approx(slowest)
    dealt = colocated_step(engine, train, lengths, 512, engines=4, gpus=8, dispatch="round_robin")
    assert dealt["rollout_s"] == pytest.approx(max(engine_rollout(engine, lengths[e::4], 512).seconds
                                                   for e in range(4)))
    assert dealt["rollout_s"] != pytest.approx(result["rollout_s"])
    uneven = colocated_step(engine, train, lengths[:63], 512, engines=4, gpus=8)  # the last engine takes the rest
    assert uneven["rollout_s"] == pytest.approx(max(
        [engine_rollout(engine, lengths[15 * e:15 * (e + 1)], 512).seconds for e in range(3)]
        + [engine_rollout(engine, lengths[45:63], 512).seconds]))
    with pytest.raises(ValueError, match="dispatch"):
        colocated_step(engine, train, lengths, 512, engines=4, gpus=8, dispatch="random")
    sequences = [512 + n for n in lengths]
    context = sum(s * (s - 1) / 2 for s in sequences) / sum(sequences)
    assert result["train_s"] == pytest.approx(train.train_s(sum(sequences), 8, context))
    assert result["step_s"] == pytest.approx(result["rollout_s"] + result["train_s"])
    assert result["tokens"] == sum(lengths)
    assert result["tokens_per_s"] == pytest.approx(sum(lengths) / result["step_s"])


def test_colocated_rollout_is_bound_by_the_longest_sample():
    engine, train = make_profiles("qwen3-8b")
    lengths = [14336] + [100] * 127
    result = colocated_step(engine, train, lengths, 512, engines=8, gpus=8)
    assert result["rollout_s"] >= engine.advance_s(1, 512, 14336)


def test_calibration_verl_qwen3_8b_makes_10k_tokens_per_s_per_node():
    run = colocated_run("qwen3-8b")
    assert run["tokens_per_s"] == pytest.approx(CALIBRATION_TARGET, rel=0.05)
    assert run["tokens_per_gpu_s"] == pytest.approx(1300, rel=0.08)  # the artifact's ~1,300 per GPU
    assert run["rollout_s"] > run["train_s"]  # rollout dominates a colocated step


def test_bigger_models_are_slower_per_gpu_in_order():
    per_gpu = [colocated_run(name, steps=8)["tokens_per_gpu_s"] for name in ("qwen3-8b", "qwen3-14b", "qwen3-32b")]
    assert per_gpu[0] > per_gpu[1] > per_gpu[2]
    assert per_gpu[2] > 0.2 * per_gpu[0]  # slower, not absurdly so


def test_default_factors_are_physically_plausible():
    cfg = ProfileConfig()
    assert 0.5 <= cfg.mem_efficiency <= 0.8
    assert 0.3 <= cfg.compute_mfu_decode <= 0.6
    assert 0.25 <= cfg.train_mfu <= 0.45
    assert 0.001 <= cfg.step_overhead_s <= 0.01
    assert math.isclose(cfg.train_flops_factor, 5.0)


def test_reference_rollout_is_itself_right_on_a_trivial_case():
    # With ample memory and slots, three equal samples are one batched prefill and one batched decode.
    engine, _ = make_profiles("qwen3-8b")
    lengths = [5, 5, 5]
    seconds, _ = reference_rollout(engine, lengths, 16)
    assert seconds == pytest.approx(engine.prefill_s(48, sequences=3) + engine.advance_s(3, 48, 5))


def test_the_package_re_exports_the_public_names():
    import rlboost.sim as sim

    assert sim.make_profiles is make_profiles and sim.ProfileConfig is ProfileConfig
    assert {"Workload", "WorkloadConfig", "EngineProfile", "TrainProfile", "colocated_step"} <= set(sim.__all__)
    with pytest.raises(AttributeError):
        sim.no_such_name  # noqa: B018
