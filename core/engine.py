"""The batched engine protocol: one executor advances many requests in one step.

A family that can batch across requests gives its factory an ``engine(max_batch)``
method (:class:`BatchingFactory`) returning a :class:`BatchEngine`. The runtime
drives it from one decode task per model, under the membership decisions of
:class:`core.batching.BatchScheduler` (reference §6):

* members **join** at a step boundary (``join``: prefill, e.g. Whisper's
  encoder for every request that arrived together);
* every active member **advances** once per ``step`` (one batched forward:
  one GEMM per layer for all members, not one matrix-vector product each);
* a member that finished, failed or was aborted **leaves** (``leave``): the
  engine forgets its state, so its key can be reused by a later member.

Each member has a key (its batch slot, ``0 <= key < max_batch``); keys are
reused only after ``leave``. A member is either a stream (``stream=True``: its
chunks are what ``Session.stream`` would yield, in order) or a single run
(``stream=False``: exactly one chunk, ``Session.run``'s result, with
``done=True``). Batched results must equal the unbatched ones (the family's
tolerance applies); one member's failure never disturbs the others: the engine
reports it as that member's :class:`Emitted` ``error`` and goes on.

Every method is synchronous and called from one thread at a time; the engine
owns its per-member state and needs no locking.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import attrs


@attrs.frozen
class Member:
    """One request entering the batch under ``key``."""

    key: int
    request: Any
    stream: bool


@attrs.frozen(eq=False)
class Emitted:
    """What one member produced in a join or a step.

    ``chunks`` are delivered to the member's owner in order; ``done`` ends the
    member (its last chunk, if any, is in ``chunks``); ``error`` ends it with a
    failure (the exception the owner's call raises). An entry with neither
    chunks nor an end means the member advanced without output this step.
    """

    key: int
    chunks: tuple[Any, ...] = ()
    done: bool = False
    error: BaseException | None = None


@runtime_checkable
class BatchEngine(Protocol):
    """One model's batched executor over shared immutable weights (see module doc)."""

    @property
    def max_batch(self) -> int:
        """The most members it holds at once (the model's slot count)."""
        ...

    def join(self, members: Sequence[Member]) -> list[Emitted]:
        """Admit ``members`` (their keys are free): validate and prefill each.

        Returns one :class:`Emitted` per member, in order; a member may already be
        done (nothing to decode) or failed (bad request) without touching the others.
        """
        ...

    def step(self, keys: Sequence[int]) -> list[Emitted]:
        """Advance every member in ``keys`` (joined, not yet done) once, together.

        Returns one :class:`Emitted` per key, in order.
        """
        ...

    def leave(self, key: int) -> None:
        """Forget member ``key`` (done, failed or aborted); its key is free again.

        Never raises; leaving an unknown key is a no-op.
        """
        ...

    def close(self) -> None:
        """Free the engine's buffers (every member has left). Never frees shared weights."""
        ...


@runtime_checkable
class BatchingFactory(Protocol):
    """A session factory whose family can also batch across requests."""

    def engine(self, max_batch: int) -> BatchEngine:
        """A batched executor for up to ``max_batch`` members on this factory's weights."""
        ...


def join_each(members: Sequence[Member], join_one: Callable[[Member], Emitted]) -> list[Emitted]:
    """An engine's ``join`` rule: each member is admitted on its own, in order.

    ``join_one`` validates, prefills and stores one member and says what it produced;
    should it raise, that exception is the member's :class:`Emitted` ``error`` and the
    other members are admitted all the same (a bad request fails only itself).
    """
    out: list[Emitted] = []
    for member in members:
        try:
            out.append(join_one(member))
        except Exception as error:  # this member only
            out.append(Emitted(member.key, error=error))
    return out
