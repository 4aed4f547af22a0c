"""Hypothesis state machine over lifecycle + residency of several models.

A miniature driver plays the runtime's part: requests, unloads, reconfigurations,
evictions and idle retirement start jobs (load, run, teardown) that complete or
fail in any order the strategy picks. After every step the invariants (docs/reference.md) are
checked on the whole registry; at the end everything drains to quiescence.
"""

from __future__ import annotations

import attrs
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from core.admission import Granted, Queued, Wakeups
from core.invariants import check_quiescent, check_registry
from core.lease import Lease
from core.lifecycle import Abandoned, Left, ModelState, Proceed, Teardown, WaitLoad
from core.registry import Registered, Registry
from core.residency import ResidencyLimits, RoomDecision, retire_idle

MODELS = ("a", "b", "c")


@attrs.define
class Job:
    kind: str  # load | run | teardown
    model: str
    ticket: int
    then: str = ""  # after a teardown: "release" or "load"


class LifecycleMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.reg = Registry(ResidencyLimits(max_loaded_models=2, memory_budget=250))
        for i, m in enumerate(MODELS):
            r = self.reg.register(m, slots=2, now=0.0, memory_bytes=100 + 10 * i)
            assert isinstance(r, Registered)
            r.entry.admission.release(r.lease.ticket, 0.0)
        self.now = 0.0
        self.jobs: list[Job] = []
        self.roles: dict[int, str] = {}  # ticket -> "request" | "unload" | "reconfigure"
        self.load_waiters: dict[int, str] = {}
        self.refusals = 0

    # -------------------------------------------------------------- helpers
    def entry(self, m: str):  # type: ignore[no-untyped-def]
        e = self.reg.get(m)
        assert e is not None
        return e

    def on_room(self, m: str, loader: int, d: RoomDecision) -> None:
        for ev in d.evictions:
            self.jobs.append(Job("teardown", ev.model, ev.lease.ticket, then="release"))
        if d.load is not None:
            self.jobs.append(Job("load", m, d.load.ticket))
        elif d.refused is not None:
            self.refusals += 1
            self.finish_holder(m, loader)
        if d.retry is not None:
            self.load_waiters.pop(d.retry.ticket, None)
            self.on_room(m, d.retry.ticket, self.reg.begin_load(self.entry(m), d.retry, self.now))

    def start_holder(self, m: str, lease: Lease) -> None:
        role = self.roles[lease.ticket]
        e = self.entry(m)
        if role == "request":
            d = self.reg.ensure_loaded(e, lease.ticket, self.now)
            if isinstance(d, Proceed):
                assert d.generation == lease.generation
                self.jobs.append(Job("run", m, lease.ticket))
            elif isinstance(d, WaitLoad):
                self.load_waiters[lease.ticket] = m
            else:
                self.on_room(m, lease.ticket, d)
        elif role == "unload":
            td = e.lifecycle.begin_unload()
            if isinstance(td, Teardown):
                self.jobs.append(Job("teardown", m, lease.ticket, then="release"))
            else:
                self.finish_holder(m, lease.ticket)
        elif role.startswith("reconfigure"):
            e.lifecycle.begin_reconfigure()
            if role.endswith("reject"):
                e.lifecycle.reject_reconfigure()
                self.finish_holder(m, lease.ticket)
                return
            slots = int(role.split(":")[1])
            td = e.commit_reconfigure(slots)
            if isinstance(td, Teardown):
                self.jobs.append(Job("teardown", m, lease.ticket, then="load"))
            else:
                self.load_as_manager(m, lease.ticket)

    def load_as_manager(self, m: str, ticket: int) -> None:
        d = self.reg.ensure_loaded(self.entry(m), ticket, self.now)
        assert isinstance(d, RoomDecision)
        self.on_room(m, ticket, d)

    def finish_holder(self, m: str, ticket: int) -> None:
        self.roles.pop(ticket, None)
        self.absorb(m, self.entry(m).admission.release(ticket, self.now).wakeups)

    def absorb(self, m: str, wake: Wakeups) -> None:
        for e in wake.expired:
            self.roles.pop(e.ticket, None)
        for lease in wake.granted:
            self.start_holder(m, lease)

    # ---------------------------------------------------------------- rules
    @rule(dt=st.floats(0, 2.0))
    def advance(self, dt: float) -> None:
        self.now += dt

    @rule(m=st.sampled_from(MODELS))
    def request(self, m: str) -> None:
        t = self.reg.new_ticket()
        self.roles[t] = "request"
        d = self.entry(m).admission.request(t, self.now, None)
        if isinstance(d, Granted):
            self.start_holder(m, d.lease)
        elif not isinstance(d, Queued):
            self.roles.pop(t)

    @rule(
        m=st.sampled_from(MODELS),
        kind=st.sampled_from(["unload", "reconfigure:1", "reconfigure:2", "reconfigure:reject"]),
    )
    def manage(self, m: str, kind: str) -> None:
        t = self.reg.new_ticket()
        self.roles[t] = kind
        d = self.entry(m).admission.manage(t, self.now, None)
        if isinstance(d, Granted):
            self.start_holder(m, d.lease)

    @rule(idle=st.floats(0.5, 5.0))
    def retire(self, idle: float) -> None:
        for ev in retire_idle(self.reg, self.now, idle):
            self.jobs.append(Job("teardown", ev.model, ev.lease.ticket, then="release"))

    @precondition(lambda self: bool(self.jobs))
    @rule(data=st.data(), ok=st.booleans(), leaves=st.booleans())
    def complete(self, data: st.DataObject, ok: bool, leaves: bool) -> None:
        self._complete(data.draw(st.integers(0, len(self.jobs) - 1)), ok, leaves)

    @precondition(lambda self: bool(self.load_waiters))
    @rule(data=st.data())
    def waiter_leaves(self, data: st.DataObject) -> None:
        """A holder waiting for another's load disconnects: it just stops waiting."""
        t = data.draw(st.sampled_from(sorted(self.load_waiters)))
        m = self.load_waiters.pop(t)
        assert self.entry(m).lifecycle.abandon_wait(t) == Abandoned(Left.WAITER)
        self.finish_holder(m, t)

    def _complete(self, index: int, ok: bool, leaves: bool = False) -> None:
        job = self.jobs.pop(index)
        e = self.entry(job.model)
        if job.kind == "run":
            self.finish_holder(job.model, job.ticket)
        elif job.kind == "teardown":
            e.lifecycle.unload_finished()
            if job.then == "load":
                self.load_as_manager(job.model, job.ticket)
            else:
                self.finish_holder(job.model, job.ticket)
        else:  # load
            role = self.roles.get(job.ticket, "")
            if ok:
                outcome = e.lifecycle.load_succeeded(job.ticket)
                e.capacity = 2
                for t in outcome.proceed:
                    self.load_waiters.pop(t)
                    self.jobs.append(Job("run", job.model, t))
                if role == "request":
                    self.jobs.append(Job("run", job.model, job.ticket))
                else:
                    self.finish_holder(job.model, job.ticket)
            else:
                outcome = e.lifecycle.load_failed(job.ticket)
                self.finish_holder(job.model, job.ticket)
                retry = outcome.retry
                if retry is not None and leaves:  # race report 2: the named one is leaving
                    self.load_waiters.pop(retry.ticket)
                    left = e.lifecycle.abandon_wait(retry.ticket)
                    assert left.left is Left.INITIALIZER
                    if left.retry is None:  # nobody left to load: unloaded, not stuck loading
                        assert (
                            e.lifecycle.state is ModelState.UNLOADED
                            and not e.lifecycle.load_waiters
                        )
                    self.finish_holder(job.model, retry.ticket)
                    retry = left.retry
                if retry is not None:
                    self.load_waiters.pop(retry.ticket)
                    self.on_room(job.model, retry.ticket, self.reg.begin_load(e, retry, self.now))

    @invariant()
    def invariants_hold(self) -> None:
        violations = check_registry(self.reg, self.now)
        assert not violations, [str(v) for v in violations]

    def teardown(self) -> None:
        steps = 0
        while self.jobs:
            self._complete(0, True)  # loads succeed so that waiters drain
            steps += 1
            assert steps < 10_000, "did not drain"
            assert not check_registry(self.reg, self.now)
        assert not self.load_waiters
        violations = check_quiescent(self.reg)
        assert not violations, [str(v) for v in violations]


LifecycleMachine.TestCase.settings = settings(
    max_examples=120, stateful_step_count=40, deadline=None
)
TestLifecycleProperties = LifecycleMachine.TestCase
