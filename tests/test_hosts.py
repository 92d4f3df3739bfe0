"""Many hosts on one machine (`rlboost.cluster.hosts`): the config of `cluster.hosts`, and the tests
that must run inside a room of namespaces (tests/in_room/), each file started here as a pytest run of
its own inside a fresh room, which is also how their teardown is complete: the room's processes die
with it, whatever the tests left."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from hybrid_util import patience
from rlboost.cluster.hosts import HostEntry, check_rooms_possible, expand_hosts, link_bits_s, room_command

ROOT = Path(__file__).resolve().parent.parent
IN_ROOM = Path(__file__).resolve().parent / "in_room"


def test_link_rates_parse_as_tc_writes_them():
    assert link_bits_s("100mbit") == 1e8 and link_bits_s("10gbit") == 1e10 and link_bits_s("1.5Mbit") == 1.5e6
    assert link_bits_s("") is None
    for bad in ("fast", "100", "0mbit", "-1gbit", "nan"):
        with pytest.raises(ValueError, match=r"cluster.hosts\[1\].link="):
            link_bits_s(bad, "cluster.hosts[1].link")


def test_hosts_expand_in_order_with_names():
    specs = expand_hosts([HostEntry(kind="reserved", name="res-0", gpus=2, cpus=4),
                          HostEntry(kind="preemptible", count=3, gpus=1, link="1gbit"),
                          HostEntry(kind="preemptible", name="far", count=2, link="100mbit")])
    assert [s.name for s in specs] == ["res-0", "spot-0", "spot-1", "spot-2", "far-0", "far-1"]
    assert [s.link_bits_s for s in specs[1:]] == [1e9] * 3 + [1e8] * 2 and specs[0].gpus == 2


@pytest.mark.parametrize("entries, message", [
    ([HostEntry(kind="preemptible")], "first host must be reserved"),
    ([HostEntry(kind="reserved"), HostEntry(kind="spot")], r"cluster.hosts\[1\].kind='spot'"),
    ([HostEntry(kind="reserved"), HostEntry(count=0)], r"cluster.hosts\[1\].count must be >= 1"),
    ([HostEntry(kind="reserved", gpus=-1)], r"cluster.hosts\[0\].gpus must be >= 0"),
    ([HostEntry(kind="reserved", name="a"), HostEntry(kind="reserved", name="a")], "names must differ"),
])
def test_bad_hosts_are_refused_naming_the_entry(entries, message):
    with pytest.raises(ValueError, match=message):
        expand_hosts(entries)


def test_this_machine_can_make_rooms():
    """CI must say so, not skip, when its kernel refuses rootless namespaces."""
    check_rooms_possible()


BENCH_ROOMS = {"room_drain.py": "the drain script also runs on Ray nodes in tests/test_providers.py, and a "
                               "vanished host in room_vanish.py; 2-3 min that keep make test and CI within budget"}
ROOMS = sorted(p.name for p in IN_ROOM.glob("room_*.py"))


def run_in_a_room(*modules: str) -> None:
    """Runs tests/in_room/MODULES with one pytest inside one fresh room (a room's start-up, Ray's head and
    the imports paid once); its output is the failure message."""
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    done = subprocess.run(room_command([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                                        "--durations=5", *(str(IN_ROOM / m) for m in modules)]),
                          cwd=ROOT, env=env | {"RLBOOST_HOSTS_ROOM": "1"}, capture_output=True, text=True,
                          timeout=patience(420 * len(modules)))  # the backstop below stretches as much
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]


@pytest.mark.e2e
@pytest.mark.timeout(900 * 3)
def test_in_a_room():
    """Every room module but the benchmarks', in one room."""
    run_in_a_room(*(m for m in ROOMS if m not in BENCH_ROOMS))


@pytest.mark.bench
@pytest.mark.parametrize("module", sorted(BENCH_ROOMS))
def test_in_a_room_bench(module):
    """The room modules left to `make bench` (BENCH_ROOMS says why), each in a room of its own."""
    run_in_a_room(module)


def test_a_killed_room_leaves_no_process_behind(tmp_path):
    """SIGKILL of the room's launcher (what a CI timeout or a crash does) ends every host and Ray
    process inside it."""
    script = tmp_path / "room.py"
    script.write_text(
        "import time\n"
        "from rlboost.cluster.config import ClusterConfig\n"
        "from rlboost.cluster.hosts import HostEntry\n"
        "from rlboost.cluster.ray_cluster import Cluster\n"
        "c = Cluster(ClusterConfig(hosts=[HostEntry(kind='reserved', cpus=1), HostEntry(count=2)]), 'hosts')\n"
        "c.start_node({'preemptible': 1}); c.start_node({'preemptible': 1})\n"
        "print('ready', flush=True)\n"
        "time.sleep(3600)\n")
    env = os.environ | {"PYTHONPATH": str(ROOT), "RLBOOST_HOSTS_ROOM": "1"}
    room = subprocess.Popen(room_command([sys.executable, str(script)]), cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert room.stdout.readline().strip() == "ready"
        inside = psutil.Process(room.pid).children(recursive=True)
        assert len(inside) > 8  # the driver, Ray's head, two hosts with a node each
    finally:
        room.kill()
        room.wait()
    deadline = time.monotonic() + patience(30)
    while left := [p for p in inside if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]:
        assert time.monotonic() < deadline, f"left behind: {[p.name() for p in left]}"
        time.sleep(0.1)


@pytest.mark.parametrize("override, message", [
    ("cluster.ray_address=127.0.0.1:1", "instances=hosts emulates a cluster on this machine; it cannot join"),
    ("cluster.hosts=[{kind: preemptible}]", "cluster.hosts: the first host must be reserved"),
    ("cluster.hosts=[{kind: reserved, link: fast}]", "cluster.hosts[0].link='fast' is not a link rate"),
])
def test_a_bad_hosts_run_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys, override, message):
    """Checked before the command enters a room (in the command's own process here: entering one would
    re-execute it, which fails the test), before Ray or a model loads."""
    import rlboost.cluster.hosts as hosts
    from rlboost.cli import main

    def entered(argv=None):
        raise AssertionError(f"entered a room with a bad config: {argv}")

    monkeypatch.setattr(hosts, "enter_room", entered)
    code = main(["train", str(ROOT / "configs" / "hybrid_smoke.yaml"), "rollout.hybrid.instances=hosts", override,
                 f"run.output_dir={tmp_path / 'run'}"])
    out = capsys.readouterr()
    assert code == 2, out.out + out.err
    assert message in out.out and "Traceback" not in out.out + out.err
    assert "ray" not in sys.modules or not __import__("ray").is_initialized()
