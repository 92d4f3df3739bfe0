"""`rlboost simulate`: the table, the JSON the issue specifies (with `avg` rows), the plots, dotted
overrides of the simulator's config and clear errors for bad input."""

from __future__ import annotations

import json

import pytest

from rlboost.cli import main


def run(tmp_path, *args) -> int:
    return main(["simulate", "--models", "qwen3-8b", "--segments", "AC", "--policies", "verl,rlboost,rlboost-noseed",
                 "--plots", str(tmp_path / "plots"), *args])


def test_simulate_writes_the_json_rows_and_the_plots(tmp_path):
    assert run(tmp_path, "--json", str(tmp_path / "sim.json"), "duration_s=1800") == 0
    result = json.loads((tmp_path / "sim.json").read_text())
    rows = {(r["segment"], r["policy"]): r for r in result["results"]}
    assert set(rows) == {(s, p) for s in ("A", "C", "avg") for p in ("verl", "rlboost", "rlboost-noseed")}
    for row in rows.values():
        assert {"model", "segment", "policy", "throughput_tokens_per_s", "cost_usd", "throughput_rel_verl",
                "cost_efficiency_rel_verl"} <= set(row)
        assert row["model"] == "qwen3-8b"
    assert rows[("A", "verl")]["throughput_rel_verl"] == 1.0
    for key in ("throughput_rel_verl", "cost_efficiency_rel_verl", "throughput_tokens_per_s"):
        assert rows[("avg", "rlboost")][key] == pytest.approx((rows[("A", "rlboost")][key] + rows[("C", "rlboost")][key]) / 2)
    for segment in ("A", "C"):
        verl, hybrid = rows[(segment, "verl")], rows[(segment, "rlboost")]
        # veRL's step rolls out, then trains on the same GPUs; rlboost's overlaps the two, so its step
        # is shorter, but never below its training
        assert verl["step_s"] > verl["train_s"] > 0 and 0 < hybrid["train_s"] <= hybrid["step_s"] < verl["step_s"]
    # spot instances bought throughput on the abundant segment
    assert rows[("A", "rlboost")]["throughput_rel_verl"] > 1.2
    assert result["config"]["duration_s"] == 1800  # the override reached the simulator
    assert {p.name for p in (tmp_path / "plots").iterdir()} == {"throughput_qwen3-8b.png", "relative.png"}


@pytest.mark.parametrize("args, message", [
    (["duraton_s=10"], "unknown config key `duraton_s`"),
    (["--policies", "verl,rlboost,magic"], "unknown magic"),
    (["model=gpt5"], "simulate.model='gpt5'"),
])
def test_bad_input_exits_2_naming_it(tmp_path, capsys, args, message):
    code = main(["simulate", "--plots", str(tmp_path / "plots"), *args])
    assert code == 2
    assert message in capsys.readouterr().out.replace("\n", "")


def test_a_csv_of_ones_own_is_one_run_over_its_whole_length_or_the_windows_named(tmp_path, capsys):
    csv = tmp_path / "market.csv"
    csv.write_text("time_s,available_instances\n0,0\n1200,3\n2400,1\n5400,1\n")  # 1.5 hours
    out = tmp_path / "sim.json"
    assert run(tmp_path, f"trace.path={csv}", "--json", str(out)) == 0
    rows = json.loads(out.read_text())["results"]
    assert {r["segment"] for r in rows} == {"all", "avg"}  # not three copies labelled A, B, C
    assert "trace.sample=0.5 keeps that fraction" in capsys.readouterr().out.replace("\n", "")
    verl = next(r for r in rows if r["segment"] == "all" and r["policy"] == "verl")
    assert verl["steps"] >= 5400 / 1700  # the run covers the file's 1.5 hours (a veRL step is ~26 min)
    assert verl["worst_step_rel_verl"] == 1.0  # every step is veRL's own
    assert run(tmp_path, f"trace.path={csv}", "--windows", "0-0.5,0.5-9", "--json", str(out)) == 0
    result = json.loads(out.read_text())
    assert {r["segment"] for r in result["results"]} == {"0-0.5", "0.5-9", "avg"}


@pytest.mark.parametrize("args, message", [
    (["--windows", "2-1"], "'2-1' is empty or outside the trace"),
    (["--windows", "a-b"], "'a-b' is not a window in hours"),
])
def test_bad_windows_exit_2_naming_them(tmp_path, capsys, args, message):
    csv = tmp_path / "market.csv"
    csv.write_text("time_s,available_instances\n0,0\n3600,2\n")
    assert run(tmp_path, f"trace.path={csv}", *args) == 2
    assert message in capsys.readouterr().out.replace("\n", "")


def test_windows_are_for_a_csv_of_ones_own(tmp_path, capsys):
    assert run(tmp_path, "--windows", "0-1") == 2
    assert "--windows applies to a trace of one's own" in capsys.readouterr().out.replace("\n", "")
