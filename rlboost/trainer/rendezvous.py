"""Where the trainer ranks listen: torch.distributed's rendezvous store and collectives, on the node's
cluster address only.

Contract:
- `StoreSocket(host)`: rank 0's listening socket for torch.distributed's TCP store, bound to `host`
  (the address Ray advertises for its node: 127.0.0.1 in a local run, `cluster.ray.bind_host`
  otherwise). torch's `TCPStore` on its own listens on every interface (`::`), unauthenticated;
  handed this socket's descriptor (`master_listen_fd`) it serves on `host` alone.
- `bind_collectives(own_ip, device_type)`: points gloo (and NCCL's bootstrap) at the network interface
  holding this rank's node address, so their listening sockets sit on it rather than on whatever the
  host name resolves to. A choice already made in the environment (`GLOO_SOCKET_IFNAME`,
  `NCCL_SOCKET_IFNAME`) is kept.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta


class StoreSocket:
    """A TCP socket bound to `host` on a free port and listening, for rank 0's store to serve on."""

    def __init__(self, host: str):
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.bind((host, 0))
        self.sock.listen()
        self.host, self.port = host, self.sock.getsockname()[1]

    def server(self, world_size: int, timeout: timedelta):
        """The store rank 0 serves on this socket (it must stay open while the store lives)."""
        import torch.distributed as dist

        return dist.TCPStore(self.host, self.port, world_size, is_master=True, timeout=timeout,
                             master_listen_fd=self.sock.fileno())

    def close(self) -> None:
        self.sock.close()


def client_store(host: str, port: int, world_size: int, timeout: timedelta):
    """The store of a rank other than 0: a client of rank 0's."""
    import torch.distributed as dist

    return dist.TCPStore(host, port, world_size, is_master=False, timeout=timeout)


def bind_collectives(own_ip: str, device_type: str) -> None:
    interface = interface_of(own_ip)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", interface)
    if device_type == "cuda":
        os.environ.setdefault("NCCL_SOCKET_IFNAME", interface)


def interface_of(ip: str) -> str:
    """The name of this machine's network interface that holds `ip` (ValueError when none does)."""
    import psutil

    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address.split("%")[0] == ip for a in addresses if a.family in (socket.AF_INET, socket.AF_INET6)):
            return name
    raise ValueError(f"no network interface of this machine holds {ip}, the address Ray advertises for its node")
