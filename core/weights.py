"""The shared immutable weight cache: one load per (source, backend, device), many users.

Sessions of a model (and models sharing a checkpoint) reference the same uploaded
weights. :class:`WeightCache` decides, sans-IO, who loads, who waits, who gets a
hit and when the last user's release lets the caller free the weights:

* **single flight**: the first :meth:`~WeightCache.acquire` of a key is told to
  load (:class:`StartLoad`); every later acquire while that load is in flight is
  told to :class:`Wait`, and :meth:`~WeightCache.load_succeeded` grants them all.
* **failed-load retry**: :meth:`~WeightCache.load_failed` fails the loader *and
  every waiter* together and forgets the key, so the next acquire starts a fresh
  load. (audio.cpp's server lets each queued cold request retry the load in turn;
  failing the group instead bounds the cost of a persistent failure to one load per
  wave of requests, and any caller may simply acquire again.)
* **reference-counted release**: each user holds at most one reference per key;
  the release that drops the count to zero returns :class:`Free` and only then may
  the caller free the handle. Misuse (double release, double acquire, a loader
  releasing before reporting) returns :class:`Refused`, never raises.

Users are any hashable caller identity (a session, a lease id). Orders are
insertion orders, so every decision is deterministic.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable
from typing import Generic, TypeVar

import attrs

from core.events import Reason

H = TypeVar("H")


@attrs.frozen(order=True)
class WeightKey:
    """What identifies one upload of weights: checkpoint source, array backend, device."""

    source: str
    backend: str
    device: str


@attrs.frozen
class Hit(Generic[H]):
    """The weights are loaded: ``user`` now holds a reference to ``handle``."""

    key: WeightKey
    user: Hashable
    handle: H
    reason: Reason = Reason.GRANTED


@attrs.frozen
class StartLoad:
    """Nobody holds or loads ``key``: ``user`` must load it, then report success or failure."""

    key: WeightKey
    user: Hashable
    reason: Reason = Reason.LOAD_STARTED


@attrs.frozen
class Wait:
    """A load of ``key`` is in flight: ``user`` waits for its outcome (single flight)."""

    key: WeightKey
    user: Hashable
    reason: Reason = Reason.LOAD_IN_FLIGHT


@attrs.frozen
class Loaded(Generic[H]):
    """The load succeeded: every user in ``granted`` (loader first) now holds ``handle``."""

    key: WeightKey
    handle: H
    granted: tuple[Hashable, ...]
    reason: Reason = Reason.GRANTED


@attrs.frozen
class LoadFailed:
    """The load failed: every user in ``failed`` (loader first) gets ``message``.

    The key is forgotten; the next acquire starts a fresh load.
    """

    key: WeightKey
    failed: tuple[Hashable, ...]
    message: str
    reason: Reason = Reason.LOAD_FAILED


@attrs.frozen
class Released:
    """``user``'s reference is gone; ``remaining`` users still hold the weights."""

    key: WeightKey
    user: Hashable
    remaining: int
    reason: Reason = Reason.STILL_REFERENCED


@attrs.frozen
class Free(Generic[H]):
    """The last user released ``key``: the caller must free ``handle`` now."""

    key: WeightKey
    handle: H
    reason: Reason = Reason.UNREFERENCED


@attrs.frozen
class Withdrawn:
    """A waiting user gave up before the load finished; it holds nothing."""

    key: WeightKey
    user: Hashable
    reason: Reason = Reason.CANCELLED


@attrs.frozen
class Refused:
    """The call was a misuse (double release, double acquire, wrong state); nothing changed."""

    key: WeightKey
    user: Hashable | None
    reason: Reason
    message: str


AcquireDecision = Hit[H] | StartLoad | Wait | Refused
LoadDecision = Loaded[H] | Refused
ReleaseDecision = Released | Free[H] | Withdrawn | Refused


class EntryState(enum.Enum):
    """A key's state: a load in flight, or loaded and referenced."""

    LOADING = "loading"
    READY = "ready"


@attrs.define
class _Entry(Generic[H]):
    state: EntryState
    loader: Hashable
    waiters: dict[Hashable, None] = attrs.field(factory=dict)  # ordered set
    holders: dict[Hashable, None] = attrs.field(factory=dict)  # ordered set
    handle: H | None = None


class WeightCache(Generic[H]):
    """Sans-IO reference-counted cache of immutable weight handles (see module doc)."""

    def __init__(self) -> None:
        self._entries: dict[WeightKey, _Entry[H]] = {}

    # ----------------------------------------------------------------- events

    def acquire(self, key: WeightKey, user: Hashable) -> AcquireDecision[H]:
        """Hit if loaded, Wait if loading, StartLoad if unknown; Refused if ``user`` is already
        in."""
        entry = self._entries.get(key)
        if entry is None:
            self._entries[key] = _Entry(EntryState.LOADING, loader=user)
            return StartLoad(key, user)
        loading = entry.state is EntryState.LOADING
        if (loading and user == entry.loader) or user in entry.waiters or user in entry.holders:
            return Refused(
                key, user, Reason.WEIGHTS_ALREADY_HELD, f"{user!r} already acquired {key}"
            )
        if loading:
            entry.waiters[user] = None
            return Wait(key, user)
        entry.holders[user] = None
        assert entry.handle is not None
        return Hit(key, user, entry.handle)

    def load_succeeded(self, key: WeightKey, handle: H) -> LoadDecision[H]:
        """Publish ``handle``: the loader and every waiter become holders, in arrival order."""
        entry = self._entries.get(key)
        if entry is None or entry.state is not EntryState.LOADING:
            return Refused(key, None, Reason.INVALID_STATE, f"no load of {key} is in flight")
        granted = (entry.loader, *entry.waiters)
        entry.state, entry.handle = EntryState.READY, handle
        entry.holders = dict.fromkeys(granted)
        entry.waiters = {}
        return Loaded(key, handle, granted)

    def load_failed(self, key: WeightKey, error: BaseException | str) -> LoadFailed | Refused:
        """Fail the loader and every waiter together and forget ``key`` (the next acquire
        retries)."""
        entry = self._entries.get(key)
        if entry is None or entry.state is not EntryState.LOADING:
            return Refused(key, None, Reason.INVALID_STATE, f"no load of {key} is in flight")
        del self._entries[key]
        message = f"failed to load weights {key.source} on {key.backend}:{key.device}: {error}"
        return LoadFailed(key, (entry.loader, *entry.waiters), message)

    def release(self, key: WeightKey, user: Hashable) -> ReleaseDecision[H]:
        """Drop ``user``'s reference; Free when it was the last, so the handle dies unreferenced.

        A waiter releasing is withdrawn from the wait. The loader cannot release
        before reporting its load; a user that holds nothing is Refused (double release).
        """
        entry = self._entries.get(key)
        if entry is not None and entry.state is EntryState.READY and user in entry.holders:
            del entry.holders[user]
            if entry.holders:
                return Released(key, user, len(entry.holders))
            del self._entries[key]
            assert entry.handle is not None
            return Free(key, entry.handle)
        if entry is not None and user in entry.waiters:
            del entry.waiters[user]
            return Withdrawn(key, user)
        if entry is not None and entry.state is EntryState.LOADING and user == entry.loader:
            return Refused(
                key,
                user,
                Reason.INVALID_STATE,
                f"{user!r} is loading {key}: report load_succeeded or load_failed first",
            )
        return Refused(
            key, user, Reason.WEIGHTS_NOT_HELD, f"{user!r} does not hold {key} (double release?)"
        )

    # ---------------------------------------------------------------- queries

    def keys(self) -> tuple[WeightKey, ...]:
        """Every key loading or loaded, in first-acquire order."""
        return tuple(self._entries)

    def state(self, key: WeightKey) -> EntryState | None:
        """LOADING, READY, or None when the key is unknown (never loaded, failed or freed)."""
        entry = self._entries.get(key)
        return None if entry is None else entry.state

    def handle(self, key: WeightKey) -> H | None:
        """The loaded handle of ``key``, if any."""
        entry = self._entries.get(key)
        return None if entry is None else entry.handle

    def holders(self, key: WeightKey) -> tuple[Hashable, ...]:
        """Users holding a reference to ``key``, in grant order."""
        entry = self._entries.get(key)
        return () if entry is None else tuple(entry.holders)

    def refcount(self, key: WeightKey) -> int:
        """Number of references to ``key``'s handle."""
        return len(self.holders(key))

    def loader(self, key: WeightKey) -> Hashable | None:
        """The user loading ``key`` while a load is in flight."""
        entry = self._entries.get(key)
        return entry.loader if entry is not None and entry.state is EntryState.LOADING else None

    def waiters(self, key: WeightKey) -> tuple[Hashable, ...]:
        """Users waiting for the in-flight load of ``key``, in arrival order."""
        entry = self._entries.get(key)
        return () if entry is None else tuple(entry.waiters)
