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

from feedmux._plumbing.shm import (
    REF,
    ROW_GEN,
    ROW_OWNER,
    ROW_STATE,
    SEGMENT_PREFIX,
    SENT,
    SHM_DIR,
    Segment,
    is_ref,
    release_run,
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

    @property
    def token(self) -> str:
        return self.segment.token.hex()

    def _released(self, row: int, generation: int, nbytes: int) -> None:
        release_run(self.segment.slots, row, generation, SENT)
        self.views -= 1
        self.view_bytes -= nbytes

    def resolve(self, ref: Any, nbytes: int) -> np.ndarray:
        """The memory a reference frame names: claimed by this process, freed when unused."""
        _, _, head, count, size, generation, _ = REF.unpack(ref)
        segment = self.segment
        if size != nbytes or not 0 <= head < segment.granules or (
                count * segment.granule < size or head + count > segment.granules):
            raise ValueError(f"shared-memory reference to {size} bytes at granule {head} does "
                             f"not fit an array of {nbytes} bytes in this pool")
        slots, row = segment.slots, head * 4
        slots[row + ROW_OWNER] = self.pid
        if slots[row + ROW_GEN] != generation or slots[row + ROW_STATE] != SENT:
            raise ValueError(f"shared-memory run {head} was taken back before it was received")
        memory = segment.run_memory(head, size)
        self.views += 1
        self.view_bytes += size
        weakref.finalize(memory, self._released, row, generation, size)
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
        if not is_ref(frame):
            return frame
        segment_id = int.from_bytes(frame[8:16], "little")
        attachment = self.attachments.get(segment_id)
        if attachment is None:
            attachment = self._attach_named(segment_id, REF.unpack(frame)[-1])
        if attachment is None:
            raise ValueError("reference to a shared-memory pool this trainer has not mapped "
                             "(a trainer on another host, or one started with shm=False)")
        return attachment.resolve(frame, nbytes)
