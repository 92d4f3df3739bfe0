"""CostMeter: hand-computed step prices, running totals, per-type prices, resume."""

from __future__ import annotations

import json

import pytest

from rlboost.spot import CostConfig, CostMeter


def test_a_step_with_reserved_and_three_instances():
    meter = CostMeter(CostConfig())  # $83.79/h reserved node, $5.32/h per 2xH100 spot instance
    m = meter.charge_step(600.0, 3 * 600.0, tokens=166_250)
    # 10 minutes: 83.79 / 6 = 13.965 reserved; 3 instances x 10 min = 0.5 h x 5.32 = 2.66 preemptible.
    assert m["cost/reserved_usd"] == pytest.approx(13.965)
    assert m["cost/preemptible_usd"] == pytest.approx(2.66)
    assert m["cost/usd"] == pytest.approx(16.625)
    assert m["cost/tokens_per_usd"] == pytest.approx(10_000.0)
    assert m["cost/total_usd"] == pytest.approx(16.625)
    assert m["cost/total_tokens_per_usd"] == pytest.approx(10_000.0)
    assert meter.instance_s == {"spot-2xH100": 1800.0}


def test_totals_accumulate():
    meter = CostMeter(CostConfig())
    meter.charge_step(600.0, 1800.0, tokens=166_250)
    m = meter.charge_step(300.0, {}, tokens=0)  # a step without preemptible instances nor tokens
    assert m["cost/usd"] == pytest.approx(6.9825) and m["cost/preemptible_usd"] == 0.0
    assert m["cost/tokens_per_usd"] == 0.0
    assert m["cost/total_usd"] == pytest.approx(16.625 + 6.9825)
    assert m["cost/total_tokens_per_usd"] == pytest.approx(166_250 / 23.6075)
    assert meter.usd == pytest.approx(23.6075) and meter.tokens == 166_250
    assert meter.reserved_usd == pytest.approx(13.965 + 6.9825) and meter.preemptible_usd == pytest.approx(2.66)
    assert meter.wall_s == 900.0


def test_prices_per_instance_type():
    cfg = CostConfig(reserved_nodes=0,
                     instance_usd_per_hour={"spot-2xH100": 5.32, "spot-8xH100": 21.28})
    meter = CostMeter(cfg)
    m = meter.charge_step(3600.0, {"spot-2xH100": 3600.0, "spot-8xH100": 1800.0}, tokens=1000)
    assert m["cost/reserved_usd"] == 0.0
    assert m["cost/preemptible_usd"] == pytest.approx(5.32 + 10.64)
    assert meter.instance_s == {"spot-2xH100": 3600.0, "spot-8xH100": 1800.0}
    with pytest.raises(ValueError, match="spot-A100"):
        meter.charge_step(1.0, {"spot-A100": 1.0}, tokens=0)


def test_reserved_only_and_free_runs():
    meter = CostMeter(CostConfig(reserved_nodes=2))
    assert meter.reserved_only_usd(1800.0) == pytest.approx(83.79)
    free = CostMeter(CostConfig(reserved_usd_per_hour=0.0, instance_usd_per_hour={"spot-2xH100": 0.0}))
    m = free.charge_step(60.0, 60.0, tokens=500)
    assert m["cost/usd"] == 0.0 and m["cost/tokens_per_usd"] == 0.0 and m["cost/total_tokens_per_usd"] == 0.0


def test_state_round_trips_through_json():
    steps = [(600.0, 1800.0, 166_250), (300.0, {"spot-2xH100": 120.0}, 4_000), (45.5, 0.0, 17)]
    straight = CostMeter(CostConfig())
    for step in steps:
        straight.charge_step(*step)

    first = CostMeter(CostConfig())
    for step in steps[:2]:
        first.charge_step(*step)
    resumed = CostMeter(CostConfig())
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    assert resumed.state_dict() == first.state_dict()
    m = resumed.charge_step(*steps[2])
    got, want = resumed.state_dict(), straight.state_dict()
    assert got.pop("instance_s") == pytest.approx(want.pop("instance_s"))
    assert got == pytest.approx(want)
    assert m["cost/total_usd"] == pytest.approx(straight.usd)
    assert resumed.tokens == straight.tokens == 170_267
    with pytest.raises(ValueError, match="tokens"):
        CostMeter(CostConfig()).load_state_dict({"usd": 1.0})


@pytest.mark.parametrize("kwargs, name", [
    ({"reserved_usd_per_hour": -1.0}, "cost.reserved_usd_per_hour"),
    ({"reserved_nodes": -1}, "cost.reserved_nodes"),
    ({"instance_type": "spot-A100"}, "cost.instance_type"),
    ({"instance_usd_per_hour": {"spot-2xH100": -0.5}}, "cost.instance_usd_per_hour.spot-2xH100"),
])
def test_config_validation_names_the_field(kwargs, name):
    with pytest.raises(ValueError, match=name.replace(".", r"\.")):
        CostConfig(**kwargs).validate()
    CostConfig().validate()


def test_bad_steps_are_rejected():
    meter = CostMeter(CostConfig())
    for wall_s, inst, tokens in [(-1.0, 0.0, 0), (1.0, -1.0, 0), (1.0, 0.0, -5)]:
        with pytest.raises(ValueError):
            meter.charge_step(wall_s, inst, tokens)
    assert meter.usd == 0.0 and meter.tokens == 0  # a rejected step charges nothing
