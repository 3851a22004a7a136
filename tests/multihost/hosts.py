"""Two "hosts" on one machine: network namespaces joined by a veth pair, each with its own /dev/shm.

This module owns the harness of the multi-host tests and of ``benchmarks.bench_hosts``:
:class:`TwoHosts` creates two network namespaces (``fmxa<pid>x<n>`` and ``fmxb<pid>x<n>``,
unique per process and per pair), a veth pair between them with addresses of their own
(``10.<a>.<b>.1`` in host A, ``.2`` in host B, a /24 that exists only inside the two
namespaces), loopback up in each, and a private tmpfs per host that every process started
in that host sees as ``/dev/shm`` (``ip netns exec`` gives each command a mount namespace of
its own, slave to the machine's; the host's tmpfs is bind-mounted onto ``/dev/shm`` in it).
So two processes of one host share memory as on one machine, and a trainer in host B cannot
map a segment the server made in host A: the same-host handshake truly sees another host.

The link is shaped with ``tc``'s token bucket (``tbf``) on both ends (:meth:`TwoHosts.shape`),
and taken down and up (:meth:`TwoHosts.link`); a host crashes whole (:meth:`TwoHosts.kill`:
every process in it SIGKILLed) and the kernel's TCP buffers in it can be capped
(:meth:`TwoHosts.tcp_buffers`, the namespace's own ``tcp_wmem`` / ``tcp_rmem``). One
process's connections can be made half-open while the rest of the link goes on: it
connects to another address of the peer host (:meth:`TwoHosts.alias`), and its host then
drops, without a word, whatever it sends there (:meth:`TwoHosts.cut`, a blackhole route:
the machine these tests were written on has no ``iptables`` or ``nft`` and no ``tc``
filters);
:meth:`TwoHosts.connections` lists a host's TCP connections to an address (``ss``).
``tc ... netem`` (delay, loss) is not available on the machine these tests were written on
("Specified qdisc kind is unknown": the kernel has no ``sch_netem``); :func:`netem_available`
says whether it is, and :meth:`TwoHosts.delay` uses it when it is, or raises
:class:`HostsUnavailable`.

Clean-up on every exit path: :meth:`TwoHosts.close` (a fixture finaliser, a ``with`` block,
and an ``atexit`` hook for an interpreter that ends otherwise) SIGKILLs every process in the
two namespaces (``ip netns pids``: only processes this harness started live there), unmounts
the tmpfs and deletes the namespaces, which removes the veth pair with them; what a
SIGKILLed harness left (no code runs then) the next one removes (:func:`sweep`: names of
this harness whose pid is gone). The machine's
own interfaces, routes and ``/dev/shm`` are never touched. It needs root (``CAP_NET_ADMIN``,
``CAP_SYS_ADMIN``); :func:`unavailable` gives the reason it cannot run, or None.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

#: Seconds one ``ip`` / ``tc`` / ``mount`` command may take (a loaded machine is slow).
COMMAND_TIMEOUT = 30.0

#: The environment variable that makes an unavailable harness a failure, not a skip
#: (``.ci/run`` sets it: there the tests must run).
REQUIRE_ENV = "FEEDMUX_MULTIHOST"

_pairs = itertools.count()
_open: set[TwoHosts] = set()


class HostsUnavailable(RuntimeError):
    """The machine cannot make the two hosts (not root, no netns, no tc qdisc)."""


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT)
    if check and done.returncode != 0:
        raise HostsUnavailable(f"{' '.join(argv)} failed (exit {done.returncode}): "
                               f"{done.stderr.strip()}")
    return done


#: The names this harness gives its namespaces: ``fmx`` a|b|p, the creating pid, a count.
_OURS = re.compile(r"fmx[abp](\d+)x\d+")


def sweep() -> list[str]:
    """Delete the namespaces (and unmount the ``/dev/shm`` tmpfs) that a harness process
    left behind when it was SIGKILLed (its pid, in their names, is gone): the exit path
    that runs no code. Only names of this harness's pattern; returns what it deleted."""
    listed = _run("ip", "netns", "list", check=False).stdout.split("\n")
    gone = []
    for name in (line.split()[0] for line in listed if line.strip()):
        match = _OURS.fullmatch(name)
        if match is None or Path(f"/proc/{match[1]}").exists():
            continue
        for pid in TwoHosts.pids_of(name):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _run("ip", "netns", "del", name, check=False)
        gone.append(name)
    for folder in Path(tempfile.gettempdir()).glob("feedmux-hosts-*"):
        pid = folder.name.split("-")[2].split("x")[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            for mount in folder.glob("shm-*"):
                unmount(mount)
            shutil.rmtree(folder, ignore_errors=True)
    return gone


def unmount(folder: Path) -> None:
    """Unmount ``folder`` (bounded: lazily at last, should a user still hold it)."""
    deadline = time.monotonic() + 10
    while _run("umount", str(folder), check=False).returncode != 0:
        if time.monotonic() > deadline:
            _run("umount", "-l", str(folder), check=False)  # lazily, at the last user
            return
        time.sleep(0.05)  # the poll interval of a bounded wait for the last user to go


def unavailable() -> str | None:
    """Why two hosts cannot be made here (None: they can)."""
    if sys.platform != "linux":
        return f"network namespaces need Linux, this is {sys.platform}"
    if os.geteuid() != 0:
        return "network namespaces and tc need root (run as root, as .ci/run does)"
    for tool in ("ip", "tc", "ss", "mount", "umount"):
        if shutil.which(tool) is None:
            return f"the {tool!r} command is missing (iproute2 / util-linux)"
    probe = f"fmxp{os.getpid()}x{next(_pairs)}"
    try:
        _run("ip", "netns", "add", probe)
    except (HostsUnavailable, subprocess.TimeoutExpired) as error:
        return f"cannot create a network namespace: {error}"
    _run("ip", "netns", "del", probe, check=False)
    sweep()
    return None


def netem_available() -> bool:
    """Whether ``tc qdisc ... netem`` works here (delay and loss on the link): tried on the
    loopback of a namespace of its own."""
    probe = f"fmxp{os.getpid()}x{next(_pairs)}"
    if _run("ip", "netns", "add", probe, check=False).returncode != 0:
        return False
    try:
        return _run("tc", "-n", probe, "qdisc", "add", "dev", "lo", "root", "netem", "delay",
                    "1ms", check=False).returncode == 0
    finally:
        _run("ip", "netns", "del", probe, check=False)


class TwoHosts:
    """Host A and host B, joined by one veth link; see the module docstring.

    ``shm_size``: bytes of each host's private ``/dev/shm``.
    """

    def __init__(self, shm_size: int = 1 << 30) -> None:
        n = next(_pairs)
        tag = f"{os.getpid()}x{n}"
        self.names = {"a": f"fmxa{tag}", "b": f"fmxb{tag}"}
        # Interface names have at most 15 characters.
        self.links = {"a": f"fva{tag}"[:15], "b": f"fvb{tag}"[:15]}
        subnet = (os.getpid() * 64 + n) % (250 * 256)
        self.prefix = f"10.{subnet // 256 + 1}.{subnet % 256}"
        self.addresses = {"a": f"{self.prefix}.1", "b": f"{self.prefix}.2"}
        self._aliases = itertools.count(3)
        self._folder = Path(tempfile.mkdtemp(prefix=f"feedmux-hosts-{tag}-"))
        self.shm = {host: self._folder / f"shm-{host}" for host in self.names}
        self._mounted: list[Path] = []
        self._made: list[str] = []
        self.processes: list[subprocess.Popen[bytes]] = []
        _open.add(self)
        try:
            self._make(shm_size)
        except BaseException:
            self.close()
            raise

    def _make(self, shm_size: int) -> None:
        for name in self.names.values():
            _run("ip", "netns", "add", name)
            self._made.append(name)
            _run("ip", "-n", name, "link", "set", "lo", "up")
        _run("ip", "link", "add", self.links["a"], "netns", self.names["a"], "type", "veth",
             "peer", "name", self.links["b"], "netns", self.names["b"])
        for host, name in self.names.items():
            _run("ip", "-n", name, "addr", "add", f"{self.addresses[host]}/24",
                 "dev", self.links[host])
            _run("ip", "-n", name, "link", "set", self.links[host], "up")
            self.shm[host].mkdir()
            _run("mount", "-t", "tmpfs", "-o", f"size={shm_size},mode=1777", "tmpfs",
                 str(self.shm[host]))
            self._mounted.append(self.shm[host])

    def address(self, host: str) -> str:
        """Host ``host``'s own address on the link."""
        return self.addresses[host]

    def command(self, host: str, argv: Sequence[str]) -> list[str]:
        """``argv`` as run in ``host``: its network namespace and its own ``/dev/shm``."""
        bind = 'mount --bind "$0" /dev/shm && exec "$@"'
        return ["ip", "netns", "exec", self.names[host], "sh", "-c", bind,
                str(self.shm[host]), *argv]

    def popen(self, host: str, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        """Start ``argv`` in ``host`` (same pid: ``ip netns exec`` and ``sh`` exec it)."""
        env = {**os.environ, "PYTHONPATH": str(ROOT), **kwargs.pop("env", {})}
        process: subprocess.Popen[bytes] = subprocess.Popen(
            self.command(host, argv), env=env, cwd=kwargs.pop("cwd", ROOT), **kwargs)
        self.processes.append(process)
        return process

    def python(self, host: str, *args: str, **kwargs: Any) -> subprocess.Popen[bytes]:
        """``python ARGS...`` (this interpreter) in ``host``."""
        return self.popen(host, [sys.executable, *args], **kwargs)

    def run(self, host: str, argv: Sequence[str], timeout: float = COMMAND_TIMEOUT
            ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` in ``host`` to its end (bounded), its output captured."""
        return subprocess.run(self.command(host, argv), capture_output=True, text=True,
                              timeout=timeout)

    def shape(self, rate: str | None, burst: str = "512kb", latency: str = "20ms") -> None:
        """Limit both directions of the link to ``rate`` (``tc`` units: ``1gbit``) with a
        token bucket; None: unshaped (the veth's own speed)."""
        for host, name in self.names.items():
            _run("tc", "-n", name, "qdisc", "del", "dev", self.links[host], "root", check=False)
            if rate is not None:
                _run("tc", "-n", name, "qdisc", "add", "dev", self.links[host], "root", "tbf",
                     "rate", rate, "burst", burst, "latency", latency)

    def delay(self, milliseconds: float) -> None:
        """Delay every packet ``milliseconds`` each way (needs ``netem``; see the module)."""
        if not netem_available():
            raise HostsUnavailable("tc netem is not available here (no sch_netem module)")
        for host, name in self.names.items():
            _run("tc", "-n", name, "qdisc", "replace", "dev", self.links[host], "root",
                 "netem", "delay", f"{milliseconds}ms")

    def tcp_buffers(self, host: str, most: int) -> None:
        """Cap what the kernel buffers of one TCP connection in ``host`` may hold, each way
        (``net.ipv4.tcp_wmem`` / ``tcp_rmem``, the namespace's own), at ``most`` bytes."""
        for knob in ("tcp_wmem", "tcp_rmem"):
            _run("ip", "netns", "exec", self.names[host], "sysctl", "-q", "-w",
                 f"net.ipv4.{knob}=4096 {min(most, 65536)} {most}")

    def link(self, up: bool) -> None:
        """Take the link down (both ends: no carrier, every packet dropped) or up again."""
        for host, name in self.names.items():
            _run("ip", "-n", name, "link", "set", self.links[host], "up" if up else "down")

    def alias(self, host: str) -> str:
        """Give ``host`` one more address on the link (``.3``, then ``.4``, ...) and return it."""
        address = f"{self.prefix}.{next(self._aliases)}"
        _run("ip", "-n", self.names[host], "addr", "add", f"{address}/24", "dev",
             self.links[host])
        return address

    def cut(self, host: str, address: str) -> None:
        """Drop everything ``host`` sends to ``address`` (of the other host), silently: a
        blackhole route. Its connections there go half-open: what the other end sends still
        arrives, but no acknowledgement, FIN or RST ever goes back (a process of ``host``
        SIGKILLed then vanishes without a word). The rest of the link goes on."""
        _run("ip", "-n", self.names[host], "route", "add", "blackhole", f"{address}/32")

    def connections(self, host: str, address: str) -> list[str]:
        """``host``'s TCP connections (any state but listening) with ``address`` at either
        end, one ``ss`` line each: state, bytes unread, bytes unacknowledged or unsent, the
        two ends."""
        done = self.run(host, ["ss", "-Htn", "state", "connected",
                               f"( src {address} or dst {address} )"])
        if done.returncode != 0:
            raise HostsUnavailable(f"ss failed in host {host}: {done.stderr.strip()}")
        return [line for line in done.stdout.splitlines() if line.strip()]

    def pids(self, host: str) -> list[int]:
        """Every process in ``host``'s network namespace."""
        return self.pids_of(self.names[host])

    def kill(self, host: str, timeout: float = COMMAND_TIMEOUT) -> list[int]:
        """SIGKILL every process in ``host`` (a host that crashes: nothing of it runs its
        clean-up) and wait until none is left (bounded); the pids killed. What this harness
        started there is reaped; the others (a server's sampling workers) are not its
        children."""
        killed = self.pids(host)
        for pid in killed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + timeout
        for process in self.processes:
            if process.pid in killed:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
        while self.pids(host):
            if time.monotonic() > deadline:
                raise HostsUnavailable(f"processes of host {host} outlived SIGKILL for "
                                       f"{timeout:g} s: {self.pids(host)}")
            time.sleep(0.05)  # the poll interval of a bounded wait for the kernel to end them
        return killed

    def close(self) -> None:
        """Kill every process in the two hosts, unmount their /dev/shm, delete both
        namespaces (and the veth pair with them). Safe to call twice."""
        for name in self._made:
            for pid in self.pids_of(name):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self.processes = []
        for folder in self._mounted:
            unmount(folder)
        self._mounted = []
        for name in self._made:
            _run("ip", "netns", "del", name, check=False)
        self._made = []
        shutil.rmtree(self._folder, ignore_errors=True)
        _open.discard(self)

    @staticmethod
    def pids_of(name: str) -> list[int]:
        """Every process in the network namespace ``name``."""
        done = _run("ip", "netns", "pids", name, check=False)
        return [int(pid) for pid in done.stdout.split()]

    def __enter__(self) -> TwoHosts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@atexit.register
def _close_all() -> None:
    for hosts in list(_open):
        hosts.close()
