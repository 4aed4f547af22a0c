"""The model gate M1-M6: serial references, fresh starts, waves, recovery, memory, modes.

No verdict depends on how fast the machine is. A verdict about concurrency
(every slot busy at once) is read from the runtime's counters at a moment
when that is provably the case: the wave's session calls wait at a
:class:`Rendezvous` until all of them are in flight, and the counters are read
then. A model registered with ``batching`` makes no session calls: its one
decode task joins and steps the members, so the rendezvous holds the wave's
first engine join instead, until every member of the wave has launched into
the batch (each holding its lease and batch slot). A verdict about a queued
manager waits until the counters show it.
Timeouts are hang guards only: when one expires, the verdict is read from
the state reached (and so fails). Wall-clock times are performance evidence,
never a verdict.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from typing import Any

import anyio
import attrs

from core.engine import BatchEngine, Emitted, Feed, Member
from core.policy import RuntimeKind
from server.families import registry
from server.provider import make_backend
from server.runtime import ModelSpec, Runtime, RuntimeConfig
from server.runtime.errors import LoadError
from server.validation.plans import GROWTH_TOLERANCE_BYTES, MIN_STARTS, MIN_WAVES, Case, plan
from server.validation.probes import Check, GateProvider, Monitor, settled_rss

HANG_GUARD_S = 300.0
"""The longest wait for a state the runtime must reach. Only a guard against a hang: reaching the
state decides a verdict, never the time it took."""


async def settle(predicate: Callable[[], bool], poll_s: float = 0.001) -> bool:
    """Wait until ``predicate()`` holds; False only if the hang guard expired first."""
    with anyio.move_on_after(HANG_GUARD_S):
        while not predicate():
            await anyio.sleep(poll_s)
        return True
    return False


@attrs.define(eq=False)
class Rendezvous:
    """Holds each session call of a wave until ``expected`` calls are in flight, then lets them go.

    A call in flight holds a lease, so when the last one arrives every slot is
    provably busy: ``on_full`` runs then (it reads the runtime's counters). A
    wave member that ends without arriving (it failed before its session call)
    lowers the count to wait for. Disarmed, calls pass straight through. A
    runtime that never admits ``expected`` calls at once is released by the
    hang guard, and the counters it showed are the verdict.
    """

    expected: int = 0
    arrived: int = 0
    ended: int = 0
    full: anyio.Event | None = None
    on_full: Callable[[], None] | None = None
    launched: Callable[[], int] | None = None

    def arm(
        self,
        expected: int,
        on_full: Callable[[], None],
        launched: Callable[[], int] | None = None,
    ) -> None:
        """Hold the next ``expected`` calls; ``launched`` counts a batched model's launched
        members (the batched wave's count, see :meth:`gather`)."""
        self.expected, self.arrived, self.ended = expected, 0, 0
        self.full, self.on_full, self.launched = anyio.Event(), on_full, launched

    def disarm(self) -> None:
        self.expected = 0
        if self.full is not None:
            self.full.set()

    def _holding(self) -> anyio.Event | None:
        full = self.full
        return None if self.expected == 0 or full is None or full.is_set() else full

    async def arrive(self) -> None:
        full = self._holding()
        if full is None:
            return
        self.arrived += 1
        if self.arrived == self.expected:
            if self.on_full is not None:
                self.on_full()
            full.set()
            return
        if self.arrived + self.ended >= self.expected:
            full.set()
            return
        with anyio.move_on_after(HANG_GUARD_S):
            await full.wait()
        full.set()  # after the guard, the others go too

    async def gather(self, joining: int) -> None:
        """Hold a batched engine's join until every member of the wave has launched.

        The one decode task waits here, but owners launch without it (a launch
        takes the lease's batch slot and waits to join), so when ``launched()``
        reaches ``expected`` every member holds its lease at once: ``on_full``
        runs then. Members that ended without launching lower the count; only
        the first join of a wave is held (the members that launched meanwhile
        join at the next step boundary). Disarmed, joins pass straight through.
        """
        full, launched = self._holding(), self.launched
        if full is None or launched is None:
            return
        self.arrived += joining
        with anyio.move_on_after(HANG_GUARD_S):
            while not full.is_set():
                if launched() >= self.expected:
                    if self.on_full is not None:
                        self.on_full()
                    break
                if launched() + self.ended >= self.expected:
                    break
                await anyio.sleep(0.001)
        full.set()  # after the guard, the others go too

    def left(self) -> None:
        """A wave member ended.

        One that never arrived (held ones cannot end) is no longer awaited.
        """
        full = self._holding()
        if full is None:
            return
        self.ended += 1
        if self.arrived + self.ended >= self.expected:
            full.set()


class RendezvousProvider:
    """The gate's provider as the runtime sees it: a session call passes the rendezvous first,
    and so does a batched engine's join (:meth:`Rendezvous.gather`)."""

    def __init__(self, inner: GateProvider, rendezvous: Rendezvous) -> None:
        self.inner = inner
        self.rendezvous = rendezvous

    async def load(self, spec: ModelSpec) -> Any:
        return await self.inner.load(spec)

    async def release(self, spec: ModelSpec, factory: Any) -> None:
        await self.inner.release(spec, factory)

    async def create(self, factory: Any) -> Any:
        return await self.inner.create(factory)

    async def clone(self, factory: Any, primary: Any) -> Any:
        return await self.inner.clone(factory, primary)

    async def close(self, session: Any) -> None:
        await self.inner.close(session)

    async def run(self, session: Any, request: Any) -> Any:
        await self.rendezvous.arrive()
        return await self.inner.run(session, request)

    async def stream(self, session: Any, request: Any) -> AsyncIterator[Any]:
        await self.rendezvous.arrive()  # before the first chunk: every stream of the wave is open
        chunks = self.inner.stream(session, request)
        try:
            async for chunk in chunks:
                yield chunk
        finally:
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                await aclose()

    async def batch(self, session: Any, requests: Sequence[Any]) -> list[Any]:
        return await self.inner.batch(session, requests)

    async def reset(self, session: Any) -> None:
        await self.inner.reset(session)

    async def engine(self, factory: Any, max_batch: int) -> BatchEngine:
        return await self.inner.engine(factory, max_batch)

    async def join(self, engine: BatchEngine, members: Sequence[Member]) -> list[Emitted]:
        await self.rendezvous.gather(len(members))
        return await self.inner.join(engine, members)

    async def step(self, engine: BatchEngine, keys: Sequence[int]) -> list[Emitted]:
        return await self.inner.step(engine, keys)

    async def leave(self, engine: BatchEngine, key: int) -> None:
        await self.inner.leave(engine, key)

    async def close_engine(self, engine: BatchEngine) -> None:
        await self.inner.close_engine(engine)


# --------------------------------------------------------------- the gate
@attrs.define
class Gate:
    """One gate run: a family at one slot count, its sessions or (``batching``) its batched
    engine with the slots as the batch capacity.

    References (``cold``, ``warm``, ``stream_ref``: fingerprints, with the results they were
    taken from) come from one slot; the references of streams from an unbatched session.
    Outputs must match them exactly; with ``batching``, an output that differs may still
    pass within the family's declared batched tolerance (``plan.batched_tolerance``) of
    the unbatched session's output (``upstream_results``: never of the batch of one, which
    M1 admits within that tolerance itself), and the checks count those (``tolerated``).
    """

    family: str
    slots: int
    starts: int
    waves: int
    make_provider: Callable[[], GateProvider]
    batching: bool = False
    plan: Any = None
    cases: list[Case] = attrs.field(factory=list)
    monitor: Monitor = attrs.field(factory=Monitor)
    cold: list[str] = attrs.field(factory=list)
    warm: list[str] = attrs.field(factory=list)
    cold_results: list[Any] = attrs.field(factory=list)
    upstream_results: list[Any] = attrs.field(factory=list)
    """Each case's output from the family's session called directly (M1's "upstream")."""
    warm_results: list[Any] = attrs.field(factory=list)
    stream_ref: list[str] = attrs.field(factory=list)
    stream_results: list[list[Any]] = attrs.field(factory=list)
    tolerated: dict[str, int] = attrs.field(factory=dict)
    stream_chunks: dict[str, int] = attrs.field(factory=dict)
    rendezvous: Rendezvous = attrs.field(factory=Rendezvous)
    perf: dict[str, list[float]] = attrs.field(factory=dict)
    checks: dict[str, Check] = attrs.field(factory=dict)
    load_options: Mapping[str, Any] = attrs.field(factory=dict)
    """The model's ``load_options`` (every model the gate registers, and its plan, gets them)."""

    @property
    def model_id(self) -> str:
        return f"validate-{self.family}"

    def spec(
        self, slots: int, mode: str = "offline", suffix: str = "", *, batching: bool | None = None
    ) -> ModelSpec:
        """The model under test (batched as the gate is, unless ``batching`` says otherwise)."""
        return ModelSpec(
            self.model_id + suffix,
            self.family,
            task=registry.family(self.family).task,
            mode=mode,
            slots=slots,
            batching=self.batching if batching is None else batching,
            load_options=dict(self.load_options),
        )

    def check(self, cid: str) -> Check:
        return self.checks[cid]

    # ---- requests and waves
    async def one(self, rt: Runtime, request: Any, model: str | None = None) -> Any:
        return await rt.run(model or self.model_id, request)

    async def attempt(self, rt: Runtime, request: Any) -> Any:
        """One request's result, or the exception it raised (so a failure becomes a verdict,
        not the end of the gate)."""
        try:
            return await self.one(rt, request)
        except Exception as exc:
            return exc

    async def wave(
        self, rt: Runtime, idx: Sequence[int], extra: Sequence[Any] = (), *, together: bool = False
    ) -> tuple[list[Any], float]:
        """Submit every request at once (in ``idx`` order, then ``extra``); results or exceptions.

        ``together``: no session call starts until all of them are in flight, and the counters
        are read at that moment (:meth:`observe`), so the wave's concurrency is seen for sure.
        """
        requests = [self.cases[i].request for i in idx] + list(extra)
        out: list[Any] = [None] * len(requests)

        async def go(k: int) -> None:
            try:
                out[k] = await self.one(rt, requests[k])
            except Exception as exc:
                out[k] = exc
            finally:
                self.rendezvous.left()

        if together:
            self.rendezvous.arm(len(requests), self.observe, self.launched)
        t = time.perf_counter()
        try:
            async with anyio.create_task_group() as tg:
                for k in range(len(requests)):
                    tg.start_soon(go, k)
        finally:
            self.rendezvous.disarm()
        return out, time.perf_counter() - t

    def launched(self) -> int:
        """The watched batched models' launched members (0 for unbatched models)."""
        rt = self.monitor.runtime
        if rt is None:
            return 0
        drivers = rt.drivers
        return sum(drivers[m].members for m in self.monitor.models if m in drivers)

    def observe(self) -> None:
        """Read the watched models' counters now into the monitor's maxima for the current phase."""
        rt, phase = self.monitor.runtime, self.monitor.phase
        if rt is None:
            return
        for model in self.monitor.models:
            row = rt.status_of(model)
            self.monitor.active[phase] = max(self.monitor.active.get(phase, 0), row.active_slots)
            if row.loaded:
                ready = self.monitor.active_ready.get(phase, 0)
                self.monitor.active_ready[phase] = max(ready, row.active_slots)

    def compare(
        self, c: Check, label: str, idx: Sequence[int], got: Sequence[Any], refs: Sequence[Any]
    ) -> int:
        """Each output (a result, or the exception its request raised) against its serial
        reference result: exact, or with ``batching`` within the family's declared batched
        tolerance (counted) of the unbatched session's output (the batch of one may itself be
        within the tolerance of it: two tolerances in a row would admit twice the declared
        one); the number compared."""
        unbatched = self.upstream_results or refs
        for i, g in zip(idx, got, strict=False):
            if isinstance(g, Exception):
                c.failures.append(f"{label}: {self.cases[i].name} raised {type(g).__name__}: {g}")
                continue
            exact = self.plan.fingerprint(g) == self.plan.fingerprint(refs[i])
            if not self.same(c, exact, g, unbatched[i], self.plan.batched_equal):
                c.failures.append(
                    f"{label}: {self.cases[i].name} differs from its single-slot reference"
                )
        return len(idx)

    def same(
        self, c: Check, exact: bool, got: Any, ref: Any, close: Callable[[Any, Any], bool]
    ) -> bool:
        """Exactly equal, or (batched only) equal within the declared tolerance, counted in
        ``tolerated``."""
        if exact:
            return True
        if self.batching and close(got, ref):
            self.tolerated[c.id] = self.tolerated.get(c.id, 0) + 1
            return True
        return False

    def drained(self, c: Check, rt: Runtime, label: str) -> None:
        for row in rt.status():
            c.expect(
                row.active_slots == 0 and row.queued_requests == 0 and row.queued_management == 0,
                f"{label}: counters not drained on {row.id} ({row.active_slots} active, "
                f"{row.queued_requests} queued, {row.queued_management} managers)",
            )
        c.expect(not rt.in_use, f"{label}: slots still in use {sorted(rt.in_use)}")
        c.expect(not rt.violations, f"{label}: runtime violations {rt.violations}")

    def pick(self, n: int, rotate: int = 0) -> list[int]:
        return [(rotate + k) % len(self.cases) for k in range(n)]

    def fresh(
        self, slots: int, kind: RuntimeKind = RuntimeKind.PARALLEL
    ) -> tuple[GateProvider, Runtime]:
        """A fresh provider and runtime with the model under test (the original runtime's is
        never batched: it is the unflagged reference)."""
        provider = self.make_provider()
        held = RendezvousProvider(provider, self.rendezvous)
        rt = Runtime(held, RuntimeConfig(busy_timeout_ms=600_000, kind=kind))
        rt.add_model(self.spec(slots, batching=self.batching and kind is RuntimeKind.PARALLEL))
        return provider, rt

    def watch(self, rt: Runtime | None, *models: str) -> None:
        self.monitor.runtime, self.monitor.models = rt, models or (self.model_id,)

    # ---- M1
    async def serial_references(self) -> None:
        c = self.check("M1")
        entry = registry.family(self.family)
        module = importlib.import_module(entry.backend)
        options = entry.load_kwargs("offline", options=self.load_options)

        def direct() -> list[Any]:
            session = module.load_factory(make_backend("numpy", "cpu"), **options).create()
            return [session.run(case.request) for case in self.cases]

        upstream_results = self.upstream_results = await anyio.to_thread.run_sync(direct)
        upstream = [self.plan.fingerprint(r) for r in upstream_results]
        n_idx = self.pick(self.slots)
        _, rt = self.fresh(1, RuntimeKind.ORIGINAL)
        async with rt:
            legacy = [
                self.plan.fingerprint(await self.one(rt, case.request)) for case in self.cases
            ]
            self.perf["original_one"], self.perf["original_serial_n"] = await self.serial_timings(
                rt, n_idx
            )
        _, rt = self.fresh(1)
        self.watch(rt)
        async with rt:
            repeat = []
            for case in self.cases:
                await rt.unload(self.model_id)
                self.cold_results.append(await self.one(rt, case.request))
                self.warm_results.append(await self.one(rt, case.request))
                self.cold.append(self.plan.fingerprint(self.cold_results[-1]))
                self.warm.append(self.plan.fingerprint(self.warm_results[-1]))
                repeat.append(self.plan.fingerprint(await self.one(rt, case.request)))
            self.perf["candidate_one"], self.perf["candidate_serial_n"] = await self.serial_timings(
                rt, n_idx
            )
            self.drained(c, rt, "M1 single-slot")
        self.stream_ref = await self.stream_references(c)
        batched = " batched" if self.batching else ""
        for i, case in enumerate(self.cases):
            ours = {
                f"parallel x1{batched} cold": self.cold[i],
                f"parallel x1{batched} warm": self.warm[i],
                f"parallel x1{batched} repeated warm": repeat[i],
            }
            unbatched = {"upstream (direct session)": upstream[i], "original runtime": legacy[i]}
            variants = {**unbatched, **ours}
            if len(set(variants.values())) == 1:
                continue
            # batched: the single-slot outputs identical among themselves, the unbatched ones
            # too, and the former within the declared batched tolerance of the latter
            tolerated = (
                len(set(ours.values())) == 1
                and len(set(unbatched.values())) == 1
                and self.same(
                    c, False, self.cold_results[i], upstream_results[i], self.plan.batched_equal
                )
            )
            c.expect(tolerated, f"{case.name}: serial outputs vary ({variants}); parity unverified")
        c.evidence.update(
            references={
                case.name: {"cold": self.cold[i], "warm": self.warm[i], "input": case.meta}
                for i, case in enumerate(self.cases)
            },
            stream_references={
                s.name: {"sha256": ref, "chunks": self.stream_chunks[s.name]}
                for s, ref in zip(self.plan.stream_cases(), self.stream_ref, strict=True)
            },
            compared=(
                "upstream direct session, original runtime (unflagged), "
                f"parallel runtime at 1 slot{batched}: cold, warm, repeated warm"
            ),
        )

    async def serial_timings(
        self, rt: Runtime, idx: Sequence[int]
    ) -> tuple[list[float], list[float]]:
        one, serial = [], []
        for _ in range(3):
            t = time.perf_counter()
            await self.one(rt, self.cases[idx[0]].request)
            one.append(time.perf_counter() - t)
            t = time.perf_counter()
            for i in idx:
                await self.one(rt, self.cases[i].request)
            serial.append(time.perf_counter() - t)
        return one, serial

    async def stream_references(self, c: Check) -> list[str]:
        provider = self.make_provider()
        rt = Runtime(provider, RuntimeConfig(busy_timeout_ms=600_000))
        rt.add_model(self.spec(1, self.plan.stream_mode, "-stream", batching=False))
        refs: list[str] = []
        async with rt:
            for case in self.plan.stream_cases():
                chunks = await rt.stream(self.model_id + "-stream", case.request)
                self.stream_chunks[case.name] = len(chunks)
                self.stream_results.append(chunks)
                first = self.plan.chunks_fingerprint(chunks)
                again = self.plan.chunks_fingerprint(
                    await rt.stream(self.model_id + "-stream", case.request)
                )
                c.expect(
                    first == again,
                    f"stream {case.name}: serial streams vary; stream parity unverified",
                )
                refs.append(first)
        return refs

    # ---- M2 + M3 (one fresh start)
    async def start(self, s: int) -> None:
        m2, m3, m5 = self.check("M2"), self.check("M3"), self.check("M5")
        tag = f"start{s}"
        settled_rss()
        provider, rt = self.fresh(self.slots)
        self.watch(rt)
        n = self.slots
        stats: dict[str, Any] = {"compared": 0}
        async with rt:
            base_rss = settled_rss()
            self.monitor.phase = f"{tag}/cold"
            idx = self.pick(n, s)
            got, _ = await self.wave(rt, idx, together=True)
            stats["compared"] += self.compare(m2, f"{tag} cold wave", idx, got, self.cold_results)
            m2.expect(
                provider.loads == 1, f"{tag}: {provider.loads} weight loads for one cold wave"
            )
            cold_active = self.monitor.active.get(self.monitor.phase, 0)
            stats["cold_wave_active_leases"] = cold_active
            m2.expect(
                cold_active == n,
                f"{tag} cold wave: observed {cold_active} active leases, expected {n}",
            )
            first_peak = self.monitor.peak(f"{tag}/cold")
            self.drained(m2, rt, f"{tag} cold wave")
            ready_seen = 0
            for w in range(2):
                self.monitor.phase = f"{tag}/mixed{w}"
                idx = self.pick(n, s + w + 1)[:: -1 if w % 2 else 1]
                got, _ = await self.wave(rt, idx, together=True)
                stats["compared"] += self.compare(
                    m2, f"{tag} mixed warm wave {w}", idx, got, self.warm_results
                )
                ready_seen = max(ready_seen, self.monitor.active_ready.get(self.monitor.phase, 0))
            self.monitor.phase = f"{tag}/serial"
            for i in self.pick(n, s):
                got = [await self.attempt(rt, self.cases[i].request)]
                stats["compared"] += self.compare(
                    m2, f"{tag} serial reuse", [i], got, self.warm_results
                )
            self.monitor.phase = f"{tag}/unload"
            await rt.unload(self.model_id)
            m2.expect(not rt.status_of(self.model_id).loaded, f"{tag}: still loaded after unload")
            idle_rss = settled_rss()
            self.monitor.phase = f"{tag}/reload"
            idx = self.pick(n, s + 1)
            got, _ = await self.wave(rt, idx)
            stats["compared"] += self.compare(
                m2, f"{tag} reload cold wave", idx, got, self.cold_results
            )
            self.drained(m2, rt, f"{tag} after reload")
            after_wave: list[int] = []
            walls = []
            for w in range(self.waves):
                self.monitor.phase = f"{tag}/wave{w}"
                idx = self.pick(n, s + 2 * w + 1)
                if w % 2:
                    idx = idx[::-1]
                got, wall = await self.wave(rt, idx, together=True)
                walls.append(wall)
                self.compare(m3, f"{tag} warm wave {w}", idx, got, self.warm_results)
                ready_seen = max(ready_seen, self.monitor.active_ready.get(self.monitor.phase, 0))
                after_wave.append(settled_rss())
            self.drained(m3, rt, f"{tag} after warm waves")
            m2.expect(
                ready_seen == n,
                f"{tag}: at most {ready_seen} active loaded leases observed in warm waves, "
                f"expected {n}",
            )
            self.monitor.phase = f"{tag}/perf"
            idx = self.pick(n)
            for _ in range(3):
                _, wall = await self.wave(rt, idx)
                self.perf.setdefault("candidate_n_slots", []).append(wall)
        self.drained(m2, rt, f"{tag} after shutdown")
        stats.update(warm_active_loaded_leases=ready_seen, weight_loads=provider.loads)
        if self.batching:  # evidence, not a verdict: how many members the steps carried
            stats.update(batch_steps=provider.steps, widest_batch_step=provider.widest_step)
        m2.evidence.setdefault("starts", {})[tag] = stats
        m3.evidence.setdefault("starts", {})[tag] = {
            "waves": self.waves,
            "requests_compared": self.waves * n,
            "reversed_waves": self.waves // 2,
            "inputs_used": sorted(
                {self.cases[i].name for w in range(self.waves) for i in self.pick(n, s + 2 * w + 1)}
            ),
            "wave_walls_s": [round(x, 4) for x in walls],
        }
        m5.evidence.setdefault("starts", {})[tag] = self.memory(
            base_rss, first_peak, idle_rss, after_wave
        )

    def memory(
        self, base: int, first_peak: int, idle: int, after_wave: list[int]
    ) -> dict[str, Any]:
        c = self.check("M5")
        mib = 1024 * 1024
        out: dict[str, Any] = {
            "rss_before_load_mib": round(base / mib, 2),
            "first_request_peak_mib": round(first_peak / mib, 2),
            "first_request_peak_growth_mib": round(max(first_peak - base, 0) / mib, 2),
            "retained_after_unload_mib": round((idle - base) / mib, 2),
            "after_each_warm_wave_mib": [round(r / mib, 2) for r in after_wave],
        }
        if len(after_wave) < 4:
            c.gaps.append(
                f"only {len(after_wave)} warm waves in a start: too few to assess stabilization"
            )
            return out
        half = len(after_wave) // 2
        growth = max(after_wave[half:]) - max(after_wave[:half])
        out["late_growth_mib"] = round(growth / mib, 2)
        if growth > GROWTH_TOLERANCE_BYTES:
            c.gaps.append(
                f"RSS still grew {growth / mib:.1f} MiB over the later warm waves "
                "(unexplained; investigate)"
            )
        return out

    # ---- M4 + M6 (one more fresh start)
    async def recovery_and_modes(self) -> None:
        m4, m6 = self.check("M4"), self.check("M6")
        provider, rt = self.fresh(self.slots)
        stream_model = self.model_id + ("-stream" if self.plan.stream_mode != "offline" else "")
        if stream_model != self.model_id:
            rt.add_model(self.spec(self.slots, self.plan.stream_mode, "-stream"))
        self.watch(rt, self.model_id, stream_model)
        n, steps = self.slots, []
        async with rt:
            self.monitor.phase = "m4/invalid"
            idx = self.pick(n)
            got, _ = await self.wave(rt, idx, [self.plan.invalid()])
            self.compare(
                m4, "healthy work beside an invalid input", idx, got[:n], self.cold_results
            )
            m4.expect(isinstance(got[n], Exception), "the invalid input did not fail")
            self.drained(m4, rt, "after the invalid input")
            steps.append(f"invalid input ({self.plan.invalid_reason}) beside {n} healthy requests")
            injected: tuple[str, ...] = ("fail_next_load", "fail_next_create")
            if self.batching:
                injected += ("fail_next_engine",)
            for what in injected:
                self.monitor.phase = f"m4/{what}"
                await rt.unload(self.model_id)
                setattr(provider, what, True)
                try:
                    await self.one(rt, self.cases[0].request)
                    m4.failures.append(
                        f"{what}: the request succeeded despite the injected failure"
                    )
                except LoadError:
                    pass
                m4.expect(
                    not rt.status_of(self.model_id).loaded,
                    f"{what}: model loaded after a failed load",
                )
                self.drained(m4, rt, f"after {what}")
                got, _ = await self.wave(rt, idx)
                self.compare(m4, f"retry after {what}", idx, got, self.cold_results)
                steps.append(
                    f"{what.replace('_', ' ')} injected, then a concurrent cold retry wave"
                )
            for scope in ("targeted", "all-model"):
                self.monitor.phase = f"m4/unload_during_load/{scope}"
                await rt.unload(self.model_id)
                provider.hold_load, provider.load_started = anyio.Event(), anyio.Event()
                hold = provider.hold_load
                result: list[Any] = []

                async def request(result: list[Any] = result) -> None:
                    try:
                        result.append(await self.one(rt, self.cases[0].request))
                    except Exception as exc:
                        result.append(exc)

                async with anyio.create_task_group() as tg:
                    tg.start_soon(request)
                    await provider.load_started.wait()
                    if scope == "targeted":
                        tg.start_soon(rt.unload, self.model_id)
                    else:
                        tg.start_soon(rt.bulk_unload, None)
                    # the unload queues behind the held load: wait until the counters show it
                    await settle(lambda: rt.status_of(self.model_id).queued_management >= 1)
                    row = rt.status_of(self.model_id)
                    m4.expect(
                        row.state == "loading" and row.queued_management >= 1,
                        f"{scope} unload during load: state {row.state}, "
                        f"{row.queued_management} managers queued",
                    )
                    hold.set()
                self.compare(
                    m4,
                    f"request that started the load ({scope} unload)",
                    [0],
                    result,
                    self.cold_results,
                )
                m4.expect(
                    not rt.status_of(self.model_id).loaded,
                    f"{scope} unload undone: model still loaded",
                )
                self.drained(m4, rt, f"after {scope} unload during first load")
                got, _ = await self.wave(rt, idx)
                self.compare(m4, f"reload after {scope} unload", idx, got, self.cold_results)
                steps.append(
                    f"{scope} unload while the first lazy load was held; "
                    "the loading request finished, then the unload ran"
                )
            await self.streams(rt, stream_model, m6)
        self.drained(m4, rt, "after shutdown")
        m4.evidence.update(steps=steps, weight_loads=provider.loads)

    async def streams(self, rt: Runtime, model: str, c: Check) -> None:
        cases = self.plan.stream_cases()
        n = self.slots
        picks = [k % len(cases) for k in range(n)]

        async def full(k: int, out: list[Any]) -> None:
            try:
                out[k] = await rt.stream(model, cases[picks[k]].request)
            except Exception as exc:
                out[k] = exc
            finally:
                self.rendezvous.left()

        async def wave(label: str) -> None:
            out: list[Any] = [None] * n
            await self.stream_wave(c, label, lambda k: full(k, out), out, picks)

        await wave("concurrent streams")
        self.monitor.phase = "m6/cancel"
        pulled = 0
        other: list[Any] = [None] * n
        async with anyio.create_task_group() as tg:
            if n > 1:
                tg.start_soon(full, 1, other)
            with anyio.CancelScope() as scope:
                try:
                    async with rt.open_stream(model, cases[0].request) as chunks:
                        async for _ in chunks:
                            pulled += 1
                            scope.cancel()
                except Exception as exc:
                    c.failures.append(f"the stream to cancel raised {type(exc).__name__}: {exc}")
        c.expect(pulled == 1, f"cancelled stream pulled {pulled} chunks after its cancellation")
        if n > 1:
            c.expect(
                self.same_stream(c, other[1], picks[1]),
                "the stream beside the cancelled one differs from its serial stream",
            )
        self.drained(c, rt, "after a stream cancelled midway")
        await wave("streams after a cancellation")
        c.evidence["streaming"] = {
            "model": model,
            "mode": self.plan.stream_mode,
            "concurrent_streams": n,
            "cancelled_after_chunks": pulled,
            "cancelled_stream_total_chunks": self.stream_chunks[cases[0].name],
            "references": "serial streams on one slot (M1)",
        }
        if self.batching and self.plan.live(cases[0].request) is not None:
            await self.live_streams(rt, model, c)

    async def live_streams(self, rt: Runtime, model: str, c: Check) -> None:
        """Batched families that take live input: n live streams at once (each stream's
        audio pushed piece by piece into its feed while it runs, as a live client's), every
        chunk compared with the serial stream of the same audio."""
        cases, n = self.plan.stream_cases(), self.slots
        picks = [k % len(cases) for k in range(n)]
        out: list[Any] = [None] * n
        pieces = 0

        async def live(k: int) -> None:
            nonlocal pieces
            request, parts = self.plan.live(cases[picks[k]].request)
            feed = Feed()
            try:
                async with rt.open_stream(model, request, feed=feed) as chunks:
                    for part in parts:
                        feed.push(part)
                    feed.close()
                    pieces += len(parts)
                    out[k] = [chunk async for chunk in chunks]
            except Exception as exc:
                out[k] = exc
            finally:
                self.rendezvous.left()

        await self.stream_wave(c, "live", live, out, picks)
        self.drained(c, rt, "after live streams")
        c.evidence["live"] = {
            "concurrent_streams": n,
            "pieces_pushed": pieces,
            "references": "serial streams on one slot (M1)",
        }

    async def stream_wave(
        self,
        c: Check,
        label: str,
        run: Callable[[int], Coroutine[Any, Any, None]],
        out: list[Any],
        picks: list[int],
    ) -> None:
        """``len(out)`` streams at once (``run(k)`` fills ``out[k]``; their first chunks
        wait until all are open): each must equal its serial stream, and the monitor must
        have seen them all active together (phase ``m6/<label>``)."""
        n = len(out)
        names = [case.name for case in self.plan.stream_cases()]
        self.monitor.phase = f"m6/{label}"
        self.rendezvous.arm(n, self.observe, self.launched)
        try:
            async with anyio.create_task_group() as tg:
                for k in range(n):
                    tg.start_soon(run, k)
        finally:
            self.rendezvous.disarm()
        for k, got in enumerate(out):
            c.expect(
                self.same_stream(c, got, picks[k]),
                f"{label}: stream {names[picks[k]]} differs from its serial stream",
            )
        seen = self.monitor.active_ready.get(self.monitor.phase, 0)
        c.expect(seen == n, f"{label}: observed {seen} active streams, expected {n}")

    def same_stream(self, c: Check, got: Any, case: int) -> bool:
        """A stream's chunks (or the exception it raised) against the serial stream of
        ``case``: exact, or batched within the declared tolerance."""
        if isinstance(got, Exception) or got is None:
            return False
        exact = self.plan.chunks_fingerprint(got) == self.stream_ref[case]
        return self.same(c, exact, got, self.stream_results[case], self.plan.batched_chunks_equal)

    # ---- the whole run
    async def run(self) -> None:
        self.plan = plan(self.family, self.load_options)
        self.cases = self.plan.cases()
        titles = {
            "M1": "Scope/serial quality",
            "M2": "Every admitted count",
            "M3": "Mixed/repeated quality",
            "M4": "Model recovery",
            "M5": "Memory reuse",
            "M6": "Execution modes",
        }
        self.checks = {k: Check(k, v) for k, v in titles.items()}
        async with anyio.create_task_group() as tg:
            tg.start_soon(self.monitor.poll)
            await self.serial_references()
            for s in range(1, self.starts + 1):
                await self.start(s)
            await self.recovery_and_modes()
            self.watch(None)
            tg.cancel_scope.cancel()
        if self.starts < MIN_STARTS:
            self.check("M2").gaps.append(
                f"{self.starts} fresh start(s) run; "
                f"the validation procedure requires at least {MIN_STARTS}"
            )
        if self.batching:
            for cid, check in self.checks.items():
                if cid in ("M1", "M2", "M3", "M4", "M6"):
                    check.evidence["batched"] = {
                        "declared_tolerance": self.plan.batched_tolerance,
                        "outputs_within_tolerance_not_exact": self.tolerated.get(cid, 0),
                    }
        if self.waves < MIN_WAVES:
            self.check("M3").gaps.append(
                f"{self.waves} warm wave(s) per start; "
                f"the validation procedure requires at least {MIN_WAVES}"
            )
