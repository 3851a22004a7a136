"""The state of the process-wide random generators, saved and put back in a few µs.

A process that runs several shards switches the generators user code draws from
(``random``, numpy's global state, torch's when imported) to the shard it runs
next, every block of samples. Their public round trip costs some 80-100 µs,
nearly all of it in numpy's ``get_state``/``set_state`` building and parsing a
624-word array, and a sampler of small items spent two thirds of its time there.
So, where the internals are as expected, :class:`GlobalRandomState` copies the
generators' C state as raw bytes: the Mersenne Twister words and position of
``random``'s ``_random.Random`` and of numpy's MT19937, and numpy's legacy
Gaussian cache (the second value of a Box-Muller pair that ``randn``/``normal``
keep for the next call). Each layout is checked once per process against the
public get/set-state (read and written both ways) before any byte is written;
anything else (another interpreter, another numpy, a global bit generator that is
not an MT19937) keeps the public round trip. The draws are the same either way:
the bytes are exactly what the public calls would carry. This module must never
reseed nor draw (that is :mod:`~feedmux.server._sources.seeding`'s), and never
write memory whose layout it has not checked.
"""

from __future__ import annotations

import _random
import ctypes
import functools
import logging
import random
import struct
import sys
from typing import Any

import numpy as np

__all__ = ["GlobalRandomState"]

log = logging.getLogger("feedmux.server")

#: A Mersenne Twister's state in both CPython and numpy: 624 32-bit words and an int
#: position (CPython keeps the position first, numpy last; each is copied as it lies).
_MT_BYTES = 624 * 4 + 4
#: numpy's ``bitgen_t``: a state pointer and four function pointers.
_BITGEN_BYTES = 5 * ctypes.sizeof(ctypes.c_void_p)


class _GaussCache(ctypes.Structure):
    """The tail of numpy's ``aug_bitgen_t``: whether a Gaussian is kept, and its value."""

    _fields_ = [("has_gauss", ctypes.c_int), ("gauss", ctypes.c_double)]


class _AugBitgen(ctypes.Structure):
    """numpy's ``aug_bitgen_t``, held inside the RandomState (``mtrand.pyx``)."""

    _fields_ = [("bit_generator", ctypes.c_void_p), ("cache", _GaussCache)]


def _memory(address: int, size: int) -> memoryview:
    """``size`` bytes at ``address``: a slice copy is one memcpy, with the GIL held.

    (``ctypes.memmove`` would release the GIL, and be slower.)
    """
    return memoryview((ctypes.c_char * size).from_address(address)).cast("B")


class _PythonMemory:
    """``random``'s generator in place: CPython's ``RandomObject`` (index, then 624 words).

    ``gauss_next`` (``random.gauss``'s kept value) is an attribute of the instance.
    """

    def __init__(self, instance: random.Random, words: memoryview) -> None:
        self.instance = instance
        self.words = words


class _NumpyMemory:
    """numpy's global RandomState in place: its MT19937's words and its Gaussian cache."""

    def __init__(self, state: np.random.RandomState, bit_generator: np.random.MT19937,
                 words: memoryview, cache: memoryview) -> None:
        self.state = state
        #: Held so that its memory stays its own: the check in :meth:`current` relies on it.
        self.bit_generator = bit_generator
        self.words = words
        self.cache = cache
        #: The RandomState's draws hold it (some with the GIL released): a copy under it
        #: is never torn by a draw in another thread.
        self.lock = bit_generator.lock

    def current(self) -> bool:
        """Whether the global RandomState still draws from this bit generator.

        ``np.random.set_bit_generator`` replaces it; its copies then take the public way.
        """
        return self.state._bit_generator is self.bit_generator


@functools.cache
def _python_memory() -> _PythonMemory | None:
    """``random``'s state in place, once per process, or None (the reason is logged)."""
    found = _check_python()
    if isinstance(found, str):
        log.debug("random's state switches through getstate/setstate: %s", found)
        return None
    return found


@functools.cache
def _numpy_memory() -> _NumpyMemory | None:
    """numpy's global state in place, once per process, or None (the reason is logged)."""
    found = _check_numpy()
    if isinstance(found, str):
        log.debug("numpy's global random state switches through get_state/set_state: %s",
                  found)
        return None
    return found


def _check_python() -> _PythonMemory | str:
    """``random``'s state in place if CPython lays it out as read here (both ways), else why not."""
    instance = random._inst  # the generator the module's functions are bound to
    header = object.__basicsize__
    if sys.implementation.name != "cpython":
        return f"expected CPython, got {sys.implementation.name}"
    if (not isinstance(instance, _random.Random)
            or _random.Random.__basicsize__ < header + _MT_BYTES):
        return f"expected a _random.Random of at least {header + _MT_BYTES} bytes"
    words = _memory(id(instance) + header, _MT_BYTES)
    state = instance.getstate()
    internal = state[1]
    if bytes(words) != struct.pack("=i624I", internal[624], *internal[:624]):
        return "its bytes are not the index and words getstate() gives"
    kept = bytes(words)
    instance.setstate(random.Random(0).getstate())
    words[:] = kept
    instance.gauss_next = state[2]  # type: ignore[attr-defined]
    if instance.getstate() != state:
        instance.setstate(state)
        return "its bytes written back are not what getstate() reads"
    return _PythonMemory(instance, words)


def _check_numpy() -> _NumpyMemory | str:
    """numpy's global state in place if laid out as read here (both ways), else why not."""
    if sys.implementation.name != "cpython":
        return f"expected CPython, got {sys.implementation.name}"
    try:
        state = np.random.mtrand._rand
        bit_generator = state._bit_generator
        address = bit_generator.ctypes.state_address
    except AttributeError as error:
        return f"numpy {np.__version__} has no {error.name}"
    if type(bit_generator) is not np.random.MT19937:
        return f"expected an MT19937 bit generator, got {type(bit_generator).__name__}"
    words = _memory(address, _MT_BYTES)
    mt = bit_generator.state["state"]
    if bytes(words) != mt["key"].astype("=u4").tobytes() + struct.pack("=i", mt["pos"]):
        return "the MT19937's bytes are not the key and pos of its state"
    aug = _find_aug_bitgen(state, address)
    if aug is None:
        return f"no single aug_bitgen_t in numpy {np.__version__}'s RandomState"
    cache = _memory(aug + _AugBitgen.cache.offset, ctypes.sizeof(_GaussCache))
    legacy, other = state.get_state(legacy=True), np.random.RandomState(0).get_state(legacy=True)
    assert isinstance(legacy, tuple) and isinstance(other, tuple)  # an MT19937's
    kept = bytes(words)
    try:
        state.set_state((*other[:3], 1, 0.3125))
        written = _GaussCache.from_buffer_copy(cache)
        words[:] = kept
        cache[:] = bytes(_GaussCache(0, 0.0))
        read = state.get_state(legacy=True)
        assert isinstance(read, tuple)
        if ((written.has_gauss, written.gauss) != (1, 0.3125)
                or read[2:] != (legacy[2], 0, 0.0) or not (read[1] == legacy[1]).all()):
            return "its bytes written and read are not what get_state/set_state carry"
    finally:
        state.set_state(legacy)
    return _NumpyMemory(state, bit_generator, words, cache)


def _find_aug_bitgen(state: object, state_address: int) -> int | None:
    """The address of the RandomState's ``aug_bitgen_t``, found by what it points at.

    Cython lays out the RandomState's fields ``_bit_generator``, ``_bitgen``,
    ``_aug_state``: ``_aug_state.bit_generator`` points at ``_bitgen`` just
    before it, whose first field is the MT19937's state address. Exactly one
    place within the object may match.
    """
    start, size = id(state), type(state).__basicsize__
    pointer = ctypes.sizeof(ctypes.c_void_p)
    found = []
    for offset in range(object.__basicsize__ + _BITGEN_BYTES,
                        size - ctypes.sizeof(_AugBitgen) + 1, pointer):
        bitgen = start + offset - _BITGEN_BYTES
        if (ctypes.c_void_p.from_address(start + offset).value == bitgen
                and ctypes.c_void_p.from_address(bitgen).value == state_address):
            found.append(start + offset)
    return found[0] if len(found) == 1 else None


class GlobalRandomState:
    """Room for one copy of the process-wide generators' state: :meth:`save`, then :meth:`restore`.

    ``random`` and numpy's global state are copied as bytes where their layout
    checked out (the module's paragraph says how), else through their public
    ``getstate``/``setstate`` and ``get_state``/``set_state``; torch's, when torch
    is imported, through ``get_rng_state``/``set_rng_state``.

    Parameters
    ----------
    fast : bool
        False takes the public round trip for every generator (the fallback,
        which gives the same draws).

    Examples
    --------
    >>> saved = GlobalRandomState()
    >>> np.random.seed(3); random.seed(3); saved.save()
    >>> first = np.random.randn(3), random.random()
    >>> saved.restore(); again = np.random.randn(3), random.random()
    >>> bool((first[0] == again[0]).all()), first[1] == again[1]
    (True, True)
    """

    def __init__(self, fast: bool = True) -> None:
        self._python = _python_memory() if fast else None
        self._numpy = _numpy_memory() if fast else None
        # Views of bytearrays: a view's slice assignment copies faster than a bytearray's.
        self._python_words = memoryview(bytearray(_MT_BYTES))
        self._numpy_words = memoryview(bytearray(_MT_BYTES))
        self._numpy_cache = memoryview(bytearray(ctypes.sizeof(_GaussCache)))
        # gauss_next when copied in place, else random.getstate().
        self._python_saved: Any = None
        # None when copied in place, else np.random.get_state().
        self._numpy_saved: Any = None
        self._torch_saved: Any = None

    def save(self) -> None:
        """Copy the generators' current state in (over the previous copy)."""
        python = self._python
        if python is not None:
            self._python_words[:] = python.words
            self._python_saved = python.instance.gauss_next  # type: ignore[attr-defined]
        else:
            self._python_saved = random.getstate()
        numpy = self._numpy
        if numpy is not None and numpy.current():
            with numpy.lock:
                self._numpy_words[:] = numpy.words
                self._numpy_cache[:] = numpy.cache
            self._numpy_saved = None
        else:
            self._numpy_saved = np.random.get_state()
        torch = sys.modules.get("torch")
        self._torch_saved = None if torch is None else torch.get_rng_state()

    def restore(self) -> None:
        """Make the generators' state the one last saved."""
        python = self._python
        if python is not None:
            python.words[:] = self._python_words
            python.instance.gauss_next = self._python_saved  # type: ignore[attr-defined]
        else:
            random.setstate(self._python_saved)
        numpy = self._numpy
        if self._numpy_saved is not None:
            np.random.set_state(self._numpy_saved)
        elif numpy is not None and numpy.current():
            with numpy.lock:
                numpy.words[:] = self._numpy_words
                numpy.cache[:] = self._numpy_cache
        else:  # the global bit generator was replaced since: as the public round trip would
            np.random.set_state(self._numpy_legacy())
        torch = sys.modules.get("torch")
        if torch is not None and self._torch_saved is not None:
            torch.set_rng_state(self._torch_saved)

    def _numpy_legacy(self) -> tuple[str, Any, int, int, float]:
        """The bytes copied from numpy as ``np.random.get_state()`` gives them."""
        key = np.frombuffer(self._numpy_words, dtype="=u4", count=624).astype(np.uint32)
        (pos,) = struct.unpack_from("=i", self._numpy_words, 624 * 4)
        cache = _GaussCache.from_buffer_copy(self._numpy_cache)
        return "MT19937", key, pos, cache.has_gauss, cache.gauss
