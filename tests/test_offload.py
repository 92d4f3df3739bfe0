"""Adaptive offload controller: the T_seed rule, the memory per instance count, the instance cap, and
convergence on a synthetic model of the hybrid step."""

from __future__ import annotations

import json
import math

import pytest

from rlboost.configs import SHOWCASE
from rlboost.config import RLBoostConfig, load_config
from rlboost.policies.offload import OffloadConfig, OffloadController, StepTimings
from rlboost.policies.offload_loop import OffloadLoop, StepOutcome
from rlboost.spot import SpotTrace, TraceReplay


def timings(n=4, stable=True, wait_train=0.0, wait_remote=0.0, remote=30.0, train=20.0, tokens_per_s=math.nan):
    return StepTimings(instances=n, stable=stable, wait_train_s=wait_train, wait_remote_s=wait_remote,
                       remote_s=remote, train_s=train, tokens_per_s=tokens_per_s)


def controller(seed=5.0, reserved=2, **cfg):
    return OffloadController(OffloadConfig(**cfg), initial_seed_s=seed, num_reserved=reserved)


# --- the T_seed rule ---

def test_trainer_waiting_seeds_longer():
    c = controller(seed=5.0)
    assert c.update(timings(wait_train=10.0)) == pytest.approx(10.0)  # 5 + 10/2
    assert c.seed_s == pytest.approx(10.0)


def test_instances_idle_seeds_less():
    c = controller(seed=5.0)
    assert c.update(timings(wait_remote=4.0)) == pytest.approx(3.0)  # 5 - 4/2


def test_the_difference_of_the_waits_moves_t_seed():
    c = controller(seed=5.0)
    assert c.update(timings(wait_train=3.0, wait_remote=3.0)) == pytest.approx(5.0)
    assert c.update(timings(wait_train=1.0, wait_remote=7.0)) == pytest.approx(2.0)


def test_eta_damps_the_step():
    step = timings(wait_train=8.0)
    assert controller(seed=5.0, eta=1.0).update(step) == pytest.approx(13.0)
    assert controller(seed=5.0, eta=4.0).update(step) == pytest.approx(7.0)


def test_t_seed_stays_within_bounds():
    c = controller(seed=5.0, min_seed_s=1.0, max_seed_s=20.0)
    assert c.update(timings(wait_train=100.0)) == 20.0
    assert c.update(timings(wait_remote=100.0)) == 1.0
    assert controller(seed=500.0, max_seed_s=20.0).seed_s == 20.0  # the initial value too


def test_broken_measurement_changes_nothing():
    c = controller(seed=5.0)
    c.update(timings(remote=30.0, train=20.0))
    cap = c.instance_cap()
    assert c.update(timings(wait_train=math.nan, train=1.0)) == 5.0
    assert c.instance_cap() == cap and c.memory == {4: 5.0}


# --- the memory M[n] ---

def test_memory_stored_only_when_n_was_stable():
    c = controller(seed=5.0)
    c.update(timings(n=4, stable=False, wait_train=10.0))
    assert c.memory == {}
    c.update(timings(n=4, stable=True, wait_train=10.0))  # the step ran with T_seed 10, next is 15
    assert c.memory == {4: pytest.approx(10.0)} and c.seed_s == pytest.approx(15.0)
    c.update(timings(n=4, stable=False, wait_remote=20.0))  # a later unstable step leaves M[4]
    assert c.memory == {4: pytest.approx(10.0)} and c.seed_s == pytest.approx(5.0)


def test_memory_keeps_the_window_of_the_best_throughput():
    c = controller(seed=10.0)
    c.seed_for(4)
    c.update(timings(n=4, wait_train=10.0, tokens_per_s=900.0))  # ran with 10 -> 15
    c.seed_for(4)
    c.update(timings(n=4, wait_train=10.0, tokens_per_s=1000.0))  # ran with 15 -> 20: best
    c.seed_for(4)
    c.update(timings(n=4, wait_remote=30.0, tokens_per_s=950.0))  # ran with 20 -> 5: worse
    assert c.memory == {4: 15.0} and c.memory_tokens_per_s == {4: 1000.0}
    assert c.seed_for(4) == 5.0  # n held: adapting goes on from where it is
    c.update(timings(n=8, stable=False))
    assert c.seed_for(8) == 5.0 and c.seed_for(4) == 15.0  # n changed back: the best window for 4


def test_memory_reused_when_n_recurs_and_not_for_an_unseen_n():
    c = controller(seed=5.0)
    c.update(timings(n=4, wait_train=10.0))  # ran with 5: M[4] = 5, next 10
    c.update(timings(n=8, wait_remote=8.0))  # ran with 10: M[8] = 10, next 6
    assert c.seed_for(3) == pytest.approx(6.0)  # unseen: carry on from the current value
    assert c.seed_for(4) == pytest.approx(5.0)
    assert c.seed_s == pytest.approx(5.0)  # and adapting continues from there
    assert c.update(timings(n=4, wait_train=2.0)) == pytest.approx(6.0)
    assert c.seed_for(8) == pytest.approx(10.0)


# --- the instance cap ---

def test_no_cap_before_the_first_step():
    assert controller().instance_cap() is None


def test_cap_formula_uses_the_step_t_seed():
    c = controller(seed=10.0, reserved=2)
    # (t_remote·n + T_seed·N_resv) / t_train = (30·4 + 10·2) / 16 = 8.75 → 9, with the step's T_seed
    # (10), not the updated one (15).
    c.update(timings(n=4, wait_train=10.0, remote=30.0, train=16.0))
    assert c.seed_s == pytest.approx(15.0)
    assert c.instance_cap() == 9
    c.update(timings(n=4, remote=30.0, train=20.0))  # (120 + 30) / 20 = 7.5 → 8
    assert c.instance_cap() == 8
    c.update(timings(n=4, remote=25.0, train=10.0))  # (100 + 30) / 10 = 13 exactly: no round-up
    assert c.instance_cap() == 13


def test_cap_kept_when_train_time_is_not_positive():
    c = controller(seed=10.0)
    c.update(timings(remote=30.0, train=16.0))
    c.update(timings(remote=30.0, train=0.0))
    assert c.instance_cap() == 9


def test_cap_clamped_to_min_and_max_instances():
    low = controller(seed=0.0, min_instances=3)
    low.update(timings(n=1, remote=1.0, train=100.0))  # needs 0.01 → 1, raised to 3
    assert low.instance_cap() == 3
    high = controller(seed=0.0, max_instances=5)
    high.update(timings(n=4, remote=100.0, train=10.0))  # needs 40
    assert high.instance_cap() == 5
    assert controller(seed=0.0).update(timings(n=1, remote=1.0, train=100.0)) == 0.0
    default = controller(seed=0.0)
    default.update(timings(n=1, remote=1.0, train=100.0))
    assert default.instance_cap() == 1  # min_instances defaults to 1


# --- disabled, checkpoints, config ---

def test_disabled_controller_is_constant():
    c = controller(seed=200.0, enabled=False)  # not even clamped: the config's window is used as is
    for step in (timings(wait_train=50.0), timings(n=8, wait_remote=50.0), timings(n=4)):
        assert c.seed_for(step.instances) == 200.0
        assert c.update(step) == 200.0
    assert c.instance_cap() is None and c.memory == {}


def test_state_dict_round_trips_through_json():
    c = controller(seed=5.0)
    c.update(timings(n=4, wait_train=10.0, train=16.0, tokens_per_s=800.0))
    c.update(timings(n=8, wait_remote=2.0, train=16.0))  # an unknown throughput: stored as null
    state = json.loads(json.dumps(c.state_dict(), allow_nan=False))
    restored = controller(seed=99.0)
    restored.load_state_dict(state)
    assert restored.seed_s == c.seed_s and restored.instance_cap() == c.instance_cap()
    assert restored.memory == c.memory and all(isinstance(n, int) for n in restored.memory)
    assert restored.memory_tokens_per_s[4] == 800.0 and math.isnan(restored.memory_tokens_per_s[8])
    assert restored.seed_for(4) == c.seed_for(4)
    step = timings(n=4, wait_train=3.0, remote=12.0, train=7.0)
    assert restored.update(step) == c.update(step) and restored.instance_cap() == c.instance_cap()


def test_a_checkpoint_without_throughputs_loads():
    restored = controller(seed=99.0)
    restored.load_state_dict({"seed_s": 7.0, "cap": 3, "memory": {"4": 12.0}})  # saved before they were kept
    assert restored.memory == {4: 12.0} and restored.seed_for(4) == 12.0
    restored.update(timings(n=4, tokens_per_s=500.0))  # any measured step beats an unranked window
    assert restored.memory_tokens_per_s == {4: 500.0}


def test_disabled_controller_keeps_its_window_on_load():
    c = controller(seed=5.0)
    c.update(timings(wait_train=10.0))
    off = controller(seed=2.0, enabled=False)
    off.load_state_dict(c.state_dict())
    assert off.seed_s == 2.0 and off.seed_for(4) == 2.0


@pytest.mark.parametrize("field, value", [
    ("eta", 0.0), ("eta", -1.0), ("eta", math.inf), ("min_seed_s", -0.5), ("max_seed_s", -1.0),
    ("min_instances", -1), ("max_instances", 0),
])
def test_validate_names_the_field(field, value):
    cfg = OffloadConfig(**{field: value})
    with pytest.raises(ValueError, match=rf"rollout\.hybrid\.offload\.{field}\b"):
        cfg.validate()
    with pytest.raises(ValueError, match=field):
        OffloadController(cfg, initial_seed_s=1.0, num_reserved=1)
    OffloadConfig().validate()


# --- convergence on a synthetic hybrid step ---
#
# Rollout work W in instance-seconds (an instance generates 1 unit/s); the reserved workers generate
# R units/s; n instances. For T = min(T_seed, W/(R+n)) all generate; then the instances alone finish
# the rest, their last response at t_R = (W − R·T)/n. The trainer starts at T, consumes the stream at
# W/t_c units/s but never ahead of it, so it is done consuming at max(T + t_c, t_R), then runs the
# optimizer step (TAU s): end = max(T + t_c, t_R) + TAU, train_s = t_c + TAU.
# wait_train = end − T − train_s (trainer idle), wait_remote = end − t_R (instances idle).

W, R, TRAIN, TAU = 400.0, 2.0, 40.0, 2.0


def hybrid_step(seed_s, n):
    window = min(seed_s, W / (R + n))
    last_response = (W - R * window) / n
    end = max(window + TRAIN - TAU, last_response) + TAU
    return end, StepTimings(instances=n, stable=True, wait_train_s=end - window - TRAIN,
                            wait_remote_s=end - last_response, remote_s=last_response, train_s=TRAIN)


def best_fixed_seed(n, cfg=OffloadConfig()):
    grid = [cfg.min_seed_s + i * 0.01 for i in range(int((cfg.max_seed_s - cfg.min_seed_s) / 0.01) + 1)]
    return min(grid, key=lambda seed: hybrid_step(seed, n)[0])


def run(c, n, steps):
    for _ in range(steps):
        end, step = hybrid_step(c.seed_for(n), n)
        c.update(step)
    return end


def test_model_has_an_interior_optimum():
    best = best_fixed_seed(4)
    assert 10.0 < best < 100.0  # (W − n·(TRAIN − TAU)) / (n + R) ≈ 41.3
    assert hybrid_step(best, 4)[0] < 0.9 * min(hybrid_step(0.0, 4)[0], hybrid_step(120.0, 4)[0])


@pytest.mark.parametrize("start", [0.0, 120.0])
def test_controller_converges_to_the_best_fixed_seed(start):
    best = best_fixed_seed(4)
    c = controller(seed=start, reserved=int(R))
    end = run(c, 4, 30)
    assert c.seed_s == pytest.approx(best, rel=0.10)
    assert end == pytest.approx(hybrid_step(best, 4)[0], rel=0.02)
    # The cap is the step's instance-seconds of work over the training time: W / TRAIN instances
    # would generate as fast as the trainer consumes.
    assert c.instance_cap() == math.ceil(W / TRAIN)


def test_memory_jumps_back_to_what_was_learned_for_a_recurring_n():
    best4, best8 = best_fixed_seed(4), best_fixed_seed(8)
    assert best8 < 0.5 * best4  # twice the instances: seed much less
    c = controller(seed=0.0, reserved=int(R))
    run(c, 4, 20)
    learned4 = c.memory[4]
    # The step during which n went 4 → 8 mixes both regimes: it updates T_seed but is not remembered.
    c.update(StepTimings(4, False, 0.0, 30.0, 30.0, TRAIN))
    assert c.memory == {4: learned4}
    end = run(c, 8, 20)
    assert end == pytest.approx(hybrid_step(best8, 8)[0], rel=0.02)
    assert set(c.memory) == {4, 8}
    # Back to 4: the very first step already runs at the learned window, near the best step time...
    assert c.seed_for(4) == learned4
    assert hybrid_step(c.seed_s, 4)[0] == pytest.approx(hybrid_step(best4, 4)[0], rel=0.02)
    # ...whereas adapting from n=8's window, without memory, starts far off.
    assert hybrid_step(best8, 4)[0] > 1.1 * hybrid_step(best4, 4)[0]


def test_without_memory_nothing_is_stored_or_reused():
    c = controller(seed=5.0, memory=False)
    c.update(timings(n=4, wait_train=10.0))  # stable, would be M[4] = 5 (the step's window)
    assert c.memory == {}
    c.update(timings(n=8, wait_remote=8.0))  # 10 - 4 = 6, not remembered either
    assert c.seed_for(4) == pytest.approx(6.0)  # carries on from the current value
    assert c.instance_cap() is not None  # the rest of the controller still works
    with_memory = controller(seed=5.0)
    with_memory.update(timings(n=4, wait_train=10.0))
    with_memory.update(timings(n=8, wait_remote=8.0))
    assert with_memory.seed_for(4) == pytest.approx(5.0)


# --- the showcase: the cap advised, not enforced ---

def showcase_loop(*overrides: str) -> OffloadLoop:
    cfg = load_config(RLBoostConfig, SHOWCASE, overrides)
    h = cfg.rollout.hybrid
    return OffloadLoop(OffloadController(h.offload, h.seed_window_s, h.num_reserved,
                                         reserved_usd_per_s=cfg.cost.reserved_usd_per_s(),
                                         instance_usd_per_s=cfg.cost.instance_usd_per_s()))


def one_machine_step(instances: int, tokens: int) -> StepOutcome:
    """A steady 30 s step on one small machine: an instance shares the trainer's cores, so a step with
    one makes fewer tokens than one without."""
    return StepOutcome(instances_start=instances, instances_end=instances, preemptions=0, wall_s=30.0,
                       train_s=10.0, wait_train_s=2.0, remote_s=15.0, wait_remote_s=1.0, samples=64,
                       response_tokens=tokens, instance_s=30.0 * instances)


@pytest.mark.parametrize("enforced", [False, True], ids=["showcase", "enforce_cap=true"])
def test_with_the_showcases_settings_the_cap_gives_no_instance_back(enforced):
    loop = showcase_loop(*(["rollout.hybrid.offload.enforce_cap=true"] if enforced else []))
    caps = [loop.end(one_machine_step(1, 1500)) for _ in range(3)]  # judged after 3: explore without
    caps += [loop.end(one_machine_step(0, 1800)) for _ in range(4)]  # colocated is measured to do better
    assert loop.advised == 0  # the no-regret objective would hold none here, with either setting
    replay = TraceReplay(SpotTrace(times_s=(0.0, 60.0), counts=(3, 3)), seed=0)
    actions = replay.step(30.0, ["pree-0", "pree-1", "pree-2"], 0, caps[-1])
    if enforced:
        assert caps[-1] == 0 and actions.release == ["pree-0", "pree-1", "pree-2"]
    else:  # the showcase: no cap reaches the provider, the trace's three instances stay
        assert caps == [None] * 7 and actions.release == [] and replay.releases == 0
