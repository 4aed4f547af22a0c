"""What the gate watches.

A provider that can fail or corrupt on cue, memory, leases, check records.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import time
from collections.abc import Sequence
from typing import Any

import anyio
import attrs

from core.engine import BatchEngine, Emitted, Member
from server.runtime import ModelProvider, ModelSpec, Runtime
from server.runtime.ports import BatchingProvider
from server.validation.plans import FAIL, NOT_APPLICABLE, PASS, PENDING


# --------------------------------------------------------------- provider
class GateProvider:
    """The production provider with failure injection (next load, next primary, next batched
    engine) and a load hold; for a ``batching`` model it also drives the batched engine and
    counts what its joins and steps carried (:attr:`steps`, :attr:`widest_step`: the most
    members one join or step took; an engine may advance its members in their join, as
    silero_vad's does with no live member)."""

    def __init__(self, inner: ModelProvider) -> None:
        self.inner = inner
        self.fail_next_load = False
        self.fail_next_create = False
        self.fail_next_engine = False
        self.engines = 0
        self.steps = 0
        self.widest_step = 0
        self.hold_load: anyio.Event | None = None
        self.load_started = anyio.Event()
        self.loads = 0
        self.sessions: list[Any] = []  # every session built, in build order (primary first)

    async def load(self, spec: ModelSpec) -> Any:
        self.loads += 1
        self.load_started.set()
        if self.hold_load is not None:
            hold, self.hold_load = self.hold_load, None
            await hold.wait()
        if self.fail_next_load:
            self.fail_next_load = False
            raise RuntimeError("injected weight-load failure")
        return await self.inner.load(spec)

    async def release(self, spec: ModelSpec, factory: Any) -> None:
        await self.inner.release(spec, factory)

    async def create(self, factory: Any) -> Any:
        if self.fail_next_create:
            self.fail_next_create = False
            raise RuntimeError("injected primary-session failure")
        session = await self.inner.create(factory)
        self.sessions.append(session)
        return session

    async def clone(self, factory: Any, primary: Any) -> Any:
        session = await self.inner.clone(factory, primary)
        self.sessions.append(session)
        return session

    async def close(self, session: Any) -> None:
        await self.inner.close(session)

    async def run(self, session: Any, request: Any) -> Any:
        return await self.inner.run(session, request)

    def stream(self, session: Any, request: Any) -> Any:
        return self.inner.stream(session, request)

    async def batch(self, session: Any, requests: Sequence[Any]) -> list[Any]:
        return await self.inner.batch(session, requests)

    async def reset(self, session: Any) -> None:
        await self.inner.reset(session)

    # ---- batching (models registered with ``batching``)
    def _batching(self) -> BatchingProvider:
        if not isinstance(self.inner, BatchingProvider):
            raise ValueError("the gate's inner provider cannot batch")
        return self.inner

    async def engine(self, factory: Any, max_batch: int) -> BatchEngine:
        if self.fail_next_engine:
            self.fail_next_engine = False
            raise RuntimeError("injected batched-engine failure")
        engine = await self._batching().engine(factory, max_batch)
        self.engines += 1
        return engine

    async def join(self, engine: BatchEngine, members: Sequence[Member]) -> list[Emitted]:
        self.steps += 1
        self.widest_step = max(self.widest_step, len(members))
        return await self._batching().join(engine, members)

    async def step(self, engine: BatchEngine, keys: Sequence[int]) -> list[Emitted]:
        self.steps += 1
        self.widest_step = max(self.widest_step, len(keys))
        return await self._batching().step(engine, keys)

    async def leave(self, engine: BatchEngine, key: int) -> None:
        await self._batching().leave(engine, key)

    async def close_engine(self, engine: BatchEngine) -> None:
        await self._batching().close_engine(engine)


# --------------------------------------------------------------- observers
def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def settled_rss() -> int:
    """RSS after collecting garbage and returning free heap pages (glibc).

    So retained memory shows.
    """
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    return rss_bytes()


@attrs.define
class Monitor:
    """Polls leases (every 2 ms) and RSS (every 20 ms) of the models under test, per phase."""

    runtime: Runtime | None = None
    models: tuple[str, ...] = ()
    phase: str = "idle"
    active: dict[str, int] = attrs.field(factory=dict)  # phase -> max active leases seen
    active_ready: dict[str, int] = attrs.field(factory=dict)  # ... while the model was loaded
    rss: list[tuple[float, str, int]] = attrs.field(factory=list)
    t0: float = attrs.field(factory=time.perf_counter)

    async def poll(self) -> None:
        last_rss = 0.0
        while True:
            rt = self.runtime
            if rt is not None:
                for model in self.models:
                    row = rt.status_of(model)
                    self.active[self.phase] = max(self.active.get(self.phase, 0), row.active_slots)
                    if row.loaded:
                        self.active_ready[self.phase] = max(
                            self.active_ready.get(self.phase, 0), row.active_slots
                        )
            now = time.perf_counter()
            if now - last_rss >= 0.02:
                self.rss.append((round(now - self.t0, 4), self.phase, rss_bytes()))
                last_rss = now
            await anyio.sleep(0.002)

    def peak(self, prefix: str) -> int:
        return max((r for _, p, r in self.rss if p.startswith(prefix)), default=0)


@attrs.define
class Check:
    """One M entry while it is being collected: failures make it FAIL, gaps keep it PENDING."""

    id: str
    title: str
    failures: list[str] = attrs.field(factory=list)
    gaps: list[str] = attrs.field(factory=list)
    evidence: dict[str, Any] = attrs.field(factory=dict)
    applicability: str = "applicable"
    limitations: list[str] = attrs.field(factory=list)

    def expect(self, ok: bool, failure: str) -> None:
        if not ok:
            self.failures.append(failure)

    def status(self) -> str:
        if self.applicability != "applicable":
            return NOT_APPLICABLE
        return FAIL if self.failures else PENDING if self.gaps else PASS
