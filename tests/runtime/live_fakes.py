"""A fake batched engine for the runtime's live-member tests (tests/runtime/test_batched_live.py,
tests/runtime/test_batched_stress.py, tests/runtime/test_live_window.py): it echoes its
members' input; and the provider, owners and helpers those tests drive it with."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import anyio
import anyio.abc
import attrs

from core.engine import BatchEngine, Emitted, Feed, Member
from core.pool import SessionFactory
from server.runtime import ModelSpec, Runtime, RuntimeConfig
from server.runtime.ports import SystemClock
from sim.fakes import FakeProvider, FakeScript

BOOM = "boom"
"""A piece that fails its member."""


@attrs.define(eq=False)
class EchoEngine:
    """Live members: their feed's pieces, at most ``per_step`` a step (the rest held); a
    member without a feed: its request's pieces, one in its join, then one a step. A
    "boom" piece fails its member."""

    max_batch: int
    per_step: int
    live_input: bool = True
    feeds: dict[int, Feed | None] = attrs.field(factory=dict)
    held: dict[int, list[Any]] = attrs.field(factory=dict)
    steps: list[tuple[Feed | None, ...]] = attrs.field(factory=list)  # each step's feeds

    def join(self, members: Sequence[Member]) -> list[Emitted]:
        out = []
        for m in members:
            assert m.key not in self.feeds, "joined over a member still in the engine"
            self.feeds[m.key] = m.feed
            self.held[m.key] = [] if m.feed is not None else list(m.request)
            out.append(Emitted(m.key) if m.feed is not None else self._emit(m.key, False))
        return out

    def step(self, keys: Sequence[int]) -> list[Emitted]:
        self.steps.append(tuple(self.feeds[key] for key in keys))
        out = []
        for key in keys:
            feed, closed = self.feeds[key], True
            if feed is not None:
                pieces, closed = feed.take()
                self.held[key].extend(pieces)
            out.append(self._emit(key, closed))
        return out

    def _emit(self, key: int, closed: bool) -> Emitted:
        held = self.held[key]
        now, held[:] = held[: self.per_step], held[self.per_step :]
        feed = self.feeds[key]
        if feed is not None:
            feed.hold(bool(held))
        if BOOM in now:
            return Emitted(key, tuple(now[: now.index(BOOM)]), error=RuntimeError(BOOM))
        return Emitted(key, tuple(now), done=closed and not held)

    def leave(self, key: int) -> None:
        self.feeds.pop(key, None)
        self.held.pop(key, None)

    def close(self) -> None:
        assert not self.feeds, "closed with members"


HANG_GUARD_S = 10.0  # a guard against a hang, not a verdict on speed


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
