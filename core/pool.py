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

MAX_PARALLEL_SESSIONS = 16


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
        """Advertised parallel sessions (primary included) for this backend/task/mode; 1 = no clones."""
        ...

    def create(self) -> Session:
        """Create the primary session."""
        ...

    def clone(self, primary: Session) -> Session:
        """Create one more session sharing ``primary``'s weights with private mutable state."""
        ...
