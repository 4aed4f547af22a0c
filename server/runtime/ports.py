"""The runtime's seams: the clock, the model provider, and what a model is.

Production passes :class:`SystemClock` and a provider that runs real sessions
in worker threads; the simulator passes its virtual clock and fake sessions.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import anyio
import attrs

from core.engine import BatchEngine, Emitted, Member
from core.pool import Session, SessionFactory


def _frozen_options(value: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return dict(value or {})


@attrs.frozen
class ModelSpec:
    """Everything the runtime and provider need to know about one registered model.

    ``load_options`` select the weights (with family, path, backend, device);
    ``session_options`` configure sessions. Two specs with the same weight key
    share weights; with the same session key they also share capacity.
    ``batching`` runs the model's requests through its family's batched engine
    (one step serves every running request; the slots are the batch capacity).
    """

    id: str
    family: str
    task: str = "tts"
    mode: str = "offline"
    slots: int = 1
    path: str = ""
    backend: str = "numpy"
    device: str = "cpu"
    load_options: Mapping[str, Any] = attrs.field(factory=dict, converter=_frozen_options)
    session_options: Mapping[str, Any] = attrs.field(factory=dict, converter=_frozen_options)
    busy_timeout_ms: int | None = None
    memory_bytes: int = 0
    lazy: bool = True
    batching: bool = False
    extra: Mapping[str, Any] = attrs.field(factory=dict, converter=_frozen_options, eq=False)

    def weight_key(self) -> tuple[Any, ...]:
        """What identifies the immutable weights (a loaded factory): family, path, mode (a
        family may load differently per mode), backend, device and load options. The one
        definition: the provider's weight cache keys on it too."""
        return (
            self.family,
            self.path,
            self.mode,
            self.backend,
            self.device,
            sorted(self.load_options.items()),
        )

    def session_key(self) -> tuple[Any, ...]:
        """What identifies the sessions built on those weights (and so their capacity)."""
        return (*self.weight_key(), self.task, self.mode, sorted(self.session_options.items()))

    def pool_key(self) -> tuple[Any, ...]:
        """What a reconfiguration changes (reference §4.5: path, family, task, mode, slots,
        config, weights and options). Two specs with the same pool key describe the same
        pool: the other fields (``lazy``, ``busy_timeout_ms``, ``memory_bytes``) are
        operational and update in place, without a reload."""
        return (*self.session_key(), self.slots, self.batching)


class Clock(Protocol):
    """Where time comes from: monotonic seconds, and sleeping until a moment."""

    def now(self) -> float: ...

    async def sleep_until(self, deadline: float | None) -> None:
        """Sleep until ``deadline`` (monotonic seconds); None: no deadline, until cancelled."""
        ...


class SystemClock:
    """The event loop's monotonic clock (anyio)."""

    def now(self) -> float:
        return anyio.current_time()

    async def sleep_until(self, deadline: float | None) -> None:
        if deadline is None:
            await anyio.sleep_forever()
        else:
            await anyio.sleep_until(deadline)


class ModelProvider(Protocol):
    """How the runtime loads weights and drives sessions, asynchronously.

    Every method may take time (worker threads in production, virtual time in the
    simulator). The runtime shields session calls from cancellation: a call that
    started always finishes before its session is reused or closed.
    """

    async def load(self, spec: ModelSpec) -> SessionFactory:
        """Load (or share) the weights of ``spec`` and return its session factory."""
        ...

    async def release(self, spec: ModelSpec, factory: SessionFactory) -> None:
        """Drop this pool's reference to the weights (freed after the last user)."""
        ...

    async def create(self, factory: SessionFactory) -> Session: ...

    async def clone(self, factory: SessionFactory, primary: Session) -> Session: ...

    async def close(self, session: Session) -> None: ...

    async def run(self, session: Session, request: Any) -> Any: ...

    def stream(self, session: Session, request: Any) -> AsyncIterator[Any]:
        """Chunks of one request; the runtime pulls them one at a time."""
        ...

    async def batch(self, session: Session, requests: Sequence[Any]) -> list[Any]: ...

    async def reset(self, session: Session) -> None: ...


@runtime_checkable
class BatchingProvider(ModelProvider, Protocol):
    """A provider that can also drive batched engines (for models registered with
    ``batching``); the runtime refuses to load such a model through any other."""

    async def engine(self, factory: SessionFactory, max_batch: int) -> BatchEngine:
        """The batched engine of a ``batching`` model's weights (raises if the family has none)."""
        ...

    async def join(self, engine: BatchEngine, members: Sequence[Member]) -> list[Emitted]: ...

    async def step(self, engine: BatchEngine, keys: Sequence[int]) -> list[Emitted]: ...

    async def leave(self, engine: BatchEngine, key: int) -> None: ...

    async def close_engine(self, engine: BatchEngine) -> None: ...
