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

**Live members.** A member may have a :class:`Feed`: its input arrives while it
runs (a live audio stream, 32 ms at a time). Its owner ``push``es pieces and
finally ``close``s the feed; at each step the engine takes whatever was pushed
since (:meth:`Feed.take`) and advances the member over it. A member with nothing
new sits the step out: the runtime steps only members whose feed is
:attr:`~Feed.ready`, and waits (without spinning) for a push when none is. An
engine that accepts live members says so (:class:`LiveInputEngine`); the runtime
refuses a feed for any other.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import attrs


class Feed:
    """The input of a live member, arriving while it runs (see the module doc).

    One owner pushes (the event loop's thread) and one engine takes (a worker
    thread, between the runtime's checks of :attr:`ready`): the pieces sit in a
    deque, whose appends and pops are atomic, so neither side locks. The close
    is read before the pieces are drained, so a take that sees the close has
    every piece pushed before it. ``on_push`` (set by the runtime) is called,
    on the pusher's thread, after every push and the close.
    """

    def __init__(self) -> None:
        self._pieces: collections.deque[Any] = collections.deque()
        self._closed = False
        self._close_taken = False
        self._held = False
        self.on_push: Callable[[], None] | None = None

    def push(self, piece: Any) -> None:
        """Append the next piece of input (the owner); refused once closed."""
        if self._closed:
            raise ValueError("push after the feed was closed")
        self._pieces.append(piece)
        if self.on_push is not None:
            self.on_push()

    def close(self) -> None:
        """No more input (the owner): the member finishes once it has processed every piece.
        Closing twice is a no-op."""
        if self._closed:
            return
        self._closed = True
        if self.on_push is not None:
            self.on_push()

    @property
    def closed(self) -> bool:
        """Whether the owner closed the feed."""
        return self._closed

    def take(self) -> tuple[list[Any], bool]:
        """Every piece pushed since the last take, in order, and whether the feed is closed
        (then the list holds the last pieces there will be)."""
        closed = self._closed  # read first: a close seen here follows every push drained below
        pieces = []
        while self._pieces:
            pieces.append(self._pieces.popleft())
        if closed:
            self._close_taken = True
        return pieces, closed

    def hold(self, held: bool) -> None:
        """The engine says whether it holds input it took but has not processed yet (more than
        one step's worth): the member is then ready without a new push."""
        self._held = held

    @property
    def ready(self) -> bool:
        """Whether the member has something to do at the next step: pieces to take, a close
        not yet taken, or input the engine holds."""
        return bool(self._pieces) or (self._closed and not self._close_taken) or self._held


@attrs.frozen
class Member:
    """One request entering the batch under ``key``; ``feed``: a live member's input."""

    key: int
    request: Any
    stream: bool
    feed: Feed | None = attrs.field(default=None, eq=False)


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

        Never raises; leaving an unknown key is a no-op. Cheap and never blocking (drop the
        member's rows and states; no device work, no waiting): the server calls it on its
        event loop, between the engine's other calls.
        """
        ...

    def close(self) -> None:
        """Free the engine's buffers (every member has left). Never frees shared weights."""
        ...


@runtime_checkable
class LiveInputEngine(BatchEngine, Protocol):
    """A :class:`BatchEngine` that also takes live members (a :class:`Member` with a
    :class:`Feed`, a stream whose input arrives while it runs)."""

    @property
    def live_input(self) -> bool:
        """True: members with a feed are welcome."""
        ...


@runtime_checkable
class OwnWindowEngine(BatchEngine, Protocol):
    """A :class:`BatchEngine` that says how long its batch waits for simultaneous arrivals
    when nothing runs (the scheduler's collection window; an engine without this property
    gets the runtime's default)."""

    @property
    def collection_window(self) -> float:
        """Seconds to wait, once the first member is pending and nothing runs, for others
        to start with it (0: a member starts at once)."""
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
