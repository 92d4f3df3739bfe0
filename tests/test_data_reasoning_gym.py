"""reasoning-gym's datasets as a data source (`data.task=reasoning_gym:NAME`): rows in veRL's schema with
disjoint splits, scored by the dataset's own checker on the entry the row's key regenerates, and every
bad name, field or value refused in one line before anything starts."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rlboost.cli import main
from rlboost.config import RLBoostConfig, load_config
from rlboost.data import DataConfig, load_datasets, task_rows
from rlboost.data.reasoning_gym import INSTRUCTION, build_dataset
from rlboost.rewards import compute_score

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
TASK = "reasoning_gym:word_sorting"


def rows(n: int, split: str = "train", seed: int = 0, **params):
    return task_rows(TASK, n, seed, split, **params)


def score(row, text: str) -> float:
    return compute_score(data_source=row.data_source, solution_str=text, ground_truth=row.ground_truth,
                         extra_info=row.extra_info)


def test_rows_are_the_datasets_entries_in_veRLs_schema():
    dataset = build_dataset("word_sorting", "{}", 0)
    for row in rows(6):
        key = row.extra_info["reasoning_gym"]
        entry = dataset[key["entry"]]
        assert row.data_source == "reasoning_gym/word_sorting" and row.ability == "reasoning"
        assert row.prompt == [{"role": "user", "content": f"{entry['question'].rstrip()}\n{INSTRUCTION}"}]
        assert row.ground_truth == entry["answer"] and key == {"dataset": "word_sorting", "config": {}, "seed": 0,
                                                               "entry": key["entry"]}
        assert set(row.to_verl()) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}


def test_the_splits_share_no_question_and_a_splits_first_rows_do_not_depend_on_its_size():
    train, val = rows(200), rows(40, "eval")
    questions = [r.prompt[0]["content"] for r in train], [r.prompt[0]["content"] for r in val]
    assert len(set(questions[0])) == 200 and len(set(questions[1])) == 40
    assert not set(questions[0]) & set(questions[1])
    assert [r.prompt for r in rows(30)] == [r.prompt for r in train[:30]]
    assert [r.prompt for r in rows(30, seed=1)] != [r.prompt for r in train[:30]]  # the seed is data.seed


def test_the_datasets_config_fields_shape_the_rows():
    for row in rows(10, max_words=4, min_words=3):
        assert 3 <= len(row.ground_truth.split(", ")) <= 4
        assert row.extra_info["reasoning_gym"]["config"] == {"max_words": 4, "min_words": 3}


def test_the_reward_is_the_datasets_checker_on_the_final_answer():
    row = rows(1)[0]
    assert score(row, f"Sorted:\nAnswer: {row.ground_truth}") == 1.0
    assert score(row, f"<answer>{row.ground_truth}</answer>") == 1.0  # reasoning-gym's own tags
    reversed_words = ", ".join(reversed(row.ground_truth.split(", ")))
    entry = build_dataset("word_sorting", "{}", 0)[row.extra_info["reasoning_gym"]["entry"]]
    partial = score(row, f"Answer: {reversed_words}")  # the checker's own partial credit, whatever it is
    assert partial < 1.0 and partial == build_dataset("word_sorting", "{}", 0).score_answer(reversed_words, entry)
    assert score(row, row.ground_truth) == 0.0  # no answer marked
    chain = task_rows("reasoning_gym:chain_sum", 1, 0, "train")[0]
    assert score(chain, f"Answer: {chain.ground_truth}") == 1.0 and score(chain, "Answer: x") == 0.0


def test_a_row_another_reasoning_gym_made_is_an_error_not_a_zero():
    row = rows(1)[0]
    with pytest.raises(ValueError, match="word_sorting entry .* regenerates with answer .*another reasoning-gym"):
        compute_score(data_source=row.data_source, solution_str="Answer: a, b", ground_truth="a, b",
                      extra_info=row.extra_info)


def test_a_row_without_the_key_is_checked_against_its_ground_truth_and_metadata():
    row = rows(1)[0]
    entry = build_dataset("word_sorting", "{}", 0)[row.extra_info["reasoning_gym"]["entry"]]
    for extra_info, expected in (({"metadata": entry["metadata"]}, 1.0), ({}, 0.0)):  # word_sorting reads its metadata
        assert compute_score(data_source=row.data_source, solution_str=f"Answer: {row.ground_truth}",
                             ground_truth=row.ground_truth, extra_info=extra_info) == expected
    chain = task_rows("reasoning_gym:chain_sum", 1, 0, "train")[0]  # chain_sum reads the answer alone
    assert compute_score(data_source=chain.data_source, solution_str=f"Answer: {chain.ground_truth}",
                         ground_truth=chain.ground_truth, extra_info=None) == 1.0


def test_the_task_and_its_fields_load_from_dotted_overrides():
    cfg = load_config(RLBoostConfig, CONFIGS / "smoke.yaml",
                      [f"data.task={TASK}", "data.reasoning_gym.max_words=4", "data.train_size=16", "data.val_size=4"])
    assert cfg.data.reasoning_gym == {"max_words": 4}
    train, val = load_datasets(cfg.data)
    assert len(train) == 16 and len(val) == 4 and all(len(r.ground_truth.split(", ")) <= 4 for r in train)


@pytest.mark.parametrize("fields, message", [
    ({"task": "reasoning_gym:word_sortng"},
     "data.task=reasoning_gym:word_sortng: reasoning-gym has no dataset 'word_sortng'; did you mean word_sorting"),
    ({"task": TASK, "reasoning_gym": {"max_wordz": 3}},
     "data.reasoning_gym: word_sorting's config refuses it: .*unexpected keyword argument 'max_wordz'"),
    ({"task": TASK, "reasoning_gym": {"min_words": 0}}, "data.reasoning_gym: word_sorting's config refuses it: "),
    ({"task": TASK, "reasoning_gym": {"seed": 3}}, r"data.reasoning_gym.seed is set by rlboost \(data.seed"),
    ({"task": "countdown", "reasoning_gym": {"max_words": 3}},
     "data.reasoning_gym is set but data.task='countdown' is not a reasoning_gym:NAME task"),
])
def test_a_bad_dataset_field_or_value_is_refused_naming_it(fields, message):
    with pytest.raises(ValueError, match=message):
        DataConfig(**fields).validate()


def test_without_the_package_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # `import reasoning_gym` raises ImportError
    with pytest.raises(ValueError, match=r"data.task=reasoning_gym:word_sorting: needs the reasoning-gym package "
                                         r".*pip install 'rlboost\[reasoning-gym\]'"):
        DataConfig(task=TASK).validate()


def test_a_bad_task_is_one_line_and_exit_2_before_the_run_starts(tmp_path, capsys):
    assert main(["train", str(CONFIGS / "smoke.yaml"), "data.task=reasoning_gym:word_sortng",
                 f"run.output_dir={tmp_path / 'run'}"]) == 2
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert "Traceback" not in text
    assert [line for line in text.splitlines() if line.startswith("error:")] == [
        "error: data.task=reasoning_gym:word_sortng: reasoning-gym has no dataset 'word_sortng'; did you mean "
        "word_sorting, number_sorting?"]
    assert not (tmp_path / "run" / "config.yaml").exists()  # refused before the run was set up
