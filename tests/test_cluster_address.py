"""Joining a running cluster (`cluster.ray_address`) is checked first: a malformed address, one where
nothing answers, and a cluster that accepts calls without a token are each refused in one line, in
seconds, before Ray (or the run's data and model) is touched. Only loopback addresses."""

from __future__ import annotations

import functools
import socket
import time

import pytest

from hybrid_util import patience, wait_for
from rlboost.cluster.address import check_joinable, check_reachable, parse_address
from rlboost.cluster.config import ClusterConfig, RaySecurityConfig
from rlboost.config import ConfigError, RLBoostConfig, load_config


def closed_port() -> int:
    """A loopback port nothing listens on: the kernel's free pick, released."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def listener():
    """A loopback TCP port that accepts connections (the kernel's backlog) but speaks no gRPC."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield f"127.0.0.1:{s.getsockname()[1]}"


def joining(address: str, auth_token: bool = True) -> ClusterConfig:
    return ClusterConfig(ray_address=address, ray=RaySecurityConfig(auth_token=auth_token))


@pytest.mark.parametrize("address", ["HEAD", "HEAD:", ":6379", "127.0.0.1:0", "127.0.0.1:70000",
                                     "127.0.0.1:port", "ray://127.0.0.1"])
def test_a_malformed_address_names_the_key(address):
    with pytest.raises(ValueError, match="cluster.ray_address=.* must be host:port"):
        parse_address(address)


def test_well_formed_addresses_parse():
    assert parse_address("127.0.0.1:6379") == ("127.0.0.1", 6379)
    assert parse_address("head-node:6379") == ("head-node", 6379)
    assert parse_address("[::1]:6379") == ("::1", 6379)


def test_nothing_answering_is_one_line_in_seconds():
    address = f"127.0.0.1:{closed_port()}"
    start = time.monotonic()
    with pytest.raises(ValueError) as err:
        check_reachable(address)
    assert time.monotonic() - start < patience(2.5)
    assert str(err.value) == f"cluster.ray_address={address}: nothing answers there (connection refused)"


def test_an_unauthenticated_cluster_is_refused_unless_asked_for(listener):
    calls = []

    def accepts_anyone(address, timeout_s):
        calls.append((address, timeout_s))
        return False

    with pytest.raises(ValueError, match=f"cluster.ray_address={listener}: this Ray cluster accepts calls without "
                                         "a token .*set cluster.ray.auth_token=false to join it knowingly"):
        check_joinable(joining(listener), probe=accepts_anyone)
    assert calls == [(listener, 3.0)]
    check_joinable(joining(listener, auth_token=False), probe=accepts_anyone)  # knowingly: not even asked
    assert len(calls) == 1


def test_a_cluster_that_refuses_unauthenticated_calls_is_joined(listener):
    check_joinable(joining(listener), probe=lambda address, timeout_s: True)


def test_something_that_is_not_a_gcs_is_one_line(listener):
    """The real probe against a port that accepts TCP but never answers gRPC: its failure, in one line."""
    start = time.monotonic()
    with pytest.raises(ValueError) as err:
        check_joinable(joining(listener), timeout_s=1.0)
    assert time.monotonic() - start < patience(7.5)
    message = str(err.value)
    assert message.startswith(f"cluster.ray_address={listener}: not a Ray GCS that answers") and "\n" not in message


def test_cluster_checks_before_ray_init():
    """`Cluster` (the benches' way in) refuses before `ray.init`, so no Ray is left behind."""
    import ray

    from rlboost.cluster.ray_cluster import Cluster

    with pytest.raises(ValueError, match="nothing answers there"):
        Cluster(joining(f"127.0.0.1:{closed_port()}"), "processes")
    assert not ray.is_initialized()


def test_the_run_s_validation_checks_the_address_only_when_it_joins_ray():
    from rlboost.checks import validate

    address = f"127.0.0.1:{closed_port()}"
    with pytest.raises(ConfigError, match=f"cluster.ray_address={address}: nothing answers there"):
        validate(load_config(RLBoostConfig, overrides=["rollout.mode=hybrid", f"cluster.ray_address={address}"]))
    # a colocated run at world size 1 starts no Ray: the address is not used, so not checked
    validate(load_config(RLBoostConfig, overrides=["rollout.mode=colocated", f"cluster.ray_address={address}"]))


@pytest.fixture
def two_nodes():
    """A local cluster of two Ray nodes (a head and a node process), standing in for a joined one."""
    from rlboost.cluster.ray_cluster import Cluster

    cluster = Cluster(ClusterConfig(), instances="nodes")
    node = None
    try:
        node = cluster.start_node({"preemptible": 1})
        yield cluster
    finally:
        if node is not None:
            node.end()
        cluster.shutdown()


@pytest.mark.e2e
def test_every_node_of_a_joined_cluster_is_asked_for_the_model_before_any_worker(two_nodes, tmp_path):
    """The workers a joined cluster runs build their model from `model.path` on their node: a node
    without it is named at start-up, before any worker, with what it lacks."""
    import ray

    from rlboost.checks import check_model_on_nodes

    wait_for(lambda: sum(n["Alive"] for n in ray.nodes()) == 2, 60, "the node process to join")
    missing = tmp_path / "checkpoint"
    cfg = load_config(RLBoostConfig, overrides=[f"model.path={missing}", "cluster.ray_address=127.0.0.1:6379"])
    with pytest.raises(ConfigError) as err:
        check_model_on_nodes(cfg, two_nodes)
    message = str(err.value)
    assert message.startswith(f"model.path='{missing}': not readable on 2 of 2 nodes of "
                              "cluster.ray_address=127.0.0.1:6379 (node 127.0.0.1 (")
    assert message.count(f"{missing} does not exist") == 2 and "\n" not in message
    missing.mkdir()
    (missing / "config.json").write_text("{}")
    check_model_on_nodes(cfg, two_nodes)  # every node holds it now
    # what a node raises is its answer, unwrapped from Ray's task error
    raised = two_nodes.on_every_node(functools.partial(open, tmp_path / "absent"), patience(60))
    assert len(raised) == 2 and all(v.startswith("FileNotFoundError: [Errno 2]") for v in raised.values()), raised
