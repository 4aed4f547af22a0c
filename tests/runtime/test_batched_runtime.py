"""The runtime's batched path on the production event loop (asyncio, a real clock).

The simulator covers the batched path under virtual time (scenarios/batched_*.toml
and the fuzzer); these tests run the same :class:`server.runtime.Runtime` and
:class:`~server.runtime.batch_driver.BatchDriver` under asyncio, with a fake
engine whose steps wait at a gate the test opens, so every check waits on
observable state and never on timing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import anyio
import pytest

from core.batching import MAX_AHEAD
from core.engine import BatchEngine, Emitted
from core.pool import Session, SessionFactory
from server.runtime import ModelSpec, Runtime, RuntimeConfig
from server.runtime.batch_driver import COLLECTION_WINDOW_S
from server.runtime.errors import LoadError
from server.runtime.ports import SystemClock
from sim.fakes import FakeEngine, FakeProvider, FakeRunError, FakeScript

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class GatedProvider(FakeProvider):
    """Fake sessions and engine on the real clock; each batched step waits for the test."""

    def __init__(self) -> None:
        script = FakeScript(load_time=0.0, create_time=0.0, clone_time=0.0, close_time=0.0)
        script.step_time = 1.0  # a run member of duration 3.0 takes 3 steps
        super().__init__(SystemClock(), {"m": script})
        self.engines: list[FakeEngine] = []
        self.in_step = anyio.Event()
        self.gate = anyio.Event()
        self.stepped: list[tuple[int, ...]] = []

    async def engine(self, factory: Any, max_batch: int) -> BatchEngine:
        engine = await super().engine(factory, max_batch)
        assert isinstance(engine, FakeEngine)
        self.engines.append(engine)
        return engine

    async def step(self, engine: BatchEngine, keys: Sequence[int]) -> list[Emitted]:
        self.in_step.set()
        await self.gate.wait()
        self.stepped.append(tuple(keys))
        assert isinstance(engine, FakeEngine)
        return engine.step(keys)

    def open(self) -> None:
        self.gate.set()

    def close_gate(self) -> None:
        self.in_step, self.gate = anyio.Event(), anyio.Event()


HANG_GUARD_S = 10.0  # a guard against a hang, not a verdict on speed


async def until(predicate: Callable[[], bool]) -> None:
    """Wait until ``predicate()`` holds (observable state), polling the event loop."""
    with anyio.fail_after(HANG_GUARD_S):
        while not predicate():
            await anyio.sleep(0.001)


def runtime(provider: Any, slots: int = 3) -> Runtime:
    rt = Runtime(provider, RuntimeConfig(busy_timeout_ms=0))
    rt.add_model(ModelSpec("m", "fake", slots=slots, batching=True))
    return rt


async def test_members_share_steps_and_get_their_own_results() -> None:
    provider = GatedProvider()
    results: dict[str, Any] = {}
    async with runtime(provider) as rt:

        async def run(name: str, duration: float) -> None:
            results[name] = await rt.run("m", {"duration": duration})

        async with anyio.create_task_group() as tg:
            tg.start_soon(run, "long", 3.0)
            await provider.in_step.wait()  # 'long' decodes alone, held at its first step
            tg.start_soon(run, "short", 1.0)
            await until(lambda: rt.drivers["m"].scheduler.pending() != ())
            provider.open()
        assert rt.status_of("m").active_slots == 0
    assert results["long"]["batch_slot"] != results["short"]["batch_slot"]
    # 'short' joined at a step boundary and advanced in the same steps as 'long'
    assert any(len(keys) == 2 for keys in provider.stepped)
    assert len(provider.stepped) < 3 + 1  # shared steps, not one run after the other
    assert provider.engines[0].closed and provider.engines[0].members == {}


async def test_an_owner_that_leaves_mid_batch_frees_its_slot_after_the_member_left() -> None:
    provider = GatedProvider()
    provider.script("m").step_time = 0.5
    out: dict[str, Any] = {}
    async with runtime(provider, slots=2) as rt:
        leaver = anyio.CancelScope()

        async def leaving() -> None:
            with leaver:
                await rt.run("m", {"duration": 5.0})
            out["left"] = leaver.cancelled_caught

        async def staying() -> None:
            out["stayed"] = await rt.run("m", {"duration": 1.0})

        async with anyio.create_task_group() as tg:
            tg.start_soon(leaving)
            tg.start_soon(staying)
            await provider.in_step.wait()  # both members decode, held mid-step
            leaver.cancel()
            await anyio.wait_all_tasks_blocked()
            # the leaver's lease is still held: its member is in the engine, mid-step
            assert "left" not in out
            assert rt.status_of("m").active_slots == 2
            provider.open()
        assert out["left"] is True
        assert out["stayed"]["revision"] == "m"
        assert rt.status_of("m").active_slots == 0
        assert provider.engines[0].members == {}
        again = await rt.run("m", {"duration": 0.5})  # the freed slot serves a later request
        assert again["revision"] == "m"
    assert provider.premature == []


async def test_a_failing_member_never_disturbs_the_others() -> None:
    provider = GatedProvider()
    provider.open()
    async with runtime(provider) as rt:
        out: dict[str, Any] = {}

        async def run(name: str, request: dict[str, Any]) -> None:
            try:
                out[name] = await rt.run("m", request)
            except FakeRunError as exc:
                out[name] = exc

        async with anyio.create_task_group() as tg:
            tg.start_soon(run, "bad_join", {"fail": True})
            tg.start_soon(run, "bad_step", {"duration": 3.0, "fail_step": 2})
            tg.start_soon(run, "good", {"duration": 3.0})
    assert isinstance(out["bad_join"], FakeRunError)
    assert str(out["bad_step"]) == "injected step failure"
    assert out["good"]["revision"] == "m"
    assert provider.premature == []


async def test_streams_are_members_too() -> None:
    provider = GatedProvider()
    provider.open()
    async with runtime(provider) as rt, rt.open_stream("m", {"chunks": 3}) as chunks:
        got = [chunk async for chunk in chunks]
    assert [c["chunk"] for c in got] == [0, 1, 2]


async def test_a_member_whose_owner_stops_reading_waits_for_it() -> None:
    """A stream whose owner reads its first chunk and then nothing more decodes at most
    MAX_AHEAD more engine calls past its oldest unread chunk and then none, while another
    member goes on alone; once the owner reads, it decodes to its end, every chunk in
    order."""
    provider = GatedProvider()
    provider.open()
    async with runtime(provider) as rt, rt.open_stream("m", {"chunks": 20}) as chunks:
        driver = rt.drivers["m"]
        reader = chunks.__aiter__()
        assert (await reader.__anext__())["chunk"] == 0
        await until(lambda: driver.held_members == 1)
        await anyio.wait_all_tasks_blocked()
        stepped = len(provider.stepped)
        assert stepped <= 2 + MAX_AHEAD  # its first step, one more, then MAX_AHEAD at most
        other = await rt.run("m", {"duration": 2.0})  # steps alone meanwhile
        assert all(keys == (other["batch_slot"],) for keys in provider.stepped[stepped:])
        assert driver.held_members == 1 and len(provider.stepped) == stepped + 2
        with anyio.fail_after(HANG_GUARD_S):  # a lost wake-up would hang here
            rest = [chunk["chunk"] async for chunk in reader]
    assert rest == list(range(1, 20))
    assert driver.held_members == 0


async def test_unload_stops_the_decode_task_and_closes_the_engine() -> None:
    provider = GatedProvider()
    provider.open()
    async with runtime(provider) as rt:
        await rt.run("m", {"duration": 1.0})
        assert "m" in rt.drivers
        await rt.unload("m")
        assert "m" not in rt.drivers
        assert provider.engines[0].closed
        await rt.run("m", {"duration": 1.0})  # a reload gets a fresh engine
        assert len(provider.engines) == 2


class SessionsOnly:
    """A provider without the batching methods (the runtime must refuse to batch on it)."""

    def __init__(self, inner: FakeProvider) -> None:
        self.inner = inner

    async def load(self, spec: ModelSpec) -> SessionFactory:
        return await self.inner.load(spec)

    async def release(self, spec: ModelSpec, factory: SessionFactory) -> None:
        await self.inner.release(spec, factory)

    async def create(self, factory: SessionFactory) -> Session:
        return await self.inner.create(factory)

    async def clone(self, factory: SessionFactory, primary: Session) -> Session:
        return await self.inner.clone(factory, primary)

    async def close(self, session: Session) -> None:
        await self.inner.close(session)

    async def run(self, session: Session, request: Any) -> Any:
        return await self.inner.run(session, request)

    def stream(self, session: Session, request: Any) -> AsyncIterator[Any]:
        return self.inner.stream(session, request)

    async def batch(self, session: Session, requests: Sequence[Any]) -> list[Any]:
        return await self.inner.batch(session, requests)

    async def reset(self, session: Session) -> None:
        await self.inner.reset(session)


async def test_a_provider_that_cannot_batch_fails_the_load_cleanly() -> None:
    inner = FakeProvider(SystemClock(), {"m": FakeScript(load_time=0.0)})
    async with runtime(SessionsOnly(inner)) as rt:
        with pytest.raises(LoadError, match="cannot batch"):
            await rt.run("m", {"duration": 1.0})
        assert rt.status_of("m").active_slots == 0
    assert inner.live_sessions.get("m", 0) == 0
    assert inner.live_weights.get("m", 0) == 0


class NoWindowEngine(FakeEngine):
    """A fake engine that declares no collection window (as Silero VAD's does)."""

    @property
    def collection_window(self) -> float:
        return 0.0


class NoWindowProvider(FakeProvider):
    def __init__(self) -> None:
        super().__init__(SystemClock(), {"m": FakeScript(load_time=0.0, create_time=0.0)})

    async def engine(self, factory: Any, max_batch: int) -> BatchEngine:
        fake = await super().engine(factory, max_batch)
        assert isinstance(fake, FakeEngine)
        return NoWindowEngine(
            fake.model, fake.script, fake.weights, max_batch, fake.problem, fake.ran_ahead
        )


async def test_an_engine_may_declare_its_own_collection_window() -> None:
    """The scheduler waits the engine's window for simultaneous arrivals (none: a request
    alone starts at once); an engine that declares none gets the runtime's default."""
    for provider, window in (
        (NoWindowProvider(), 0.0),
        (FakeProvider(SystemClock(), {"m": FakeScript()}), COLLECTION_WINDOW_S),
    ):
        async with runtime(provider) as rt:
            assert (await rt.run("m", {"duration": 0.0}))["batch_slot"] == 0
            assert rt.drivers["m"].scheduler.window == window
