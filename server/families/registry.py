"""The family registry: the one table of model families every consumer reads.

Each family is one :class:`~server.families.base.Family` entry, in its own module
``server/families/<family>.py``; :data:`ENTRIES` lists them. The configuration,
the provider, the HTTP layer, the CLI, the validation gate and the benches look
families up here and nowhere else. :func:`register` adds a family at run time
(a test's fake family; an embedding application's own).
"""

from __future__ import annotations

from typing import TypeGuard

from server.families import piper, silero_vad, whisper
from server.families.base import Family

ENTRIES: tuple[Family, ...] = (piper.ENTRY, whisper.ENTRY, silero_vad.ENTRY)
"""The bundled families, in the order they are listed (embedded default, help, errors)."""
_REGISTRY: dict[str, Family] = {entry.name: entry for entry in ENTRIES}


class UnknownFamily(KeyError):
    """A family name that is not registered."""


def register(entry: Family) -> None:
    """Add ``entry`` (or replace the entry of the same name)."""
    _REGISTRY[entry.name] = entry


def unregister(name: str) -> None:
    """Remove the family ``name`` (a test's own family, when it is done)."""
    _REGISTRY.pop(name, None)


def family(name: str) -> Family:
    """The entry of the family ``name``; :class:`UnknownFamily` if there is none."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownFamily(name) from None


def is_family(name: object) -> TypeGuard[str]:
    """Whether ``name`` is a registered family's name."""
    return isinstance(name, str) and name in _REGISTRY


def entries() -> tuple[Family, ...]:
    """Every registered family, in registration order."""
    return tuple(_REGISTRY.values())


def names() -> tuple[str, ...]:
    """Every registered family's name, in registration order."""
    return tuple(_REGISTRY)


def listing() -> str:
    """The family names for an error message: ``piper, whisper, silero_vad``."""
    return ", ".join(_REGISTRY)


def for_task(task: str) -> Family:
    """The first registered family serving ``task`` (what ``voxpool run <task>`` runs)."""
    for entry in _REGISTRY.values():
        if entry.task == task and entry.run_request is not None:
            return entry
    raise UnknownFamily(task)


def validated() -> tuple[str, ...]:
    """The families ``voxpool validate`` can run the gate for: those with a validation plan."""
    return tuple(e.name for e in _REGISTRY.values() if e.plan is not None)


def tasks() -> tuple[str, ...]:
    """The tasks ``voxpool run`` can run, in registration order."""
    found = (e.task for e in _REGISTRY.values() if e.run_request is not None)
    return tuple(dict.fromkeys(found))


def voices() -> tuple[str, ...]:
    """Every registered family's voices, in order, once each."""
    return tuple(dict.fromkeys(v for e in _REGISTRY.values() for v in e.voices))


def limit_errors() -> tuple[type[Exception], ...]:
    """The exceptions of every family that has speech limits (routes turn them into 400s)."""
    return tuple(e.limit_error() for e in _REGISTRY.values() if e.limit_error is not None)
