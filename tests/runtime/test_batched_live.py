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

import anyio
import pytest

from tests.runtime.live_fakes import HANG_GUARD_S, LiveProvider, Owners, runtime, steps, until

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["trio", "asyncio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    backend: str = request.param
    return backend


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
