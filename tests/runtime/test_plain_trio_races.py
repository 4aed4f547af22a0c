"""Race report 2 under plain trio: the real scheduler, a real clock, fake sessions.

The report was first seen this way (13 of 40 runs): a waiter's client leaves
in the very loop step in which the first load fails. Here the load and the
disconnect are due at the same deadline, so trio wakes both in one batch and
its own scheduler picks the order: roughly half the runs cancel the waiter
before the failure names it the next initializer. Every run must end with the
model loadable and serving; with the fix reverted (the mutant), some run
wedges the model in ``loading``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import trio

from core.events import TraceRecord
from core.lifecycle import ModelState
from server.runtime import ModelSpec, Runtime, RuntimeConfig
from server.runtime.errors import LoadError
from server.runtime.ports import SystemClock
from sim.fakes import FakeProvider, FakeScript
from tests.mutants.catalogue import MUTANTS

RUNS = 40
LOAD_S = 0.02
HANG_GUARD_S = 5.0  # a wedged model never serves again: the guard, not a verdict on speed


class DeadlineProvider(FakeProvider):
    """The fake provider on a real clock, telling the test when its current load will end."""

    def __init__(self) -> None:
        super().__init__(
            SystemClock(), {"m": FakeScript(load_time=LOAD_S, create_time=0.0, clone_time=0.0)}
        )
        self.load_deadline = trio.Event()
        self.deadline = 0.0

    async def _sleep(self, seconds: float) -> None:
        deadline = self.clock.now() + seconds
        if self.events and self.events[-1][2] == "load_start" and not self.load_deadline.is_set():
            self.deadline = deadline
            self.load_deadline.set()
        await self.clock.sleep_until(deadline)


async def one_run() -> tuple[bool, bool]:
    """(the model served again, the race was hit: the leaver had been named initializer)."""
    provider = DeadlineProvider()
    provider.script("m").fail_loads = 1
    records: list[TraceRecord] = []
    rt = Runtime(provider, RuntimeConfig(busy_timeout_ms=0), trace=records.append)
    rt.add_model(ModelSpec("m", "fake", slots=3))
    served = False
    async with rt:
        waiter_scope = trio.CancelScope()

        async def first() -> None:
            with contextlib.suppress(LoadError):
                await rt.run("m", {"duration": 0.0})

        async def waiter() -> None:
            with waiter_scope, contextlib.suppress(LoadError):
                await rt.run("m", {"duration": 0.0})

        async def leave_as_the_load_ends() -> None:
            await provider.load_deadline.wait()
            while not rt.core.entry("m").lifecycle.load_waiters:  # the waiter is parked on the load
                await trio.sleep(0)
            await rt.clock.sleep_until(provider.deadline)  # the same deadline: one batch
            waiter_scope.cancel()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(first)
            nursery.start_soon(waiter)
            nursery.start_soon(leave_as_the_load_ends)
        with trio.move_on_after(HANG_GUARD_S):
            await rt.run("m", {"duration": 0.0})
            served = rt.core.entry("m").lifecycle.state is ModelState.READY
        if not served:
            rt.closed = True  # a wedged model cannot be unloaded: leave without the final teardown
    hit = any(r.event == "abandon_wait" and r.fields["left"] == "initializer" for r in records)
    return served, hit


def _runs() -> Iterator[tuple[bool, bool]]:
    for _ in range(RUNS):
        yield trio.run(one_run)


def test_a_waiter_leaving_as_the_first_load_fails_never_wedges_the_model() -> None:
    results = list(_runs())
    assert all(served for served, _ in results), (
        f"{sum(not s for s, _ in results)} of {RUNS} runs wedged"
    )
    hits = sum(hit for _, hit in results)
    assert hits >= 1, (
        "trio never ordered the disconnect before the failure: the race was not exercised"
    )


def test_with_the_fix_reverted_the_race_wedges_the_model() -> None:
    with MUTANTS["abandoned_initializer_strands"].patch():
        wedged = next((i for i, (served, _) in enumerate(_runs()) if not served), None)
    assert wedged is not None, "the mutant never wedged: the test does not reach the race"
