"""Invariant monitors the runner's state checks cannot see, attached through ``runtime_factory``.

The runner checks core's state at every quiescent step. Some of the invariants
(docs/reference.md) are about *decisions* (a request queued that had to be rejected, a
grant that jumped the queue, a load refused although there was room, a bulk
unload that waited before freeing idle models) or about the sessions the
runtime hands out. :func:`monitored` builds a runtime whose trace sink and
provider are watched, so every decision is checked the moment core makes it,
against the rule restated here independently of the code that decides it.
Violations go to ``Runtime.violations``, which the runner reports. The FIFO
and overdue checks apply to the parallel runtime only (the original runtime's
single lock has no queue order by design). A run that keeps deciding without
end raises :class:`Livelock` (invariant 10) instead of spinning forever.
"""

from __future__ import annotations

import contextvars
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Any

from core.bulk import BulkUnload
from core.events import TraceRecord
from core.lifecycle import ModelState
from core.policy import RuntimeKind, bound, exceeds
from core.residency import Eviction
from server.runtime import Runtime
from server.runtime.ports import ModelSpec

SPEC_RESIDENT = frozenset({ModelState.LOADING, ModelState.READY, ModelState.RECONFIGURING})
"""Logical residency (docs/reference.md §4.7): from load start until teardown starts."""


MAX_DECISIONS = 5_000
"""More core decisions than this in one small scenario is a livelock (invariant 10); fuzzed ones
make < 100."""

MAX_REPEATS = 200
"""The same decision at the same virtual instant this many times in a row is a livelock too."""


IDLE_SLACK = 1e-9
"""Float slack when comparing an idle retirement's age with ``idle_unload_ms``."""

APPLYING: contextvars.ContextVar[ModelSpec | None] = contextvars.ContextVar(
    "applying", default=None
)
"""The spec the current task's reconfiguration applies (set by the monitored ``reconfigure``)."""


class Livelock(RuntimeError):
    """The runtime keeps deciding without the scenario making progress."""


class Monitor:
    """Watches one runtime's decisions and session use."""

    def __init__(self, checks: bool = True, max_decisions: int | None = MAX_DECISIONS) -> None:
        self.checks = checks
        self.max_decisions = max_decisions  # None: no livelock bound (long fleet runs)
        self.rt: Runtime | None = None
        self.decisions = 0
        self.repeats = 0
        self.last: tuple[float, str, str, str] | None = None
        self.bulks: list[tuple[BulkUnload, list[str]]] = []
        self.sessions_busy: set[int] = set()
        self.loading: dict[str, int] = {}
        self.request_tickets: set[int] = set()
        self.last_use_end: dict[str, float] = {}

    def flag(self, text: str) -> None:
        if self.rt is not None:
            self.rt.violations.append(text)

    # ----------------------------------------------------------- decisions
    def observe(self, r: TraceRecord) -> None:
        self.decisions += 1
        key = (r.t, r.model, r.event, r.decision)
        self.repeats = self.repeats + 1 if key == self.last else 0
        self.last = key
        too_many = self.max_decisions is not None and self.decisions > self.max_decisions
        if too_many or self.repeats > MAX_REPEATS:
            raise Livelock(
                f"invariant 10: livelock, {self.decisions} core decisions, the last one "
                f"({r.event} {r.decision} on '{r.model}' at t={r.t}) repeated {self.repeats} times"
            )
        rt = self.rt
        if rt is None or not r.model or not self.checks:
            return
        entry = rt.core.registry.get(r.model)
        if entry is None:
            return
        adm = entry.admission
        fifo = getattr(rt.config, "kind", RuntimeKind.PARALLEL) is RuntimeKind.PARALLEL
        if fifo and r.event == "request" and r.fields.get("outcome") == "queued":
            timeout = bound(float(r.args["timeout"]))  # the trace writes unbounded as 0
            since = [s for _, s in adm.occupied().values()]
            if (
                adm.exclusive_ticket is None
                and timeout is not None
                and since
                and all(r.t - s > timeout for s in since)
            ):
                self.flag(
                    f"invariant 8 ({r.model}): ticket {r.args['ticket']} queued although "
                    "every occupied "
                    f"slot overran its {timeout}s timeout (must be rejected at once)"
                )
        waiting = (
            [w.ticket for w in adm.waiters()] if fifo else []
        )  # the original guard has no FIFO
        if waiting:
            newest = max(adm.ledger.active, default=0)
            if newest > min(waiting):
                self.flag(
                    f"invariant 3 ({r.model}): ticket {newest} holds a lease while older "
                    f"ticket {min(waiting)} still waits"
                )
        if r.event == "request":
            self.request_tickets.add(int(r.args["ticket"]))
        elif r.event == "release" and int(r.args["ticket"]) in self.request_tickets:
            self.request_tickets.discard(int(r.args["ticket"]))
            self.last_use_end[r.model] = r.t
        elif r.event == "commit_reconfigure":
            self._check_reconfigure(r.model)
        if r.reason in ("residency_limit", "memory_budget") and r.event in (
            "ensure_loaded",
            "begin_load",
        ):
            self._check_refusal(r)
        if r.event == "begin_unload" and adm.exclusive_ticket is not None:
            self._check_bulk_order(r.model, adm.exclusive_ticket)

    def _check_refusal(self, r: TraceRecord) -> None:
        assert self.rt is not None
        registry = self.rt.core.registry
        limits = registry.limits
        incoming = registry.get(r.model)
        others = [
            e
            for e in registry.entries()
            if e is not incoming and e.lifecycle.state in SPEC_RESIDENT
        ]
        fits_count = not exceeds(len(others) + 1, limits.max_loaded_models)
        used = sum(e.memory_bytes for e in others) + (incoming.memory_bytes if incoming else 0)
        fits_memory = not exceeds(used, limits.memory_budget)
        if fits_count and fits_memory:
            self.flag(
                f"invariant 5 ({r.model}): load refused ({r.reason}) although only "
                f"{[e.id for e in others]} are logically resident"
            )

    def _check_reconfigure(self, model: str) -> None:
        """Reference §4.5: only path, family, task, mode, slots, config, weights and options
        make a reconfiguration; a spec that changes nothing else updates in place."""
        assert self.rt is not None
        new, old = APPLYING.get(), self.rt.specs.get(model)
        if new is None or old is None:
            return
        same = (old.family, old.path, old.task, old.mode, old.slots, old.backend, old.device)
        if same == (
            new.family,
            new.path,
            new.task,
            new.mode,
            new.slots,
            new.backend,
            new.device,
        ) and (
            dict(old.load_options),
            dict(old.session_options),
        ) == (dict(new.load_options), dict(new.session_options)):
            self.flag(
                f"reference §4.5 ({model}): reconfigured (new generation, reload) although only "
                "operational fields (lazy, busy_timeout_ms, memory_bytes) changed"
            )

    def check_retirements(
        self, now: float, idle_seconds: float | None, victims: Sequence[Eviction]
    ) -> None:
        """Reference §4.8: a model is idle from the end of its last request, stream or batch
        (``idle_seconds`` None: retirement is off, so there must be no victim)."""
        for v in victims:
            ended = self.last_use_end.get(v.model)
            if idle_seconds is None:
                self.flag(f"invariant 5 ({v.model}): retired as idle with retirement off")
            elif ended is not None and now - ended < idle_seconds - IDLE_SLACK:
                self.flag(
                    f"invariant 5 ({v.model}): retired as idle at t={now} although its last use "
                    f"ended at t={ended}, less than {idle_seconds}s before"
                )

    def wrap_retire(
        self, retire: Callable[[float, float | None], tuple[Eviction, ...]]
    ) -> Callable[[float, float | None], tuple[Eviction, ...]]:
        def wrapped(now: float, idle_seconds: float | None) -> tuple[Eviction, ...]:
            victims = retire(now, idle_seconds)
            self.check_retirements(now, idle_seconds, victims)
            return victims

        return wrapped

    def wrap_reconfigure(
        self, reconfigure: Callable[[ModelSpec], Any]
    ) -> Callable[[ModelSpec], Any]:
        async def wrapped(spec: ModelSpec) -> Any:
            token = APPLYING.set(spec)
            try:
                return await reconfigure(spec)
            finally:
                APPLYING.reset(token)

        return wrapped

    def _check_bulk_order(self, model: str, ticket: int) -> None:
        for bulk, started in self.bulks:
            if bulk.tickets.get(model) != ticket:
                continue
            started.append(model)
            idle_left = [m for m in bulk.ready_at_publication if m not in started]
            if model not in bulk.ready_at_publication and idle_left:
                self.flag(
                    f"invariant 9: bulk unload started busy '{model}' before ready idle {idle_left}"
                )

    def wrap_bulk(self, publish: Callable[..., BulkUnload]) -> Callable[..., BulkUnload]:
        def wrapped(ids: Iterable[str] | None, now: float) -> BulkUnload:
            bulk = publish(ids, now)
            self.bulks.append((bulk, []))
            return bulk

        return wrapped

    # ------------------------------------------------------------- sessions
    def use(self, session: Any, what: str) -> None:
        sid = id(session)
        if sid in self.sessions_busy:
            self.flag(
                f"invariant 2: session {getattr(session, 'sid', '?')} used by two leases at once "
                f"({what})"
            )
        self.sessions_busy.add(sid)

    def done(self, session: Any) -> None:
        self.sessions_busy.discard(id(session))


class MonitoredProvider:
    """The provider, with session use and first loads watched (everything else passes through)."""

    def __init__(self, inner: Any, monitor: Monitor) -> None:
        self._inner = inner
        self._m = monitor

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def load(self, spec: ModelSpec) -> Any:
        m = self._m
        if m.loading.get(spec.id, 0):
            m.flag(f"invariant 7 ({spec.id}): a second load started while one is in flight")
        m.loading[spec.id] = m.loading.get(spec.id, 0) + 1
        try:
            return await self._inner.load(spec)
        finally:
            m.loading[spec.id] -= 1

    async def run(self, session: Any, request: Any) -> Any:
        self._m.use(session, "run")
        try:
            return await self._inner.run(session, request)
        finally:
            self._m.done(session)

    async def batch(self, session: Any, requests: Sequence[Any]) -> list[Any]:
        self._m.use(session, "batch")
        try:
            return list(await self._inner.batch(session, requests))
        finally:
            self._m.done(session)

    async def stream(self, session: Any, request: Any) -> AsyncIterator[Any]:
        self._m.use(session, "stream")
        try:
            async for chunk in self._inner.stream(session, request):
                yield chunk
        finally:
            self._m.done(session)


def monitored(
    factory: Callable[..., Runtime] = Runtime,
    *,
    checks: bool = True,
    max_decisions: int | None = MAX_DECISIONS,
) -> Callable[..., Runtime]:
    """A ``runtime_factory`` for :func:`sim.runner.run_scenario` whose runtime is watched.

    ``checks=False`` keeps only the livelock guard: the run sees exactly what
    ``voxpool sim run`` sees, but cannot spin forever. ``max_decisions`` bounds the
    decisions of one runtime (None: no bound, for the fleet's long runs; the
    repeat guard stays).
    """

    def build(
        provider: Any, config: Any, *, trace: Callable[[TraceRecord], None], **kw: Any
    ) -> Runtime:
        monitor = Monitor(checks, max_decisions)

        def sink(r: TraceRecord) -> None:
            trace(r)
            monitor.observe(r)

        rt = factory(
            MonitoredProvider(provider, monitor) if checks else provider, config, trace=sink, **kw
        )
        monitor.rt = rt
        if checks:
            rt.core.bulk_publish = monitor.wrap_bulk(rt.core.bulk_publish)  # type: ignore[method-assign]
            rt.core.retire_idle = monitor.wrap_retire(rt.core.retire_idle)  # type: ignore[method-assign,assignment]
            rt.management.reconfigure = monitor.wrap_reconfigure(rt.management.reconfigure)  # type: ignore[method-assign,assignment]
        return rt

    return build
