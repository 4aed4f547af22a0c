"""Runtime.run fills a request's Phases in: queued, loading and running, on the runtime's
clock (virtual here, so every figure is exact)."""

from __future__ import annotations

import pytest
import trio

from server.runtime import BusyError, ModelSpec, Runtime, RuntimeConfig
from server.runtime.phases import Phases
from sim.clock import SimClock
from sim.fakes import FakeProvider, FakeScript
from tests.runtime.test_runtime_basic import simulate


def test_the_second_request_queues_behind_the_first_which_loaded() -> None:
    script = FakeScript(load_time=0.5, create_time=0.1, run_time=1.0)

    async def body(rt: Runtime, clock: SimClock, fp: FakeProvider) -> list[Phases]:
        first, second = Phases(), Phases()

        async def one(phases: Phases, at: float, duration: float) -> None:
            await clock.sleep_until(at)
            await rt.run("m", {"duration": duration}, phases=phases)

        async with trio.open_nursery() as n:
            n.start_soon(one, first, 0.0, 2.0)
            n.start_soon(one, second, 0.25, 1.0)
        return [first, second]

    (first, second), _, _ = simulate(
        body, scripts={"m": script}, specs=[ModelSpec("m", "fake", slots=1)]
    )
    a, b = first.durations_ms(), second.durations_ms()
    assert a["queue"] == 0.0 and a["load"] > 0 and a["run"] == 2000.0
    assert b["load"] == 0.0 and b["run"] == 1000.0
    assert second.admitted == first.finished, "the slot passes on when the first one's work ends"
    assert b["queue"] == round((first.finished - 0.25) * 1000.0, 3)
    assert first.server_timing() == f"queue;dur=0, load;dur={a['load']:g}, run;dur=2000"


def test_the_header_carries_every_decimal_of_a_long_phase() -> None:
    """A phase over a second keeps its microseconds (the JSON fields have them too)."""
    phases = Phases(requested=0.0, admitted=0.000257, ready=0.000361, finished=1.039439)
    assert phases.durations_ms() == {"queue": 0.257, "load": 0.104, "run": 1039.078}
    assert phases.server_timing() == "queue;dur=0.257, load;dur=0.104, run;dur=1039.078"


def test_a_request_refused_in_the_queue_has_no_phases() -> None:
    """One slot, a queue of none: the second request is refused at once, so it reached
    only ``requested`` and its header would be empty."""

    async def body(rt: Runtime, clock: SimClock, fp: FakeProvider) -> Phases:
        refused = Phases()

        async def second() -> None:
            await clock.sleep_until(0.1)
            with pytest.raises(BusyError):
                await rt.run("m", {"duration": 1.0}, phases=refused)

        async with trio.open_nursery() as n:
            n.start_soon(rt.run, "m", {"duration": 1.0})
            n.start_soon(second)
        return refused

    refused, _, _ = simulate(
        body,
        specs=[ModelSpec("m", "fake", slots=1)],
        config=RuntimeConfig(busy_timeout_ms=0, max_queue=0),
    )
    assert refused.requested == 0.1 and refused.admitted is None
    assert refused.durations_ms() == {} and refused.server_timing() == ""
