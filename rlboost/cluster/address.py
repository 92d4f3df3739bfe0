"""Checking a running Ray cluster before joining it (`cluster.ray_address`): one line, in seconds.

`ray.init(address=...)` on an address where nothing answers retries for minutes and ends in a
traceback, and it joins a cluster that accepts anyone without a word. `check_joinable` is asked first,
by the run's validation (before data, model or Ray) and by `Cluster` (for its other callers, the
benches):

* the address must be `host:port` (the GCS's), else ValueError naming `cluster.ray_address`;
* a TCP connection to it must open within `timeout_s`, else ValueError saying what the socket said;
* with `cluster.ray.auth_token=true` the GCS must refuse a call that carries no token
  (`ray_setup.gcs_refuses_unauthenticated`); a cluster that accepts one is refused, naming
  `cluster.ray.auth_token=false` as the way to join it knowingly.

The only traffic is to the address the user gave. The errors are ValueErrors (the run's validation
turns them into ConfigErrors); importing this module loads no Ray (the probe imports it when used).
"""

from __future__ import annotations

import socket
from typing import Callable

from rlboost.cluster.config import ClusterConfig

CONNECT_TIMEOUT_S = 3.0
"""A GCS on a reachable machine accepts a TCP connection in milliseconds; a few seconds covers a slow
network without leaving a mistyped address hanging."""

Probe = Callable[[str, float], bool]
"""`(gcs_address, timeout_s) -> whether it refuses unauthenticated calls`; raises RuntimeError if the
probe itself fails (`ray_setup.gcs_refuses_unauthenticated`)."""


def parse_address(address: str) -> tuple[str, int]:
    """(host, port) of `cluster.ray_address`; ValueError naming the key if it is not `host:port`."""
    host, sep, port = str(address).strip().rpartition(":")
    host = host.removeprefix("[").removesuffix("]")  # an IPv6 literal: [::1]:6379
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"cluster.ray_address={address!r} must be host:port (the GCS of a running Ray "
                         f"cluster, e.g. 127.0.0.1:6379)")
    return host, int(port)


def check_reachable(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """ValueError unless a TCP connection to `address` opens within `timeout_s`."""
    host, port = parse_address(address)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except socket.timeout:
        raise ValueError(f"cluster.ray_address={address}: nothing answers there (no reply in "
                         f"{timeout_s:g} s)") from None
    except OSError as e:
        reason = e.strerror or type(e).__name__
        raise ValueError(f"cluster.ray_address={address}: nothing answers there ({reason.lower()})") from None


def check_joinable(cfg: ClusterConfig, timeout_s: float = CONNECT_TIMEOUT_S, probe: Probe | None = None) -> None:
    """ValueError unless the cluster at `cfg.ray_address` answers and, with `cfg.ray.auth_token`, refuses
    calls without a token. `probe`: the authentication check (default: ask the GCS)."""
    address = cfg.ray_address
    check_reachable(address, timeout_s)
    if not cfg.ray.auth_token:
        return
    if probe is None:
        from rlboost.cluster.ray_setup import gcs_refuses_unauthenticated as probe
    try:
        refuses = probe(address, timeout_s)
    except RuntimeError as e:
        raise ValueError(f"cluster.ray_address={address}: not a Ray GCS that answers ({e})") from None
    if not refuses:
        raise ValueError(f"cluster.ray_address={address}: this Ray cluster accepts calls without a token "
                         f"(no authentication); set cluster.ray.auth_token=false to join it knowingly")


__all__ = ["CONNECT_TIMEOUT_S", "check_joinable", "check_reachable", "parse_address"]
