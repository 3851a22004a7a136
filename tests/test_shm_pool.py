"""The shared-memory pool without sockets: placement, views, release, reuse, reclaim, sweep."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from feedmux._shm import (
    REF_SIZE,
    ShmPool,
    ShmViews,
    activate,
    is_ref,
    shared_empty,
    sweep,
)
from feedmux.protocol import Data, decode, encode

MIB = 1 << 20


@pytest.fixture
def pool(tmp_path: Path) -> ShmPool:
    created = ShmPool.create(4 * MIB, directory=str(tmp_path))  # 16 granules of 256 KiB
    assert created is not None
    return created


def send(pool: ShmPool, value: float) -> list[object] | None:
    message = Data(np.array([[1, int(value)]]), [{"x": np.full(MIB // 4, value, np.float32)}])
    return pool.place(encode(message))


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
    assert pool.reclaim() == 4
    assert send(pool, 5.0) is not None


def test_shared_empty_lives_in_the_pool_and_travels_without_a_copy(pool: ShmPool) -> None:
    assert type(shared_empty((2, 3), "float32")) is np.ndarray  # no active pool: plain
    activate(pool)
    try:
        array = shared_empty(MIB // 4, np.float32)
        array[:] = 7.0
        start = int(array.ctypes.data) - pool.segment.base
        assert 0 <= start < len(pool.segment.data)
        frames = pool.place(encode(Data(np.array([[1, 0]]), [{"x": array}])))
        assert frames is not None
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
    finally:
        activate(None)


def test_sweep_removes_segments_of_servers_that_are_gone(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    stale = tmp_path / f"feedmux-{int(dead.stdout)}-abc"
    stale.write_bytes(b"x")
    alive = tmp_path / f"feedmux-{os.getpid()}-abc"
    alive.write_bytes(b"x")
    assert sweep(str(tmp_path)) == [str(stale)]
    assert alive.exists() and not stale.exists()


def test_close_unlinks_and_a_missing_directory_falls_back(pool: ShmPool, tmp_path: Path) -> None:
    pool.close()
    assert not os.path.exists(pool.path)
    assert ShmPool.create(4 * MIB, directory=str(tmp_path / "missing")) is None
