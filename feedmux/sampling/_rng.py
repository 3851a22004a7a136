"""Random state of the muxes: one fresh generator per pass, derived from (seed, pass).

This module owns the translation of a pescador-style ``random_state`` argument
(None, an int, a ``numpy.random.Generator`` or a ``numpy.random.RandomState``)
into a :class:`SeedPlan`, and the derivation of one independent
``numpy.random.Generator`` per pass of a mux (and per shard of a mux). It must
never hand out a generator shared between passes: two passes, or two
concurrent iterations of one mux, must not influence each other's order.
"""

from __future__ import annotations

import numpy as np

from feedmux.errors import SamplingError
from feedmux.sampling.streamer import is_integer

__all__ = ["SeedPlan", "seed_plan"]

# Four 32-bit words of entropy drawn from a caller's generator: 128 bits, the
# size numpy's SeedSequence pools its entropy into.
_ENTROPY_WORDS = 4


class SeedPlan:
    """How a mux gets a new random generator for each of its passes.

    Parameters
    ----------
    entropy : tuple of int or None
        The root entropy. ``None`` draws fresh entropy from numpy's global
        random state at every pass, so ``np.random.seed(...)`` makes an
        unseeded mux reproducible, as in pescador.
    spawn_key : tuple of int
        Extra key words; a shard appends its index, a pass its number.
    """

    __slots__ = ("entropy", "spawn_key")

    def __init__(self, entropy: tuple[int, ...] | None, spawn_key: tuple[int, ...] = ()) -> None:
        self.entropy = entropy
        self.spawn_key = spawn_key

    def for_pass(self, pass_number: int) -> np.random.Generator:
        """Return the generator of pass ``pass_number`` (1-based)."""
        entropy = self.entropy
        if entropy is None:
            words = np.random.randint(0, 2**32, size=_ENTROPY_WORDS, dtype=np.uint64)
            entropy = tuple(int(word) for word in words)
        sequence = np.random.SeedSequence(list(entropy), spawn_key=(*self.spawn_key, pass_number))
        return np.random.Generator(np.random.PCG64(sequence))

    def child(self, index: int) -> SeedPlan:
        """Return the plan of shard ``index``: same root, a longer key.

        Keys of different depths never collide (a pass key has one more word
        than its plan's key), so a shard never replays its parent's passes.
        """
        return SeedPlan(self.entropy, (*self.spawn_key, index))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SeedPlan):
            return NotImplemented
        return (self.entropy, self.spawn_key) == (other.entropy, other.spawn_key)

    def __hash__(self) -> int:
        return hash((self.entropy, self.spawn_key))

    def __repr__(self) -> str:
        return f"SeedPlan(entropy={self.entropy!r}, spawn_key={self.spawn_key!r})"


def seed_plan(random_state: object) -> SeedPlan:
    """Translate a ``random_state`` argument into a :class:`SeedPlan`.

    A generator or RandomState given by the caller is consumed once, here, to
    draw the root entropy: the mux then never touches it again, so the order
    of every pass is fixed at construction and reproducible.

    Raises
    ------
    SamplingError
        If ``random_state`` is none of None, an int >= 0, a
        ``numpy.random.Generator`` or a ``numpy.random.RandomState``.

    Examples
    --------
    >>> plan = seed_plan(7)
    >>> plan
    SeedPlan(entropy=(7,), spawn_key=())
    >>> a, b = plan.for_pass(1).random(), plan.for_pass(2).random()
    >>> a == seed_plan(7).for_pass(1).random(), a == b
    (True, False)
    >>> plan.child(3)
    SeedPlan(entropy=(7,), spawn_key=(3,))
    """
    if random_state is None:
        return SeedPlan(None)
    if is_integer(random_state):
        seed = int(random_state)
        if seed < 0:
            raise SamplingError(f"random_state must be an int >= 0, got random_state={seed}")
        return SeedPlan((seed,))
    if isinstance(random_state, np.random.Generator):
        words = random_state.integers(0, 2**32, size=_ENTROPY_WORDS, dtype=np.uint64)
        return SeedPlan(tuple(int(word) for word in words))
    if isinstance(random_state, np.random.RandomState):
        words = random_state.randint(0, 2**32, size=_ENTROPY_WORDS, dtype=np.uint64)
        return SeedPlan(tuple(int(word) for word in words))
    raise SamplingError(
        "random_state must be None, an int >= 0, a numpy.random.Generator or a "
        f"numpy.random.RandomState, got random_state={random_state!r} "
        f"({type(random_state).__name__})"
    )
