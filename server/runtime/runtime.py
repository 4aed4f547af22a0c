"""The runtime: request leases, first loads, session work and pool lifetimes.

Every decision is a call to :class:`core.recorder.Core` (so it is traced and
replayable); this module only waits, wakes and does the work decided. Rules it
keeps that core cannot see:

* a request lease lives exactly as long as the work: released on success,
  error, cancellation or disconnect (``acquire`` is a context manager);
* session work is shielded from cancellation: a call that started finishes
  before its session can be reused or closed; cancellation takes effect between
  calls (between stream chunks), and within a ``run`` or ``batch`` at the
  session's next stop point (:mod:`server.runtime.stoppable`);
* a queued waiter whose client goes away leaves the queue at once;
* loads and teardowns are shielded too: an initializer whose client leaves
  still publishes the pool others wait for.

Management (unload, reconfigure, register, bulk unload, eviction, idle
retirement, shutdown) is in :mod:`server.runtime.management`.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel
import attrs

from core.admission import Granted, Queued, Rejected, RetryAfter, Wakeups
from core.engine import Feed, OwnWindowEngine
from core.events import Reason, TraceRecord
from core.lease import Lease
from core.lifecycle import Proceed, StartLoad, WaitLoad
from core.policy import busy_timeout
from core.pool import (
    MAX_BATCH_SLOTS,
    CreateClone,
    CreatePrimary,
    PoolBuilder,
    Publish,
    Session,
)
from core.recorder import Core
from core.registry import ModelStatus, Registered
from core.residency import Eviction, RoomDecision
from server.runtime.batch_driver import COLLECTION_WINDOW_S, BatchDriver
from server.runtime.errors import BusyError, InvalidRequestError, LoadError, NotFoundError
from server.runtime.management import BulkResult, Management
from server.runtime.phases import Phases
from server.runtime.ports import (
    BatchingProvider,
    Clock,
    ModelProvider,
    ModelSpec,
    SystemClock,
)
from server.runtime.state import LivePool, RuntimeConfig
from server.runtime.stoppable import shielded_stoppable
from server.runtime.waits import WaitTable

log = logging.getLogger("voxpool.runtime")


@attrs.frozen
class Held:
    """What a request holds while it runs: its lease and the session of its slot."""

    model: str
    lease: Lease
    session: Session
    spec: ModelSpec

    @property
    def slot(self) -> int:
        return self.lease.request_slot()


class InvariantBroken(AssertionError):
    """The runtime caught itself breaking a rule (a bug; the simulator reports it)."""


class Runtime:
    """Drives core for every registered model. Use as ``async with Runtime(...) as rt``.

    Admission, loading and session work are here; every management operation is
    its :class:`~server.runtime.management.Management` component's (the methods
    below of that name only forward to it).
    """

    def __init__(
        self,
        provider: ModelProvider,
        config: RuntimeConfig | None = None,
        *,
        clock: Clock | None = None,
        trace: Callable[[TraceRecord], None] | None = None,
        choose: Callable[[Sequence[int]], int] | None = None,
    ) -> None:
        self.provider = provider
        self.config = config or RuntimeConfig()
        self.clock: Clock = clock or SystemClock()
        self.core = Core(
            self.config.residency_limits,
            max_queue=self.config.max_queue,
            sink=trace,
            kind=self.config.kind,
            choose=choose,
        )
        self.specs: dict[str, ModelSpec] = {}
        self.pools: dict[str, LivePool] = {}
        self.waits = WaitTable()
        self.in_use: dict[tuple[str, int], int] = {}
        self.violations: list[str] = []
        self._tg: anyio.abc.TaskGroup | None = None
        self._changed = anyio.Event()
        self._background = 0
        self.closing = False
        self.closed = False
        self.management = Management(self)
        self.trace = trace
        if trace is not None:
            trace(
                TraceRecord(
                    0,
                    self.clock.now(),
                    "",
                    "config",
                    {
                        "max_loaded_models": self.config.max_loaded_models,
                        "memory_budget": self.config.memory_budget,
                        "max_queue": self.config.max_queue,
                        "runtime": self.config.kind.value,
                    },
                )
            )

    # ------------------------------------------------------------ lifetime
    async def __aenter__(self) -> Runtime:
        self._tg_cm = anyio.create_task_group()
        self._tg = await self._tg_cm.__aenter__()
        if self.config.idle_unload_seconds is not None:
            self._tg.start_soon(self.management.idle_loop)
        return self

    async def __aexit__(self, *exc: object) -> bool | None:
        try:
            if not self.closed:
                with anyio.CancelScope(shield=True):
                    await self.shutdown()
            assert self._tg is not None
            self._tg.cancel_scope.cancel()
        finally:
            result = await self._tg_cm.__aexit__(*exc)  # type: ignore[arg-type]
            self._tg = None
        return result

    def spawn(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run background work (teardowns of evicted models) owned by the runtime."""
        if self._tg is None:
            raise RuntimeError("the runtime is not running (use 'async with')")
        self._background += 1

        async def wrapper() -> None:
            try:
                with anyio.CancelScope(shield=True):
                    await fn(*args)
            finally:
                self._background -= 1
                self.notify_changed()

        self._tg.start_soon(wrapper)

    def notify_changed(self) -> None:
        """Wake anyone waiting for the runtime to drain."""
        self._changed.set()
        self._changed = anyio.Event()

    def is_quiet(self) -> bool:
        """No lease held or queued anywhere and no background work in flight."""
        return self._background == 0 and all(
            e.admission.is_idle() for e in self.core.registry.entries()
        )

    async def wait_quiet(self) -> None:
        """Wait until :meth:`is_quiet`."""
        while not self.is_quiet():
            await self._changed.wait()

    # ------------------------------------------- management (the component's)
    def manage(self, model: str) -> AbstractAsyncContextManager[Lease]:
        return self.management.manage(model)

    async def load_model(self, model: str) -> None:
        await self.management.load_model(model)

    async def unload(self, model: str) -> None:
        await self.management.unload(model)

    async def register(self, spec: ModelSpec) -> bool:
        return await self.management.register(spec)

    async def reconfigure(self, spec: ModelSpec) -> bool:
        return await self.management.reconfigure(spec)

    async def bulk_unload(self, ids: Iterable[str] | None) -> BulkResult:
        return await self.management.bulk_unload(ids)

    async def shutdown(self) -> None:
        await self.management.shutdown()

    def status(self) -> list[ModelStatus]:
        return self.management.status()

    def status_of(self, model: str) -> ModelStatus:
        return self.management.status_of(model)

    # --------------------------------------------------------------- models
    def add_model(self, spec: ModelSpec) -> None:
        """Register ``spec`` at startup (lazily; :meth:`load` loads it eagerly)."""
        now = self.clock.now()
        registered = self.core.register(spec.id, spec.slots, spec.memory_bytes, now)
        if not isinstance(registered, Registered):
            raise ValueError(f"duplicate server model id '{spec.id}'")
        self.specs[spec.id] = spec
        self.release(spec.id, registered.lease.ticket)

    def spec(self, model: str) -> ModelSpec:
        spec = self.specs.get(model)
        if spec is None:
            raise NotFoundError(Reason.NOT_FOUND, f"unknown model id: {model}")
        return spec

    def ceiling_seconds(self, model: str) -> float | None:
        """The busy timeout of a manager on ``model``, in seconds (None: unbounded)."""
        return busy_timeout(self.config.busy_timeout_ms, self.spec(model).busy_timeout_ms)

    def request_timeout(self, model: str, override_ms: int | None) -> float | None:
        """The effective busy timeout of a request, in seconds (None: unbounded)."""
        return busy_timeout(
            self.config.busy_timeout_ms, self.spec(model).busy_timeout_ms, override_ms
        )

    # ------------------------------------------------------------ admission
    def apply(self, wakeups: Wakeups) -> None:
        """Wake the waiters core granted or expired."""
        self.waits.deliver(wakeups)
        if wakeups:
            self.notify_changed()

    def release(self, model: str, ticket: int) -> None:
        """Release one lease (exactly once) and wake whoever core grants next."""
        released = self.core.release(model, ticket, self.clock.now())
        if released.double:
            self.violations.append(f"double release of ticket {ticket} on '{model}'")
        self.apply(released.wakeups)
        self.notify_changed()

    async def admit(self, model: str, ticket: int, decision: Granted | Queued | Rejected) -> Lease:
        """Turn an admission decision into a held lease: now, after waiting, or a BusyError."""
        if isinstance(decision, Granted):
            return decision.lease
        if isinstance(decision, Rejected):
            raise BusyError(decision.reason, decision.message, decision.retry_after)
        wait = self.waits.park(model, ticket)
        try:
            while wait.lease is None and wait.expired is None:
                deadline = decision.deadline  # None: no busy timeout, wait until woken
                with anyio.CancelScope() as scope:
                    wait.scope = scope
                    if wait.lease is None and wait.expired is None:
                        await self.clock.sleep_until(deadline)
                wait.scope = None
                if wait.lease is None and wait.expired is None:
                    self.apply(self.core.expire(model, self.clock.now()))
        except BaseException:
            # the client went away while queued (or right as it was granted)
            if wait.lease is not None:
                self.release(model, ticket)
            elif wait.expired is None:
                self.apply(self.core.cancel(model, ticket, self.clock.now()).wakeups)
                self.notify_changed()
            raise
        finally:
            self.waits.admission.pop(ticket, None)
        if wait.expired is not None:
            raise BusyError(wait.expired.reason, wait.expired.message, wait.expired.retry_after)
        assert wait.lease is not None
        return wait.lease

    @asynccontextmanager
    async def acquire(
        self, model: str, timeout_ms: int | None = None, *, phases: Phases | None = None
    ) -> AsyncIterator[Held]:
        """Hold one request lease on ``model``'s pool (loaded first if needed) for the body.

        The lease is released when the body ends, however it ends. ``phases``, when
        given, gets the instants the request asked, was admitted and had its session.
        """
        timeout = self.request_timeout(model, timeout_ms)
        now = self.clock.now()
        if phases is not None:
            phases.requested = now
        ticket = self.core.new_ticket(now)
        lease = await self.admit(model, ticket, self.core.request(model, ticket, now, timeout))
        if phases is not None:
            phases.admitted = self.clock.now()
        try:
            session = await self.ensure_loaded(model, lease)
            if phases is not None:
                phases.ready = self.clock.now()
            key = (model, lease.request_slot())
            if key in self.in_use:
                raise InvariantBroken(
                    f"slot {key} leased to ticket {ticket} while ticket {self.in_use[key]} uses it"
                )
            self.in_use[key] = ticket
            try:
                yield Held(model, lease, session, self.pools[model].spec)
            finally:
                del self.in_use[key]
        finally:
            self.release(model, ticket)

    # -------------------------------------------------------------- loading
    async def ensure_loaded(self, model: str, lease: Lease) -> Session:
        """The session of ``lease``'s slot, after the first load if this holder must do it."""
        ticket = lease.ticket
        decision: Proceed | WaitLoad | RoomDecision = self.core.ensure_loaded(
            model, ticket, self.clock.now()
        )
        while True:
            if isinstance(decision, Proceed):
                return self.session_for(model, lease)
            if isinstance(decision, WaitLoad):
                wait = self.waits.park_load(ticket)
                try:
                    await wait.event.wait()
                except BaseException:
                    # gone before loading: stop waiting, or, if a failed load named this
                    # holder the next initializer in the same instant, pass the role on
                    self.waits.loads.pop(ticket, None)
                    left = self.core.abandon_wait(model, ticket, self.clock.now())
                    if left.retry is not None:
                        self.waits.load_retry(left.retry)
                    raise
                if wait.proceed:
                    return self.session_for(model, lease)
                assert wait.retry is not None
                decision = self.core.begin_load(model, wait.retry, self.clock.now())
                continue
            await self.load_with_room(model, decision)
            return self.session_for(model, lease)

    async def load_with_room(self, model: str, decision: RoomDecision) -> None:
        """Act on a cold-load decision: evict in the background, then load or refuse."""
        self.evict(decision.evictions)
        if decision.refused is not None:
            if decision.retry is not None:
                self.waits.load_retry(decision.retry)
            if decision.never:  # over the whole budget: no wait helps, so no "retry later"
                raise LoadError(*decision.refused)
            raise BusyError(decision.refused[0], decision.refused[1], self.room_retry(model))
        assert decision.load is not None
        await self.load(model, decision.load)

    def room_retry(self, model: str) -> RetryAfter | None:
        """After a residency refusal.

        When the first other resident model would be idle (evictable).
        """
        now = self.clock.now()
        others = [
            e.admission.idle_after(now)
            for e in self.core.registry.entries()
            if e.id != model and e.resident
        ]
        return min(others, key=lambda r: r.seconds, default=None)

    def evict(self, evictions: Sequence[Eviction]) -> None:
        """Tear evicted victims down in the background; the load that needed room goes on."""
        for ev in evictions:
            self.spawn(self._finish_eviction, ev)

    async def _finish_eviction(self, ev: Eviction) -> None:
        await self.teardown(ev.model)
        self.core.unload_finished(ev.model, self.clock.now())
        self.release(ev.model, ev.lease.ticket)

    def session_for(self, model: str, lease: Lease) -> Session:
        live = self.pools.get(model)
        if live is None:
            raise InvariantBroken(f"'{model}' is ready but has no pool")
        if live.generation != lease.generation:
            raise InvariantBroken(
                f"ticket {lease.ticket} bound generation {lease.generation} "
                f"but the pool is {live.generation}"
            )
        if live.spec.batching:  # its slots are engine rows; the pool is the primary alone
            return live.pool.primary
        return live.pool.at(lease.request_slot())

    async def load(self, model: str, start: StartLoad) -> None:
        """Build and publish ``model``'s pool as its one initializer (shielded)."""
        spec = self.specs[model]
        try:
            with anyio.CancelScope(shield=True):
                live = await self.build_pool(spec, start.generation)
                if spec.batching:
                    await self.start_batching(live)
        except BaseException:
            outcome = self.core.load_failed(model, start.ticket, self.clock.now())
            if outcome.retry is not None:
                self.waits.load_retry(outcome.retry)
            raise
        self.pools[model] = live
        # a batching model's capacity is its engine's rows, not its one session's pool
        capacity = MAX_BATCH_SLOTS if spec.batching else live.pool.capacity
        outcome = self.core.load_succeeded(model, start.ticket, capacity, self.clock.now())
        self.waits.load_proceed(outcome.proceed)

    async def build_pool(self, spec: ModelSpec, generation: int) -> LivePool:
        """Load weights, then the primary and its clones; nothing is published on failure."""
        try:
            factory = await self.provider.load(spec)
        except Exception as exc:
            raise LoadError(Reason.LOAD_FAILED, f"cannot load model '{spec.id}': {exc}") from exc
        try:
            # a batching model's slots are rows of its engine, not sessions: one primary
            builder = PoolBuilder.for_factory(factory, 1 if spec.batching else spec.slots)
            action = builder.next_action()
            while True:
                if isinstance(action, Publish):
                    return LivePool(action.pool, factory, spec, generation)
                if isinstance(action, CreatePrimary):
                    try:
                        session = await self.provider.create(factory)
                    except Exception as exc:
                        action = builder.primary_failed(exc)
                    else:
                        action = builder.primary_created(session)
                elif isinstance(action, CreateClone):
                    primary = builder.primary
                    assert primary is not None
                    try:
                        session = await self.provider.clone(factory, primary)
                    except Exception as exc:
                        action = builder.clone_failed(exc)
                    else:
                        action = builder.clone_created(session)
                else:
                    await self.close_all(action.sessions)
                    raise LoadError(action.reason, action.message)
        except BaseException:
            await self.provider.release(spec, factory)
            raise

    @property
    def drivers(self) -> dict[str, BatchDriver]:
        """The decode tasks of the published batching models, by model (read from the pools)."""
        return {m: live.driver for m, live in self.pools.items() if live.driver is not None}

    async def start_batching(self, live: LivePool) -> None:
        """Give a ``batching`` model its engine and start its decode task (one per pool).

        On failure the pool is closed and its weights released, as for any failed load.
        """
        spec = live.spec
        provider = self.provider
        try:
            if not isinstance(provider, BatchingProvider):
                raise ValueError("this runtime's model provider cannot batch")
            engine = await provider.engine(live.factory, spec.slots)
        except Exception as exc:
            await self.close_all(live.pool.teardown_order())
            await self.provider.release(spec, live.factory)
            raise LoadError(Reason.LOAD_FAILED, f"cannot batch model '{spec.id}': {exc}") from exc
        driver = BatchDriver(
            spec.id,
            engine,
            provider,
            self.clock,
            violation=self.violations.append,
            trace=self.trace,
            window=engine.collection_window
            if isinstance(engine, OwnWindowEngine)
            else COLLECTION_WINDOW_S,
        )
        assert self._tg is not None
        await self._tg.start(driver.serve)
        live.driver = driver

    def check_batches(self) -> list[str]:
        """Every batched model's ownership check (the simulator runs it at every quiescent
        step): what :meth:`BatchDriver.check` finds, in model order."""
        return [text for driver in self.drivers.values() for text in driver.check()]

    async def teardown(self, model: str) -> None:
        """Destroy ``model``'s pool: its decode task and engine, clones, the primary, then the
        weights (shielded)."""
        live = self.pools.pop(model, None)
        if live is None:
            return
        busy = [slot for (m, slot) in self.in_use if m == model]
        if busy:
            self.violations.append(f"'{model}' torn down while slots {busy} are in use")
        with anyio.CancelScope(shield=True):
            driver = live.driver
            if driver is not None:
                await driver.stop()
                try:
                    await driver.calls.close_engine(driver.engine)
                except Exception:
                    log.exception("closing the batched engine of '%s' failed", model)
            await self.close_all(live.pool.teardown_order())
            await self.provider.release(live.spec, live.factory)

    async def close_all(self, sessions: Sequence[Session]) -> int:
        """Close ``sessions`` in the order given (clones before their primary), every one of
        them even if some close fails, so a rollback and a teardown both end with nothing
        open on the weights and the lifecycle moving on. A failure is logged, never raised
        (the pool is gone either way); the number of failed closes is returned."""
        failed = 0
        for session in sessions:
            try:
                await self.provider.close(session)
            except Exception:
                failed += 1
                log.exception("closing a session failed; the other sessions are closed anyway")
        return failed

    # --------------------------------------------------------- session work
    async def run_on(self, held: Held, request: Any) -> Any:
        """Run one request on a held session (shielded: it finishes, or stops at a stop point
        once cancelled, before the lease ends), or,
        for a ``batching`` model, as one member of its batch (it has left the batch before
        the lease ends)."""
        driver = self.pools[held.model].driver
        if driver is not None:
            return await driver.run(request)
        session = held.session
        return await shielded_stoppable(lambda: self.provider.run(session, request))

    async def batch_on(self, held: Held, requests: Sequence[Any]) -> list[Any]:
        """Run a native batch on a held session (shielded, stoppable as ``run_on``). A
        ``batching`` model's leases share its one session (the primary), so their native
        batches take turns on it."""
        live = self.pools[held.model]
        session = held.session

        async def batch() -> list[Any]:
            if live.spec.batching:
                async with live.session_lock:
                    return await self.provider.batch(session, requests)
            return await self.provider.batch(session, requests)

        return await shielded_stoppable(batch)

    async def run(
        self,
        model: str,
        request: Any,
        timeout_ms: int | None = None,
        *,
        phases: Phases | None = None,
    ) -> Any:
        """Run one request to completion on a leased session (``phases``: see ``acquire``;
        ``finished`` is when the work ended, however it ended)."""
        async with self.acquire(model, timeout_ms, phases=phases) as held:
            try:
                return await self.run_on(held, request)
            finally:
                if phases is not None:
                    phases.finished = self.clock.now()

    async def batch(
        self, model: str, requests: Sequence[Any], timeout_ms: int | None = None
    ) -> list[Any]:
        """Run a native batch on one leased session."""
        async with self.acquire(model, timeout_ms) as held:
            return await self.batch_on(held, requests)

    @asynccontextmanager
    async def open_stream(
        self,
        model: str,
        request: Any,
        timeout_ms: int | None = None,
        *,
        feed: Feed | None = None,
    ) -> AsyncIterator[AsyncIterator[Any]]:
        """Hold a lease for a whole stream: enter before the response starts, iterate, exit.

        Each chunk is produced shielded; cancellation (a client gone, a stream
        cancelled) takes effect between chunks, or at the session's next stop point
        while a chunk is being made (:mod:`server.runtime.stoppable`). Leaving the
        block, with or without consuming every chunk, resets the session and releases
        the lease.

        ``feed``: a live stream, whose input the caller pushes into the feed while
        it reads the chunks (and closes it at the end); only a ``batching`` model
        whose engine takes live input accepts one (InvalidRequestError otherwise,
        before any lease).
        """
        if feed is not None and not self.spec(model).batching:
            raise InvalidRequestError(
                Reason.INVALID_STATE, f"model '{model}' takes live input only with batching"
            )
        async with self.acquire(model, timeout_ms) as held:
            driver = self.pools[model].driver
            if driver is not None:
                async with driver.member(request, stream=True, feed=feed) as members_chunks:
                    yield members_chunks
                return
            chunks = self.provider.stream(held.session, request)

            async def pull() -> AsyncIterator[Any]:
                while True:
                    # the one point where a gone client stops the stream (the
                    # consumer need not checkpoint between chunks itself); a chunk in
                    # the making stops at the session's next stop point
                    await anyio.lowlevel.checkpoint_if_cancelled()
                    try:
                        chunk = await shielded_stoppable(chunks.__anext__)
                    except StopAsyncIteration:
                        return
                    yield chunk

            try:
                yield pull()
            finally:
                with anyio.CancelScope(shield=True):
                    aclose = getattr(chunks, "aclose", None)
                    if aclose is not None:
                        await aclose()
                    await self.provider.reset(held.session)

    async def stream(self, model: str, request: Any, timeout_ms: int | None = None) -> list[Any]:
        """Collect every chunk of one streamed request (``/v1/tasks/stream``)."""
        async with self.open_stream(model, request, timeout_ms) as chunks:
            return [chunk async for chunk in chunks]
