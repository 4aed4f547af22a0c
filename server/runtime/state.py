"""What the runtime keeps besides core's state: its settings and the published pools."""

from __future__ import annotations

import anyio
import attrs

from core.policy import RuntimeKind, ms_to_seconds
from core.pool import SessionFactory, SessionPool
from core.residency import ResidencyLimits
from server.runtime.batch_driver import BatchDriver
from server.runtime.ports import ModelSpec


@attrs.frozen
class RuntimeConfig:
    """Process-wide settings, as the config file writes them: milliseconds, bytes, and 0 for no
    limit (``max_queue``: None for no bound). The runtime reads them converted, as the typed
    values core takes (None for no limit, :mod:`core.policy`): :attr:`residency_limits`,
    :attr:`idle_unload_seconds`, and busy timeouts through :func:`core.policy.busy_timeout`."""

    busy_timeout_ms: int = 300_000
    max_loaded_models: int = 0
    memory_budget: int = 0
    max_queue: int | None = None
    idle_unload_ms: int = 0
    kind: RuntimeKind = RuntimeKind.PARALLEL

    @property
    def residency_limits(self) -> ResidencyLimits:
        """``max_loaded_models`` and ``memory_budget`` (None: no limit)."""
        return ResidencyLimits.from_config(self.max_loaded_models, self.memory_budget)

    @property
    def idle_unload_seconds(self) -> float | None:
        """How long a model may stay idle before it is retired (None: never)."""
        return ms_to_seconds(self.idle_unload_ms)


@attrs.define
class LivePool:
    """A published pool with the weights it was built on, its generation and, for a
    ``batching`` model, the decode task that runs its batch (its pool is the primary alone,
    which its leases' native batches share, one at a time under ``session_lock``)."""

    pool: SessionPool
    factory: SessionFactory
    spec: ModelSpec
    generation: int
    driver: BatchDriver | None = None
    session_lock: anyio.Lock = attrs.field(factory=anyio.Lock)
