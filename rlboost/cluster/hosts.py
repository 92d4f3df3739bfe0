"""Many hosts on one machine: each a network namespace behind a rate-limited link, for tests, benches
and trying rlboost before renting a cluster (`rollout.hybrid.instances=hosts`, `rlboost bench cluster`).

The machine room. A run that uses hosts re-executes itself inside a room (`enter_room`): new user,
network, PID and mount namespaces, made without privileges (`unshare --map-root-user`). Inside, the
room's own network holds a bridge at `ROOM_IP`; the driver and the head Ray node (the first reserved
host) live there. Every other host (`Room.add_host`) is a network + PID + mount namespace of its own,
joined to the bridge by a veth pair whose two ends are each shaped by a `tbf` qdisc at the host's link
rate, with a Ray temp dir of its own (a tmpfs over /tmp/ray). Addresses exist only inside the room:
nothing here can send a packet to any other machine.

Contract:
- `Room()` works only inside a room (`in_room()`); `add_host(spec)` boots a host and returns it;
  `Host.run(argv)` starts a process inside the host (its network, PIDs and mounts).
- `vanish(host)` is a spot preemption without warning: the host's bridge port stops forwarding (its
  packets are dropped, nobody gets a reset), then every process of the host dies at once with its PID
  namespace's init. `cut`/`restore` drop and bring back a host's link without killing it (a
  partition); `set_link` changes its rate (a link that degrades).
- Teardown is complete: `close()` kills every host (and a new Room may start), and everything in the room dies with the room's
  first process (the driver), whatever way it ends.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field

ROOM_ENV = "RLBOOST_HOSTS_ROOM"
"""Set (to 1) in the environment of a process running inside a room."""
SUBNET = "10.77.0"
ROOM_IP = f"{SUBNET}.1"
"""The room's address on its bridge: the driver's and the head node's."""
RAY_TMP = "/tmp/ray"
HOST_KINDS = ("reserved", "preemptible")
VANISH_S = 30.0
"""The longest a vanishing host's processes may take to die once killed (they go in milliseconds)."""
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(k|m|g)?bit\s*$", re.IGNORECASE)
_UNIT = {None: 1, "k": 1e3, "m": 1e6, "g": 1e9}


@dataclass
class HostEntry:
    """One line of `cluster.hosts`: a host, or `count` alike ones."""

    kind: str = "preemptible"
    """`reserved` (the trainer's and reserved workers' host; the first one is the room itself, where the
    driver and Ray's head run) or `preemptible` (a spot instance: booted when the run asks for one,
    vanished on preemption)."""
    name: str = ""
    """The host's name (`res-0`, `spot-3`); empty: the kind's prefix and its index."""
    count: int = 1
    """How many alike hosts this line stands for (preemptible: the most instances alive at once)."""
    cpus: int = 1
    """Logical CPUs the host's Ray node offers."""
    gpus: int = 0
    """Logical GPUs the host's Ray node offers (Ray hands them to the workers asking for GPUs)."""
    link: str = "1gbit"
    """The host's link to the room, as tc writes a rate (`100mbit`, `1gbit`, `10gbit`); empty: not
    shaped. Ignored for the first reserved host, which is the room."""


@dataclass(frozen=True)
class HostSpec:
    name: str
    kind: str
    cpus: int
    gpus: int
    link_bits_s: float | None
    """The link's rate in bits per second; None: not shaped."""


def link_bits_s(link: str, key: str = "link") -> float | None:
    """`100mbit` -> 1e8; empty -> None. ValueError naming `key` otherwise."""
    if not link:
        return None
    match = _RATE.match(str(link))
    if not match or float(match.group(1)) <= 0:
        raise ValueError(f"{key}={link!r} is not a link rate such as 100mbit, 1gbit or 10gbit")
    return float(match.group(1)) * _UNIT[(match.group(2) or "").lower() or None]


def expand_hosts(entries: list[HostEntry], key: str = "cluster.hosts") -> list[HostSpec]:
    """The hosts `entries` stand for, in order, named; ValueError naming the entry otherwise. The
    first must be a reserved host (the room: driver and head)."""
    specs, counters = [], {kind: 0 for kind in HOST_KINDS}
    for i, entry in enumerate(entries):
        where = f"{key}[{i}]"
        if entry.kind not in HOST_KINDS:
            raise ValueError(f"{where}.kind={entry.kind!r}; choose one of {', '.join(HOST_KINDS)}")
        for name in ("count", "cpus", "gpus"):
            if getattr(entry, name) < (1 if name == "count" else 0):
                raise ValueError(f"{where}.{name} must be >= {1 if name == 'count' else 0}, got {getattr(entry, name)}")
        rate = link_bits_s(entry.link, f"{where}.link")
        for j in range(entry.count):
            index = counters[entry.kind]
            counters[entry.kind] += 1
            prefix = "res" if entry.kind == "reserved" else "spot"
            name = entry.name if entry.name and entry.count == 1 else \
                f"{entry.name or prefix}-{j if entry.name else index}"
            specs.append(HostSpec(name, entry.kind, entry.cpus, entry.gpus, rate))
    if not specs or specs[0].kind != "reserved":
        raise ValueError(f"{key}: the first host must be reserved (the driver and Ray's head run there)")
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"{key}: host names must differ, got {names}")
    if len(specs) > 250:
        raise ValueError(f"{key}: at most 250 hosts, got {len(specs)}")
    return specs


def in_room() -> bool:
    return os.environ.get(ROOM_ENV) == "1"


def room_command(argv: list[str]) -> list[str]:
    """`argv` run as the first process of a new room (it ends, and all the room with it, when it exits)."""
    return ["unshare", "--user", "--map-root-user", "--net", "--pid", "--mount", "--fork", "--mount-proc",
            "--kill-child", *argv]


def check_rooms_possible() -> None:
    """RuntimeError in one line when this machine refuses the namespaces a room needs."""
    for tool in ("unshare", "nsenter", "ip", "tc", "bridge", "mount"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"hosts need the `{tool}` command (util-linux / iproute2), not found on PATH")
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "--net", "--pid", "--mount", "--fork",
                            "ip", "link", "add", "probe0", "type", "bridge"], capture_output=True, text=True)
    if probe.returncode != 0:
        reason = (probe.stderr.strip().splitlines() or ["no reason given"])[-1]
        raise RuntimeError(f"this machine refuses rootless user+network namespaces ({reason}); "
                           f"hosts cannot be emulated here (kernel.unprivileged_userns_clone, "
                           f"user.max_user_namespaces)")


def enter_room(argv: list[str] | None = None) -> None:
    """Re-execute this program (or `argv`) inside a new room; returns only if already inside one."""
    if in_room():
        return
    check_rooms_possible()
    argv = argv or [sys.executable, *sys.argv]
    os.execvpe("unshare", room_command(argv), os.environ | {ROOM_ENV: "1"})


def _sh(*args: str, netns_pid: int | None = None) -> None:
    cmd = (["nsenter", "-t", str(netns_pid), "-n"] if netns_pid else []) + list(args)
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"`{' '.join(args)}` failed: {done.stderr.strip()}")


def _shape(dev: str, bits_s: float | None, netns_pid: int | None = None) -> None:
    """Egress of `dev` at `bits_s` (a token bucket: bursts of 10 ms of the rate, queueing up to 50 ms)."""
    if bits_s is None:
        subprocess.run((["nsenter", "-t", str(netns_pid), "-n"] if netns_pid else []) +
                       ["tc", "qdisc", "del", "dev", dev, "root"], capture_output=True)
        return
    burst = max(int(bits_s / 8 * 0.01), 32 * 1024)
    _sh("tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{int(bits_s)}bit", "burst", str(burst),
        "latency", "50ms", netns_pid=netns_pid)


@dataclass
class Host:
    spec: HostSpec
    ip: str
    port: str
    """The room-side end of its veth pair (the bridge port)."""
    unshare: subprocess.Popen
    init_pid: int
    """PID (in the room) of the init of the host's PID namespace: all its processes die with it."""
    processes: list[subprocess.Popen] = field(default_factory=list)
    vanished: bool = False

    @property
    def name(self) -> str:
        return self.spec.name

    def run(self, argv: list[str], log_path: str | None = None) -> subprocess.Popen:
        """Start `argv` inside the host (its network, PIDs and mounts), with this process's environment."""
        if self.vanished:
            raise RuntimeError(f"host {self.name} has vanished")
        out = open(log_path, "ab") if log_path else subprocess.DEVNULL
        try:
            proc = subprocess.Popen(["nsenter", "-t", str(self.init_pid), "-n", "-p", "-m", "--", *argv],
                                    stdout=out, stderr=subprocess.STDOUT if log_path else subprocess.DEVNULL)
        finally:
            if log_path:
                out.close()
        self.processes.append(proc)
        return proc

    def alive(self) -> bool:
        return not self.vanished and self.unshare.poll() is None

    def kill_process(self, pid: int) -> None:
        """SIGKILL one process of the host, `pid` as the host sees it (a crash on a host that lives on:
        its sockets close, so peers get a reset at once)."""
        subprocess.run(["nsenter", "-t", str(self.init_pid), "-p", "-m", "--", "kill", "-9", str(pid)],
                       capture_output=True)

    def room_pid(self, pid: int) -> int:
        """The room's PID of the host's process `pid` (as the host sees it); ProcessLookupError if none."""
        for candidate in self.pids():
            try:
                with open(f"/proc/{candidate}/status") as f:
                    nspid = next((line.split()[1:] for line in f if line.startswith("NSpid:")), [])
            except OSError:
                continue
            if nspid and int(nspid[-1]) == pid:
                return candidate
        raise ProcessLookupError(f"host {self.name} has no process {pid}")

    def pids(self) -> list[int]:
        """The room's PIDs of every process of the host (its PID namespace's)."""
        try:
            ns = os.readlink(f"/proc/{self.init_pid}/ns/pid")
        except OSError:
            return []
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    if os.readlink(f"/proc/{entry}/ns/pid") == ns:
                        found.append(int(entry))
                except OSError:
                    continue
        return found


class Room:
    """The bridge and the hosts of a room; see the module's contract."""

    def __init__(self):
        if not in_room():
            raise RuntimeError("hosts exist only inside a room: run through enter_room (the CLI does for "
                               "rollout.hybrid.instances=hosts)")
        self.hosts: dict[str, Host] = {}
        self._next = 2
        _sh("ip", "link", "set", "lo", "up")
        os.makedirs(RAY_TMP, exist_ok=True)
        _sh("mount", "-t", "tmpfs", "tmpfs", RAY_TMP)  # the room's Ray temp dir, gone with the room
        _sh("ip", "link", "add", "br0", "type", "bridge")
        _sh("ip", "addr", "add", f"{ROOM_IP}/24", "dev", "br0")
        _sh("ip", "link", "set", "br0", "up")

    def add_host(self, spec: HostSpec, boot_timeout_s: float = 30.0) -> Host:
        """Boot host `spec` (a fresh one: a host name, once vanished, may boot again) and link it to the
        bridge at its rate."""
        if spec.name in self.hosts and self.hosts[spec.name].alive():
            raise ValueError(f"host {spec.name} is running")
        index, self._next = self._next, self._next + 1
        if index > 254:
            raise RuntimeError("the room's subnet has no address left")
        unshare = subprocess.Popen(
            ["unshare", "--net", "--pid", "--mount", "--fork", "--mount-proc", "--kill-child", "sh", "-c",
             f"mount -t tmpfs tmpfs {RAY_TMP} && exec sleep infinity"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        init_pid = _child_pid(unshare, boot_timeout_s)
        port, inner, ip = f"h{index}", f"h{index}i", f"{SUBNET}.{index}"
        host = Host(spec, ip, port, unshare, init_pid)
        self.hosts[spec.name] = host
        try:
            _sh("ip", "link", "add", port, "type", "veth", "peer", "name", inner)
            _sh("ip", "link", "set", port, "master", "br0", "up")
            _sh("ip", "link", "set", inner, "netns", str(init_pid))
            for args in (("ip", "link", "set", "lo", "up"), ("ip", "link", "set", inner, "name", "eth0"),
                         ("ip", "addr", "add", f"{ip}/24", "dev", "eth0"), ("ip", "link", "set", "eth0", "up")):
                _sh(*args, netns_pid=init_pid)
            self.set_link(host, spec.link_bits_s)
        except BaseException:
            self.vanish(host)
            raise
        return host

    def set_link(self, host: Host, bits_s: float | None) -> None:
        """Shape both directions of `host`'s link at `bits_s` (None: unshaped)."""
        _shape(host.port, bits_s)
        _shape("eth0", bits_s, netns_pid=host.init_pid)

    def set_head_link(self, bits_s: float | None) -> None:
        """Shape what the room's own node (the driver and Ray's head: the trainer's machine) sends into the
        bridge, its NIC's uplink (None: unshaped). Traffic between hosts does not cross it."""
        _shape("br0", bits_s)

    def cut(self, host: Host) -> None:
        """Drop every packet on `host`'s link, both ways; nobody is told (no reset, the carrier stays up)."""
        _sh("bridge", "link", "set", "dev", host.port, "state", "0")

    def restore(self, host: Host) -> None:
        _sh("bridge", "link", "set", "dev", host.port, "state", "3")

    def vanish(self, host: Host) -> None:
        """The host is gone: its link drops everything first (so its dying sockets reset nothing), then
        all its processes die at once."""
        if host.vanished:
            return
        if host.unshare.poll() is None:
            subprocess.run(["bridge", "link", "set", "dev", host.port, "state", "0"], capture_output=True)
        host.vanished = True
        doomed = host.pids()
        try:
            os.kill(host.init_pid, 9)
        except ProcessLookupError:
            pass
        host.unshare.kill()
        host.unshare.wait()
        for proc in host.processes:
            proc.wait()
        # the kernel kills the rest of the PID namespace after its init, not within the kill() call:
        # the host is gone when its last process is (a busy machine took it past the return)
        deadline = time.monotonic() + VANISH_S
        while any(_alive(pid) for pid in doomed) and time.monotonic() < deadline:
            time.sleep(0.005)
        subprocess.run(["ip", "link", "del", host.port], capture_output=True)

    def close(self) -> None:
        """Every host vanishes; the bridge and the Ray temp dir go, so that another Room may start here."""
        for host in list(self.hosts.values()):
            self.vanish(host)
        subprocess.run(["ip", "link", "del", "br0"], capture_output=True)
        subprocess.run(["umount", "--lazy", RAY_TMP], capture_output=True)


def _child_pid(proc: subprocess.Popen, timeout_s: float) -> int:
    """The PID of `proc`'s (unshare's) one child: the host's init."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as f:
                children = f.read().split()
        except FileNotFoundError:
            children = []
        if children:
            return int(children[0])
        if proc.poll() is not None:
            break
        time.sleep(0.01)
    proc.kill()
    raise RuntimeError("a host's namespaces did not come up")



def _alive(pid: int) -> bool:
    """Whether process `pid` still runs (a zombie, dead and not reaped yet, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False

__all__ = ["HOST_KINDS", "ROOM_IP", "Host", "HostEntry", "HostSpec", "Room", "check_rooms_possible", "enter_room",
           "expand_hosts", "in_room", "link_bits_s", "room_command"]
