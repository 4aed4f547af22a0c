"""One registered model: its admission queue, lifecycle and accounting (a registry entry).

Kept apart from :mod:`core.registry` so that the residency rules (which read
entries) and the registry (which applies those rules) do not import each other.
"""

from __future__ import annotations

from typing import Any

import attrs

from core.admission import Admission
from core.lifecycle import Lifecycle, Nothing, Teardown


@attrs.define
class ModelEntry:
    """One registered model: its admission queue, lifecycle and accounting."""

    id: str
    order: int
    admission: Admission
    lifecycle: Lifecycle
    memory_bytes: int = 0
    last_used: float = 0.0
    config: Any = None
    capacity: int | None = None

    @property
    def resident(self) -> bool:
        return self.lifecycle.resident

    def commit_reconfigure(
        self, slots: int, config: Any = None, memory_bytes: int | None = None
    ) -> Teardown | Nothing:
        """Under the exclusive lease: resize, start a new generation and swap the config.

        Requests admitted before the barrier ran on the old generation; every
        request admitted after it binds the new one. The old pool, if any, must be
        torn down (the returned :class:`Teardown`) before the new one loads, and
        the new configuration's memory estimate (if given) is what its load is
        measured against.
        """
        generation = self.admission.configure(slots)
        self.config = config if config is not None else self.config
        if memory_bytes is not None:
            self.memory_bytes = memory_bytes
        self.capacity = None
        return self.lifecycle.commit_reconfigure(generation)
