"""Rewards: built-in scoring rules, custom functions loaded from files, what a worker makes of a call.
The worker processes and the on_error policy: test_reward_pool.py."""

from __future__ import annotations

import sys
import threading

import numpy as np
import pytest

from rlboost.rewards import (RewardConfig, RewardConfigError, arithmetic_score, compute_score, countdown_score,
                             load_reward_fn, math_score)
from rlboost.rewards.loading import _module_name
from rlboost.rewards.wire import ReplyError, encode_reply, parse_reply
from rlboost.rewards.worker import call


@pytest.mark.parametrize("solution,score", [
    ("37 + 45 = 82.\nAnswer: 82", 1.0),
    ("Answer:82", 1.0),
    ("**Answer:** 82", 1.0),
    ("**Answer: 82**", 1.0),
    ("Answer: **82**.", 1.0),
    ("answer: 82", 1.0),
    ("Answer:\n82\n", 1.0),
    ("Answer: 81", 0.0),
    ("Answer: 82 or 83", 0.0),
    ("The result is 82", 0.0),
    ("Answer: 81\nWait, I made a mistake.\nAnswer: 82", 1.0),
    ("Answer: 82\nHmm, no.\nAnswer: 81", 0.0),
    ("Answer: eighty-two", 0.0),
    ("", 0.0),
])
def test_arithmetic_score(solution, score):
    assert arithmetic_score(solution, "82") == score
    assert compute_score("arithmetic", solution, "82") == score


def test_arithmetic_signs_and_thousands():
    assert arithmetic_score("Answer: -8", "-8") == 1.0
    assert arithmetic_score("Answer: −8", "-8") == 1.0  # unicode minus
    assert arithmetic_score("Answer: 8", "-8") == 0.0
    assert arithmetic_score("Answer: 1,234", "1234") == 1.0
    assert arithmetic_score("Answer: 12,34", "1234") == 0.0
    assert arithmetic_score("Answer: 1234.5", "1234") == 0.0
    assert arithmetic_score("Answer: 007", "7") == 1.0
    assert arithmetic_score("Answer: -0", "0") == 1.0
    assert arithmetic_score("Answer: +82", 82) == 1.0
    assert arithmetic_score("Answer: ٨٢", "82") == 1.0  # other scripts' digits, as int() reads them
    with pytest.raises(ValueError, match="ground truth must be an integer"):
        arithmetic_score("Answer: 8", "eight")


def test_arithmetic_numbers_of_any_length():
    """int() refuses a string of over 4300 digits (Python's int-string limit): a model that wrote one
    crashed the built-in reward, which stopped the run under on_error=raise."""
    huge = "9" * 5000
    assert arithmetic_score(f"Answer: {huge}", huge) == 1.0
    assert arithmetic_score(f"Answer: -{huge}", f"-{huge}") == 1.0
    assert arithmetic_score(f"Answer: {huge}8", huge) == 0.0
    assert arithmetic_score(f"Answer: {huge}", "82") == 0.0
    assert compute_score("arithmetic", f"Answer: {huge}", "82") == 0.0
    assert compute_score("math", f"\\boxed{{{huge}}}", "82") == 0.0  # math-verify: a parse failure, not a crash


COUNTDOWN = {"target": 16, "numbers": [2, 3, 5]}


@pytest.mark.parametrize("solution,score", [
    ("Answer: (3 + 5) * 2", 1.0),
    ("Answer: 2*(5+3)", 1.0),
    ("Answer: (3 + 5) * 2 = 16", 1.0),
    ("Answer: `(3 + 5) × 2`.", 1.0),
    ("Answer: (3 + 5) * 2 = 17", 0.0),
    ("Answer: 3 + 5 * 2", 0.0),  # 13
    ("Answer: (3 + 5) * 2 * 1", 0.0),  # a number not given
    ("Answer: (5 + 5) + 3 * 2", 0.0),  # 5 used twice
    ("Answer: (3 + 5) + 8", 0.0),  # 2 missing
    ("Answer: 16", 0.0),
    ("Answer: (3 + 5) ** 2 / 4", 0.0),
    ("Answer: 2 * (5 - -3)", 0.0),  # unary minus
    ("Answer: 2.0 * (5 + 3)", 0.0),
    ("Answer: (3 + 5) * 2 / 0", 0.0),
    ("Answer: __import__('os').system('echo pwned')", 0.0),
    ("Answer: (lambda: 16)()", 0.0),
    ("Answer: [16][0]", 0.0),
    ("Answer: (3 + 5) * 2 +", 0.0),
    ("Answer: " + "(" * 200 + "2" + ")" * 200, 0.0),
    ("Answer: 2 * 3\nAnswer: (3 + 5) * 2", 1.0),
    ("(3 + 5) * 2", 0.0),
])
def test_countdown_score(solution, score):
    assert countdown_score(solution, COUNTDOWN) == score
    assert compute_score("countdown", solution, COUNTDOWN) == score


def test_countdown_division_and_repeated_numbers():
    assert countdown_score("Answer: (17 + 3) / 4", {"target": 5, "numbers": [3, 4, 17]}) == 1.0
    assert countdown_score("Answer: 3 * 3 - 1", {"target": 8, "numbers": [3, 3, 1]}) == 1.0
    assert countdown_score("Answer: 3 * 3 - 1", {"target": 8, "numbers": [3, 1, 1]}) == 0.0
    assert countdown_score("Answer: (1 / 3 + 1) * 3", {"target": 4, "numbers": [1, 3, 1, 3]}) == 1.0


def test_math_score():
    assert math_score("So the answer is $\\boxed{0.5}$.", "\\frac{1}{2}") == 1.0
    assert math_score("The answer is \\boxed{\\frac{1}{2}}", "0.5") == 1.0
    assert compute_score("openai/gsm8k", "She has 72 clips.\n#### 72", "72") == 1.0
    assert compute_score("math", "\\boxed{3}", "\\frac{1}{2}") == 0.0
    assert compute_score("math", "", "2") == 0.0
    assert compute_score("math", "\\frac{{{", "2") == 0.0
    assert compute_score("math", "\\boxed{2}", "\\frac{{") == 0.0


def test_a_math_verify_timeout_scores_0_instead_of_escaping(monkeypatch):
    """math-verify raises its TimeoutException (a BaseException: `except Exception` misses it) when a
    parse or a comparison runs past its time; the built-in reward scores that answer 0."""
    import math_verify
    from math_verify.errors import TimeoutException

    def times_out(*args, **kwargs):
        raise TimeoutException("Operation timed out!")

    assert math_score("\\boxed{0.5}", "\\frac{1}{2}") == 1.0
    monkeypatch.setattr(math_verify, "verify", times_out)
    assert math_score("\\boxed{0.5}", "\\frac{1}{2}") == 0.0
    monkeypatch.setattr(math_verify, "parse", times_out)
    assert compute_score("math", "\\boxed{0.5}", "\\frac{1}{2}") == 0.0


def test_math_score_off_the_main_thread():
    # math-verify's signal-based timeouts refuse to run there; the answer must still be checked.
    scores = []
    thread = threading.Thread(target=lambda: scores.append(math_score("\\boxed{0.5}", "\\frac{1}{2}")))
    thread.start()
    thread.join()
    assert scores == [1.0]


def write_module(tmp_path, source: str, name: str = "my_reward.py"):
    path = tmp_path / name
    path.write_text(source)
    return path


REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(solution_str.strip() == ground_truth)

def length_reward(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    return {"score": len(solution_str) / 10, "length": len(solution_str)}
"""


def test_config_target_and_validate():
    assert RewardConfig().target() == (None, "compute_score")
    assert RewardConfig(path="r.py", name="f").target() == ("r.py", "f")
    assert RewardConfig(path="dir/r.py:g", name="f").target() == ("dir/r.py", "g")
    assert RewardConfig(path="C:\\rewards\\r.py").target() == ("C:\\rewards\\r.py", "compute_score")
    RewardConfig(path="r.py:g").validate()
    with pytest.raises(ValueError, match="reward.on_error"):
        RewardConfig(on_error="ignore").validate()
    with pytest.raises(ValueError, match="reward.name"):
        RewardConfig(name="not a name").validate()
    with pytest.raises(ValueError, match="reward.path"):
        RewardConfig(path=" ").validate()
    for key, bad in (("num_workers", 0), ("num_workers", 1.5), ("num_workers", True), ("timeout_s", 0),
                     ("timeout_s", float("nan")), ("timeout_s", float("inf")), ("start_timeout_s", -1),
                     ("start_timeout_s", "10")):
        with pytest.raises(ValueError, match=f"reward.{key} must be"):
            RewardConfig(**{key: bad}).validate()


def test_load_builtin_and_custom(tmp_path, monkeypatch):
    assert load_reward_fn(RewardConfig()) is compute_score
    path = write_module(tmp_path, REWARD)
    fn = load_reward_fn(RewardConfig(path=str(path)))
    assert fn("x", " 42 ", "42") == 1.0
    fn = load_reward_fn(RewardConfig(path=str(path), name="length_reward"))
    assert fn("x", "abcde", "1", None)["score"] == 0.5
    fn = load_reward_fn(RewardConfig(path=f"{path}:length_reward", name="ignored"))
    assert fn.__name__ == "length_reward"
    monkeypatch.chdir(tmp_path)
    assert load_reward_fn(RewardConfig(path="my_reward.py:compute_score"))("x", "1", "1") == 1.0


def test_load_does_not_clobber_modules(tmp_path):
    json_module = sys.modules["json"]
    path = write_module(tmp_path, "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                                  "    return 1.0\n", name="json.py")
    assert load_reward_fn(RewardConfig(path=str(path)))("x", "", "") == 1.0
    assert sys.modules["json"] is json_module
    other = tmp_path / "other"
    other.mkdir()
    write_module(other, "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                        "    return 2.0\n", name="json.py")
    assert load_reward_fn(RewardConfig(path=str(other / "json.py")))("x", "", "") == 2.0
    assert load_reward_fn(RewardConfig(path=str(path)))("x", "", "") == 1.0


@pytest.mark.parametrize("source,name,pattern", [
    (None, "compute_score", r"missing\.py not found"),
    ("x = 1", "compute_score", r"not a Python \(\.py\) file"),
    ("import not_a_module_anywhere", "compute_score", r"importing .*my_reward\.py failed: ModuleNotFoundError"),
    ("def broken(:\n", "compute_score", r"importing .*failed: SyntaxError"),
    ("raise SystemExit(3)", "compute_score", r"failed: SystemExit"),
    (REWARD, "score_fn", r"has no 'score_fn'; its functions: compute_score, length_reward"),
    ("score_fn = 3", "score_fn", r"'score_fn' in .* is a int, not a function"),
    ("def score_fn(solution_str, ground_truth):\n    return 0.0", "score_fn",
     r"score_fn\(solution_str, ground_truth\) in .* cannot be called as fn\(data_source=.*extra_info"),
    ("def score_fn(data_source, solution_str, ground_truth):\n    return 0.0", "score_fn",
     r"cannot be called as .*extra_info"),
])
def test_load_errors(tmp_path, source, name, pattern):
    if source is None:
        path = tmp_path / "missing.py"
    elif pattern.startswith("not a Python"):
        path = write_module(tmp_path, source, name="reward.txt")
    else:
        path = write_module(tmp_path, source)
    with pytest.raises(RewardConfigError, match=pattern):
        load_reward_fn(RewardConfig(path=str(path), name=name))
    if "failed" in pattern:
        assert _module_name(path.resolve()) not in sys.modules, "a failed import leaves no module behind"


def test_call_return_values():
    """What a worker makes of what the function returns (rlboost.rewards.worker.call, in process)."""
    def returning(value):
        return lambda data_source, solution_str, ground_truth, extra_info=None: value

    kwargs = {"data_source": "d", "solution_str": "", "ground_truth": "", "extra_info": None}
    for value, score in ((1, 1.0), (True, 1.0), (np.float32(0.25), 0.25), (np.bool_(False), 0.0),
                         ({"score": 0.5, "acc": True}, 0.5)):
        assert parse_reply(encode_reply(call(returning(value), kwargs))) == {"score": score}
    for bad in (None, "1.0", float("nan"), float("inf"), {"acc": 1.0}, [1.0], 10 ** 400):
        assert parse_reply(encode_reply(call(returning(bad), kwargs))) == {"returned": repr(bad)[:200]}


def test_call_passes_arguments_by_keyword():
    seen = []

    def fn(solution_str, data_source, extra_info, ground_truth):
        seen.append((data_source, solution_str, ground_truth, extra_info))
        return 0.0

    call(fn, {"data_source": "gsm8k", "solution_str": "text", "ground_truth": "7", "extra_info": {"index": 1}})
    assert seen == [("gsm8k", "text", "7", {"index": 1})]


def test_call_turns_whatever_is_raised_into_a_reply():
    """SystemExit and math-verify's TimeoutException are BaseExceptions: `except Exception` let them
    through and they ended the run under on_error=zero too."""
    from math_verify.errors import TimeoutException

    kwargs = {"data_source": "d", "solution_str": "", "ground_truth": "", "extra_info": None}
    for error, text in ((KeyError("target"), "KeyError: 'target'"), (SystemExit(3), "SystemExit: 3"),
                        (TimeoutException("Operation timed out!"), "TimeoutException: Operation timed out!")):
        def fn(data_source, solution_str, ground_truth, extra_info=None, error=error):
            raise error

        reply = parse_reply(encode_reply(call(fn, kwargs)))
        assert reply["raised"] == text and "Traceback" in reply["traceback"] and "raise error" in reply["traceback"]


@pytest.mark.parametrize("payload", [
    b"not json", b"[1]", b'{"score": "1.0"}', b'{"score": NaN}', b'{"score": true}', b'{"score": 1, "x": 2}',
    b'{"raised": "E"}', b'{"ready": 1}', b'{"returned": null}',
])
def test_replies_are_checked_field_by_field(payload):
    with pytest.raises(ReplyError):
        parse_reply(payload)
