"""What the runtime keeps besides core's state: its settings and the published pools."""

from __future__ import annotations

import attrs

from core.policy import RuntimeKind
from core.pool import SessionFactory, SessionPool
from server.runtime.ports import ModelSpec


@attrs.frozen
class RuntimeConfig:
    """Process-wide settings (milliseconds as in the config file)."""

    busy_timeout_ms: int = 300_000
    max_loaded_models: int = 0
    memory_budget: int = 0
    max_queue: int | None = None
    idle_unload_ms: int = 0
    kind: RuntimeKind = RuntimeKind.PARALLEL


@attrs.define
class LivePool:
    """A published pool with the weights it was built on and its generation."""

    pool: SessionPool
    factory: SessionFactory
    spec: ModelSpec
    generation: int
