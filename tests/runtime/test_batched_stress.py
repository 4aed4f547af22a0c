"""Random owners against the batched runtime's marks and parking, on trio and on asyncio.

Hypothesis plays owners that open streams (live ones with a feed, run-like ones
without), push, close, fail (a "boom" piece) and get cancelled, more owners than
slots (so slots are reused under new epochs), while the fake engine's steps may be
held at a gate (pushes land between a step's take and its end) and the test yields
to the event loop in between. Whatever the interleaving: every owner that was not
cancelled gets exactly its input back, in order, and ends (a lost wake-up hangs
and trips the guard); a cancelled owner got a prefix; afterwards no slot, mark,
parked owner or engine member is left behind and no violation was recorded.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel
import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.engine import BatchEngine, Emitted, Feed, Member
from core.pool import SessionFactory
from server.runtime import ModelSpec, Runtime, RuntimeConfig
from server.runtime.ports import SystemClock
from sim.fakes import FakeProvider, FakeScript
from tests.runtime.live_fakes import BOOM, EchoEngine

HANG_GUARD_S = 20.0  # a guard against a hang, not a verdict on speed
SLOTS = 2


class EchoProvider(FakeProvider):
    """A step takes its input, yields, then waits at the gate while it is closed."""

    def __init__(self, per_step: int) -> None:
        script = FakeScript(load_time=0.0, create_time=0.0, clone_time=0.0, close_time=0.0)
        super().__init__(SystemClock(), {"m": script})
        self.per_step = per_step
        self.echo: EchoEngine | None = None
        self.gate = anyio.Event()
        self.gate.set()

    async def engine(self, factory: SessionFactory, max_batch: int) -> BatchEngine:
        self.echo = EchoEngine(max_batch, self.per_step)
        return self.echo

    async def join(self, engine: BatchEngine, members: Sequence[Member]) -> list[Emitted]:
        await anyio.lowlevel.checkpoint()
        return engine.join(members)

    async def step(self, engine: BatchEngine, keys: Sequence[int]) -> list[Emitted]:
        out = engine.step(keys)
        await anyio.lowlevel.checkpoint()
        await self.gate.wait()
        return out

    async def leave(self, engine: BatchEngine, key: int) -> None:
        await anyio.lowlevel.checkpoint()
        engine.leave(key)

    async def close_engine(self, engine: BatchEngine) -> None:
        engine.close()


@attrs.define(eq=False)
class Owner:
    """One stream: what it pushed (or asked for), what it got, how it ended."""

    feed: Feed | None
    sent: list[Any]
    scope: anyio.CancelScope = attrs.field(factory=anyio.CancelScope)
    got: list[Any] = attrs.field(factory=list)
    ended: bool = False
    failed: bool = False
    cancelled: bool = False
    done: bool = False

    async def own(self, rt: Runtime) -> None:
        try:
            with self.scope:
                request = () if self.feed is not None else tuple(self.sent)
                async with rt.open_stream("m", request, feed=self.feed) as chunks:
                    async for chunk in chunks:
                        self.got.append(chunk)
                self.ended = True
        except RuntimeError as exc:
            assert str(exc) == BOOM
            self.failed = True
        finally:
            self.done = True
        self.cancelled = self.scope.cancelled_caught


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("open"), st.booleans(), st.integers(0, 3)),
        st.tuples(st.just("push"), st.integers(0, 7), st.sampled_from(("a", "b", BOOM))),
        st.tuples(st.just("close"), st.integers(0, 7)),
        st.tuples(st.just("cancel"), st.integers(0, 7)),
        st.tuples(st.just("hold")),
        st.tuples(st.just("gate")),
        st.tuples(st.just("settle")),
        st.tuples(st.just("yield"), st.integers(1, 4)),
    ),
    max_size=30,
)


async def until(predicate: Callable[[], bool]) -> None:
    """Wait until ``predicate()`` holds (observable state), polling the event loop."""
    with anyio.fail_after(HANG_GUARD_S):
        while not predicate():
            await anyio.sleep(0.001)


async def play(ops: list[tuple[Any, ...]], per_step: int, live_window: float) -> None:
    provider = EchoProvider(per_step)
    rt = Runtime(provider, RuntimeConfig(busy_timeout_ms=600_000))
    rt.add_model(ModelSpec("m", "fake", slots=SLOTS, batching=True))
    owners: list[Owner] = []
    async with rt, anyio.create_task_group() as tg:
        await rt.load_model("m")
        rt.drivers["m"].live_window = live_window
        serial = 0
        for op in ops:
            live = [o for o in owners if o.feed is not None and not o.feed.closed]
            if op[0] == "open":
                serial += 1
                feed = Feed() if op[1] else None
                sent = [] if op[1] else [f"r{serial}.{n}" for n in range(op[2])]
                owner = Owner(feed, sent)
                owners.append(owner)
                tg.start_soon(owner.own, rt)
            elif op[0] in ("push", "close") and live:
                owner = live[op[1] % len(live)]
                assert owner.feed is not None
                if op[0] == "close":
                    owner.feed.close()
                else:
                    serial += 1
                    piece = op[2] if op[2] == BOOM else f"{op[2]}{serial}"
                    owner.sent.append(piece)
                    owner.feed.push(piece)
            elif op[0] == "cancel" and owners:
                owners[op[1] % len(owners)].scope.cancel()
            elif op[0] == "hold":
                if provider.gate.is_set():
                    provider.gate = anyio.Event()
            elif op[0] == "gate":
                provider.gate.set()
            elif op[0] == "settle":
                with anyio.fail_after(HANG_GUARD_S):
                    await anyio.wait_all_tasks_blocked()
            elif op[0] == "yield":
                for _ in range(op[1]):
                    await anyio.lowlevel.checkpoint()
        provider.gate.set()
        for owner in owners:
            if owner.feed is not None:
                owner.feed.close()
        await until(lambda: all(o.done for o in owners))
        driver = rt.drivers["m"]
        assert driver.members == 0
        assert driver.scheduler.active_members() == 0
        assert len(driver.scheduler.free_slots()) == SLOTS
        assert len(driver._marks) <= SLOTS
        parked = driver._parked
        assert parked is None or parked._parked == [None] * SLOTS
        assert provider.echo is not None and provider.echo.feeds == {}
    assert rt.violations == []
    for owner in owners:
        check(owner)


def check(owner: Owner) -> None:
    """What an owner got, given how it ended."""
    sent, got = owner.sent, owner.got
    assert got == sent[: len(got)], (sent, got)  # in order, nothing lost before it
    if owner.cancelled:
        return
    if BOOM in sent:
        assert owner.failed and got == sent[: len(got)] and len(got) <= sent.index(BOOM)
        return
    assert owner.ended and not owner.failed and got == sent


@pytest.mark.parametrize("backend", ["trio", "asyncio"])
@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(ops=OPS, per_step=st.sampled_from((1, 2, 100)), live_window=st.sampled_from((0.0, 0.004)))
def test_random_owners_get_their_input_and_leave_nothing_behind(
    backend: str, ops: list[tuple[Any, ...]], per_step: int, live_window: float
) -> None:
    anyio.run(play, ops, per_step, live_window, backend=backend)
