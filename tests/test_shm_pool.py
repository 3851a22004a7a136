"""The shared-memory pool without sockets: placement, views, release, reuse, reclaim, sweep."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from feedmux._plumbing.shm import (
    REF_SIZE,
    ShmPool,
    drawing_into,
    is_ref,
    shared_empty,
    sweep,
)
from feedmux._plumbing.shmviews import ShmViews
from feedmux.protocol import Data, decode, encode

MIB = 1 << 20


@pytest.fixture
def pool(tmp_path: Path) -> ShmPool:
    created = ShmPool.create(4 * MIB, directory=str(tmp_path))  # 16 granules of 256 KiB
    assert created is not None
    return created


def send(pool: ShmPool, value: float) -> list[object] | None:
    message = Data(np.array([[1, int(value)]]), [{"x": np.full(MIB // 4, value, np.float32)}])
    placed = pool.place(encode(message))
    return None if placed is None else placed.frames


def receive(views: ShmViews, frames: list[object]) -> np.ndarray:
    message = decode(frames, resolve=views)
    assert isinstance(message, Data)
    array: np.ndarray = message.samples[0]["x"]
    return array


def test_large_frames_become_refs_and_decode_to_views_of_the_pool(pool: ShmPool) -> None:
    frames = send(pool, 3.0)
    assert frames is not None and is_ref(frames[2]) and len(frames[2]) == REF_SIZE
    views = ShmViews()
    assert views.attach(pool.path) == pool.token
    array = receive(views, frames)
    assert array.shape == (MIB // 4,) and (array == 3.0).all() and array.flags.writeable
    # Without the pool mapped, the decoder says what is missing.
    with pytest.raises(Exception, match="has not mapped"):
        decode(frames, resolve=ShmViews())


def test_a_held_view_stays_unchanged_however_many_messages_pass(pool: ShmPool) -> None:
    views = ShmViews()
    views.attach(pool.path)
    first = send(pool, 1.0)
    assert first is not None
    held = receive(views, first)
    for value in range(2, 200):
        frames = send(pool, float(value))
        assert frames is not None
        assert (receive(views, frames) == value).all()  # dropped at once: released
    assert (held == 1.0).all()


def test_runs_are_reused_only_after_release_and_a_full_pool_refuses(pool: ShmPool) -> None:
    views = ShmViews()
    views.attach(pool.path)
    held = []
    for value in range(4):  # 4 x 1 MiB fill the 4 MiB pool
        frames = send(pool, float(value))
        assert frames is not None
        held.append(receive(views, frames))
    assert send(pool, 9.0) is None  # full: nothing overwritten
    assert [float(array[0]) for array in held] == [0.0, 1.0, 2.0, 3.0]
    view = held.pop(0)[10:20]  # a view of a view keeps the run too
    assert send(pool, 9.0) is None
    del view
    frames = send(pool, 9.0)
    assert frames is not None and (receive(views, frames) == 9.0).all()
    assert [float(array[0]) for array in held] == [1.0, 2.0, 3.0]


def test_the_runs_of_a_dead_trainer_come_back(pool: ShmPool) -> None:
    for value in range(4):
        frames = send(pool, float(value))
        assert frames is not None
        head = int.from_bytes(bytes(frames[2][16:24]), "little")  # type: ignore[index]
        dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True)
        pool.segment.table[head, 2] = int(dead.stdout)  # claimed by a process now gone
    # Taken back at a look for dead trainers: the next allocation's (a few times a second,
    # even with room left), or this one.
    pool.reclaim()
    assert pool.stats()["shm_bytes_in_use"] == 0
    for value in range(4):  # the whole pool is free again
        assert send(pool, 5.0 + value) is not None


def test_shared_empty_lives_in_the_pool_and_travels_without_a_copy(pool: ShmPool) -> None:
    assert type(shared_empty((2, 3), "float32")) is np.ndarray  # no active pool: plain
    with drawing_into(pool):
        array = shared_empty(MIB // 4, np.float32)
        array[:] = 7.0
        start = int(array.ctypes.data) - pool.segment.base
        assert 0 <= start < len(pool.segment.data)
        placed = pool.place(encode(Data(np.array([[1, 0]]), [{"x": array}])))
        assert placed is not None
        frames = placed.frames
        views = ShmViews()
        views.attach(pool.path)
        head = int.from_bytes(bytes(frames[2][16:24]), "little")  # type: ignore[index]
        assert head * pool.segment.granule == start  # the very memory it was built in
        received = receive(views, frames)
        assert (received == 7.0).all()
        unsent = shared_empty(MIB // 4, np.float32)
        in_use = pool.stats()["shm_bytes_in_use"]
        del unsent  # never sent: its run comes back
        pool.reclaim()
        assert pool.stats()["shm_bytes_in_use"] == in_use - MIB


def test_sweep_removes_segments_of_servers_that_are_gone(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    stale = tmp_path / f"feedmux-{int(dead.stdout)}-abc"
    stale.write_bytes(b"x")
    alive = tmp_path / f"feedmux-{os.getpid()}-abc"
    alive.write_bytes(b"x")
    assert sweep(str(tmp_path)) == [str(stale)]
    assert alive.exists() and not stale.exists()


def test_sweep_leaves_alone_a_segment_made_in_another_pid_namespace(tmp_path: Path) -> None:
    # A server in a container that shares /dev/shm but not the host's pids: its pid means
    # nothing here, so its segment is not judged by it (before, every such server's start
    # removed the live pools of the servers outside its namespace, and theirs its own).
    import struct

    from feedmux._plumbing.shmtable import MAGIC, pid_namespace

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    header = struct.pack("<8s16sQQQQ", MAGIC, b"t" * 16, 1, 1, 4096, pid_namespace() + 1)
    elsewhere = tmp_path / f"feedmux-{int(dead.stdout)}-abc"
    elsewhere.write_bytes(header)
    here = tmp_path / f"feedmux-{int(dead.stdout)}-def"
    here.write_bytes(header[:-8] + struct.pack("<Q", pid_namespace()))
    assert sweep(str(tmp_path)) == [str(here)]
    assert elsewhere.exists()


def test_close_unlinks_and_a_missing_directory_falls_back(pool: ShmPool, tmp_path: Path) -> None:
    pool.close()
    assert not os.path.exists(pool.path)
    assert ShmPool.create(4 * MIB, directory=str(tmp_path / "missing")) is None


def test_released_runs_are_reused_lowest_first_so_few_pages_are_touched(pool: ShmPool) -> None:
    # Three times the pool's size goes through it, one message in flight at a time: every
    # message lands on the same lowest run, so only its pages were ever written (a next-fit
    # allocator cycled through the whole pool, making all of it resident).
    views = ShmViews()
    views.attach(pool.path)
    heads = set()
    for value in range(12):  # 12 x 1 MiB through a 4 MiB pool
        frames = send(pool, float(value))
        assert frames is not None
        heads.add(int.from_bytes(bytes(frames[2][16:24]), "little"))
        array = receive(views, frames)
        assert (array == value).all()
        del array
        assert pool.stats()["shm_bytes_in_use"] <= MIB
    assert heads == {0}


def test_a_placement_that_is_not_sent_is_given_back(pool: ShmPool) -> None:
    with drawing_into(pool):
        held = shared_empty(MIB // 4, np.float32)
    held[:] = 5
    message = Data(np.array([[1, 0]]), [{"x": held, "y": np.full(MIB // 4, 6, np.float32)}])
    placed = pool.place(encode(message))
    assert placed is not None and pool.stats()["shm_bytes_in_use"] == 2 * MIB
    pool.cancel(placed)  # went to a trainer on another host, as it was
    # The copied run is free again; the shared_empty array is still its owner's.
    pool.reclaim()
    assert pool.stats()["shm_bytes_in_use"] == MIB
    del held, message
    pool.reclaim()
    assert pool.stats()["shm_bytes_in_use"] == 0


def test_references_in_transit_count_until_the_trainer_receives_them(pool: ShmPool) -> None:
    views = ShmViews()
    views.attach(pool.path)
    sent = []
    for value in range(3):
        placed = pool.place(encode(Data(np.array([[1, value]]),
                                        [{"x": np.full(MIB // 4, value, np.float32)}])))
        assert placed is not None
        pool.delivered(b"trainer", placed)
        sent.append(placed)
    assert pool.in_transit(b"trainer") == 3 and pool.in_transit(b"other") == 0
    kept = receive(views, sent[0].frames)  # decoded: claimed, in the trainer's hands now
    assert pool.in_transit(b"trainer") == 2
    receive(views, sent[1].frames)  # decoded and dropped at once: released
    assert pool.in_transit(b"trainer") == 1
    assert (kept == 0).all()
    # The statistics split what is in use: the run still on its way, and the kept view's.
    stats = pool.stats()
    assert stats["shm_bytes_in_transit"] == MIB and stats["shm_bytes_in_use"] == 2 * MIB
    receive(views, sent[2].frames)
    assert pool.stats()["shm_bytes_in_transit"] == 0


def test_a_view_of_a_shared_empty_array_keeps_its_run(pool: ShmPool) -> None:
    # numpy points a view of a view at the array that has the memory: had the finalizer
    # been on a slice of the pool, dropping the array while a view of it (an encoded
    # frame queued in ZeroMQ) lives would free the run under that view.
    with drawing_into(pool):
        array = shared_empty((2, MIB // 8), np.float32)
    array[:] = 7
    frame = array.reshape(-1).view(np.uint8)
    del array
    pool.reclaim()
    assert pool.stats()["shm_bytes_in_use"] == MIB  # still the frame's
    del frame
    pool.reclaim()
    assert pool.stats()["shm_bytes_in_use"] == 0


def test_the_servers_own_copy_goes_to_the_pool_and_spares_shared_empty(pool: ShmPool) -> None:
    from feedmux.server._sources.owning import own

    with drawing_into(pool):
        pool.want(False)  # no trainer on this host: a plain copy
        drawn = np.full(MIB // 4, 2, np.float32)
        assert not pool.lent(own(drawn, pool))
        pool.want(True)  # sent through the pool: the protective copy is made there
        copied = own(drawn, pool)
        assert copied is not drawn and pool.lent(copied) and (copied == 2).all()
        built = shared_empty(MIB // 4, np.float32)
        assert own({"x": built}, pool)["x"] is built  # the server's already: never copied


def test_a_run_the_server_still_holds_is_not_reused_after_the_trainers_release(
        pool: ShmPool) -> None:
    # A rank's message is kept (its frames: the server's owned copies, in the pool) for a
    # successor while the trainer got references: the trainer's release must not let the
    # run be reused under the frames the server keeps.
    with drawing_into(pool):
        kept = shared_empty(MIB // 4, np.float32)
    kept[:] = 4
    placed = pool.place(encode(Data(np.array([[1, 0]]), [{"x": kept}])))
    assert placed is not None
    pool.delivered(b"rank", placed)
    views = ShmViews()
    views.attach(pool.path)
    receive(views, placed.frames)  # received and dropped at once: released by the trainer
    pool.reclaim()
    assert pool.stats()["shm_bytes_in_use"] == MIB  # still the server's
    for value in range(8):  # other messages pass through the pool meanwhile
        frames = send(pool, float(value))
        assert frames is not None and (receive(views, frames) == value).all()
    assert (kept == 4).all()
    del kept, placed
    pool.reclaim()
    assert pool.stats()["shm_bytes_in_use"] == 0


def _worker_sends(pool: ShmPool, pipe: Any, value: float, keep_one: bool) -> None:
    """A forked worker: its message as references to its region, sent up ``pipe``."""
    pool.enter_worker(0, lambda: False)
    pool.want(True)
    from feedmux.server._sources.owning import own

    sample = own({"x": np.full(MIB // 4, value, np.float32)}, pool)  # the owned copy, in the pool
    placed = pool.forward(encode(Data(np.array([[1, 0]]), [sample])))
    assert placed is not None
    placed.delivered()
    with drawing_into(pool):
        lent = shared_empty(MIB // 4, np.float32) if keep_one else None  # dies with the worker
    pipe.send([bytes(memoryview(frame)) for frame in placed.frames])
    if lent is not None:
        os.kill(os.getpid(), 9)


def _from_worker(pool: ShmPool, keep_one: bool, value: float = 6.0) -> list[Any]:
    context = multiprocessing.get_context("fork")
    parent, child = context.Pipe()
    worker = context.Process(target=_worker_sends, args=(pool, child, value, keep_one))
    worker.start()
    assert parent.poll(30), "the worker sent nothing"
    frames: list[Any] = parent.recv()
    worker.join(30)
    return frames


def test_a_worker_writes_into_its_region_and_the_server_sends_its_references_on(
        pool: ShmPool) -> None:
    pool.split(1)  # before the fork: 8 granules for the server, 8 for the worker
    frames = _from_worker(pool, keep_one=False)
    head = int.from_bytes(frames[2][16:24], "little")
    assert is_ref(frames[2]) and head >= 8  # in the worker's region, not copied by us
    placed = pool.place(frames)  # the server sends it on as it is
    assert placed is not None and pool.stats()["shm_bytes_copied"] == 0
    views = ShmViews()
    views.attach(pool.path)
    assert (receive(views, placed.frames) == 6.0).all()
    # A trainer on another host gets the bytes, copied out; the run is free after.
    frames = _from_worker(pool, keep_one=False)
    whole = pool.forwarded.copied_out(frames)
    assert (np.frombuffer(whole[2], np.float32) == 6.0).all()
    pool.drop(frames)
    assert pool.stats()["shm_bytes_in_use"] == 0


def test_the_runs_of_a_killed_worker_come_back_when_the_server_adopts_them(
        pool: ShmPool) -> None:
    pool.split(1)
    frames = _from_worker(pool, keep_one=True)  # forwarded one message, killed holding one
    assert pool.stats()["shm_bytes_in_use"] == 2 * MIB
    views = ShmViews()
    views.attach(pool.path)
    placed = pool.place(frames)
    assert placed is not None
    pool.delivered(b"trainer", placed)
    view = receive(views, placed.frames)  # a trainer's view: it stays
    assert pool.adopt(0) == 1  # the lent-out run of the dead worker
    assert pool.stats()["shm_bytes_in_use"] == MIB and (view == 6.0).all()
    del view
    pool.reclaim()
    assert pool.stats()["shm_bytes_in_use"] == 0


def test_a_dead_workers_successor_writes_into_its_region_around_what_a_trainer_holds(
        pool: ShmPool) -> None:
    # A dead worker is replaced by a new one in its seat: after the server adopted the
    # dead one's runs, the new worker allocates in the same region, around the run a
    # trainer still holds, and both views keep their values.
    pool.split(1)
    frames = _from_worker(pool, keep_one=True)  # forwarded one message, killed holding one
    placed = pool.place(frames)
    assert placed is not None
    pool.delivered(b"trainer", placed)
    views = ShmViews()
    views.attach(pool.path)
    held = receive(views, placed.frames)
    assert pool.adopt(0) == 1  # the lent-out run; the trainer's stays
    again = _from_worker(pool, keep_one=False, value=7.0)  # the successor, forked after
    old, new = (int.from_bytes(each[2][16:24], "little") for each in (frames, again))
    assert new >= 8 and new != old  # in the seat's region, not over the held run
    placed = pool.place(again)
    assert placed is not None and pool.stats()["shm_bytes_copied"] == 0
    pool.delivered(b"trainer", placed)
    fresh = receive(views, placed.frames)
    assert (held == 6.0).all() and (fresh == 7.0).all()
    del held, fresh
    pool.adopt(0)
    pool.reclaim()
    assert pool.stats()["shm_bytes_in_use"] == 0


def test_a_dead_workers_runs_the_server_took_stay_and_the_others_come_back(
        pool: ShmPool) -> None:
    pool.split(1)
    taken = _from_worker(pool, keep_one=False)  # the server took this message (its merge)
    pool.forwarded.receive(taken)
    on_its_way = _from_worker(pool, keep_one=False)  # sent, not taken yet: then it died
    assert pool.stats()["shm_bytes_in_use"] == 2 * MIB  # the worker's region, full
    assert pool.adopt(0) == 1  # the run of the message nothing took
    assert pool.stats()["shm_bytes_in_use"] == MIB
    # What the server took goes on as a live worker's would: sent as references.
    placed = pool.place(taken)
    assert placed is not None and pool.stats()["shm_bytes_copied"] == 0
    pool.delivered(b"trainer", placed)
    views = ShmViews()
    views.attach(pool.path)
    view = receive(views, placed.frames)
    assert (view == 6.0).all()
    # The message still on its way names a run taken back: it can name nothing now.
    with pytest.raises(ValueError, match="not a run it forwarded"):
        pool.forwarded.head(on_its_way[2])
    del view
    pool.reclaim()
    assert pool.stats()["shm_bytes_in_use"] == 0


def test_a_failed_runs_workers_give_back_even_what_the_server_took(pool: ShmPool) -> None:
    pool.split(1)
    taken = _from_worker(pool, keep_one=False)
    pool.forwarded.receive(taken)
    assert pool.adopt(0, keep_received=False) == 1  # nothing the server holds will be sent
    assert pool.stats()["shm_bytes_in_use"] == 0


def test_a_workers_run_the_server_reads_in_place_goes_on_and_is_kept_while_viewed(
        pool: ShmPool) -> None:
    pool.split(1)
    frames = _from_worker(pool, keep_one=False)
    message = decode(frames, resolve=pool.forwarded.view)  # the forwarder's read: no copy
    assert isinstance(message, Data)
    sample = message.samples[0]
    start = int(sample["x"].ctypes.data) - pool.segment.base
    assert start // pool.segment.granule >= 8 and (sample["x"] == 6.0).all()
    # Encoded again (a rank's share of this sample): the worker's run goes on as it is.
    placed = pool.place(encode(Data(np.array([[1, 0]]), [sample])))
    assert placed is not None and is_ref(placed.frames[2])
    assert pool.stats()["shm_bytes_copied"] == 0
    pool.delivered(b"rank", placed)
    views = ShmViews()
    views.attach(pool.path)
    assert (receive(views, placed.frames) == 6.0).all()  # received and released at once
    # The server still reads it (kept for a successor): the run is not free yet.
    assert pool.stats()["shm_bytes_in_use"] == MIB
    # A second share of the same run (a padding repeat) is copied, never sent twice.
    again = pool.place(encode(Data(np.array([[1, 1]]), [sample])))
    assert again is not None and again.taken and pool.stats()["shm_bytes_copied"] == MIB
    pool.cancel(again)
    del sample, message, placed
    assert pool.stats()["shm_bytes_in_use"] == 0


def test_a_workers_run_the_server_reads_and_never_sends_on_is_freed_with_its_views(
        pool: ShmPool) -> None:
    pool.split(1)
    frames = _from_worker(pool, keep_one=True)  # killed holding a lent-out run
    message = decode(frames, resolve=pool.forwarded.view)
    assert isinstance(message, Data)
    assert pool.adopt(0) == 1  # the lent-out run; the one the server reads stays
    assert pool.stats()["shm_bytes_in_use"] == MIB
    assert (message.samples[0]["x"] == 6.0).all()
    del message
    pool.reclaim()  # the dead worker's run, now the server's: free with its last view
    assert pool.stats()["shm_bytes_in_use"] == 0
