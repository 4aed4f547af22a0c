"""The runtime under the simulator's virtual clock: basic flows end to end."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
import trio.testing

from core.invariants import check_quiescent, check_registry
from server.runtime import BusyError, ModelSpec, Runtime, RuntimeConfig
from sim.clock import SimClock, seed_trio
from sim.fakes import FakeProvider, FakeScript


def simulate(
    body: Callable[[Runtime, SimClock, FakeProvider], Awaitable[Any]],
    *,
    scripts: dict[str, FakeScript] | None = None,
    specs: list[ModelSpec] | None = None,
    config: RuntimeConfig | None = None,
    seed: int = 0,
) -> tuple[Any, Runtime, FakeProvider]:
    seed_trio(seed)
    mock = trio.testing.MockClock(autojump_threshold=0)
    out: dict[str, Any] = {}

    async def main() -> None:
        clock = SimClock(random.Random(seed), mock)
        provider = FakeProvider(clock, scripts or {})
        runtime = Runtime(provider, config or RuntimeConfig(busy_timeout_ms=0), clock=clock)
        for spec in specs or [ModelSpec("m", "fake", slots=2)]:
            runtime.add_model(spec)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(clock.drive)
            async with runtime:
                out["result"] = await body(runtime, clock, provider)
        out["runtime"] = runtime
        out["provider"] = provider

    trio.run(main, clock=mock)
    return out["result"], out["runtime"], out["provider"]


def test_concurrent_requests_get_distinct_sessions_and_one_load() -> None:
    async def body(rt: Runtime, clock: SimClock, fp: FakeProvider) -> list[Any]:
        results: list[Any] = []

        async def one() -> None:
            results.append(await rt.run("m", {"duration": 1.0}))

        async with trio.open_nursery() as n:
            for _ in range(2):
                n.start_soon(one)
        return results

    results, rt, fp = simulate(body)
    assert len({r["session"] for r in results}) == 2
    assert fp.loads["m"] == 1
    assert not check_quiescent(rt.core.registry)
    assert not rt.violations and not fp.premature
    assert fp.live_sessions["m"] == 0 and fp.live_weights["m"] == 0, "shutdown destroyed the pool"


def test_unload_waits_for_older_and_blocks_newer() -> None:
    async def body(rt: Runtime, clock: SimClock, fp: FakeProvider) -> list[str]:
        order: list[str] = []

        async def request(tag: str, at: float) -> None:
            await clock.sleep_until(at)
            await rt.run("m", {"duration": 1.0})
            order.append(tag)

        async def unload(at: float) -> None:
            await clock.sleep_until(at)
            await rt.unload("m")
            order.append("unload")

        async with trio.open_nursery() as n:
            n.start_soon(request, "old", 0.0)
            n.start_soon(unload, 0.1)
            n.start_soon(request, "new", 0.2)
        return order

    order, rt, fp = simulate(body, specs=[ModelSpec("m", "fake", slots=2)])
    assert order == ["old", "unload", "new"]
    assert fp.loads["m"] == 2, "the newer request reloads after the unload"


def test_overdue_rejection_while_unload_waits() -> None:
    async def body(rt: Runtime, clock: SimClock, fp: FakeProvider) -> str:
        async def hold() -> None:
            await rt.run("m", {"duration": 5.0})

        async with trio.open_nursery() as n:
            n.start_soon(hold)
            await clock.sleep_until(1.0)
            n.start_soon(rt.unload, "m")
            await clock.sleep_until(2.0)
            try:
                await rt.run("m", {"duration": 0.1}, timeout_ms=15)
            except BusyError as exc:
                return exc.message
        return "admitted"

    msg, rt, fp = simulate(body, specs=[ModelSpec("m", "fake", slots=1)])
    assert msg == "model 'm': all active slots exceeded busy_timeout_ms"


def test_load_failure_is_retried_by_next_request() -> None:
    async def body(rt: Runtime, clock: SimClock, fp: FakeProvider) -> list[str]:
        outcomes: list[str] = []
        for _ in range(2):
            try:
                await rt.run("m", {})
                outcomes.append("ok")
            except Exception as exc:
                outcomes.append(type(exc).__name__)
        return outcomes

    outcomes, rt, fp = simulate(body, scripts={"m": FakeScript(fail_loads=1)})
    assert outcomes == ["LoadError", "ok"]
    assert fp.loads["m"] == 2


def test_clone_failure_destroys_clones_before_primary() -> None:
    async def body(rt: Runtime, clock: SimClock, fp: FakeProvider) -> str:
        try:
            await rt.run("m", {})
        except Exception as exc:
            return type(exc).__name__
        return "ok"

    outcome, rt, fp = simulate(
        body, scripts={"m": FakeScript(fail_clone_at=2)}, specs=[ModelSpec("m", "fake", slots=4)]
    )
    assert outcome == "LoadError"
    assert fp.live_sessions["m"] == 0 and fp.live_weights["m"] == 0 and not fp.premature


def test_disconnect_while_queued_frees_the_place() -> None:
    async def body(rt: Runtime, clock: SimClock, fp: FakeProvider) -> tuple[int, int]:
        async with trio.open_nursery() as n:
            n.start_soon(rt.run, "m", {"duration": 3.0})
            await clock.sleep_until(0.5)
            with trio.CancelScope() as scope:
                n.start_soon(clock.sleep_until, 1.0)

                async def leave() -> None:
                    await clock.sleep_until(1.0)
                    scope.cancel()

                n.start_soon(leave)
                await rt.run("m", {"duration": 1.0})
            status = rt.status_of("m")
            return status.queued_requests, status.active_slots

    (queued, active), rt, fp = simulate(body, specs=[ModelSpec("m", "fake", slots=1)])
    assert (queued, active) == (0, 1)
    assert not check_registry(rt.core.registry, 100.0)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_runtime_runs_under_anyio_backends(backend: str) -> None:
    import anyio

    from server.runtime import SystemClock

    async def main() -> list[Any]:
        clock = SystemClock()
        instant = FakeScript(load_time=0, create_time=0, clone_time=0, close_time=0, run_time=0)
        rt = Runtime(
            FakeProvider(clock, {"m": instant}), RuntimeConfig(busy_timeout_ms=1000), clock=clock
        )
        rt.add_model(ModelSpec("m", "fake", slots=2))
        results: list[Any] = []

        async def one() -> None:
            results.append(await rt.run("m", {"duration": 0.01}))

        async with rt, anyio.create_task_group() as tg:
            for _ in range(4):
                tg.start_soon(one)
        return results

    results = anyio.run(main, backend=backend)
    assert len(results) == 4
    assert len({r["session"] for r in results}) == 2


def test_original_runtime_serializes_on_one_lock_and_one_session() -> None:
    from core.policy import RuntimeKind

    async def body(rt: Runtime, clock: SimClock, fp: FakeProvider) -> list[Any]:
        results: list[Any] = []

        async def one(at: float) -> None:
            await clock.sleep_until(at)
            results.append((await rt.run("m", {"duration": 1.0}), clock.now()))

        async with trio.open_nursery() as n:
            for i in range(3):
                n.start_soon(one, 0.01 * i)
            await clock.sleep_until(0.5)
            assert rt.status_of("m").active_slots == 1
            assert rt.status_of("m").queued_requests == 2
        return results

    config = RuntimeConfig(busy_timeout_ms=0, kind=RuntimeKind.ORIGINAL)
    results, rt, fp = simulate(body, specs=[ModelSpec("m", "fake")], config=config)
    assert len({r["session"] for r, _ in results}) == 1, "one session per model"
    ends = sorted(t for _, t in results)
    assert ends[1] - ends[0] >= 1.0 and ends[2] - ends[1] >= 1.0, "one at a time"


def test_original_runtime_rejects_explicit_slots_on_registration() -> None:
    from core.policy import RuntimeKind
    from server.runtime import InvalidRequestError

    async def body(rt: Runtime, clock: SimClock, fp: FakeProvider) -> str:
        try:
            await rt.register(ModelSpec("new", "fake", slots=2))
        except InvalidRequestError as exc:
            return exc.message
        return "accepted"

    config = RuntimeConfig(busy_timeout_ms=0, kind=RuntimeKind.ORIGINAL)
    message, rt, fp = simulate(body, config=config, specs=[ModelSpec("m", "fake")])
    assert "slots requires --parallel-jobs" in message
    assert "new" not in rt.specs


def test_fake_factory_builds_pools_synchronously_too() -> None:
    """The fake factory satisfies the SessionFactory protocol on its own (core.pool.build_pool)."""
    import anyio

    from core.pool import build_pool
    from server.runtime import SystemClock

    provider = FakeProvider(SystemClock(), {"m": FakeScript(load_time=0, capacity=4)})
    factory = anyio.run(provider.load, ModelSpec("m", "fake"))
    pool = build_pool(factory, 3)
    assert pool.size == 3 and len({s.sid for s in pool.sessions}) == 3  # type: ignore[attr-defined]
    assert provider.live_sessions["m"] == 3


def test_a_failing_session_close_does_not_stop_the_teardown() -> None:
    """One close that raises: the other sessions still close, the weights are released, and
    the unload finishes (the model is not left 'unloading')."""
    attempts: list[int] = []

    async def body(rt: Runtime, clock: SimClock, fp: FakeProvider) -> Any:
        await rt.run("m", {"duration": 0.1})
        real_close = fp.close

        async def flaky_close(session: Any) -> None:
            attempts.append(session.sid)
            if len(attempts) == 1:
                raise RuntimeError("injected close failure")
            await real_close(session)

        fp.close = flaky_close  # type: ignore[method-assign]
        await rt.unload("m")
        return rt.status_of("m")

    row, rt, fp = simulate(body, specs=[ModelSpec("m", "fake", slots=3)])
    assert len(attempts) == 3, "every session of the pool was closed, the failing one included"
    assert row.state == "unloaded" and not row.loaded
    assert fp.live_weights["m"] == 0 and fp.live_sessions["m"] == 1  # only the failed close is left


def test_a_model_over_the_whole_memory_budget_is_a_load_error_not_retry_later() -> None:
    """Busy models holding the budget are a 503 with Retry-After (waiting helps); a model whose
    own estimate exceeds the whole budget can never load: a LoadError, and nothing evicted."""
    from server.runtime import LoadError

    async def body(rt: Runtime, clock: SimClock, fp: FakeProvider) -> list[str]:
        seen: list[str] = []
        for _ in range(2):  # the refusal does not wedge the model: the same answer again
            try:
                await rt.run("big", {"duration": 0.1})
            except LoadError as exc:
                seen.append(exc.message)
        await rt.run("small", {"duration": 0.1})
        return seen

    specs = [
        ModelSpec("big", "fake", memory_bytes=200, lazy=True),
        ModelSpec("small", "fake", memory_bytes=50, lazy=True),
    ]
    config = RuntimeConfig(busy_timeout_ms=0, memory_budget=100)
    seen, rt, fp = simulate(body, specs=specs, config=config)
    assert len(seen) == 2 and all("can never load" in m for m in seen), seen
    assert fp.loads.get("big", 0) == 0
    assert rt.status_of("big").state == "unloaded"
