"""Compressed links between the hosts: exact samples, and ``auto`` turning itself on where the
link (shaped with tbf) is the limit and the stream compresses, and staying off otherwise."""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.multihost.hosts import TwoHosts
from tests.multihost.test_two_hosts import records, serve_in, trainer_in

pytestmark = pytest.mark.timeout(180)

EPOCH = 64


def stats_in_a(hosts: TwoHosts, control: str, timeout: float = 5.0) -> dict[str, object]:
    """The server's statistics, asked from host A (``feedmux stats`` prints JSON; {} if it
    did not answer within ``timeout`` s)."""
    done = hosts.run("a", [sys.executable, "-m", "feedmux", "stats", control, "--timeout",
                           f"{timeout:g}"])
    if done.returncode != 0:
        return {}
    stats: dict[str, object] = json.loads(done.stdout)
    return stats


def exact(path: Path, epochs: int) -> None:
    got = records(path)
    assert len(got) == EPOCH * epochs
    for epoch in range(1, epochs + 1):
        ids = Counter(i for e, i in got if e == epoch)
        assert sorted(ids) == list(range(EPOCH)) and set(ids.values()) == {1}


@pytest.mark.parametrize("compress", ["lz4", "zstd:3"])
def test_a_fixed_codec_carries_exact_epochs_to_the_other_host(
        hosts: TwoHosts, tmp_path: Path, compress: str) -> None:
    server = serve_in(hosts, "--arg", "streams=4", "--arg", "per_stream=16", "--arg",
                      "width=8192", "--epochs", "2", "--samples-per-message", "16",
                      "--shm-size", "64", "--compress", compress)
    trainer = trainer_in(hosts, "b", server, tmp_path / "b")
    assert trainer.wait(timeout=60) == 0
    assert server.wait(timeout=30) == 0, server.stderr
    exact(tmp_path / "b", 2)


def test_auto_compresses_a_compressible_stream_on_a_slow_link_and_says_why(
        hosts: TwoHosts, tmp_path: Path) -> None:
    hosts.shape("100mbit")
    # 16 samples of 32 KiB a message, each array one value: compresses about 1000 to 1.
    # The stream must last past auto's trial (a window off, a quarter second settling, a
    # window on): unpaced, 400 epochs took about a second once lz4 was on and the trainer
    # was often done before the trial. Paced at 0.2 ms a sample (at most ~160 MB/s, 13x
    # the link's 12.5 MB/s), the rest of the stream takes 5 s or more.
    epochs = 400
    server = serve_in(hosts, "--arg", "streams=4", "--arg", "per_stream=16", "--arg",
                      "width=8192", "--arg", "delay=0.0002", "--epochs", str(epochs),
                      "--samples-per-message", "16", "--shm-size", "64")
    trainer = trainer_in(hosts, "b", server, tmp_path / "b")
    deadline = time.monotonic() + 60
    decision: dict[str, str] = {}
    while time.monotonic() < deadline and trainer.poll() is None:
        stats = stats_in_a(hosts, server.control)
        decision = {key: str(value) for key, value in stats.items() if ".compress" in key}
        if any(value.startswith("link is the limit") for value in decision.values()):
            break
        time.sleep(0.2)  # the poll interval of a bounded wait for the decision
    assert any(key.endswith(".compress") and value in ("lz4", "zstd:1")
               for key, value in decision.items()), decision
    assert any(value.startswith("link is the limit") for value in decision.values()), decision
    assert trainer.wait(timeout=120) == 0
    assert server.wait(timeout=30) == 0, server.stderr
    exact(tmp_path / "b", epochs)


def test_two_workers_compress_and_the_other_host_gets_exact_epochs(
        hosts: TwoHosts, tmp_path: Path) -> None:
    # The workers compress (no trainer in host A maps the pool); the server sends their
    # frames on as they are.
    server = serve_in(hosts, "--arg", "streams=4", "--arg", "per_stream=16", "--arg",
                      "width=8192", "--epochs", "3", "--samples-per-message", "16",
                      "--shm-size", "64", "--compress", "lz4", "--workers", "2")
    trainer = trainer_in(hosts, "b", server, tmp_path / "b")
    assert trainer.wait(timeout=90) == 0
    assert server.wait(timeout=30) == 0, server.stderr
    exact(tmp_path / "b", 3)


def _exact_between(paths: list[Path], epochs: int) -> None:
    """Every sample of every epoch once among the trainers that recorded into ``paths``."""
    got = [record for path in paths for record in records(path)]
    assert len(got) == EPOCH * epochs
    for epoch in range(1, epochs + 1):
        ids = Counter(i for e, i in got if e == epoch)
        assert sorted(ids) == list(range(EPOCH)) and set(ids.values()) == {1}, epoch


@pytest.mark.parametrize("mode", ["free", "ranked", "groups"])
def test_reliable_ranked_and_grouped_trainers_get_exact_epochs_compressed_across_the_link(
        hosts: TwoHosts, tmp_path: Path, mode: str) -> None:
    # Two free trainers, two ranks, two groups, each through a compressed link: the free
    # trainers' ledger keeps compressed frames, a rank's share is cut from the message
    # before it is compressed, each group gets its own copy.
    # Sampling starts once both trainers are there (a group that comes later starts at
    # the next epoch, and this stream has two).
    serve_flags = ["--min-trainers", "2"]
    trainer_flags = {"free": [[], []],
                     "ranked": [["--rank", "0", "--world-size", "2"],
                                ["--rank", "1", "--world-size", "2"]],
                     "groups": [["--group", "one"], ["--group", "two"]]}[mode]
    server = serve_in(hosts, "--arg", "streams=4", "--arg", "per_stream=16", "--arg",
                      "width=8192", "--epochs", "2", "--samples-per-message", "16",
                      "--shm-size", "64", "--compress", "zstd:1", *serve_flags)
    outs = [tmp_path / f"b{index}" for index in range(2)]
    trainers = [trainer_in(hosts, "b", server, out, *flags)
                for out, flags in zip(outs, trainer_flags, strict=True)]
    for trainer in trainers:
        assert trainer.wait(timeout=90) == 0
    assert server.wait(timeout=30) == 0, server.stderr
    if mode == "groups":  # every group the whole stream
        for out in outs:
            exact(out, 2)
    else:
        _exact_between(outs, 2)
