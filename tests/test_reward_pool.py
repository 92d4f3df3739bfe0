"""The reward workers: the function runs there and never in the driver, without Ray's token; a call
that hangs, crashes or raises anything scores 0 under on_error=zero (counted in reward/errors and
reward/timeouts) or stops the run with one line naming the sample; no worker outlives its pool, nor
a driver killed with SIGKILL. A hang is a `time.sleep(3600)`; every limit scales with the load."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from hybrid_util import patience, wait_for
from rlboost.rewards import RewardConfig, RewardConfigError, RewardFunctionError, RewardScorer, ScoreRequest
from rlboost.rewards.loading import _module_name

REPO = Path(__file__).resolve().parents[1]

REWARD = """
import json, os, time
from pathlib import Path

import math_verify.utils

RECORD = os.environ.get("RLBOOST_TEST_IMPORTS")


def record(suffix=""):
    if RECORD:
        with open(RECORD + suffix, "a") as f:
            f.write(f"{os.getpid()}\\n")


record()  # who imported this file


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "hang":
        record(".hanging")
        time.sleep(3600)
    if solution_str == "crash":
        os._exit(3)
    if solution_str == "exit":
        raise SystemExit(4)
    if solution_str == "keyerror":
        raise KeyError("target")
    if solution_str == "math-verify timeout":  # math-verify's own SIGALRM timeout, as it fires in its parse
        math_verify.utils.timeout(1)(time.sleep)(30)
    if solution_str == "none":
        return None
    if solution_str == "pid":
        return float(os.getpid())
    if solution_str == "environment":
        Path(extra_info["out"]).write_text(json.dumps({
            "environ": dict(os.environ), "initial": Path("/proc/self/environ").read_bytes().decode(errors="replace")}))
    return float(solution_str == ground_truth)
"""


@pytest.fixture(scope="module")
def reward_file(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("reward")
    (folder / "my_reward.py").write_text(REWARD)
    return folder / "my_reward.py"


@pytest.fixture
def imports(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "imports.txt"
    monkeypatch.setenv("RLBOOST_TEST_IMPORTS", str(path))
    return path


TIMEOUT_S = 0.5
"""reward.timeout_s in these tests on an idle machine; each pool's is `patience(TIMEOUT_S)`, read when the
pool starts (the load beside the test then, not when this module was imported): well above an ordinary
call under that load (each hang costs that long)."""


def start(reward_file: Path, on_error: str = "zero", num_workers: int = 2, timeout_s: float | None = None
          ) -> RewardScorer:
    timeout_s = patience(TIMEOUT_S) if timeout_s is None else timeout_s
    return RewardScorer.start(RewardConfig(path=str(reward_file), on_error=on_error, num_workers=num_workers,
                                           timeout_s=timeout_s, start_timeout_s=patience(30)))


def requests(*texts: str, ground_truth: str = "a") -> list[ScoreRequest]:
    return [ScoreRequest(f"1:{i}:0", "test", text, ground_truth) for i, text in enumerate(texts)]


def gone(pid: int) -> bool:
    """No such process (a zombie counts as gone: it runs nothing; whoever adopted it reaps it)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_the_function_runs_in_the_workers_never_in_the_driver(reward_file, imports):
    with start(reward_file) as scorer:
        pids = scorer.pool.pids()
        assert sorted(int(p) for p in imports.read_text().split()) == sorted(pids), "each worker imported it"
        assert os.getpid() not in pids and _module_name(reward_file.resolve()) not in sys.modules
        assert scorer.score(requests("a", "b", "a")) == [1.0, 0.0, 1.0]
        assert set(scorer.score(requests(*["pid"] * 8))) <= set(map(float, pids))
    assert all(gone(pid) for pid in pids)


def test_workers_never_get_rays_token(reward_file, imports, tmp_path, monkeypatch):
    """Neither the workers started with the pool nor one started after Ray set its token in the
    driver's environment (as rlboost.cluster.ray_setup does) get a RAY_* variable."""
    monkeypatch.setenv("RAY_AUTH_TOKEN", "token-of-the-shell")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "token"))
    out = tmp_path / "environment.json"

    def seen() -> dict:
        [score] = scorer.score([ScoreRequest("s", "test", "environment", "x", {"out": str(out)})])
        assert score == 0.0
        return json.loads(out.read_text())

    with start(reward_file, num_workers=1) as scorer:
        monkeypatch.setenv("RAY_AUTH_TOKEN", "token-of-the-run")
        monkeypatch.setenv("RAY_AUTH_MODE", "token")
        first = seen()
        assert scorer.score(requests("hang")) == [0.0]  # its worker is killed and replaced
        second = seen()
    for environment in (first, second):
        assert not [k for k in environment["environ"] if k.startswith("RAY_")], environment["environ"]
        assert "token-of-" not in environment["initial"] and "RAY_AUTH" not in environment["initial"]
        assert environment["environ"]["RLBOOST_TEST_IMPORTS"] == str(imports)  # the rest is the driver's


def test_a_hung_call_scores_zero_its_worker_is_replaced_and_the_rest_are_scored(reward_file, imports, caplog):
    with start(reward_file) as scorer, caplog.at_level(logging.INFO, logger="rlboost.rewards"):
        before = scorer.pool.pids()
        assert scorer.score(requests("a", "hang", "a", "b", "a")) == [1.0, 0.0, 1.0, 0.0, 1.0]
        after = scorer.pool.pids()
        assert len(after) == 2 and len(set(before) - set(after)) == 1
        [hung] = set(before) - set(after)
        assert gone(hung), "the hung worker was killed"
        assert scorer.pop_metrics() == {"reward/errors": 1.0, "reward/timeouts": 1.0}
        assert scorer.pop_metrics() == {"reward/errors": 0.0, "reward/timeouts": 0.0}
        assert scorer.score(requests("a", "a", "a")) == [1.0, 1.0, 1.0]  # its replacement serves
        timeout_s = scorer.pool.timeout_s
    [error] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert f"ran past reward.timeout_s={timeout_s:g} s on sample '1:1:0' (data_source 'test')" in error.getMessage()
    assert all(gone(pid) for pid in after)


def test_a_hung_call_stops_the_run_under_raise_and_leaves_no_worker(reward_file, imports):
    with start(reward_file, on_error="raise") as scorer:
        pids = scorer.pool.pids()
        with pytest.raises(RewardFunctionError, match=r"reward function compute_score ran past reward\.timeout_s="
                                                      r".* on sample '1:2:0' \(data_source 'test'\)"):
            scorer.score(requests("a", "a", "hang", "a"))
        pids += scorer.pool.pids()  # the hung one's replacement
    assert len(set(pids)) == 3 and all(gone(pid) for pid in pids)


FAILURES = [
    ("keyerror", r"raised on sample '1:0:0' \(data_source 'test'\): KeyError: 'target'"),
    ("exit", r"raised on sample '1:0:0' .*: SystemExit: 4"),
    ("math-verify timeout", r"raised on sample '1:0:0' .*: TimeoutException: Operation timed out!"),
    ("crash", r"ended its worker process on sample '1:0:0' .* \(exit status 3\)"),
    ("none", r"returned None on sample '1:0:0' .*; it must return a finite number"),
]


@pytest.fixture(scope="module")
def shared_pool(reward_file):
    with start(reward_file, timeout_s=1 + patience(1)) as scorer:  # above math-verify's own alarm of 1 s
        yield scorer.pool


@pytest.mark.parametrize("text,message", FAILURES, ids=[text for text, _ in FAILURES])
def test_a_failing_call_stops_the_run_with_one_line_naming_the_sample(shared_pool, text, message, caplog):
    with caplog.at_level(logging.INFO, logger="rlboost.rewards"), pytest.raises(RewardFunctionError) as info:
        RewardScorer(shared_pool, "raise").score(requests(text))
    assert "\n" not in str(info.value)
    assert len(info.value.args) == 1 and re.search(message, str(info.value)), str(info.value)
    if "raised" in message:  # its traceback goes to the run's log, not the console's one line
        [record] = caplog.records
        assert record.levelno == logging.INFO and "Traceback" in record.getMessage()


def test_every_failure_scores_zero_and_is_counted_under_zero(shared_pool, caplog):
    scorer = RewardScorer(shared_pool, "zero")
    texts = ["a"] + [text for text, _ in FAILURES] + ["a"]
    with caplog.at_level(logging.INFO, logger="rlboost.rewards"):
        assert scorer.score(requests(*texts)) == [1.0] + [0.0] * len(FAILURES) + [1.0]
    assert scorer.pop_metrics() == {"reward/errors": float(len(FAILURES)), "reward/timeouts": 0.0}
    assert [r.levelno for r in caplog.records] == [logging.ERROR, logging.INFO], "the first error, its traceback"
    assert "on sample '1:1:0'" in caplog.records[0].getMessage() and "KeyError" in caplog.records[1].getMessage()


@pytest.mark.parametrize("source,message", [
    (None, r"missing\.py not found"),
    ("def compute_score(solution_str):\n    return 0.0\n", r"cannot be called as fn\(data_source="),
    ("raise RuntimeError('no GPU here')\n", r"importing .* failed: RuntimeError: no GPU here"),
    ("import os\nos._exit(5)\n", r"its worker ended while starting \(exit status 5\)"),
    ("import time\ntime.sleep(3600)\n", r"its worker did not start within reward\.start_timeout_s=1"),
])
def test_a_reward_that_cannot_be_loaded_is_a_set_up_error_with_nothing_left(tmp_path, source, message):
    path = tmp_path / "missing.py"
    if source is not None:
        path.write_text(source)
    children = set(psutil.Process().children())
    # 1 s only where the import hangs for good; the others must not race a start on a loaded machine
    limit = 1 if "did not start" in message else patience(120)
    with pytest.raises(RewardConfigError, match=message):
        RewardScorer.start(RewardConfig(path=str(path), num_workers=2, start_timeout_s=limit))
    assert set(psutil.Process().children()) == children


DRIVER = """
import sys
from rlboost.rewards import RewardConfig, RewardScorer, ScoreRequest
scorer = RewardScorer.start(RewardConfig(path=sys.argv[1], num_workers=2))
print(*scorer.pool.pids(), flush=True)
scorer.score([ScoreRequest("s", "test", "hang", "a"), ScoreRequest("t", "test", "hang", "a")])
"""


def test_a_driver_killed_with_sigkill_leaves_no_worker(reward_file, imports):
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, str(reward_file)], stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, PYTHONPATH=str(REPO)))
    try:
        pids = [int(p) for p in driver.stdout.readline().split()]
        assert len(pids) == 2, pids
        hanging = Path(f"{imports}.hanging")
        wait_for(lambda: hanging.exists() and sorted(map(int, hanging.read_text().split())) == sorted(pids), 30,
                 "both workers to be in their call")
        driver.send_signal(signal.SIGKILL)  # mid-call: both workers sleep in the reward
        driver.wait()
        wait_for(lambda: all(gone(pid) for pid in pids), 5, "the orphaned workers to end")
    finally:
        driver.kill()
        driver.wait()
