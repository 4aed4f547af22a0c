"""One replica of the fleet: the real ``server.runtime.Runtime`` over fake sessions.

A replica registers every workload model lazily (any replica can load any
model: Ray's model multiplexing), with the workload's residency limits and
queue bound deciding what it keeps and whom it refuses. It keeps the books the
fleet needs: its lifecycle state, the models it has loaded (reported to the
router when they change), the in-flight requests a death must fail, and the
invariant checks of :mod:`sim.runner` (core's state whenever it changed, the
runtime's and the fakes' books, and quiescence once it stopped).
"""

from __future__ import annotations

import enum
from collections.abc import Callable

import trio

from core.events import TraceRecord
from core.invariants import check_entry, check_quiescent, check_registry, check_residency
from core.lifecycle import ModelState
from core.policy import RuntimeKind
from server.runtime import ModelSpec, Runtime, RuntimeConfig
from sim.clock import SimClock
from sim.fakes import FakeProvider, FakeScript
from sim.fleet.workload import Workload

LIFECYCLE_EVENTS = frozenset(
    {"load_succeeded", "load_failed", "begin_unload", "unload_finished", "begin_load"}
)
"""Trace events after which the set of loaded models may have changed."""

REQUEST_PATH = frozenset({"new_ticket", "request", "release", "cancel", "expire", "batch_step"})
"""Decisions that change admission state only, never what is resident (nor does an
``ensure_loaded`` that lets its holder proceed or wait): no residency check needed after them."""

FLEET_FAMILY = "fake"


class ReplicaState(enum.Enum):
    """Where a replica is in its life."""

    STARTING = "starting"
    RUNNING = "running"
    DRAINING = "draining"
    DEAD = "dead"
    STOPPED = "stopped"


def runtime_config(workload: Workload) -> RuntimeConfig:
    """The runtime settings every replica of ``workload`` runs with."""
    r = workload.replicas
    return RuntimeConfig(
        busy_timeout_ms=r.busy_timeout_ms,
        max_loaded_models=r.max_loaded_models,
        memory_budget=r.memory_budget,
        max_queue=r.max_queue,
        idle_unload_ms=0,
        kind=RuntimeKind.PARALLEL,
    )


def scripts(workload: Workload) -> dict[str, FakeScript]:
    """The fake sessions of each model: its load time; creating, cloning and closing sessions
    cost no time (a measured load time includes them)."""
    return {
        m.id: FakeScript(
            capacity=max(16, m.slots),
            load_time=m.load_time_s,
            create_time=0.0,
            clone_time=0.0,
            close_time=0.0,
            release_time=0.0,
            run_time=m.duration.mean,
            interfaces=("offline",),
        )
        for m in workload.models
    }


class Replica:
    """One replica: its runtime, its fakes, its state and its checks."""

    def __init__(
        self,
        rid: int,
        workload: Workload,
        clock: SimClock,
        *,
        monitors: bool,
        on_loaded: Callable[[Replica], None],
        on_dirty: Callable[[Replica], None],
        violation: Callable[[str], None],
        runtime_factory: Callable[..., Runtime] | None = None,
    ) -> None:
        self.rid = rid
        self.graceful_timeout = workload.replicas.graceful_shutdown_timeout_s
        self.clock = clock
        self.state = ReplicaState.STARTING
        self.provider = FakeProvider(clock, scripts(workload))
        self.on_loaded = on_loaded
        self.on_dirty = on_dirty
        self._violation = violation
        self.dirty = False
        self.dirty_models: set[str] = set()  # models whose core state changed since the check
        self.residency_dirty = False  # a decision since the check may have changed residency
        self.loaded: tuple[str, ...] = ()
        self.inflight: dict[int, trio.CancelScope] = {}
        self.killed: dict[int, float] = {}  # request -> when its replica died under it
        self.stop_requested = trio.Event()
        self.idle = trio.Event()
        self.residency: list[tuple[float, tuple[str, ...]]] = []
        self.started_at: float | None = None
        self.stopped_at: float | None = None
        self.seen: set[str] = set()
        if runtime_factory is None:
            if monitors:
                from sim.monitors import monitored

                runtime_factory = monitored(Runtime, max_decisions=None)
            else:
                runtime_factory = Runtime
        self.rt = runtime_factory(
            self.provider,
            runtime_config(workload),
            clock=clock,
            trace=self._sink,
            choose=lambda c: c[clock.rng.randrange(len(c))],
        )
        for m in workload.models:
            self.rt.add_model(
                ModelSpec(
                    m.id,
                    FLEET_FAMILY,
                    slots=m.slots,
                    memory_bytes=m.memory,
                    busy_timeout_ms=m.busy_timeout_ms or None,
                    lazy=True,
                )
            )

    # ------------------------------------------------------------ books
    def _sink(self, record: TraceRecord) -> None:
        """Every core decision of this replica: mark it for checking; a lifecycle change
        refreshes the models it reports loaded."""
        if not self.dirty:
            self.dirty = True
            self.on_dirty(self)
        if record.model:
            self.dirty_models.add(record.model)
        event = record.event
        if event not in REQUEST_PATH and not (
            event == "ensure_loaded" and record.fields.get("outcome") in ("proceed", "wait")
        ):
            self.residency_dirty = True
        if event in LIFECYCLE_EVENTS:
            self.refresh_loaded()

    def refresh_loaded(self) -> None:
        """The models with a published pool (Ray: the replica's multiplexed model ids)."""
        loaded = tuple(
            e.id
            for e in self.rt.core.registry.entries()
            if e.lifecycle.state in (ModelState.READY, ModelState.RECONFIGURING)
        )
        if loaded != self.loaded:
            self.loaded = loaded
            if self.state is not ReplicaState.DEAD:  # a dead replica's teardown is not residency
                self.residency.append((self.clock.now(), loaded))
                self.on_loaded(self)

    def note(self, text: str) -> None:
        """Report a violation once, stamped with the replica and the virtual time."""
        if text not in self.seen:
            self.seen.add(text)
            self._violation(f"t={self.clock.now():.6f} replica {self.rid}: {text}")

    def check(self, everything: bool = False) -> None:
        """The invariants over this replica's state (as sim.runner's quiescent step): each model
        whose core state changed since the last check, residency if a decision since then may
        have changed it (``everything``: every model and residency), and the runtime's and the
        fakes' books."""
        rt = self.rt
        registry = rt.core.registry
        now = self.clock.now()
        if everything:
            violations = check_registry(registry, now)
        else:
            violations = []
            for model in sorted(self.dirty_models):
                entry = registry.get(model)
                if entry is not None:
                    violations.extend(check_entry(entry, now))
            if self.residency_dirty:
                violations.extend(check_residency(registry))
        self.dirty = False
        self.dirty_models = set()
        self.residency_dirty = False
        for violation in violations:
            self.note(str(violation))
        for text in rt.violations:
            self.note(f"invariant 6/2: {text}")
        for text in rt.check_batches():
            self.note(f"invariant 2: {text}")
        for text in self.provider.premature:
            self.note(f"invariant 6: {text}")

    def closing_checks(self) -> None:
        """After shutdown: nothing queued or held, no session or weight alive (invariant 1)."""
        self.check(everything=True)
        for v in check_quiescent(self.rt.core.registry):
            self.note(str(v))
        for model, n in sorted(self.provider.live_sessions.items()):
            if n:
                self.note(f"invariant 1: {n} sessions of '{model}' alive after shutdown")
        for model, n in sorted(self.provider.live_weights.items()):
            if n:
                self.note(f"invariant 6: weights of '{model}' alive after shutdown")

    # ------------------------------------------------------------- life
    @property
    def routable(self) -> bool:
        return self.state is ReplicaState.RUNNING

    def kill(self) -> None:
        """Die now: every in-flight request fails at this instant (Ray's actor calls are
        at-most-once: the caller sees the actor's death), and the runtime is torn down."""
        now = self.clock.now()
        self.state = ReplicaState.DEAD
        self.stopped_at = now
        self.residency.append((now, ()))
        self._fail_inflight()
        self.stop_requested.set()

    def _fail_inflight(self) -> None:
        """Every in-flight request fails now (its client records the failure at this time)."""
        now = self.clock.now()
        for n in sorted(self.inflight):
            self.killed[n] = now
            self.inflight[n].cancel()

    def stop(self) -> None:
        """Stop gracefully: no new requests; the ongoing ones finish, then the runtime closes."""
        if self.state in (ReplicaState.STARTING, ReplicaState.RUNNING):
            self.state = ReplicaState.DRAINING
        self.stop_requested.set()

    def request_ended(self) -> None:
        if not self.inflight:
            self.idle.set()

    async def serve(self, start_time: float, on_running: Callable[[Replica], None]) -> None:
        """The replica's life: start (``start_time`` of virtual time), serve until stopped or
        killed, drain, shut the runtime down, check quiescence."""
        if start_time > 0:
            await self._start_sleep(start_time)
        if self.stop_requested.is_set():
            self.state = ReplicaState.STOPPED
            self.stopped_at = self.clock.now()
            return
        async with self.rt:
            self.state = ReplicaState.RUNNING
            self.started_at = self.clock.now()
            self.residency.append((self.started_at, ()))
            on_running(self)
            await self.stop_requested.wait()
            if self.state is ReplicaState.DRAINING and self.inflight:
                await self._drain()
            while self.inflight:
                self.idle = trio.Event()
                await self.idle.wait()
            await self.rt.shutdown()
        if self.state is not ReplicaState.DEAD:
            self.state = ReplicaState.STOPPED
            self.stopped_at = self.clock.now()
            self.residency.append((self.stopped_at, ()))
        self.closing_checks()

    async def _drain(self) -> None:
        """Wait for the ongoing requests, at most ``graceful_shutdown_timeout_s`` (Ray's graceful
        shutdown); then the replica is killed and those still running fail."""
        async with trio.open_nursery() as nursery:

            async def timeout() -> None:
                await self.clock.sleep(self.graceful_timeout)
                self.kill()  # Ray kills the replica's actor at the timeout
                nursery.cancel_scope.cancel()

            async def drained() -> None:
                while self.inflight:
                    self.idle = trio.Event()
                    await self.idle.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(timeout)
            nursery.start_soon(drained)

    async def _start_sleep(self, start_time: float) -> None:
        """Sleep through start-up, waking early if the replica is stopped meanwhile."""
        async with trio.open_nursery() as nursery:

            async def sleeper() -> None:
                await self.clock.sleep(start_time)
                nursery.cancel_scope.cancel()

            async def stopper() -> None:
                await self.stop_requested.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(sleeper)
            nursery.start_soon(stopper)
