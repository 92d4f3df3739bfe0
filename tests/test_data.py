"""Prompt datasets: veRL-schema files, seeded built-in tasks, the resumable train order."""

from __future__ import annotations

import json
from fractions import Fraction
from itertools import permutations

import pytest

from rlboost.data import (DataConfig, DatasetError, PromptLoader, PromptRow, arithmetic_rows,
                          check_prompt_lengths, countdown_rows, load_datasets, read_rows, task_rows,
                          write_rows)


def good_row(**changes) -> dict:
    row = {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "1 + 1?"}],
           "ability": "math", "reward_model": {"style": "rule", "ground_truth": "2"},
           "extra_info": {"split": "train", "index": 0}}
    row.update(changes)
    return row


def write_jsonl(path, records) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_round_trip(tmp_path, suffix):
    for rows in (arithmetic_rows(20, 0, "train"), countdown_rows(20, 0, "eval"),
                 [PromptRow("openai/gsm8k", [{"role": "system", "content": "Be brief."},
                                             {"role": "user", "content": "Ünïcode?"}], ground_truth="4")]):
        path = tmp_path / f"rows{suffix}"
        write_rows(rows, path)
        back = read_rows(path)
        assert back == rows
        assert str(path) in back[0].origin and "row 0" in back[0].origin


def test_read_verl_row_defaults(tmp_path):
    path = tmp_path / "min.jsonl"
    record = good_row()
    del record["ability"], record["extra_info"], record["reward_model"]["style"]
    write_jsonl(path, [record])
    (row,) = read_rows(path)
    assert (row.ability, row.extra_info, row.reward_style, row.ground_truth) == ("", {}, "rule", "2")
    assert row.to_verl()["reward_model"] == {"style": "rule", "ground_truth": "2"}


MALFORMED = [
    ("data_source", lambda r: r.pop("data_source")),
    ("data_source", lambda r: r.update(data_source=3)),
    ("prompt", lambda r: r.pop("prompt")),
    ("prompt", lambda r: r.update(prompt="What is 1 + 1?")),
    ("prompt", lambda r: r.update(prompt=[])),
    ("prompt", lambda r: r.update(prompt=[{"role": "user"}])),
    ("prompt", lambda r: r.update(prompt=[{"role": "user", "content": 5}])),
    ("prompt", lambda r: r.update(prompt=["hello"])),
    ("reward_model", lambda r: r.pop("reward_model")),
    ("reward_model", lambda r: r.update(reward_model="2")),
    ("reward_model.ground_truth", lambda r: r.update(reward_model={"style": "rule"})),
    ("reward_model.style", lambda r: r.update(reward_model={"style": 1, "ground_truth": "2"})),
    ("ability", lambda r: r.update(ability=["math"])),
    ("extra_info", lambda r: r.update(extra_info="none")),
]


@pytest.mark.parametrize("column,corrupt", MALFORMED)
def test_malformed_jsonl_rows_name_file_row_column(tmp_path, column, corrupt):
    bad = good_row()
    corrupt(bad)
    path = tmp_path / "bad.jsonl"
    write_jsonl(path, [good_row(), good_row(), bad])
    with pytest.raises(DatasetError) as info:
        read_rows(path)
    message = str(info.value)
    assert "bad.jsonl" in message and "row 2 (0-based" in message and repr(column) in message, message
    assert (info.value.row, info.value.column) == (2, column)
    if column == "prompt" and "plain string" in message:
        assert "chat messages" in message


def test_malformed_parquet_rows(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "bad.parquet"
    good = good_row()
    pq.write_table(pa.Table.from_pylist([good, good_row(prompt=[])]), path)
    with pytest.raises(DatasetError, match=r"bad\.parquet row 1 \(0-based\), column 'prompt'"):
        read_rows(path)
    del good["reward_model"]
    pq.write_table(pa.Table.from_pylist([good]), path)
    with pytest.raises(DatasetError, match=r"bad\.parquet: missing column 'reward_model'"):
        read_rows(path)
    pq.write_table(pa.Table.from_pylist([good_row(reward_model={"style": "rule"})]), path)
    with pytest.raises(DatasetError, match=r"row 0 \(0-based\), column 'reward_model.ground_truth'"):
        read_rows(path)


def test_file_errors(tmp_path):
    with pytest.raises(DatasetError, match=r"nope\.jsonl: dataset file not found"):
        read_rows(tmp_path / "nope.jsonl")
    (tmp_path / "rows.csv").write_text("a,b\n")
    with pytest.raises(DatasetError, match=r"rows\.csv.*\.parquet, \.jsonl"):
        read_rows(tmp_path / "rows.csv")
    with pytest.raises(DatasetError, match=r"rows\.json\b.*\.parquet, \.jsonl"):
        write_rows([], tmp_path / "rows.json")
    (tmp_path / "broken.jsonl").write_text(json.dumps(good_row()) + "\n\n{oops\n")
    with pytest.raises(DatasetError, match=r"broken\.jsonl row 1 \(0-based, line 3\).*invalid JSON"):
        read_rows(tmp_path / "broken.jsonl")
    (tmp_path / "junk.parquet").write_text("not parquet")
    with pytest.raises(DatasetError, match=r"junk\.parquet: not a readable parquet file"):
        read_rows(tmp_path / "junk.parquet")


@pytest.mark.parametrize("task", ["arithmetic", "countdown"])
def test_tasks_are_seeded_and_splits_disjoint(task):
    a = task_rows(task, 300, 0, "train")
    assert a == task_rows(task, 300, 0, "train") and a != task_rows(task, 300, 1, "train")
    assert task_rows(task, 50, 0, "train") == a[:50], "a split's first rows must not depend on its size"

    def key(row):  # a countdown problem is its multiset of numbers and its target, in any order
        gt = row.ground_truth
        return (tuple(sorted(gt["numbers"])), gt["target"]) if task == "countdown" else row.prompt[0]["content"]

    eval_rows = task_rows(task, 200, 0, "eval")
    assert len({key(r) for r in a}) == 300 and len({key(r) for r in eval_rows}) == 200
    assert not {key(r) for r in a} & {key(r) for r in eval_rows}
    assert {r.extra_info["split"] for r in eval_rows} == {"eval"}
    assert [r.extra_info["index"] for r in a] == list(range(300))


@pytest.mark.parametrize("digits,operators", [(1, "+"), (2, "+-"), (3, "+-*")])
def test_arithmetic_ground_truth(digits, operators):
    rows = arithmetic_rows(40, 3, "train", digits=digits, operators=operators)
    for row in rows:
        info = row.extra_info
        assert row.data_source == "arithmetic" and row.ability == "math"
        assert f"What is {info['a']} {info['op']} {info['b']}?" in row.prompt[0]["content"]
        assert "Answer:" in row.prompt[0]["content"]
        assert row.ground_truth == str(eval(f"{info['a']} {info['op']} {info['b']}"))
        assert info["op"] in operators
        for operand in (info["a"], info["b"]):
            assert len(str(operand)) == digits
    assert any(r.ground_truth.startswith("-") for r in arithmetic_rows(60, 0, "train", operators="-"))


def reachable(numbers: list[int]) -> set[Fraction]:
    """Every value of an expression using each number exactly once with + - * / (brute force)."""
    if len(numbers) == 1:
        return {Fraction(numbers[0])}
    values = set()
    for order in set(permutations(numbers)):
        for split in range(1, len(order)):
            for x in reachable(list(order[:split])):
                for y in reachable(list(order[split:])):
                    values |= {x + y, x - y, x * y}
                    if y:
                        values.add(x / y)
    return values


def test_countdown_targets_reachable():
    for row in countdown_rows(25, 0, "train") + countdown_rows(5, 0, "eval", num_numbers=4, max_number=10):
        target, numbers = row.ground_truth["target"], row.ground_truth["numbers"]
        assert row.data_source == "countdown" and 1 <= target <= 100 and all(1 <= x <= 20 for x in numbers)
        assert Fraction(target) in reachable(numbers)
        assert all(str(x) in row.prompt[0]["content"] for x in numbers)
        assert f"equals {target}" in row.prompt[0]["content"]


def test_task_errors():
    with pytest.raises(ValueError, match="unknown task 'sudoku'.*arithmetic, countdown"):
        task_rows("sudoku", 4, 0, "train")
    with pytest.raises(ValueError, match="unknown split 'test'"):
        task_rows("arithmetic", 4, 0, "test")
    with pytest.raises(ValueError, match="operators"):
        arithmetic_rows(4, 0, "train", operators="+/")
    with pytest.raises(ValueError, match="found only .* distinct eval problems"):
        arithmetic_rows(100, 0, "eval", digits=1, operators="+")


def test_data_config_validate():
    DataConfig().validate()
    for changes, field in [({"train_size": 0}, "data.train_size"), ({"val_size": -1}, "data.val_size"),
                           ({"task": "sudoku"}, "data.task"), ({"train_batch_size": 0}, "data.train_batch_size"),
                           ({"max_prompt_length": 0}, "data.max_prompt_length"),
                           ({"train_batch_size": 9, "train_size": 8}, "data.train_batch_size"),
                           ({"train_files": "a.parquet"}, "data.train_files")]:
        with pytest.raises(ValueError, match=field):
            DataConfig(**changes).validate()
    cfg = DataConfig()
    cfg.arithmetic.operators = "+^"
    with pytest.raises(ValueError, match="data.arithmetic.operators"):
        cfg.validate()
    cfg = DataConfig(task="countdown")
    cfg.countdown.num_numbers = 1
    with pytest.raises(ValueError, match="data.countdown.num_numbers"):
        cfg.validate()


def test_load_datasets(tmp_path):
    train, val = load_datasets(DataConfig(task="countdown", train_size=30, val_size=7, seed=2))
    assert (len(train), len(val)) == (30, 7)
    assert train == countdown_rows(30, 2, "train") and val == countdown_rows(7, 2, "eval")
    assert load_datasets(DataConfig(val_size=0))[1] == []

    write_rows(train[:10], tmp_path / "a.parquet")
    write_rows(train[10:], tmp_path / "b.jsonl")
    write_rows(val, tmp_path / "val.jsonl")
    files = [str(tmp_path / "a.parquet"), str(tmp_path / "b.jsonl")]
    assert load_datasets(DataConfig(train_files=files)) == (train, [])
    assert load_datasets(DataConfig(train_files=files, val_files=[str(tmp_path / "val.jsonl")])) == (train, val)

    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(DatasetError, match="no rows.*empty.jsonl"):
        load_datasets(DataConfig(train_files=[str(tmp_path / "empty.jsonl")]))
    with pytest.raises(DatasetError, match="missing.jsonl"):
        load_datasets(DataConfig(train_files=files, val_files=[str(tmp_path / "missing.jsonl")]))


def test_check_prompt_lengths(tmp_path):
    rows = arithmetic_rows(5, 0, "train")
    write_rows(rows, tmp_path / "t.jsonl")
    rows = read_rows(tmp_path / "t.jsonl")
    count = lambda row: 100 if row.extra_info["index"] == 3 else 10  # noqa: E731
    assert check_prompt_lengths(rows, count, 100) == 100
    with pytest.raises(DatasetError, match=r"t\.jsonl row 3 \(0-based\): prompt is 100 tokens.*=99"):
        check_prompt_lengths(rows, count, 99)


def drain(loader: PromptLoader, n: int) -> list[list[int]]:
    return [[i for i, _ in loader.next_batch()] for _ in range(n)]


def test_loader_epochs_and_order():
    rows = arithmetic_rows(10, 0, "train")
    loader = PromptLoader(rows, batch_size=3, seed=7)
    assert loader.batches_per_epoch == 3
    batches = drain(loader, 9)
    assert drain(PromptLoader(rows, 3, seed=7), 9) == batches
    assert drain(PromptLoader(rows, 3, seed=8), 9) != batches
    epochs = [sum(batches[e * 3:(e + 1) * 3], []) for e in range(3)]
    for epoch in epochs:
        assert len(epoch) == 9 and len(set(epoch)) == 9, "each row at most once per epoch, tail of 1 dropped"
    assert len({tuple(e) for e in epochs}) == 3, "shuffle=True reorders every epoch"
    assert (loader.epoch, loader.position) == (3, 0)
    batch = PromptLoader(rows, 3, seed=7).next_batch()
    assert all(rows[i] is row for i, row in batch)

    plain = PromptLoader(rows, 5, seed=7, shuffle=False)
    assert drain(plain, 3) == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9], [0, 1, 2, 3, 4]]
    with pytest.raises(ValueError, match="batch_size 11 is larger than the 10"):
        PromptLoader(rows, 11, seed=0)


def test_loader_resume():
    rows = arithmetic_rows(10, 0, "train")
    reference = drain(PromptLoader(rows, 4, seed=3), 12)
    for stop in (0, 1, 2, 5):
        loader = PromptLoader(rows, 4, seed=3)
        head = drain(loader, stop)
        state = json.loads(json.dumps(loader.state_dict()))
        resumed = PromptLoader(rows, 4, seed=3)
        resumed.load_state_dict(state)
        assert (resumed.epoch, resumed.position) == (loader.epoch, loader.position)
        assert head + drain(resumed, 12 - stop) == reference
    with pytest.raises(ValueError, match="num_rows"):
        PromptLoader(rows[:9], 4, seed=3).load_state_dict(state)
    with pytest.raises(ValueError, match="seed"):
        PromptLoader(rows, 4, seed=4).load_state_dict(state)
