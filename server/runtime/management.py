"""Management through core's barriers: load, unload, reconfigure, register, bulk
unload, idle retirement and shutdown.

Every operation takes the model's exclusive management lease first, so it waits
for every earlier request (streams and deferred batches included) and blocks
every later one. Bulk unload publishes all its barriers in one synchronous step
and frees ready idle models before waiting on busy ones. Eviction and idle
retirement never wait: core try-acquires idle victims only.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Protocol

import anyio
import attrs

from core.bulk import BulkDone, UnloadNow, WaitForGrant
from core.events import Reason, busy_message
from core.lease import Lease
from core.lifecycle import Proceed, Teardown, WaitLoad
from core.policy import SLOTS_REQUIRE_PARALLEL_MESSAGE, Invalid, RuntimeKind, validate_slots
from core.pool import MAX_BATCH_SLOTS, MAX_PARALLEL_SESSIONS, capacity_message
from core.registry import ModelStatus, Registered
from server.runtime.errors import BusyError, InvalidRequestError, LoadError, NotFoundError
from server.runtime.ports import ModelSpec

if TYPE_CHECKING:
    from collections.abc import Sequence

    from core.admission import Decision, Wakeups
    from core.recorder import Core
    from core.residency import Eviction, RoomDecision
    from server.runtime.ports import Clock, ModelProvider
    from server.runtime.state import LivePool, RuntimeConfig
    from server.runtime.waits import WaitTable


@attrs.frozen
class BulkResult:
    """What a bulk unload did: every selected registered id once, and the unknown ids."""

    unloaded: tuple[str, ...]
    not_found: tuple[str, ...]


class Host(Protocol):
    """What management needs of the runtime: core, the clock, the published pools and
    specs, the wait table, the closing flags, and the runtime's own admission, loading
    and teardown steps. :class:`~server.runtime.runtime.Runtime` is the one host."""

    core: Core
    clock: Clock
    config: RuntimeConfig
    provider: ModelProvider
    specs: dict[str, ModelSpec]
    pools: dict[str, LivePool]
    waits: WaitTable
    closing: bool
    closed: bool

    def spec(self, model: str) -> ModelSpec: ...
    def ceiling_seconds(self, model: str) -> float | None: ...
    async def admit(self, model: str, ticket: int, decision: Decision) -> Lease: ...
    def release(self, model: str, ticket: int) -> None: ...
    def apply(self, wakeups: Wakeups) -> None: ...
    async def load_with_room(self, model: str, decision: RoomDecision) -> None: ...
    async def teardown(self, model: str) -> None: ...
    def evict(self, evictions: Sequence[Eviction]) -> None: ...
    async def wait_quiet(self) -> None: ...


class Management:
    """Every management operation, through core's barriers, on behalf of its :class:`Host`."""

    def __init__(self, rt: Host) -> None:
        self.rt = rt

    @asynccontextmanager
    async def manage(self, model: str) -> AsyncIterator[Lease]:
        """Hold ``model``'s exclusive management lease for the body (FIFO barrier), waiting at
        most the model's busy-timeout ceiling (None: unbounded)."""
        self.rt.spec(model)
        self.refuse_if_closing(model)
        timeout = self.rt.ceiling_seconds(model)
        now = self.rt.clock.now()
        ticket = self.rt.core.new_ticket(now)
        lease = await self.rt.admit(model, ticket, self.rt.core.manage(model, ticket, now, timeout))
        try:
            yield lease
        finally:
            self.rt.release(model, lease.ticket)

    def refuse_if_closing(self, model: str) -> None:
        """Once shutdown has begun, refuse new management too (busy ``shutting_down``).

        Shutdown drains what was admitted before it, then unloads everything; a
        load, reconfiguration or registration queued behind that final unload
        would leave a pool alive after shutdown (invariants 1 and 6).
        """
        if self.rt.closing:
            raise BusyError(Reason.SHUTTING_DOWN, busy_message(model, Reason.SHUTTING_DOWN))

    async def load_model(self, model: str) -> None:
        """Load ``model`` now (eager start-up, or ``/v1/models/load`` of an unchanged id)."""
        async with self.manage(model) as lease:
            await self.load_as_manager(model, lease)

    async def load_as_manager(self, model: str, lease: Lease) -> None:
        """Under the exclusive lease: make sure the pool is loaded (making room first)."""
        decision = self.rt.core.ensure_loaded(model, lease.ticket, self.rt.clock.now())
        if isinstance(decision, Proceed):
            return
        if isinstance(decision, WaitLoad):  # pragma: no cover - impossible under exclusivity
            raise AssertionError("a manager waited for another initializer")
        await self.rt.load_with_room(model, decision)

    async def unload(self, model: str) -> None:
        """Unload ``model`` (idempotent): waits for older work, then tears the pool down."""
        async with self.manage(model):
            await self.unload_under_lease(model)

    async def unload_under_lease(self, model: str) -> None:
        decision = self.rt.core.begin_unload(model, self.rt.clock.now())
        if isinstance(decision, Teardown):
            await self.rt.teardown(model)
            self.rt.core.unload_finished(model, self.rt.clock.now())

    async def register(self, spec: ModelSpec) -> bool:
        """Register a new id and load it, or reconfigure an existing one. True if reconfigured.

        A new entry is published with its exclusive lease already held, so a
        concurrent registration of the same id queues behind this one. A failed
        load leaves the entry registered and unloaded, for a later retry.
        """
        check = validate_slots(spec.slots, batching=spec.batching)
        if isinstance(check, Invalid):
            raise InvalidRequestError(check.reason, check.message)
        if self.rt.config.kind is RuntimeKind.ORIGINAL and spec.slots != 1:
            raise InvalidRequestError(Reason.SLOTS_REQUIRE_PARALLEL, SLOTS_REQUIRE_PARALLEL_MESSAGE)
        self.refuse_if_closing(spec.id)
        now = self.rt.clock.now()
        registered = self.rt.core.register(spec.id, spec.slots, spec.memory_bytes, now)
        if isinstance(registered, Registered):
            self.rt.specs[spec.id] = spec
            try:
                await self.load_as_manager(spec.id, registered.lease)
            finally:
                self.rt.release(spec.id, registered.lease.ticket)
            return False
        return await self.reconfigure(spec)

    async def reconfigure(self, spec: ModelSpec) -> bool:
        """Replace ``spec.id``'s configuration; True if anything changed.

        Validation and the capacity probe happen before teardown: a failure there
        keeps the old working pool. After commit the old pool is torn down and the
        new one loaded; a failure then leaves the new configuration unloaded.
        """
        check = validate_slots(spec.slots, batching=spec.batching)
        if isinstance(check, Invalid):  # before any lease: an invalid count changes nothing
            raise InvalidRequestError(check.reason, check.message)
        async with self.manage(spec.id) as lease:
            old = self.rt.specs[spec.id]
            if self.only_operational(old, spec):
                self.update_in_place(old, spec)
                await self.load_as_manager(spec.id, lease)
                return False
            self.rt.core.begin_reconfigure(spec.id, self.rt.clock.now())
            try:
                capacity = await self.probe_capacity(old, spec)
                if spec.slots > capacity:
                    raise InvalidRequestError(
                        Reason.CAPACITY_EXCEEDED, capacity_message(spec.family, capacity)
                    )
            except BaseException as exc:
                reason = getattr(exc, "reason", Reason.LOAD_FAILED)
                self.rt.core.reject_reconfigure(spec.id, self.rt.clock.now(), reason)
                raise
            decision = self.rt.core.commit_reconfigure(
                spec.id, spec.slots, self.rt.clock.now(), memory_bytes=spec.memory_bytes
            )
            self.rt.specs[spec.id] = spec
            if isinstance(decision, Teardown):
                await self.rt.teardown(spec.id)
                self.rt.core.unload_finished(spec.id, self.rt.clock.now())
            await self.load_as_manager(spec.id, lease)
            return True

    @staticmethod
    def only_operational(old: ModelSpec, new: ModelSpec) -> bool:
        """``new`` changes nothing a reconfiguration is for (reference §4.5: path, family,
        task, mode, slots, config, weights, options): at most operational fields."""
        return new.pool_key() == old.pool_key()

    def update_in_place(self, old: ModelSpec, new: ModelSpec) -> None:
        """Under the exclusive lease: take ``new``'s operational fields (lazy, busy timeout,
        memory estimate) without touching the pool (race report 3: no reload for them)."""
        if new.memory_bytes != old.memory_bytes and not self.rt.core.set_memory(
            new.id, new.memory_bytes, self.rt.clock.now()
        ):
            raise BusyError(
                Reason.MEMORY_BUDGET,
                f"cannot set model '{new.id}' memory estimate to {new.memory_bytes} bytes: "
                "the loaded models would exceed the memory budget",
            )
        self.rt.specs[new.id] = new

    async def probe_capacity(self, old: ModelSpec, new: ModelSpec) -> int:
        """The capacity the new configuration would advertise, without touching the live pool."""
        if new.slots == 1:
            return 1
        if new.batching:  # its slots are engine rows (one primary session), bounded by policy
            return MAX_BATCH_SLOTS
        live = self.rt.pools.get(old.id)
        if live is not None and old.session_key() == new.session_key():
            return live.pool.capacity
        capacity = 1
        with anyio.CancelScope(shield=True):
            try:
                factory = await self.rt.provider.load(new)
            except Exception as exc:
                raise LoadError(Reason.LOAD_FAILED, f"cannot load model '{new.id}': {exc}") from exc
            try:
                primary = await self.rt.provider.create(factory)
                try:
                    capacity = min(factory.capacity(), MAX_PARALLEL_SESSIONS)
                finally:
                    await self.rt.provider.close(primary)
            finally:
                await self.rt.provider.release(new, factory)
        return capacity

    async def bulk_unload(self, ids: Iterable[str] | None = None) -> BulkResult:
        """Unload the selected models (None: every registered one), ready idle ones first."""
        bulk = self.rt.core.bulk_publish(ids, self.rt.clock.now())
        progress = anyio.Event()
        for model in bulk.waiting:
            wait = self.rt.waits.park(model, bulk.tickets[model])
            wait.watchers.append(progress)
        try:
            while True:
                action = bulk.next_action()
                if isinstance(action, BulkDone):
                    return BulkResult(action.unloaded, action.not_found)
                if isinstance(action, UnloadNow):
                    try:
                        await self.unload_under_lease(action.model)
                    finally:
                        self.rt.release(action.model, action.ticket)
                    bulk.finished(action.model)
                elif isinstance(action, WaitForGrant):
                    await progress.wait()
                    progress = anyio.Event()
                    for model in action.models:
                        wait = self.rt.waits.admission[bulk.tickets[model]]
                        wait.watchers[:] = [progress]
                        if wait.lease is not None:
                            self.rt.waits.admission.pop(bulk.tickets[model])
                            bulk.granted(model)
        finally:
            for model in list(bulk.waiting):
                ticket = bulk.tickets[model]
                parked = self.rt.waits.admission.pop(ticket, None)
                if parked is not None and parked.lease is not None:
                    self.rt.release(model, ticket)
                else:
                    self.rt.apply(self.rt.core.cancel(model, ticket, self.rt.clock.now()).wakeups)

    async def idle_loop(self) -> None:
        """Retire models idle longer than ``idle_unload_ms`` (polling like the original)."""
        idle_s = self.rt.config.idle_unload_seconds
        if idle_s is None:  # idle retirement is off
            return
        period = max(1.0, idle_s / 10.0)
        while True:
            await self.rt.clock.sleep_until(self.rt.clock.now() + period)
            self.rt.evict(self.rt.core.retire_idle(self.rt.clock.now(), idle_s))

    def status(self) -> list[ModelStatus]:
        """Every model's row, in registration order (no waiting, not an atomic snapshot)."""
        return [self.rt.core.registry.status(e) for e in self.rt.core.registry.entries()]

    def status_of(self, model: str) -> ModelStatus:
        entry = self.rt.core.registry.get(model)
        if entry is None:
            raise NotFoundError(Reason.NOT_FOUND, f"unknown model id: {model}")
        return self.rt.core.registry.status(entry)

    async def shutdown(self) -> None:
        """Stop admitting, drain admitted and queued work, then destroy every pool."""
        self.rt.closing = True
        now = self.rt.clock.now()
        for entry in self.rt.core.registry.entries():
            self.rt.core.stop_admitting(entry.id, now)
        await self.rt.wait_quiet()
        await self.bulk_unload(None)
        self.rt.closed = (
            True  # a cancelled shutdown leaves this False: leaving the runtime finishes it
        )
