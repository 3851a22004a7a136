"""Compression per trainer link (``--compress auto|off|lz4|zstd[:LEVEL]``): when it pays.

:class:`LinkCompression` owns the choice, per trainer that the socket carries to, between
the message as it is and its compressed form (:func:`~feedmux.protocol.compress_frames`,
wire kind 15). A fixed codec compresses every socket link; ``off`` none; ``auto`` (the
default) decides per trainer from what it measures:

- a trainer that maps the server's shared-memory pool (same host) is never compressed;
- how compressible the stream is: about once a second one message (whichever trainer it
  goes to: the stream is the same for every link) is compressed with each candidate
  (``lz4``, ``zstd:1``, and ``zstd:1+delta`` when the message has array frames that suit
  the delta filter: integer images or rows), which gives its ratio and speed (bytes/s of
  input, the best of the last few samples); a best ratio above :data:`WORTH` is
  "incompressible" and stays off. The filter
  is measured, not assumed: on photographs it keeps 0.54 of the bytes where zstd alone
  keeps 0.79, on labels or token ids it may keep more, and the candidate with the best
  predicted rate wins;
- whether the link or the CPU is the limit, by trying: a window of
  :data:`WINDOW` seconds off, then (:data:`SETTLE` seconds after the switch, once what was
  queued raw has left) one with the candidate whose predicted rate
  (``min(speed, rate off / ratio)``) is best; it stays on only if the raw bytes/s handed to
  that trainer rose by half the gain the ratio predicts for a full link (at least
  :data:`GAIN`, at most 2x: a loaded machine's noise is not taken for a gain). On a link
  that is not the limit (a fast veth, a trainer or a server busy with its CPU) it goes
  off again.
  A codec that cannot compress as fast as the link already carries is not tried at all.
- the decision is held :data:`HOLD` seconds, then tried again (the stream or the link
  may have changed).

The decision and its reason per trainer are in the statistics
(``trainer.<id>.compress``, ``.compress_ratio``, ``.compress_reason``). With several
sampling workers a message may come compressed already (the workers compress with
:meth:`LinkCompression.worker_codec`, :mod:`feedmux.server._sources.packing`):
:class:`MessageForms` sends that form as it is to every link that wants its codec and
inflates it once for a link that wants the message raw (a same-host trainer, ``auto``
off, a trial's off window). Whatever the server must compress itself is compressed in its
dealing thread, once per message and codec (a message offered to several trainers in turn
is compressed once). The figures ``compressed_by_workers``, ``compressed_by_server`` and
``inflated_by_server`` count messages. It never sends and never decides who gets a message.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from feedmux.protocol import INFLATES, Codec, StatValue, compress_frames, inflate_frames, packed
from feedmux.protocol._compress import STORED
from feedmux.protocol._delta import frame_strides

__all__ = ["GAIN", "HOLD", "MIN_MESSAGE", "SETTLE", "LinkCompression", "MessageForms", "WINDOW",
           "WORTH"]

#: Candidates of ``auto``: a fast one, one that squeezes more for the same CPU, and the
#: same after the delta filter (measured only on a message with frames that suit it).
CANDIDATES = (Codec("lz4"), Codec("zstd", 1), Codec("zstd", 1, delta=True))
_CANDIDATE = {codec.label: codec for codec in CANDIDATES}
#: Seconds of each window of a trial (off, then on).
WINDOW = 1.0
#: Seconds after a switch (off to on, on to off) before a window counts: the messages
#: queued before it (the socket's high-water mark, the kernel's buffers: ~0.1-0.2 s of
#: 1.5 MB images on 1 Gbit) still leave at the old rate, which a window would count.
SETTLE = 0.25
#: Seconds a decision holds before it is tried again.
HOLD = 20.0
#: Seconds between two measurements of the stream's compressibility.
SAMPLE_EVERY = 1.0
#: Samples whose speeds are kept per candidate; the best counts. One compression of a few
#: ms timed on a busy machine may be preempted: it then measures the scheduler, not the
#: codec, and once made zstd:1 look faster than zstd:1+delta on photographs.
SPEEDS_KEPT = 5
#: A ratio (compressed / raw) above this is not worth a trial.
WORTH = 0.9
#: The rise of raw bytes/s that keeps compression on after a trial (a loaded machine's
#: noise is a few per cent; photographs compress ~0.8 at the fast levels, 1.25x at best,
#: ~0.54 after the delta filter, 1.85x at best).
GAIN = 1.1
#: Trainers whose measurements are kept (the oldest forgotten past it).
MAX_LINKS = 4096
#: Why a trainer gets the codec of a fixed ``--compress``.
FIXED = "set by --compress"
#: Why a link that maps the pool is never compressed.
SAME_HOST = "same host (shared memory)"
#: The codecs a trainer of this version inflates (the default of ``inflates``).
EVERY_CODEC = frozenset(INFLATES)
#: Why a trainer that names no codec of ``auto``'s is sent raw.
_NO_CODEC = "the trainer inflates none of auto's codecs (a trainer older than compression)"
#: Messages smaller than this are never compressed (nothing to gain on a header).
MIN_MESSAGE = 16 * 1024


def _taken(codec: Codec, inflates: frozenset[int]) -> tuple[Codec | None, str]:
    """What a trainer that inflates ``inflates`` gets of the fixed ``codec`` (it, zstd
    without the filter, or raw), and why.

    >>> codec, why = _taken(Codec("zstd", 3, delta=True), frozenset({1, 2}))
    >>> codec.label, why
    ('zstd:3', 'the trainer inflates codecs [1, 2], not zstd:3+delta')
    >>> _taken(Codec("lz4"), frozenset())[0] is None
    True
    """
    if codec.numbers <= inflates:
        return codec, FIXED
    why = f"the trainer inflates codecs {sorted(inflates)}, not {codec.label}"
    plain = Codec(codec.name, codec.level)
    return (plain if codec.delta and plain.numbers <= inflates else None), why


def _nbytes(frames: Sequence[Any]) -> int:
    return sum(memoryview(frame).nbytes for frame in frames)


@dataclass
class _Link:
    """One trainer's measurements and decision."""

    codec: Codec | None = None
    reason: str = "measuring"
    phase: str = "off-window"  # off-window, on-window, hold
    since: float = 0.0
    raw: int = 0  # raw bytes handed to the socket in the current window
    rate_off: float = 0.0
    #: Whether the trainer maps the pool, the codecs it inflates, and when they were last
    #: asked (a trainer maps it once, soon after its welcome, and keeps it; its codecs
    #: come with its hello: asked at most once a second).
    local: bool = False
    inflates: frozenset[int] = frozenset()
    asked: float = float("-inf")


@dataclass
class _Stream:
    """The stream's compressibility, the same for every link: per candidate, the
    compressed / raw ratio of the last sampled message and the input bytes/s, the best of
    the last :data:`SPEEDS_KEPT` samples."""

    ratio: dict[str, float] = field(default_factory=dict)
    speed: dict[str, float] = field(default_factory=dict)
    recent: dict[str, deque[float]] = field(default_factory=dict)
    sampled: float = float("-inf")


class MessageForms:
    """The forms of the message being dealt: raw, and compressed per codec, each made once.

    A message may come compressed (a sampling worker's): that form serves every link that
    wants its codec as it is; a link that wants another form gets it from the message
    inflated once. Counts what the server made itself (``compressed_by_server``,
    ``inflated_by_server``) and what came compressed (``compressed_by_workers``, told by
    :meth:`arrived`).
    """

    def __init__(self) -> None:
        self.counts = {"compressed_by_workers": 0, "compressed_by_server": 0,
                       "inflated_by_server": 0}
        self._of: Sequence[Any] | None = None  # the message whose forms are held
        self._forms: dict[str, Sequence[Any]] = {}  # by codec label; "" the raw form
        #: The codecs of the frames it came compressed with (None: it came raw).
        self._packed: frozenset[int] | None = None
        self._raw_bytes = 0

    def arrived(self, frames: Sequence[Any]) -> bool:
        """Whether a worker's message came compressed (counted)."""
        compressed = packed(frames) is not None
        self.counts["compressed_by_workers"] += compressed
        return compressed

    def raw(self, frames: Sequence[Any]) -> Sequence[Any]:
        """``frames`` as encoded (inflated once if it came compressed)."""
        if frames is not self._of and packed(frames) is None:
            return frames  # nothing to make: not held
        self._load(frames)
        raw = self._forms.get("")
        if raw is None:
            raw = self._forms[""] = inflate_frames(frames)
            self.counts["inflated_by_server"] += 1
        return raw

    def of(self, frames: Sequence[Any], codec: Codec | None) -> Sequence[Any]:
        """``frames`` compressed with ``codec`` (as they came, if they came so), or raw."""
        if codec is None:
            return self.raw(frames)
        self._load(frames)
        wire = self._forms.get(codec.label)
        if wire is None:
            if self._packed is not None and self._packed <= codec.numbers:
                wire = frames
            elif self._raw_bytes < MIN_MESSAGE:
                wire = self.raw(frames)
            else:
                wire = compress_frames(self.raw(frames), codec)
                self.counts["compressed_by_server"] += 1
            self._forms[codec.label] = wire
        return wire

    def raw_bytes(self, wire: Sequence[Any]) -> int:
        """The bytes ``wire`` carries once inflated."""
        if wire is self._of or any(wire is form for form in self._forms.values()):
            return self._raw_bytes
        return _nbytes(wire)

    def _load(self, frames: Sequence[Any]) -> None:
        if frames is self._of:
            return
        header = packed(frames)
        self._of, self._forms = frames, {}
        if header is None:
            self._packed, self._raw_bytes = None, _nbytes(frames)
            self._forms[""] = frames
        else:
            self._packed = frozenset(header["c"]) - {STORED}
            self._raw_bytes = sum(header["n"])


class LinkCompression:
    """``setting``: ``"auto"``, a :class:`~feedmux.protocol.Codec`, or None (off);
    ``same_host(target)``: whether that trainer maps the shared-memory pool;
    ``inflates(target)``: the codecs that trainer said it inflates (a trainer that named
    none is sent raw; one that cannot inflate the filter gets plain zstd); ``clock``
    the time of the windows and ``timer`` the one that times each candidate's compression
    (a test gives both, so that a loaded machine's CPU does not decide for it)."""

    def __init__(self, setting: str | Codec | None, same_host: Callable[[bytes], bool],
                 clock: Callable[[], float] = time.monotonic,
                 timer: Callable[[], float] = time.perf_counter,
                 inflates: Callable[[bytes], frozenset[int]] = lambda target: EVERY_CODEC,
                 ) -> None:
        self.setting = setting
        self.same_host = same_host
        self.inflates = inflates
        self.clock = clock
        self.timer = timer
        self.links: dict[bytes, _Link] = {}
        self.stream = _Stream()
        self.forms = MessageForms()

    def worker_codec(self) -> Codec | None:
        """The codec the sampling workers should compress with: the fixed one, or the one
        most of ``auto``'s compressing links use (None: no link compresses)."""
        if self.setting is None or isinstance(self.setting, Codec):
            return self.setting
        votes = Counter(link.codec for link in self.links.values() if link.codec is not None)
        return max(votes, key=votes.__getitem__) if votes else None

    def wire(self, target: bytes, frames: Sequence[Any]) -> Sequence[Any]:
        """What the socket carries of ``frames`` (raw, or compressed by a worker) to
        ``target``."""
        if self.setting is None:
            return frames if packed(frames) is None else self.forms.raw(frames)
        link = self.links.get(target)
        if link is None:
            if len(self.links) >= MAX_LINKS:  # ids come from peers: the oldest goes
                del self.links[next(iter(self.links))]
            link = self.links[target] = _Link(since=self.clock())
        now = self.clock()
        if not link.local and now - link.asked >= SAMPLE_EVERY:
            link.local, link.inflates, link.asked = (self.same_host(target),
                                                     self.inflates(target), now)
            if isinstance(self.setting, Codec):  # decided again when the codecs are read
                link.codec, link.reason = _taken(self.setting, link.inflates)
        if isinstance(self.setting, Codec):
            return self.forms.of(frames, link.codec)
        if link.local:
            link.codec, link.reason = None, SAME_HOST
            return self.forms.raw(frames)
        if now - self.stream.sampled >= SAMPLE_EVERY:
            raw = self.forms.raw(frames)
            if _nbytes(raw) >= MIN_MESSAGE:
                self._sample(raw, now)
        self._step(link, now)
        return self.forms.of(frames, link.codec)

    def delivered(self, target: bytes, wire: Sequence[Any]) -> None:
        """``wire`` (from :meth:`wire`) went to ``target``: count its raw bytes."""
        link = self.links.get(target)
        if link is not None:
            link.raw += self.forms.raw_bytes(wire)

    def _sample(self, frames: Sequence[Any], now: float) -> None:
        """Compress one message with each candidate: the stream's ratio and speed (the
        filtered one only when a frame suits the filter: else it is zstd's own form)."""
        stream = self.stream
        stream.sampled, stream.ratio = now, {}
        raw = _nbytes(frames)
        filterable = bool(frame_strides(frames[0]))
        for codec in CANDIDATES:
            if codec.delta and not filterable:
                continue
            started = self.timer()
            size = _nbytes(compress_frames(frames, codec))
            seconds = max(self.timer() - started, 1e-9)
            stream.ratio[codec.label] = size / raw
            recent = stream.recent.setdefault(codec.label, deque(maxlen=SPEEDS_KEPT))
            recent.append(raw / seconds)
            stream.speed[codec.label] = max(recent)

    def _best(self, link: _Link) -> tuple[Codec | None, str]:
        """The candidate with the best predicted rate, or None and why none."""
        stream = self.stream
        if not stream.ratio:
            return None, "measuring"
        rate = max(link.rate_off, 1.0)

        def predicted(codec: Codec) -> float:
            return min(stream.speed[codec.label], rate / stream.ratio[codec.label])

        taken = [codec for codec in CANDIDATES
                 if codec.label in stream.ratio and codec.numbers <= link.inflates]
        if not taken:
            return None, _NO_CODEC
        best = max(taken, key=predicted)
        ratio = stream.ratio[best.label]
        if ratio > WORTH:
            return None, f"incompressible (ratio {ratio:.2f})"
        if stream.speed[best.label] < rate * GAIN:
            return None, (f"CPU is the limit: {best.label} compresses "
                          f"{stream.speed[best.label] / 1e6:.0f} MB/s, the link carries "
                          f"{rate / 1e6:.0f} MB/s")
        return best, ""

    def _step(self, link: _Link, now: float) -> None:
        """Move the trial on once its window has passed."""
        if link.phase == "hold":
            if now - link.since >= HOLD:
                settle = 0.0 if link.codec is None else SETTLE
                link.codec, link.phase, link.since, link.raw = None, "off-window", now + settle, 0
            return
        if now < link.since:  # settling after a switch: what was queued before drains
            link.raw = 0
            return
        elapsed = now - link.since
        if elapsed < WINDOW:
            return
        rate = link.raw / elapsed
        link.since, link.raw = now, 0
        if link.phase == "off-window":
            link.rate_off = rate
            codec, reason = self._best(link)
            if codec is None:
                link.codec, link.reason, link.phase = None, reason, "hold"
            else:
                link.codec, link.phase, link.since = codec, "on-window", now + SETTLE
            return
        codec = link.codec
        assert codec is not None
        # A full link gives about the gain the ratio predicts; half of it is asked (at
        # least GAIN, at most 2x), so that a loaded machine's noise does not pass for it.
        ratio = self.stream.ratio.get(codec.label, 1.0)
        predicted = min(self.stream.speed.get(codec.label, 0.0), link.rate_off / ratio)
        wanted = max(GAIN, min(1 + (predicted / max(link.rate_off, 1.0) - 1) / 2, 2.0))
        if rate >= link.rate_off * wanted:
            link.reason = (f"link is the limit: {rate / 1e6:.0f} MB/s with {codec.label}, "
                           f"{link.rate_off / 1e6:.0f} MB/s without")
        else:
            link.codec = None
            link.reason = (f"no gain: {rate / 1e6:.0f} MB/s with {codec.label}, "
                           f"{link.rate_off / 1e6:.0f} MB/s without")
        link.phase = "hold"

    def stats(self) -> dict[str, StatValue]:
        """Per trainer: the codec (or off), why, and the stream's best measured ratio."""
        figures: dict[str, StatValue] = dict(self.forms.counts)
        setting = self.setting
        auto = not (setting is None or isinstance(setting, Codec))
        figures["compress"] = (setting.label if isinstance(setting, Codec)
                               else "off" if setting is None else "auto")
        for target, link in list(self.links.items()):  # what each trainer gets, and why
            name = target.decode(errors="replace")
            figures[f"trainer.{name}.compress"] = "off" if link.codec is None else link.codec.label
            figures[f"trainer.{name}.compress_reason"] = link.reason
            ratios = [ratio for label, ratio in self.stream.ratio.items()
                      if _CANDIDATE[label].numbers <= link.inflates]
            if auto and ratios and link.reason != SAME_HOST:
                figures[f"trainer.{name}.compress_ratio"] = round(min(ratios), 3)
        return figures

    def forget(self, target: bytes) -> None:
        self.links.pop(target, None)
