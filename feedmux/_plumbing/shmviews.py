"""The trainer's side of a server's shared-memory pool: references in, views out.

This module owns what a trainer on the server's host does with the pool
(:mod:`feedmux._plumbing.shm` owns the segment and the server's side):
:class:`ShmAttachment` maps one server's segment and turns a reference frame
into a writable uint8 array over it, claiming the run (its pid into the slot
table) and releasing it once the last view is gone (a store into the slot table,
made by a ``weakref.finalize``: no release message); :class:`ShmViews` holds a
trainer's attachments and is the resolver its decoder is given. It never
allocates, never imports zmq and never writes a row it was not sent.
"""

from __future__ import annotations

import os
import weakref
from typing import Any

import numpy as np

from feedmux._plumbing.shm import SEGMENT_PREFIX, SHM_DIR, Segment
from feedmux._plumbing.shmtable import (
    CLAIM_SHIFT,
    CLAIMS,
    MAGIC,
    REF,
    REF_SIZE,
    ROW_GEN,
    ROW_OWNER,
    ROW_STATE,
    ROW_WIDTH,
    SENT,
    cell_columns,
    release_run,
    split_count,
)

__all__ = ["ShmAttachment", "ShmViews"]


class ShmAttachment:
    """The trainer's side of one server's segment: refs in, views out, releases on death."""

    def __init__(self, path: str) -> None:
        fd = os.open(path, os.O_RDWR)
        try:
            self.segment = Segment(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)
        self.pid = os.getpid()
        #: Views of the pool this trainer holds (received, not yet released), and their bytes:
        #: what a trainer that keeps its samples is told when the pool runs full.
        self.views = self.view_bytes = 0
        #: Per view held (by the id of the weak reference to its memory, as an array is not
        #: hashable): that reference, the slot table row, the generation, the bytes and the
        #: state column of this trainer's claim cell.
        self._watched: dict[int, tuple[weakref.ref[np.ndarray], int, int, int, int]] = {}

    @property
    def token(self) -> str:
        return self.segment.token.hex()

    def _released(self, memory: weakref.ref[np.ndarray]) -> None:
        """The last view of a run is gone: the run is free again (if still this trainer's)."""
        _, row, generation, nbytes, column = self._watched.pop(id(memory))
        release_run(self.segment.slots, row, generation, SENT, column)
        self.views -= 1
        self.view_bytes -= nbytes

    def resolve(self, ref: Any, nbytes: int) -> np.ndarray:
        """The memory a reference frame names: claimed by this process, freed when unused."""
        _, _, head, count, size, generation, _ = REF.unpack(ref)
        return self.claim(head, count, size, generation, nbytes)

    def claim(self, head: int, count: int, size: int, generation: int,
              nbytes: int) -> np.ndarray:
        """The memory of the run a reference names (its fields), claimed by this process
        as the claim the reference names (its granule field's high bits)."""
        segment = self.segment
        if count >> CLAIM_SHIFT:  # one claim among several (consumer groups)
            count, claim = split_count(count)
            state, owner, _ = cell_columns(claim) if claim <= CLAIMS else (-1, -1, -1)
        else:  # the common case, the row's own fields: no call
            claim, state, owner = 0, ROW_STATE, ROW_OWNER
        if size != nbytes or not 0 <= head < segment.granules or state < 0 or (
                count * segment.granule < size or head + count > segment.granules):
            raise ValueError(f"shared-memory reference to {size} bytes at granule {head} "
                             f"(claim {claim}) does not fit an array of {nbytes} bytes in "
                             f"this pool")
        slots, row = segment.slots, head * ROW_WIDTH
        slots[row + owner] = self.pid
        if slots[row + ROW_GEN] != generation or slots[row + state] != SENT:
            raise ValueError(f"shared-memory run {head} was taken back before it was received")
        memory = segment.run_memory(head, size)
        self.views += 1
        self.view_bytes += size
        # A weak reference with a callback, not weakref.finalize: the release runs when
        # the last view goes all the same, for a third of finalize's cost per message.
        watch = weakref.ref(memory, self._released)
        self._watched[id(watch)] = (watch, row, generation, size, state)
        return memory


class ShmViews:
    """A trainer's attachments, by segment id: the resolver its decoder is given."""

    def __init__(self) -> None:
        self.attachments: dict[int, ShmAttachment] = {}

    def attach(self, path: str) -> str:
        """Map the segment at ``path``; return the token read from it (raises OSError)."""
        try:
            attachment = ShmAttachment(path)
        except ValueError as error:
            raise OSError(str(error)) from None
        self.attachments[attachment.segment.segment_id] = attachment
        return attachment.token

    def held(self) -> tuple[int, int, int]:
        """(views held, their bytes, the pools' bytes) over every mapped pool."""
        attachments = list(self.attachments.values())
        return (sum(a.views for a in attachments), sum(a.view_bytes for a in attachments),
                sum(len(a.segment.data) for a in attachments))

    def _attach_named(self, segment_id: int, creator: int) -> ShmAttachment | None:
        """Map the segment a reference names, found by its name on this host.

        A reference can arrive before the offer that names the pool (a trainer
        whose data socket was dealt to before its hello was answered): its
        creator's pid and segment id give the file's name. None where there is
        no such file (another host, another container).
        """
        token = segment_id.to_bytes(8, "little")[:6].hex()
        try:
            self.attach(os.path.join(SHM_DIR, f"{SEGMENT_PREFIX}{creator}-{token}"))
        except OSError:
            return None
        return self.attachments.get(segment_id)

    def __call__(self, frame: Any, nbytes: int) -> Any:
        if len(frame) != REF_SIZE:
            return frame
        magic, segment_id, head, count, size, generation, creator = REF.unpack(frame)
        if magic != MAGIC:
            return frame
        attachment = self.attachments.get(segment_id)
        if attachment is None:
            attachment = self._attach_named(segment_id, creator)
        if attachment is None:
            raise ValueError("reference to a shared-memory pool this trainer has not mapped "
                             "(a trainer on another host, or one started with shm=False)")
        return attachment.claim(head, count, size, generation, nbytes)
