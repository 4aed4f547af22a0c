"""What a session or factory is: its family, task and mode, and what its sessions can do.

Every family's sessions and factory hold one :class:`Identity`; the
``family``/``task``/``mode``/``interfaces`` properties of the Session and
SessionFactory protocols (core.pool) read it, so a clone matches its primary
by construction.
"""

from __future__ import annotations

import attrs

from core.pool import Interface


@attrs.frozen
class Identity:
    family: str
    task: str
    mode: str
    interfaces: frozenset[Interface]


class HasIdentity:
    """Mixin: the protocol properties, read from ``self.identity``."""

    identity: Identity

    @property
    def family(self) -> str:
        return self.identity.family

    @property
    def task(self) -> str:
        return self.identity.task

    @property
    def mode(self) -> str:
        return self.identity.mode

    @property
    def interfaces(self) -> frozenset[Interface]:
        return self.identity.interfaces
