"""A few "machines" on one Ethernet segment for the Python tests: the
Python twin of internal/testkit/netlab.go (Lab, Host) and of
internal/cluster/clustertest/lab.go (an etcd member per host).

Each :class:`Host` is a Linux network namespace with its own address
(10.213.N.i/24) and loopback, joined by a veth pair to a bridge in this
process's namespace; the bridge holds 10.213.N.254, so the test process
reaches every host. The names and the choice of subnet are the Go lab's:
every name starts with ``rl<pid><letter>`` (the Go ``sweepLabs`` and
:func:`_sweep` remove what a SIGKILLed run of either left behind), and the
subnet is chosen and the links made under the same lock file
(``/tmp/rlhub-netlab.lock``, flock), so Go and Python labs built at the
same time never share a subnet.

:meth:`Lab.cut_from` is a partition *between* hosts, as the Go lab's
CutFrom: blackhole routes in the namespaces on both sides, so packets
between them are dropped where they are sent (a connect fails at once, an
open TCP connection stalls), while the test process still reaches every
host through the bridge. (The Go lab's Cut, taking a host's link down,
has no twin here.)

Labs need root and iproute2 (scripts/setup.d/30-netlab.sh):
:func:`unavailable` says why not.
"""

from __future__ import annotations

import fcntl
import ipaddress
import itertools
import os
import pathlib
import shutil
import subprocess

from etcdproc import Etcd, serving

LOCK = "/tmp/rlhub-netlab.lock"
_labs = itertools.count(1)


def unavailable() -> str | None:
    """Why labs cannot be built here, or None."""
    if os.geteuid() != 0:
        return f"network namespaces need root (euid {os.geteuid()})"
    if shutil.which("ip") is None:
        return "ip not found (Debian: iproute2; scripts/setup.d/30-netlab.sh)"
    return None


def _ip(*args: str, check: bool = True) -> str:
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise RuntimeError(f"lab: ip {' '.join(args)}: rc {r.returncode}: {r.stderr.strip()[:300]}")
    return r.stdout


class Host:
    """One machine of a :class:`Lab`."""

    def __init__(self, name: str, ip: str, ns: str, veth: str):
        self.name, self.ip, self.ns, self.veth = name, ip, ns, veth

    def argv(self, *args: str) -> list[str]:
        """``args`` run in the host's namespace (``ip netns exec`` execs
        the program: its pid is the program's own)."""
        return ["ip", "netns", "exec", self.ns, *args]

    def __repr__(self) -> str:
        return f"Host({self.name} {self.ip})"


class Lab:
    """Hosts named ``names`` (1 to 8) on a fresh 10.213.N.0/24; the caller
    calls :meth:`remove` (after killing what it started on them)."""

    def __init__(self, *names: str):
        if not 1 <= len(names) <= 8:
            raise ValueError(f"Lab: {len(names)} hosts, want 1 to 8")
        self.hosts: list[Host] = []
        self._cuts: set[tuple[str, str]] = set()  # (namespace, blackholed address)
        with open(LOCK, "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                _sweep()
                self.id = f"rl{os.getpid()}{chr(ord('a') + next(_labs) % 26)}"
                self.bridge = self.id + "br"
                self.subnet = _free_subnet()
                try:
                    self._build(names)
                except BaseException:
                    try:
                        self.remove()
                    except RuntimeError:
                        pass  # what failed to build is raised, not what then failed to go away
                    raise
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _build(self, names: tuple[str, ...]) -> None:
        base = self.subnet.network_address
        self.bridge_ip = str(base + 254)
        _ip("link", "add", self.bridge, "type", "bridge", "forward_delay", "0")
        self._bridge_made = True
        _ip("addr", "add", self.bridge_ip + "/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i, name in enumerate(names, 1):
            h = Host(name, str(base + i), f"{self.id}-{i}", f"{self.id}v{i}")
            peer = h.veth + "p"
            _ip("netns", "add", h.ns)
            self.hosts.append(h)
            _ip("link", "add", h.veth, "type", "veth", "peer", "name", peer)
            _ip("link", "set", peer, "netns", h.ns)
            _ip("link", "set", h.veth, "master", self.bridge)
            _ip("link", "set", h.veth, "up")
            _ip("-n", h.ns, "link", "set", "lo", "up")
            _ip("-n", h.ns, "link", "set", peer, "name", "eth0")
            _ip("-n", h.ns, "addr", "add", h.ip + "/24", "dev", "eth0")
            _ip("-n", h.ns, "link", "set", "eth0", "up")
            _ip("-n", h.ns, "route", "add", "default", "via", self.bridge_ip)

    def cut_from(self, h: Host, others: list[Host]) -> None:
        """Cuts ``h`` off from ``others`` alone, both ways (Go: CutFrom): a
        blackhole route to each on each side; they still reach the rest of
        the lab, and the test process reaches all."""
        for a, b in _both_ways(h, others):
            _ip("-n", a.ns, "route", "add", "blackhole", b.ip + "/32")
            self._cuts.add((a.ns, b.ip))

    def heal_from(self, h: Host, others: list[Host]) -> None:
        """Undoes :meth:`cut_from` between ``h`` and ``others``."""
        for a, b in _both_ways(h, others):
            self._uncut(a.ns, b.ip)

    def heal_all(self) -> None:
        """Undoes every :meth:`cut_from` still in place."""
        for ns, ip in sorted(self._cuts):
            self._uncut(ns, ip)

    def _uncut(self, ns: str, ip: str) -> None:
        _ip("-n", ns, "route", "del", "blackhole", ip + "/32")
        self._cuts.discard((ns, ip))

    def remove(self) -> None:
        """Deletes the lab (veth pairs first: a deleted namespace goes away
        in the background). Raises after trying everything if a step
        failed."""
        problems = []
        for h in self.hosts:
            for args in (("link", "del", h.veth), ("netns", "del", h.ns)):
                try:
                    _ip(*args)
                except RuntimeError as e:
                    problems.append(str(e))
        self.hosts = []
        if getattr(self, "_bridge_made", False):
            try:
                _ip("link", "del", self.bridge)
            except RuntimeError as e:
                problems.append(str(e))
            self._bridge_made = False
        if problems:
            raise RuntimeError("; ".join(problems))


def _both_ways(h: Host, others: list[Host]) -> list[tuple[Host, Host]]:
    """(from, to) for each way between ``h`` and each of ``others``."""
    return [(h, o) for o in others] + [(o, h) for o in others]


def _dead(name: str) -> bool:
    """Whether ``name`` is a lab's (``rl<pid>…``) whose process is gone."""
    if not name.startswith("rl"):
        return False
    digits = "".join(itertools.takewhile(str.isdigit, name[2:]))
    if not digits:
        return False
    try:
        os.kill(int(digits), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _sweep() -> None:
    """Removes the namespaces and bridges of labs whose process is gone
    (as the Go sweepLabs)."""
    for line in _ip("netns", "list", check=False).splitlines():
        f = line.split()
        if f and "-" in f[0] and _dead(f[0]):
            _ip("netns", "del", f[0], check=False)
            shutil.rmtree(pathlib.Path("/etc/netns") / f[0], ignore_errors=True)
    for line in _ip("-o", "link", "show", "type", "bridge", check=False).splitlines():
        f = line.split()
        if len(f) >= 2:
            name = f[1].rstrip(":")
            if name.endswith("br") and _dead(name):
                _ip("link", "del", name, check=False)


def _free_subnet() -> ipaddress.IPv4Network:
    """A 10.213.N.0/24 no interface here has an address in (the Go
    freeSubnet's test)."""
    out = _ip("-o", "-4", "addr", "show")
    for n in range(1, 255):
        if f" 10.213.{n}." not in out:
            return ipaddress.IPv4Network(f"10.213.{n}.0/24")
    raise RuntimeError("lab: no free 10.213.N.0/24")


class LabEtcd(Etcd):
    """One etcd member on a lab host (clustertest.StartOnLab's addresses:
    client port 2379 and peer port 2380 on the host's address, plaintext;
    and ``--pre-vote``, as every member of an :class:`etcdproc.Etcd`
    cluster), with :class:`etcdproc.Etcd`'s calls. It does not wait: no
    member serves until a quorum runs."""

    def __init__(self, tmp: pathlib.Path, host: Host, initial: str, extra: tuple[str, ...] = ()):
        self.host = host
        super().__init__(tmp, name=host.name, peer=f"http://{host.ip}:2380", initial=initial, wait=False,
                         extra=extra, addr=f"{host.ip}:2379", wrap=tuple(host.argv()))

    def has_leader(self) -> bool:
        """etcd_server_has_leader, from the member's /metrics."""
        return self.metric("etcd_server_has_leader") == 1.0


def start_etcd_on(lab: Lab, tmp: pathlib.Path, extra: tuple[str, ...] = ()) -> list[LabEtcd]:
    """One member per host of ``lab``, each serving (30 s each); the
    caller stops them (before removing the lab)."""
    initial = ",".join(f"{h.name}=http://{h.ip}:2380" for h in lab.hosts)
    return serving([lambda h=h: LabEtcd(tmp, h, initial, extra) for h in lab.hosts])
