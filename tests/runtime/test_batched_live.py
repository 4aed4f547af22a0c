"""Live members through the batched runtime, on trio and on asyncio: who steps, and when.

A fake engine that takes live input (:class:`LiveEngine`) echoes each piece its
members' feeds hand it; a step may be held at a gate the test opens. The driver
looks only at the members a push marked (and the joiners); these tests check
that this never loses input: a member steps when it has input and only then, a
push that lands during a step (after the engine took the feed) is stepped next,
input the engine holds is stepped without a new push, and an owner parked with
nothing to read can leave at any time. Every check waits on observable state.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import anyio
import anyio.abc
import pytest

from core.engine import BatchEngine, Emitted, Feed, Member
from core.pool import SessionFactory
from server.runtime import ModelSpec, Runtime, RuntimeConfig
from server.runtime.ports import SystemClock
from sim.fakes import FakeProvider, FakeScript
from tests.runtime.live_fakes import EchoEngine

pytestmark = pytest.mark.anyio

HANG_GUARD_S = 10.0  # a guard against a hang, not a verdict on speed


@pytest.fixture(params=["trio", "asyncio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    backend: str = request.param
    return backend


class LiveProvider(FakeProvider):
    """Fake sessions, an :class:`~tests.runtime.live_fakes.EchoEngine`; a step takes its
    input, then waits at the gate while closed (so a push can land after the take, before
    the step ends)."""

    def __init__(self, per_step: int = 1_000) -> None:
        script = FakeScript(load_time=0.0, create_time=0.0, clone_time=0.0, close_time=0.0)
        super().__init__(SystemClock(), {"m": script})
        self.per_step = per_step
        self.live: EchoEngine | None = None
        self.gate = anyio.Event()
        self.gate.set()
        self.in_step = anyio.Event()

    async def engine(self, factory: SessionFactory, max_batch: int) -> BatchEngine:
        self.live = EchoEngine(max_batch, self.per_step)
        return self.live

    async def join(self, engine: BatchEngine, members: Sequence[Member]) -> list[Emitted]:
        return engine.join(members)

    async def step(self, engine: BatchEngine, keys: Sequence[int]) -> list[Emitted]:
        out = engine.step(keys)
        self.in_step.set()
        await self.gate.wait()
        return out

    async def leave(self, engine: BatchEngine, key: int) -> None:
        engine.leave(key)

    async def close_engine(self, engine: BatchEngine) -> None:
        engine.close()

    def hold_steps(self) -> None:
        self.gate, self.in_step = anyio.Event(), anyio.Event()


async def until(predicate: Callable[[], bool]) -> None:
    """Wait until ``predicate()`` holds (observable state), polling the event loop."""
    with anyio.fail_after(HANG_GUARD_S):
        while not predicate():
            await anyio.sleep(0.001)


class Owners:
    """Live streams on model ``m``: each owner reads its chunks into ``got``."""

    @classmethod
    async def open(cls, rt: Runtime, tg: anyio.abc.TaskGroup, count: int) -> Owners:
        """Load the model, then open ``count`` streams."""
        await rt.load_model("m")
        return cls(rt, tg, count)

    def __init__(self, rt: Runtime, tg: anyio.abc.TaskGroup, count: int) -> None:
        self.feeds = [Feed() for _ in range(count)]
        self.got: list[list[Any]] = [[] for _ in range(count)]
        self.ended = [False] * count
        self.scopes = [anyio.CancelScope() for _ in range(count)]
        for i in range(count):
            tg.start_soon(self._own, rt, i)

    async def _own(self, rt: Runtime, i: int) -> None:
        with self.scopes[i]:
            async with rt.open_stream("m", {}, feed=self.feeds[i]) as chunks:
                async for chunk in chunks:
                    self.got[i].append(chunk)
            self.ended[i] = True


def runtime(provider: LiveProvider, slots: int = 3) -> Runtime:
    rt = Runtime(provider, RuntimeConfig(busy_timeout_ms=0))
    rt.add_model(ModelSpec("m", "fake", slots=slots, batching=True))
    return rt


def steps(provider: LiveProvider, owners: Owners) -> list[tuple[int, ...]]:
    """Each step's members, as owner numbers (an owner's slot is whichever it launched into)."""
    assert provider.live is not None
    return [tuple(sorted(owners.feeds.index(f) for f in step)) for step in provider.live.steps]


async def test_a_member_steps_when_it_has_input_and_only_then() -> None:
    provider = LiveProvider()
    async with runtime(provider) as rt, anyio.create_task_group() as tg:
        owners = await Owners.open(rt, tg, 3)
        await until(lambda: rt.drivers["m"].members == 3)
        driver = rt.drivers["m"]
        driver.live_window = 0.0  # step at once: what is checked here is who steps
        await until(lambda: driver.scheduler.active_members() == 3)
        await anyio.wait_all_tasks_blocked()
        assert steps(provider, owners) == []  # nobody has input: no step at all
        owners.feeds[1].push("b1")
        await until(lambda: owners.got[1] == ["b1"])
        assert steps(provider, owners) == [(1,)]
        owners.feeds[2].push("c1")
        owners.feeds[0].push("a1")
        await until(lambda: owners.got[0] == ["a1"] and owners.got[2] == ["c1"])
        assert steps(provider, owners) == [(1,), (0, 2)]
        await anyio.wait_all_tasks_blocked()
        assert len(steps(provider, owners)) == 2  # no empty steps once the input is taken
        for feed in owners.feeds:
            feed.close()
        await until(lambda: all(owners.ended))
    assert owners.got == [["a1"], ["b1"], ["c1"]]
    assert rt.status_of("m").active_slots == 0


async def test_a_push_during_a_step_is_stepped_next() -> None:
    provider = LiveProvider()
    async with runtime(provider) as rt, anyio.create_task_group() as tg:
        owners = await Owners.open(rt, tg, 2)
        await until(lambda: rt.drivers["m"].scheduler.active_members() == 2)
        rt.drivers["m"].live_window = 0.0
        provider.hold_steps()
        owners.feeds[0].push("a1")
        await provider.in_step.wait()  # the engine took a1; the step is not over
        owners.feeds[0].push("a2")
        provider.gate.set()
        await until(lambda: owners.got[0] == ["a1", "a2"])
        assert steps(provider, owners) == [(0,), (0,)]
        for feed in owners.feeds:
            feed.close()
        await until(lambda: all(owners.ended))


async def test_input_the_engine_holds_is_stepped_without_a_push() -> None:
    provider = LiveProvider(per_step=1)
    async with runtime(provider) as rt, anyio.create_task_group() as tg:
        owners = await Owners.open(rt, tg, 1)
        await until(lambda: rt.drivers["m"].scheduler.active_members() == 1)
        for piece in ("a1", "a2", "a3"):
            owners.feeds[0].push(piece)
        owners.feeds[0].close()
        await until(lambda: owners.ended[0])
        assert owners.got[0] == ["a1", "a2", "a3"]
        assert steps(provider, owners) == [(0,), (0,), (0,)]


async def test_an_owner_parked_with_nothing_to_read_leaves_and_frees_its_slot() -> None:
    provider = LiveProvider()
    async with runtime(provider, slots=2) as rt, anyio.create_task_group() as tg:
        owners = await Owners.open(rt, tg, 2)
        await until(lambda: rt.drivers["m"].scheduler.active_members() == 2)
        await anyio.wait_all_tasks_blocked()  # both owners parked on their slots
        owners.scopes[0].cancel()
        await until(lambda: rt.drivers["m"].members == 1)
        assert owners.feeds[0].on_push is None  # a late push cannot mark the slot's next owner
        owners.feeds[1].push("b1")  # the other one still gets its input
        await until(lambda: owners.got[1] == ["b1"])
        assert owners.got[0] == [] and not owners.ended[0]
        owners.feeds[1].close()
        await until(lambda: owners.ended[1])
    assert rt.status_of("m").active_slots == 0
    assert provider.live is not None and provider.live.feeds == {}


async def test_a_second_owner_waiting_on_one_slot_is_refused() -> None:
    """One owner per slot (what makes trio's shared abort per slot safe): a second waiter on
    the same slot is a runtime bug, refused at once; the first still wakes, another slot's
    waiter is unaffected."""
    from core.batching import SlotHandle
    from server.runtime.batch_driver import _parking

    parking = _parking(2)
    woken: list[int] = []

    async def owner(slot: int) -> None:
        await parking.wait(slot)
        woken.append(slot)

    with anyio.fail_after(HANG_GUARD_S):
        async with anyio.create_task_group() as tg:
            tg.start_soon(owner, 0)
            tg.start_soon(owner, 1)
            await anyio.wait_all_tasks_blocked()
            with pytest.raises(RuntimeError, match="already waiting"):
                await parking.wait(0)
            parking.wake([SlotHandle(0, 0), SlotHandle(1, 0)])
    assert sorted(woken) == [0, 1]
