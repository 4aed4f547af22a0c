"""Run a fleet: every replica a real runtime, one virtual clock, one trio run.

The run starts the workload's replicas, plays its arrivals (one client task
per request: route, send, retry a replica's 503 elsewhere, record), its kill
events and, if configured, the autoscaler's controller loop; when the last
request has ended it stops every replica (each drains, shuts its runtime down
and checks quiescence). Whenever the whole system is quiescent the replicas
whose core state changed since the last check are checked against the
invariants (a replica whose state did not change cannot have broken one);
every :data:`FULL_CHECK_EVERY` steps, every live replica is. Decision monitors
(:mod:`sim.monitors`) watch every replica's decisions unless ``monitors`` is
off. The same workload and seed give the same summary in any process.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

import trio
import trio.testing

from core.policy import retry_pause
from server.runtime import BusyError, Runtime
from sim.clock import SimClock, seed_trio
from sim.fleet.arrivals import Arrival, arrivals
from sim.fleet.autoscaler import Autoscaler
from sim.fleet.pending import Pending, PendingRequests
from sim.fleet.replica import Replica, ReplicaState
from sim.fleet.router import Router, RoutingContext
from sim.fleet.stats import (
    BACKPRESSURE,
    BUSY,
    ERROR,
    FAILED,
    OK,
    FleetSummary,
    Latencies,
    ModelSummary,
    Recorder,
    ReplicaSummary,
)
from sim.fleet.workload import Workload, scheduling_for

FULL_CHECK_EVERY = 4096
"""Every this many quiescent steps, every live replica is checked, changed or not."""


def run_fleet(
    workload: Workload,
    seed: int | None = None,
    *,
    monitors: bool = True,
    runtime_factory: Callable[..., Runtime] | None = None,
) -> FleetSummary:
    """Run ``workload`` under ``seed`` (default: the workload's) and summarise it."""
    seed = workload.seed if seed is None else seed
    seed_trio(seed)
    mock = trio.testing.MockClock(autojump_threshold=0)
    fleet = Fleet(workload, seed, mock, monitors=monitors, runtime_factory=runtime_factory)
    trio.run(fleet.main, clock=mock)
    return fleet.summary()


class Fleet:
    """One fleet run: clock, router, replicas, clients, controller, and the checks."""

    def __init__(
        self,
        workload: Workload,
        seed: int,
        mock: trio.testing.MockClock | None = None,
        *,
        monitors: bool = True,
        runtime_factory: Callable[..., Runtime] | None = None,
    ) -> None:
        self.workload = workload
        self.seed = seed
        self.clock = SimClock(random.Random(seed), mock, scheduling_for(workload, seed))
        self.router = Router(
            workload.router, workload.max_ongoing, random.Random(f"voxpool-fleet-router:{seed}")
        )
        self.pending = PendingRequests(lambda: len(self.router.routable), self.router.sent)
        self.monitors = monitors
        self.runtime_factory = runtime_factory
        self.replicas: list[Replica] = []
        self.dirty: list[Replica] = []  # replicas whose core state changed since the last step
        self.recorder = Recorder()
        self.violations: list[str] = []
        self.warnings: list[str] = []
        self.steps = 0
        self.changed = trio.Event()  # replaced whenever the set of routable replicas changes
        self.scale: list[tuple[float, int]] = []
        self.peak = 0
        self.stalled = False
        self.autoscaler = (
            Autoscaler(workload.autoscaling, workload.replicas.count)
            if workload.autoscaling is not None
            else None
        )
        self._replica_nursery: trio.Nursery | None = None
        self._clients_scope = trio.CancelScope()
        self._driver_scope = trio.CancelScope()
        self._finished = False

    # ------------------------------------------------------------ replicas
    def start_replica(self, start_time: float) -> Replica:
        """A new replica (the next id), starting now and routable after ``start_time``."""
        replica = Replica(
            len(self.replicas),
            self.workload,
            self.clock,
            monitors=self.monitors,
            on_loaded=self._on_loaded,
            on_dirty=self._mark_dirty,
            violation=self.violations.append,
            runtime_factory=self.runtime_factory,
        )
        self.replicas.append(replica)
        assert self._replica_nursery is not None
        self._replica_nursery.start_soon(replica.serve, start_time, self._on_running)
        return replica

    def _mark_dirty(self, replica: Replica) -> None:
        """``replica``'s core state changed: check it at the next quiescent step."""
        self.dirty.append(replica)

    def _on_running(self, replica: Replica) -> None:
        self.router.add(replica.rid)
        self._routable_changed()

    def _on_loaded(self, replica: Replica) -> None:
        self.router.set_loaded(replica.rid, replica.loaded)

    def _routable_changed(self) -> None:
        running = len(self.router.routable)
        self.peak = max(self.peak, running)
        self.scale.append((self.clock.now(), running))
        self.changed.set()
        self.changed = trio.Event()
        self.pending.wake()

    def live(self) -> list[Replica]:
        """Replicas starting or running (what the controller counts toward its target)."""
        return [
            r for r in self.replicas if r.state in (ReplicaState.STARTING, ReplicaState.RUNNING)
        ]

    def stop_replica(self, replica: Replica) -> None:
        self.router.remove(replica.rid)
        replica.stop()
        self._routable_changed()

    def kill_replica(self, rid: int) -> None:
        """Replica ``rid`` dies now; the controller starts a replacement (Ray keeps the target
        number of replicas)."""
        if rid >= len(self.replicas):
            self.warnings.append(f"t={self.clock.now():.6f} kill: there is no replica {rid}")
            return
        replica = self.replicas[rid]
        if replica.state not in (ReplicaState.STARTING, ReplicaState.RUNNING):
            return
        self.router.remove(rid)
        replica.kill()
        self._routable_changed()
        self.start_replica(self.workload.replicas.start_time_s)

    # -------------------------------------------------------------- checks
    def on_step(self) -> None:
        """Every quiescent step: check the replicas whose state changed (all of them, now and
        then)."""
        self.steps += 1
        if self.steps % FULL_CHECK_EVERY == 0:
            for replica in self.replicas:
                if replica.state is not ReplicaState.STOPPED:
                    replica.check(everything=True)
        dirty, self.dirty = self.dirty, []
        for replica in sorted(dirty, key=lambda r: r.rid):
            if replica.dirty:
                replica.check()

    def on_stall(self) -> bool:
        """Everything blocked with no timer left: requests wait for a replica that can never
        come (invariant 10 at the fleet level). Fail them, once."""
        if self._finished or self.stalled:
            return False
        self.stalled = True
        self.violations.append(
            f"t={self.clock.now():.6f} stalled: requests wait and nothing can wake them"
        )
        self._clients_scope.cancel()
        return True

    # ----------------------------------------------------------------- run
    async def main(self) -> None:
        async with trio.open_nursery() as outer:
            outer.start_soon(self._drive)
            async with trio.open_nursery() as replicas:
                self._replica_nursery = replicas
                for _ in range(self.workload.replicas.count):
                    self.start_replica(0.0)
                while len(self.router.routable) < self.workload.replicas.count:
                    await self.changed.wait()  # the initial fleet is up before traffic starts
                async with trio.open_nursery() as control:
                    if self.autoscaler is not None:
                        control.start_soon(self._autoscale)
                    control.start_soon(self._events)
                    with self._clients_scope:
                        async with trio.open_nursery() as clients:
                            await self._arrive(clients, arrivals(self.workload, self.seed))
                    control.cancel_scope.cancel()
                for replica in self.replicas:
                    replica.stop()
            self._finished = True
            self._driver_scope.cancel()

    async def _drive(self) -> None:
        with self._driver_scope:
            await self.clock.drive(on_step=self.on_step, on_stall=self.on_stall)

    async def _arrive(self, clients: trio.Nursery, stream: Iterator[Arrival]) -> None:
        clock = self.clock
        for arrival in stream:
            if arrival.at > clock.now():
                await clock.sleep_until(arrival.at)
            clients.start_soon(self._client, arrival)

    async def _events(self) -> None:
        for event in self.workload.events:
            if event.at > self.clock.now():
                await self.clock.sleep_until(event.at)
            self.kill_replica(event.replica)

    async def _autoscale(self) -> None:
        scaler = self.autoscaler
        assert scaler is not None
        cfg = scaler.config
        clock = self.clock
        while True:
            await clock.sleep(cfg.interval_s)
            router = self.router
            total = router.queued + sum(router.ongoing.values())
            average = scaler.observe(clock.now(), total)
            target = scaler.decide(average, len(router.routable))
            live = self.live()
            if target > len(live):
                for _ in range(target - len(live)):
                    self.start_replica(self.workload.replicas.start_time_s)
            elif target < len(live):
                starting = [r for r in live if r.state is ReplicaState.STARTING]
                running = [r for r in live if r.state is ReplicaState.RUNNING]
                victims = (starting[::-1] + running[::-1])[: len(live) - target]
                for r in victims:
                    self.stop_replica(r)

    async def _client(self, a: Arrival) -> None:
        """One request: reach the router (``hop_s``), route it (with back-pressure and
        backoff), send it, retry a replica's 503 on another replica, or a request whose
        replica died, while retries last (as voxpool's Ray ingress does), and record how it
        ended."""
        router, clock = self.router, self.clock
        rec = self.recorder
        way_in = self.workload.router.hop_s / 2  # the other half: the answer's way back
        if way_in > 0:  # the proxy and the ingress before the router sees it
            await clock.sleep(way_in)
        if not router.admit():
            rec.record(BACKPRESSURE, clock.now() - a.at, None, a.model)
            return
        ctx = RoutingContext(a.at)
        avoid: list[int] = []
        retries = 0
        router.queued += 1
        queued = True
        try:
            while True:
                rid = await self._route(a, ctx, avoid)
                router.queued -= 1
                queued = False
                outcome = await self._send(rid, a)
                if outcome == BUSY:
                    rec.busy_answer(rid)
                elif outcome == FAILED:
                    died_at = self.replicas[rid].killed.pop(a.n)
                    rec.lost_on(rid)
                if outcome in (BUSY, FAILED) and retries < self.workload.router.retries:
                    retries += 1
                    await clock.sleep(retry_pause(retries) + way_in)  # the ingress's pause
                    if outcome == BUSY:  # a dead replica leaves the router by itself
                        avoid.append(rid)
                    ctx = RoutingContext(a.at)
                    router.queued += 1
                    queued = True
                    continue
                if outcome == FAILED:
                    rec.record(FAILED, died_at - a.at, rid, a.model)
                else:
                    rec.record(outcome, clock.now() - a.at, rid, a.model)
                return
        except trio.Cancelled:
            rec.record(FAILED, clock.now() - a.at, None, a.model)  # a stalled fleet gave up on it
            raise
        finally:
            if queued:
                router.queued -= 1

    async def _route(self, a: Arrival, ctx: RoutingContext, avoid: list[int]) -> int:
        """The replica request ``a`` is given (and counted as sent to): it waits for a
        routing task in arrival order; its task tries replicas with backoff; a replica that
        any task finds for its model goes to the model's oldest pending request
        (:mod:`sim.fleet.pending`)."""
        router, clock = self.router, self.clock
        pending = Pending(a.model, ctx, avoid)
        self.pending.add(pending)
        try:
            while pending.replica is None:
                if not pending.routing:
                    await pending.wait(clock, None)
                    continue
                rid = router.pick(a.model, ctx, clock.now(), avoid)
                if rid is not None:
                    self.pending.found(a.model, rid)
                    continue
                if not router.routable:
                    await self.changed.wait()
                    continue
                delay = router.backoff(ctx)
                if delay > 0:
                    await pending.wait(clock, delay)
        except BaseException:
            if pending.replica is None:
                self.pending.remove(pending)
            else:
                router.done(pending.replica)
            raise
        return pending.replica

    async def _send(self, rid: int, a: Arrival) -> str:
        """Run the request on replica ``rid``'s runtime: ok, busy, failed (the replica died
        under it) or error. The answer's way back (half the hop) ends it: Ray counts the
        request on its replica until the answer has streamed out."""
        replica = self.replicas[rid]
        router = self.router
        self.recorder.sent_to(rid)
        outcome = OK
        try:
            with trio.CancelScope() as scope:
                replica.inflight[a.n] = scope
                try:
                    await replica.rt.run(a.model, {"duration": a.duration})
                except BusyError:
                    outcome = BUSY
                except trio.Cancelled:
                    raise
                except Exception:
                    outcome = ERROR
                finally:
                    del replica.inflight[a.n]
                    replica.request_ended()
            if a.n in replica.killed:
                return FAILED
            if self.workload.router.hop_s > 0:
                await self.clock.sleep(self.workload.router.hop_s / 2)
            return outcome
        finally:
            router.done(rid)

    # ------------------------------------------------------------- summary
    def summary(self) -> FleetSummary:
        rec = self.recorder
        per = []
        for r in self.replicas:
            per.append(
                ReplicaSummary(
                    r.rid,
                    Latencies.of(rec.by_replica.get(r.rid, ())),
                    rec.sent.get(r.rid, 0),
                    rec.busy_answers.get(r.rid, 0),
                    rec.failed.get(r.rid, 0),
                    sum(r.provider.loads.values()),
                    r.started_at,
                    r.stopped_at,
                )
            )
        return FleetSummary(
            replicas=self.workload.replicas.count,
            requests=rec.total,
            counts=dict(rec.counts),
            latency=Latencies.of(rec.ok),
            per_model=tuple(
                ModelSummary(
                    m.id,
                    sum(rec.by_model_counts.get(m.id, {}).values()),
                    Latencies.of(rec.by_model.get(m.id, ())),
                    rec.by_model_counts.get(m.id, {}).get(BUSY, 0)
                    + rec.by_model_counts.get(m.id, {}).get(BACKPRESSURE, 0),
                )
                for m in self.workload.models
            ),
            per_replica=tuple(per),
            end_time=self.clock.now(),
            peak_replicas=self.peak,
            violations=tuple(self.violations),
            warnings=tuple(self.warnings),
            residency={r.rid: tuple(r.residency) for r in self.replicas},
            scale=_last_per_instant(self.scale),
        )


def _last_per_instant(changes: list[tuple[float, int]]) -> tuple[tuple[float, int], ...]:
    """The running-replica count at each instant it changed (several changes at one instant,
    such as the initial fleet starting: the last one)."""
    out: list[tuple[float, int]] = []
    for t, n in changes:
        if out and out[-1][0] == t:
            out[-1] = (t, n)
        else:
            out.append((t, n))
    return tuple(out)
