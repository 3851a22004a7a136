"""Half-open connections across the link: a trainer that vanished behind it, and one that
only stops reading, must not be told apart by waiting.

**A reliable trainer vanishes.** Two reliable trainers in host B take one stream from the
server in host A. One of them reaches the server at another address of host A
(:meth:`~tests.multihost.hosts.TwoHosts.alias`); host B then drops whatever goes there
(:meth:`~tests.multihost.hosts.TwoHosts.cut`) and that trainer is SIGKILLed: every
connection of the server to it is half-open (the server is sending to it, with data
unacknowledged; no FIN or RST ever comes), while the other trainer's, on the same link, go
on. Host A's kernel must close all of them within ``HALF_OPEN_TIMEOUT`` of the cut (plus
a heartbeat: a connection quiet at the cut has its first unacknowledged byte within one),
while the server is still serving the other trainer. Without the bound the data
connection was still established and retransmitting when the test gave up, and the
control connections libzmq had dropped (ZMTP heartbeats) still waited for their FIN to be
acknowledged (the kernel's own limit, ``net.ipv4.tcp_retries2``, is about 15 minutes). The
other trainer goes on to the end, with every sample of each epoch handed out once across
the two (the gone trainer's last hand-outs, whose acknowledgements could not cross, may
come again to the other: its last ``hwm`` messages).

**A plain trainer vanishes.** The same with two plain trainers: the server's data
connection to the gone one has no ``TCP_USER_TIMEOUT`` (below), so the server keeps the
bound itself (:mod:`feedmux._plumbing.halfopen`) and must have closed it within as long,
while the other trainer goes on (at most once: what was queued for the gone one is lost).
Without it the data connection was still established, 1.6 MB unacknowledged, when the
test gave up 19 s after the cut (the kernel would have retransmitted for 15 minutes).

**A plain trainer stops reading.** Linux applies ``TCP_USER_TIMEOUT`` to a receive window
that stays closed as well (tcp(7)), and a plain trainer's full queue closes its window:
that is plain mode's back-pressure. So a plain trainer that reads nothing for longer than
the bound (a long step, a validation pass) must keep its data connection and every sample
queued for it: the plain server's data socket goes without the kernel's bound, and the
server's own must tell the answered window probes of a live trainer from silence.

**A plain trainer cut off past the bound comes back.** The link goes down for longer
than the bound: the server closes the data connection, and once the link is back the
trainer connects again and receives the rest of the stream (without what was queued for
it when its connection went: at most once).
"""

from __future__ import annotations

import subprocess
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from feedmux._plumbing.sockets import HALF_OPEN_TIMEOUT, HEARTBEAT_INTERVAL
from tests.integration.conftest import Spawned, holds_for, wait_until
from tests.multihost.hosts import TwoHosts
from tests.multihost.test_compression import stats_in_a
from tests.multihost.test_host_faults import TRAINER_HWM, any_port, finished, read, serve_at
from tests.multihost.test_two_hosts import trainer_in

#: Where the server binds so that both of host A's addresses reach it.
ANYWHERE = "tcp://0.0.0.0:0"
#: How long after the cut host A may still hold a connection to the vanished trainer: the
#: bound, counted from the oldest unacknowledged byte, which a connection quiet at the cut
#: gets within a heartbeat (a ZMTP ping, a reliable data heartbeat).
CLOSED_BOUND = HALF_OPEN_TIMEOUT + HEARTBEAT_INTERVAL
#: Added to a bound observed by polling ``ss`` in host A: a loaded machine runs each look
#: (a process started in the namespace) and the kernel's timers late.
MARGIN = 3.0
#: 3 epochs of 2000 samples of 4 KiB, 8 a message: after the cut the other trainer alone
#: needs 25 s at least (``STEP_MS`` a sample), so the stream outlasts the wait for the cut
#: connections to close.
PER_STREAM = 500
EPOCH = 4 * PER_STREAM
EPOCHS = 3
SAMPLES_PER_MESSAGE = 8
STEP_MS = "5"


def at(endpoint: str, address: str) -> str:
    """``endpoint`` (bound on every address) as reached at ``address``."""
    return endpoint.replace("0.0.0.0", address)


def trainer_at(hosts: TwoHosts, server: Spawned, address: str, out: Path,
               *flags: str) -> subprocess.Popen[bytes]:
    """``tests.integration.trainers`` in host B, reaching the server at ``address``."""
    return hosts.python("b", "-m", "tests.integration.trainers", at(server.data, address),
                        at(server.control, address), str(out), *flags, stderr=subprocess.PIPE)


def unacknowledged(line: str) -> int:
    """Bytes of one ``ss`` line not yet acknowledged or not yet sent (its Send-Q)."""
    return int(line.split()[2])


@dataclass
class Cut:
    """Two trainers in host B, one of them vanished (cut off, then SIGKILLed)."""

    server: Spawned
    survivor: subprocess.Popen[bytes]
    near: Path
    far: Path
    #: Seconds from the cut to the first look that found no connection to it.
    let_go: float
    #: The most bytes any of its connections held unacknowledged or unsent.
    in_flight: int


def vanish_one_of_two(hosts: TwoHosts, tmp_path: Path, connections: int, *mode: str) -> Cut:
    """Serve in host A to two trainers in host B (``mode``: the server's and the trainers'
    flags); once both have 200 samples and host A sees the ``connections`` of one of them,
    make that one vanish and wait (bounded) until host A holds no connection to it."""
    doomed_address = hosts.alias("a")
    server = serve_at(
        hosts, ANYWHERE, ANYWHERE, "--arg", f"per_stream={PER_STREAM}", "--arg", "width=1024",
        "--epochs", str(EPOCHS), "--samples-per-message", str(SAMPLES_PER_MESSAGE), "--hwm",
        "4", "--min-trainers", "2", "--compress", "off", *mode)
    near, far = tmp_path / "survivor", tmp_path / "doomed"
    survivor = trainer_at(hosts, server, hosts.address("a"), near, *mode, "--step-ms", STEP_MS)
    doomed = trainer_at(hosts, server, doomed_address, far, *mode, "--step-ms", STEP_MS)
    wait_until(lambda: len(read(near)) >= 200 and len(read(far)) >= 200, 60,
               "both trainers at 200 samples")
    wait_until(lambda: len(hosts.connections("a", doomed_address)) >= connections, 10,
               "the doomed trainer's connections")
    hosts.cut("b", doomed_address)
    cut = time.monotonic()
    doomed.kill()
    doomed.wait(timeout=10)
    in_flight = 0
    left: list[str] = []

    def closed() -> bool:
        nonlocal in_flight, left
        left = hosts.connections("a", doomed_address)
        in_flight = max([in_flight, *(unacknowledged(line) for line in left)])
        return not left

    try:
        wait_until(closed, CLOSED_BOUND + MARGIN, "host A to close the vanished trainer's "
                   "connections")
    except AssertionError as error:
        raise AssertionError(f"{error}; still there:\n" + "\n".join(left)) from None
    let_go = time.monotonic() - cut
    running = server.returncode is None and survivor.poll() is None
    assert running, "the stream ended before the check: the server's exit closed them"
    assert in_flight > 0, "no data was in flight to the vanished trainer: not the case tested"
    counted = stats_in_a(hosts, at(server.control, hosts.address("a")), 5)
    assert counted.get("connected_trainers") == 1, counted
    return Cut(server, survivor, near, far, let_go, in_flight)


@pytest.mark.timeout(180)
def test_a_vanished_reliable_trainers_connections_close_within_the_bound(
    hosts: TwoHosts, tmp_path: Path
) -> None:
    # Its data, control and acknowledging connections, each seen by the server's end.
    cut = vanish_one_of_two(hosts, tmp_path, 3, "--reliable")
    handed_on = len(read(cut.near))
    finished([cut.survivor])
    assert cut.server.wait(timeout=60) == 0, cut.server.stderr
    gone, rest = read(cut.far), read(cut.near)
    assert len(rest) > handed_on, "the other trainer got nothing after the cut"
    print(f"closed {cut.let_go:.1f} s after the cut ({cut.in_flight} bytes were "
          f"unacknowledged); the gone trainer handed out {len(gone)}, the other {len(rest)}")
    for epoch in range(1, EPOCHS + 1):
        ids = Counter(row[1] for row in gone + rest if row[0] == epoch)
        assert sorted(ids) == list(range(EPOCH)), f"epoch {epoch}: samples lost"
    assert len(set(rest)) == len(rest), "the trainer that went on got a sample twice"
    repeated = set(gone) & set(rest)
    last = set(gone[-(TRAINER_HWM + 1) * SAMPLES_PER_MESSAGE:])
    assert repeated <= last, f"repeats not among the gone trainer's last: {repeated - last}"


@pytest.mark.timeout(180)
def test_a_vanished_plain_trainers_data_connection_closes_within_the_bound(
    hosts: TwoHosts, tmp_path: Path
) -> None:
    # Its data and control connections (a plain free trainer acknowledges nothing).
    cut = vanish_one_of_two(hosts, tmp_path, 2)
    handed_on = len(read(cut.near))
    finished([cut.survivor])
    assert cut.server.wait(timeout=60) == 0, cut.server.stderr
    gone, rest = read(cut.far), read(cut.near)
    assert len(rest) > handed_on, "the other trainer got nothing after the cut"
    print(f"closed {cut.let_go:.1f} s after the cut ({cut.in_flight} bytes were "
          f"unacknowledged); the gone trainer handed out {len(gone)}, the other {len(rest)}")
    # Plain delivery is at most once: what was queued for the gone trainer is lost.
    assert len(set(gone + rest)) == len(gone + rest), "a sample was handed out twice"


#: Seconds the plain trainer reads nothing: past the bound, so that a kernel applying it to
#: the closed window would have cut the connection off, and long enough for the server's
#: window probes, answered but backed off (0.2 s doubled each time), to come more than the
#: bound apart (from 25 s after the window closed: 25.6 s to the next): the server's own
#: bound must not take the time since an answer for silence.
PAUSE = 3 * HALF_OPEN_TIMEOUT + 5.0
#: Samples of 16 KiB, 8 a message: what the paused trainer's queue, its kernel's buffer and
#: the server's hold is a small part of the stream, so the server has more for it and its
#: window closes.
PAUSE_PER_STREAM = 100
PAUSE_EPOCH = 4 * PAUSE_PER_STREAM
PAUSE_EPOCHS = 2


@pytest.mark.timeout(200)
def test_a_plain_trainer_that_reads_nothing_past_the_bound_keeps_its_connection(
    hosts: TwoHosts, tmp_path: Path
) -> None:
    server = serve_at(
        hosts, *any_port(hosts), "--arg", f"per_stream={PAUSE_PER_STREAM}", "--arg",
        "width=4096", "--epochs", str(PAUSE_EPOCHS), "--samples-per-message",
        str(SAMPLES_PER_MESSAGE), "--hwm", "4", "--compress", "off")
    out, go = tmp_path / "paused", tmp_path / "go"
    trainer = trainer_in(hosts, "b", server, out, "--hold-after", "40", "--go-file", str(go),
                         "--go-wait", str(PAUSE + 60),
                         stderr=subprocess.PIPE)
    wait_until(lambda: len(read(out)) >= 40, 60, "the trainer's first 40 samples")
    data_port = server.data.rsplit(":", 1)[1]

    def data_connection() -> list[str]:
        return [line for line in hosts.connections("a", hosts.address("b"))
                if line.split()[3].endswith(f":{data_port}")]

    # The server holds bytes for the trainer that its kernel cannot deliver: the window.
    wait_until(lambda: [unacknowledged(line) > 0 for line in data_connection()] == [True], 30,
               "the server's data connection to the paused trainer to hold unsent bytes")
    ends = [line.split()[3:5] for line in data_connection()]
    assert holds_for(lambda: [line.split()[3:5] for line in data_connection()] == ends, PAUSE), (
        f"the paused trainer's data connection was closed within {PAUSE:g} s of not reading")
    assert len(read(out)) == 40 and trainer.poll() is None, "the trainer did not pause"
    go.touch()
    finished([trainer])
    assert server.wait(timeout=60) == 0, server.stderr
    rows = read(out)
    for epoch in range(1, PAUSE_EPOCHS + 1):
        ids = Counter(row[1] for row in rows if row[0] == epoch)
        lost = sorted(set(range(PAUSE_EPOCH)) - set(ids))
        assert not lost and set(ids.values()) == {1}, (
            f"epoch {epoch}: lost {len(lost)} {lost[:20]}, first rows {rows[:48]}; "
            f"server:\n{server.stderr}")


#: Seconds the link stays down in the comeback test: past the bound (plus the look that
#: finds it), so that the server has closed the trainer's data connection before the link
#: is back.
OUTAGE = CLOSED_BOUND + MARGIN + 2.0
#: Seconds a trainer cut off past the bound may take to receive again once the link is
#: back: its control socket reconnects within a second or so (ZMTP heartbeats), its data
#: socket learns that its connection is gone from the reset the server's kernel answers
#: to the first segment it sends, a keepalive probe at the latest (10 s idle, then 5 s
#: apart), and connects again under its routing id.
COMEBACK_BOUND = 25.0 + MARGIN


@pytest.mark.timeout(240)
def test_a_plain_trainer_cut_off_past_the_bound_comes_back(
    hosts: TwoHosts, tmp_path: Path
) -> None:
    server = serve_at(
        hosts, *any_port(hosts), "--arg", f"per_stream={PER_STREAM}", "--arg", "width=1024",
        "--epochs", str(EPOCHS), "--samples-per-message", str(SAMPLES_PER_MESSAGE), "--hwm",
        "4", "--compress", "off")
    out = tmp_path / "comes-back"
    trainer = trainer_in(hosts, "b", server, out, "--step-ms", STEP_MS, stderr=subprocess.PIPE)
    wait_until(lambda: len(read(out)) >= 200, 60, "the trainer's first 200 samples")
    data_port = server.data.rsplit(":", 1)[1]

    def data_connections() -> list[str]:
        return [line for line in hosts.connections("a", hosts.address("b"))
                if line.split()[3].endswith(f":{data_port}")]

    before = [line.split()[3:5] for line in data_connections()]
    assert len(before) == 1, before
    hosts.link(up=False)
    down = time.monotonic()
    wait_until(lambda: not data_connections(), CLOSED_BOUND + MARGIN,
               "the server to close the data connection to the trainer cut off")
    closed = time.monotonic() - down
    wait_until(lambda: time.monotonic() - down >= OUTAGE, OUTAGE + 5, "the outage to pass")
    handed = len(read(out))
    hosts.link(up=True)
    up = time.monotonic()
    wait_until(lambda: len(read(out)) > handed, COMEBACK_BOUND,
               "the trainer to receive again once the link is back")
    back = time.monotonic() - up
    after = [line.split()[3:5] for line in data_connections()]
    assert len(after) == 1 and after != before, (before, after)
    finished([trainer])
    assert server.wait(timeout=60) == 0, server.stderr
    rows = read(out)
    print(f"closed {closed:.1f} s after the link went down; receiving again {back:.1f} s "
          f"after it came back; {len(rows)} of {EPOCHS * EPOCH} samples")
    # At most once: what was queued for the trainer when its connection went is lost.
    assert len(set(rows)) == len(rows), "a sample was handed out twice"
    assert len(rows) > handed
