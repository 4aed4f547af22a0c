"""Session protocols and the session pool of one loaded model.

Model families implement :class:`SessionFactory` and :class:`Session` (seed 002):
the factory advertises a capacity (how many sessions of this family, task and mode
may run in parallel on the shared immutable weights), creates the primary session
and clones it. Each clone shares the weights and owns its mutable state.

The pool itself is built step by step by :class:`PoolBuilder`, a sans-IO state
machine: the caller performs each create/clone/close (in a worker thread, or in
virtual time under the simulator) and reports the result back. The builder decides
what happens next, validates the clone contract and, on failure, names the
sessions to close in the right order (clones before the primary). A pool is
published complete or not at all.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

import attrs

from core.events import Reason

MAX_PARALLEL_SESSIONS = 16
"""The most sessions one model's pool holds: its slots when it runs one session per slot."""

MAX_BATCH_SLOTS = 4096
"""The most slots of a model registered with ``batching``. Its slots are rows of its batched
engine's state (one per member, an LSTM state row for Silero VAD), not sessions: the pool
holds only the primary, so the bound is what one engine step may carry, not what sessions
cost. A family's engine may hold less (its ``max_batch`` is the slot count it is built for)."""


class Interface(enum.Enum):
    """What a session can do: run one request, stream one, or run a native batch."""

    OFFLINE = "offline"
    STREAMING = "streaming"
    BATCH = "batch"


@runtime_checkable
class Session(Protocol):
    """One execution context: private mutable state over shared immutable weights.

    Every method is synchronous; the runtime calls them from a worker thread (or
    the simulator from virtual time). A session is used by at most one lease at a
    time, so implementations need no locking of their own state.
    """

    @property
    def family(self) -> str: ...

    @property
    def task(self) -> str: ...

    @property
    def mode(self) -> str: ...

    @property
    def interfaces(self) -> frozenset[Interface]: ...

    def run(self, request: Any) -> Any:
        """Run one request to completion and return its result."""
        ...

    def stream(self, request: Any) -> Iterator[Any]:
        """Yield the result of one request chunk by chunk (pulled by the caller)."""
        ...

    def batch(self, requests: Sequence[Any]) -> list[Any]:
        """Run several requests natively batched; results in request order."""
        ...

    def reset(self) -> None:
        """Forget per-request state (stream position, caches) so the next request starts clean."""
        ...

    def close(self) -> None:
        """Free the session's private state. Never frees shared weights."""
        ...


@runtime_checkable
class SessionFactory(Protocol):
    """A loaded model: shared immutable weights plus the recipe for sessions."""

    @property
    def family(self) -> str: ...

    @property
    def task(self) -> str: ...

    @property
    def mode(self) -> str: ...

    def capacity(self) -> int:
        """Advertised parallel sessions (primary included) for this backend/task/mode; 1 = no
        clones."""
        ...

    def create(self) -> Session:
        """Create the primary session."""
        ...

    def clone(self, primary: Session) -> Session:
        """Create one more session sharing ``primary``'s weights with private mutable state."""
        ...


# --------------------------------------------------------------------------- #
# The pool and its sans-IO builder
# --------------------------------------------------------------------------- #

CLONE_MISMATCH_MESSAGE = "parallel session must match the primary family, task, mode and interfaces"
SLOTS_RANGE_MESSAGE = f"model slots must be an integer between 1 and {MAX_PARALLEL_SESSIONS}"
BATCH_SLOTS_RANGE_MESSAGE = (
    f"slots of a batching model must be an integer between 1 and {MAX_BATCH_SLOTS}"
)


def capacity_message(family: str, capacity: int) -> str:
    """audio.cpp's wording for a slot count the adapter does not advertise."""
    return (
        f"model '{family}' does not support the requested slots for this "
        f"backend/task/mode (capacity={capacity})"
    )


class PoolProtocolError(RuntimeError):
    """The caller reported an event the builder is not waiting for (a programming error)."""


class PoolBuildError(RuntimeError):
    """Raised by :func:`build_pool` after the partial pool has been closed."""

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@attrs.frozen(eq=False)
class SessionPool:
    """A published pool: the primary plus its clones, immutable once built.

    Slot 0 is the primary; slot ``i`` is clone ``i``. The pool does not schedule:
    the owner leases slots exclusively and drains every lease before tearing it down.
    Pools compare by identity: two builds are two pools.
    """

    primary: Session
    clones: tuple[Session, ...]
    capacity: int

    @property
    def size(self) -> int:
        """Number of sessions (primary included): the slot count."""
        return 1 + len(self.clones)

    @property
    def sessions(self) -> tuple[Session, ...]:
        """Every session in slot order (primary first)."""
        return (self.primary, *self.clones)

    def at(self, slot: int) -> Session:
        """The session of ``slot``; no negative indexing, so a bad slot never aliases another."""
        if isinstance(slot, bool) or not isinstance(slot, int):
            raise ValueError(f"slot must be an integer, got {slot!r}")
        if not 0 <= slot < self.size:
            raise IndexError(f"slot {slot} out of range for a {self.size}-slot pool")
        return self.sessions[slot]

    def teardown_order(self) -> tuple[Session, ...]:
        """The close order: clones newest first, then the primary, which outlives them."""
        return (*reversed(self.clones), self.primary)


@attrs.frozen
class CreatePrimary:
    """The caller must create the primary session and report it."""


@attrs.frozen
class CreateClone:
    """The caller must clone the primary once, for slot ``index``, and report it."""

    index: int


@attrs.frozen
class Publish:
    """The pool is complete: the caller publishes it. Terminal."""

    pool: SessionPool
    reason: Reason = Reason.GRANTED


@attrs.frozen
class Teardown:
    """The build failed: close ``sessions`` in this order, then report ``message``. Terminal.

    ``sessions`` lists every session created so far (a mismatched clone included):
    clones newest first, the primary last. It is empty when the build was rejected
    before anything was created.
    """

    sessions: tuple[Session, ...]
    reason: Reason
    message: str


PoolAction = CreatePrimary | CreateClone | Publish | Teardown


class BuildState(enum.Enum):
    """Where a :class:`PoolBuilder` stands."""

    CREATE_PRIMARY = "create_primary"
    CLONING = "cloning"
    PUBLISHED = "published"
    FAILED = "failed"


def _interface_for_mode(mode: str) -> Interface | None:
    """The interface a primary must implement to run in ``mode`` (None: no requirement)."""
    return {"offline": Interface.OFFLINE, "streaming": Interface.STREAMING}.get(mode)


class PoolBuilder:
    """Sans-IO construction of a :class:`SessionPool` of ``count`` sessions.

    The caller asks :meth:`next_action`, performs it (create, clone or close) and
    reports the outcome; each report returns the next action. Slot count and
    capacity are validated at construction, before any session exists. Clones are
    requested one at a time; any failure yields a :class:`Teardown` naming every
    session built so far in close order.
    """

    def __init__(self, family: str, count: int, capacity: int) -> None:
        self.family = family
        self.count = count
        self.capacity = min(capacity, MAX_PARALLEL_SESSIONS)
        self.state = BuildState.CREATE_PRIMARY
        self._primary: Session | None = None
        self._clones: list[Session] = []
        self._attempts = 0
        self._final: Publish | Teardown | None = None
        valid_count = isinstance(count, int) and not isinstance(count, bool)
        if not valid_count or not 1 <= count <= MAX_PARALLEL_SESSIONS:
            self._fail(Reason.INVALID_SLOTS, SLOTS_RANGE_MESSAGE)
        elif self.capacity < 1 or count > self.capacity:
            self._fail(Reason.CAPACITY_EXCEEDED, capacity_message(family, self.capacity))

    @classmethod
    def for_factory(cls, factory: SessionFactory, count: int) -> PoolBuilder:
        """A builder for ``factory``'s family and advertised capacity."""
        return cls(factory.family, count, factory.capacity())

    @property
    def primary(self) -> Session | None:
        """The primary once reported (the session every clone is made from)."""
        return self._primary

    @property
    def clone_attempts(self) -> int:
        """Clone outcomes reported so far, successful or not (for tests and traces)."""
        return self._attempts

    def next_action(self) -> PoolAction:
        """What the caller must do now; asking twice returns the same answer."""
        if self._final is not None:
            return self._final
        if self.state is BuildState.CREATE_PRIMARY:
            return CreatePrimary()
        return CreateClone(1 + len(self._clones))

    def primary_created(self, session: Session | None) -> PoolAction:
        """Accept the primary unless it is missing or lacks its mode's interface."""
        self._expect(BuildState.CREATE_PRIMARY)
        if session is None:
            return self._fail(
                Reason.CREATE_FAILED, f"model returned a null task session: {self.family}"
            )
        self._primary = session
        needed = _interface_for_mode(session.mode)
        if needed is not None and needed not in session.interfaces:
            return self._fail(
                Reason.CREATE_FAILED,
                f"model '{self.family}' primary session does not implement its "
                f"{session.mode} interface",
            )
        self.state = BuildState.CLONING
        return self._advance()

    def primary_failed(self, error: BaseException | str) -> PoolAction:
        """Creating the primary raised: nothing to close, the build fails."""
        self._expect(BuildState.CREATE_PRIMARY)
        return self._fail(
            Reason.CREATE_FAILED,
            f"failed to create a session of model '{self.family}': {error}",
        )

    def clone_created(self, session: Session | None) -> PoolAction:
        """Keep a clone that matches the primary; a missing or mismatched one fails the build."""
        self._expect(BuildState.CLONING)
        self._attempts += 1
        if session is None:
            return self._fail(Reason.CLONE_FAILED, f"{CLONE_MISMATCH_MESSAGE} (null session)")
        self._clones.append(session)  # created, so it must be closed on failure
        if not self._matches(session):
            return self._fail(Reason.CLONE_MISMATCH, CLONE_MISMATCH_MESSAGE)
        return self._advance()

    def clone_failed(self, error: BaseException | str) -> PoolAction:
        """Cloning raised (allocation failure, ...): tear down what was built."""
        self._expect(BuildState.CLONING)
        self._attempts += 1
        return self._fail(
            Reason.CLONE_FAILED,
            f"failed to create parallel session {1 + len(self._clones)} "
            f"of model '{self.family}': {error}",
        )

    def _matches(self, clone: Session) -> bool:
        primary = self._primary
        assert primary is not None
        return (
            clone.family == primary.family
            and clone.task == primary.task
            and clone.mode == primary.mode
            and frozenset(clone.interfaces) == frozenset(primary.interfaces)
        )

    def _advance(self) -> PoolAction:
        if 1 + len(self._clones) < self.count:
            return self.next_action()
        assert self._primary is not None
        self.state = BuildState.PUBLISHED
        self._final = Publish(SessionPool(self._primary, tuple(self._clones), self.capacity))
        return self._final

    def _fail(self, reason: Reason, message: str) -> Teardown:
        built = (*reversed(self._clones), *(() if self._primary is None else (self._primary,)))
        self.state = BuildState.FAILED
        self._final = Teardown(built, reason, message)
        return self._final

    def _expect(self, state: BuildState) -> None:
        if self.state is not state:
            raise PoolProtocolError(f"builder is {self.state.value}, not {state.value}")


def build_pool(factory: SessionFactory, count: int) -> SessionPool:
    """Drive a :class:`PoolBuilder` synchronously (tests, CLI, worker threads).

    On failure every created session is closed in the builder's order (a close that
    raises does not stop the others), then :class:`PoolBuildError` is raised.
    """
    builder = PoolBuilder.for_factory(factory, count)
    action = builder.next_action()
    while True:
        if isinstance(action, Publish):
            return action.pool
        if isinstance(action, Teardown):
            close_errors: list[BaseException] = []
            for session in action.sessions:
                try:
                    session.close()
                except Exception as exc:  # keep closing the rest
                    close_errors.append(exc)
            error = PoolBuildError(action.reason, action.message)
            if close_errors:
                raise error from close_errors[0]
            raise error
        if isinstance(action, CreatePrimary):
            try:
                primary: Session | None = factory.create()
            except Exception as exc:
                action = builder.primary_failed(exc)
            else:
                action = builder.primary_created(primary)
        else:
            assert builder.primary is not None
            try:
                clone: Session | None = factory.clone(builder.primary)
            except Exception as exc:
                action = builder.clone_failed(exc)
            else:
                action = builder.clone_created(clone)
