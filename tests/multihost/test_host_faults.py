"""Faults of a whole host across the link: the server's host crashes and comes back, or a
trainer's host is gone for good.

**The server's host.** The server runs in host A (with ``--workers 2``, its sampling workers
too), the trainers in host B. Every process of host A is SIGKILLed mid-epoch (nothing of
the server runs its clean-up) and the same ``feedmux serve`` command is started again in
host A on the same endpoints. The trainers are not restarted: they notice the new server
id, say hello to it and go on, and each mode keeps what docs/resume.md promises of a server
that restarts while its trainers live on:

- free trainers (the restarted server started with ``--min-trainers`` of all of them):
  every sample of every epoch, the interrupted one included, handed out exactly once
  across the trainers;
- the two ranks of one job (a seeded source): each rank's sequence is that of an
  uninterrupted run, sample for sample: nothing of the interrupted epoch lost or repeated.

**A trainer's host.** Two trainers share the stream, one in host A (the server's host; its
connection to the server does not cross the link) and one in host B. The link is taken
down for good, then every process of host B is SIGKILLed: the server's connections to
host B are half-open (no FIN or RST ever comes). The server must forget the gone trainer
within its liveness bound, and the trainer in host A must go on to the end with every
sample of each epoch handed out once across the two, counting what the gone trainer handed
out before it went. The gone trainer's last hand-outs may not have been acknowledged across
the link before it went down: those come again to the other (the documented edge, and how
``feedmux audit`` counts it: repeats within the last ``hwm`` messages of a trainer that did
not close), and nothing is lost. (The at-most-once plain delivery, gone since, lost what
was queued for the gone trainer instead: ``hwm`` messages on each side, the message it was
in, and what the kernel's TCP buffers held.)
"""

from __future__ import annotations

import datetime
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from feedmux._plumbing.sockets import HEARTBEAT_INTERVAL
from feedmux.server._control.core import TRAINER_TIMEOUT
from feedmux.server._delivery.reliable import SILENCE_GRACE
from tests.integration.conftest import Spawned, wait_until
from tests.multihost.hosts import TwoHosts
from tests.multihost.test_compression import stats_in_a
from tests.multihost.test_two_hosts import SAMPLER, trainer_in

PER_STREAM = 60
EPOCH = 4 * PER_STREAM  # 240 samples
EPOCHS = 3
#: Seconds a trainer or a server may take to finish after the fault (a loaded machine).
FINISH_TIMEOUT = 60.0
#: The queue of each trainer's loader, in messages (``tests.integration.trainers``).
TRAINER_HWM = 4

#: How long the server takes, at most, to see that a reliable trainer's host is gone and
#: deal its unacknowledged messages to the others: the trainer's silence (no credit,
#: acknowledgement or sign of life) passes its grace, judged at the next of the data
#: socket's heartbeats (one an interval). A data connection has no ZMTP heartbeats: a
#: link down for a few seconds is a pause, not a departure (test_link_down.py).
RELIABLE_FORGET_BOUND = SILENCE_GRACE + HEARTBEAT_INTERVAL
#: How long, at most, a gone trainer still counts as connected in the statistics.
CONNECTED_BOUND = TRAINER_TIMEOUT
#: Added to a bound measured by the server's own log line (its timestamp against the
#: moment the link went down): the server's loop looks every poll interval, and a loaded
#: machine schedules it late.
LOG_MARGIN = 2.0
#: Added to a bound observed through the statistics: each ask is a process started in
#: host A (seconds on a loaded machine), so the observation comes that late.
STATS_MARGIN = 10.0

Row = tuple[int, ...]


def serve_at(hosts: TwoHosts, data: str, control: str, *args: str) -> Spawned:
    """``feedmux serve`` in host A at ``data`` and ``control`` (port 0: any), bound."""
    server = Spawned(hosts.python(
        "a", "-m", "feedmux", "serve", SAMPLER, "--bind", data, "--control", control, *args,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    server.endpoints()
    return server


def any_port(hosts: TwoHosts) -> tuple[str, str]:
    address = hosts.address("a")
    return f"tcp://{address}:0", f"tcp://{address}:0"


def read(path: Path) -> list[Row]:
    if not path.exists():
        return []
    return [tuple(int(field) for field in line.split()) for line in path.read_text().splitlines()]


def finished(trainers: list[subprocess.Popen[bytes]]) -> None:
    """Every trainer ends normally (bounded), its stderr in the failure if not."""
    deadline = time.monotonic() + FINISH_TIMEOUT
    for trainer in trainers:
        code = trainer.wait(timeout=max(1.0, deadline - time.monotonic()))
        assert trainer.stderr is not None
        assert code == 0, f"a trainer failed ({code}):\n{trainer.stderr.read().decode()[-3000:]}"


#: The reliable server's log line for a trainer found gone (its messages go to the others).
GONE_LINE = "went away holding"


def logged_at(log: str, words: str) -> float:
    """When the server logged the first line with ``words`` (its timestamp, as time.time())."""
    line = next(line for line in log.splitlines() if words in line)
    stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
    return stamp.timestamp()


def workers_of(workers: str) -> int:
    """The sampling processes of ``--workers N`` (none of its own for one: the server samples)."""
    return int(workers) if int(workers) > 1 else 0


def each_once(rows: list[Row], epochs: int, epoch_size: int) -> None:
    for epoch in range(1, epochs + 1):
        ids = Counter(row[1] for row in rows if row[0] == epoch)
        lost = sorted(set(range(epoch_size)) - set(ids))
        repeated = sorted(i for i, count in ids.items() if count > 1)
        assert not lost and not repeated, (
            f"epoch {epoch}: {len(lost)} lost {lost[:20]}, {len(repeated)} repeated "
            f"{repeated[:20]}")


# -- the server's host SIGKILLed and restarted -----------------------------------------------

@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", ["1", "2"])
def test_free_reliable_trainers_follow_a_server_host_sigkilled_and_restarted(
    hosts: TwoHosts, tmp_path: Path, workers: str
) -> None:
    command = ("--arg", f"per_stream={PER_STREAM}", "--arg", "width=16384", "--epochs",
               str(EPOCHS), "--workers", workers, "--samples-per-message", "8",
               "--min-trainers", "2")
    server = serve_at(hosts, *any_port(hosts), *command)
    outs = [tmp_path / f"free{index}" for index in range(2)]
    trainers = [trainer_in(hosts, "b", server, out, "--step-ms", "2",
                           stderr=subprocess.PIPE) for out in outs]
    wait_until(lambda: sum(row[0] == 2 for out in outs for row in read(out)) >= EPOCH // 4,
               60, "a quarter of epoch 2 handed out")
    killed = hosts.kill("a")
    assert server.pid in killed and len(killed) >= 1 + workers_of(workers), killed
    restarted = serve_at(hosts, server.data, server.control, *command)
    finished(trainers)
    assert restarted.wait(timeout=30) == 0, restarted.stderr
    each_once([row for out in outs for row in read(out)], EPOCHS, EPOCH)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("workers", ["1", "2"])
def test_two_ranks_follow_a_server_host_sigkilled_and_restarted_exactly(
    hosts: TwoHosts, tmp_path: Path, workers: str
) -> None:
    # Samples of 64 KiB: the stream does not fit in the socket buffers, the server is still
    # sampling when it is killed.
    command = ("--arg", f"per_stream={PER_STREAM}", "--arg", "width=16384", "--epochs",
               str(EPOCHS), "--workers", workers, "--samples-per-message", "8")

    def ranks(server: Spawned, prefix: str) -> list[subprocess.Popen[bytes]]:
        return [trainer_in(hosts, "b", server, tmp_path / f"{prefix}{rank}", "--rank",
                           str(rank), "--world-size", "2", "--step-ms", "2",
                           stderr=subprocess.PIPE) for rank in range(2)]

    reference = serve_at(hosts, *any_port(hosts), *command)
    finished(ranks(reference, "whole"))
    assert reference.wait(timeout=30) == 0, reference.stderr
    uninterrupted = [read(tmp_path / f"whole{rank}") for rank in range(2)]
    assert [len(record) for record in uninterrupted] == [EPOCHS * EPOCH // 2] * 2

    server = serve_at(hosts, *any_port(hosts), *command)
    live = ranks(server, "live")
    wait_until(lambda: len(read(tmp_path / "live0")) >= EPOCH // 2 + EPOCH // 8, 60,
               "rank 0 a quarter into epoch 2")
    killed = hosts.kill("a")
    assert server.pid in killed and len(killed) >= 1 + workers_of(workers), killed
    restarted = serve_at(hosts, server.data, server.control, *command)
    finished(live)
    assert restarted.wait(timeout=30) == 0, restarted.stderr
    for rank in range(2):
        assert read(tmp_path / f"live{rank}") == uninterrupted[rank], (
            f"rank {rank}: samples lost or repeated across the server host's restart")


# -- a trainer's host gone for good ----------------------------------------------------------

GONE_PER_STREAM = 250
GONE_EPOCH = 4 * GONE_PER_STREAM  # 1000 samples of 4 KiB
GONE_SPM = 8
GONE_HWM = 4
#: A trainer's step per sample, in ms: the trainer that goes on needs 13 s at least for
#: the rest of the stream, however fast the machine, so the stream outlasts the checks.
STEP_MS = "5"


#: What the kernel may buffer of one TCP connection each way, in each host (set in the
#: test, so that what a plain trainer's gone host takes with it has a bound worth checking:
#: the default caps, 4 and 6 MiB, hold more than the whole stream).
TCP_BUFFER = 256 * 1024


@pytest.mark.timeout(120)
def test_a_trainer_host_gone_for_good_is_forgotten_and_the_other_trainer_finishes(
    hosts: TwoHosts, tmp_path: Path
) -> None:
    # Every free trainer acknowledges what it hands out (the one free delivery): what the
    # gone trainer held goes to the other. (Plain at-most-once delivery, which lost it, is
    # gone.)
    flags: list[str] = []
    for host in ("a", "b"):
        hosts.tcp_buffers(host, TCP_BUFFER)
    server = serve_at(
        hosts, *any_port(hosts), "--arg", f"per_stream={GONE_PER_STREAM}", "--arg",
        "width=1024", "--epochs", str(EPOCHS), "--samples-per-message", str(GONE_SPM),
        "--hwm", str(GONE_HWM), "--min-trainers", "2", *flags,
        # Compressed, these samples (each one value repeated) shrink a thousandfold, and
        # the kernel's buffers would hold most of the stream: the bound is for bytes.
        "--compress", "off")
    near, far = tmp_path / "near", tmp_path / "far"
    survivor = trainer_in(hosts, "a", server, near, "--step-ms", STEP_MS, *flags,
                          stderr=subprocess.PIPE)
    doomed = trainer_in(hosts, "b", server, far, "--step-ms", STEP_MS, *flags,
                        stderr=subprocess.PIPE)
    try:
        wait_until(lambda: len(read(near)) >= 200 and len(read(far)) >= 200, 60,
                   "both trainers at 200 samples")
    except AssertionError as error:
        raise AssertionError(f"{error}: {len(read(near))} and {len(read(far))}; server:\n"
                             f"{server.stderr[-3000:]}") from None
    wait_until(lambda: stats_in_a(hosts, server.control, 2).get("connected_trainers") == 2, 30,
               "both trainers connected in the statistics")
    hosts.link(up=False)  # for good: the server's connections to host B are half-open
    down, down_at = time.monotonic(), time.time()
    hosts.kill("b")
    assert doomed.poll() is not None
    wait_until(lambda: stats_in_a(hosts, server.control, 2).get("connected_trainers") == 1,
               CONNECTED_BOUND + STATS_MARGIN, "the gone trainer no longer counted as connected")
    uncounted = time.monotonic() - down
    text = server.wait_for_stderr(
        lambda text: GONE_LINE in text,
        max(0.0, down + RELIABLE_FORGET_BOUND + STATS_MARGIN - time.monotonic()),
        "the server to deal the gone trainer's messages to the other")
    forgotten = logged_at(text, GONE_LINE) - down_at
    assert forgotten <= RELIABLE_FORGET_BOUND + LOG_MARGIN, (
        f"the gone trainer's messages went to the other {forgotten:.1f} s after the link "
        f"went down, beyond the bound of {RELIABLE_FORGET_BOUND:g} s")
    finished([survivor])
    assert server.wait(timeout=FINISH_TIMEOUT) == 0, server.stderr
    gone, rest = read(far), read(near)
    print(f"uncounted within {uncounted:.1f} s, re-dealt after {forgotten:.1f} s; "
          f"the gone trainer handed out {len(gone)}, the other {len(rest)}")
    assert len(set(rest)) == len(rest), "the trainer that went on got a sample twice"
    # Nothing lost; a repeat only of what the gone trainer handed out last (its final
    # acknowledgements could not cross the link), at most its credit and its message.
    for epoch in range(1, EPOCHS + 1):
        ids = Counter(row[1] for row in gone + rest if row[0] == epoch)
        assert sorted(ids) == list(range(GONE_EPOCH)), f"epoch {epoch}: samples lost"
    repeated = set(gone) & set(rest)
    last = set(gone[-(TRAINER_HWM + 1) * GONE_SPM:])
    assert repeated <= last, f"repeats not among the gone trainer's last: {repeated - last}"
    print(f"{len(repeated)} sample(s) handed out again")
