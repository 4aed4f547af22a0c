"""Run a scenario: server.runtime under trio's mock clock, fake sessions, seeded choices.

The runner registers the scenario's fake models, plays its timeline (each
action is a client task that starts at its virtual time, :mod:`sim.actions`),
checks the invariants of docs/reference.md whenever the simulated system is
quiescent, detects stalls (pending work with nothing left to wake it: a
deadlock), and records every core decision and client action in one trace.
The same scenario and seed give a byte-identical trace in any process.
Checking the outcomes against the scenario's expectations is
:mod:`sim.expectations`.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import IO, Any

import trio
import trio.testing

from core.invariants import check_quiescent, check_registry
from core.policy import RuntimeKind
from server.runtime import Runtime, RuntimeConfig
from server.runtime.tracing import TraceLog
from sim.actions import SPEC_FIELDS, ActionPlayer, model_spec
from sim.clock import Scheduling, SimClock, seed_trio
from sim.expectations import check_expectations
from sim.fakes import FakeProvider, FakeScript
from sim.outcomes import ActionOutcome, RunResult
from sim.scenario import Scenario

__all__ = [
    "SPEC_FIELDS",
    "ActionOutcome",
    "RunResult",
    "check_expectations",
    "model_spec",
    "run_scenario",
]


def run_scenario(
    scenario: Scenario,
    seed: int | None = None,
    *,
    trace_out: IO[str] | None = None,
    runtime_factory: Callable[..., Runtime] | None = None,
) -> RunResult:
    """Run ``scenario`` with ``seed`` (default: the scenario's) and return what happened."""
    seed = scenario.seed if seed is None else seed
    seed_trio(seed)
    mock = trio.testing.MockClock(autojump_threshold=0)
    if runtime_factory is None:
        # decision monitors (sim.monitors) watch every core decision as it is made
        from sim.monitors import monitored

        runtime_factory = monitored(Runtime)
    run = _Run(scenario, seed, trace_out, runtime_factory, mock)
    trio.run(run.main, clock=mock)
    return run.result()


def runtime_config(scenario: Scenario) -> RuntimeConfig:
    """The runtime settings of a scenario's ``[config]``."""
    cfg = scenario.config
    return RuntimeConfig(
        busy_timeout_ms=int(cfg.get("busy_timeout_ms", 0)),
        max_loaded_models=int(cfg.get("max_loaded_models", 0)),
        memory_budget=int(cfg.get("memory_budget", 0)),
        max_queue=cfg.get("max_queue"),
        idle_unload_ms=int(cfg.get("idle_unload_ms", 0)),
        kind=RuntimeKind(cfg.get("runtime", "parallel")),
    )


class _Run:
    """One run: the clock, the runtime, the clients, and what the checks saw."""

    def __init__(
        self,
        scenario: Scenario,
        seed: int,
        trace_out: IO[str] | None,
        runtime_factory: Callable[..., Runtime],
        mock: trio.testing.MockClock,
    ) -> None:
        self.scenario = scenario
        self.seed = seed
        scheduling = (
            Scheduling(scenario.scheduling) if scenario.scheduling else Scheduling.for_seed(seed)
        )
        self.clock = clock = SimClock(random.Random(seed), mock, scheduling)
        self.scripts = {m.id: FakeScript.from_mapping(m.script) for m in scenario.models}
        self.provider = FakeProvider(clock, self.scripts)
        self.log = TraceLog(trace_out)
        # the original runtime's lock goes to *some* waiter: the seeded RNG picks which
        self.rt = runtime_factory(
            self.provider,
            runtime_config(scenario),
            clock=clock,
            trace=self.log,
            choose=lambda c: c[clock.rng.randrange(len(c))],
        )
        for m in scenario.models:
            self.rt.add_model(model_spec(scenario, m.id))
        self.player = ActionPlayer(scenario, self.rt, self.provider, self.scripts, clock, self.log)
        self.violations: list[str] = []
        self.warnings: list[str] = []
        self.seen: set[str] = set()
        self.stalls = 0
        self.scenario_scope = trio.CancelScope()
        self.shutdown_scope = trio.CancelScope()
        self.driver_scope = trio.CancelScope()
        self.shutting_down = False
        self.finished = False
        self.final: dict[str, dict[str, Any]] = {}

    # ------------------------------------------------------------ checks
    def note(self, text: str) -> None:
        """Report a violation once, stamped with the virtual time it was seen."""
        if text not in self.seen:
            self.seen.add(text)
            self.violations.append(f"t={self.clock.now():.6f} {text}")

    def on_step(self) -> None:
        """Every quiescent step: the registry's invariants, the runtime's and the provider's
        books."""
        for violation in check_registry(self.rt.core.registry, self.clock.now()):
            self.note(str(violation))
        for text in self.rt.violations:
            self.note(f"invariant 6/2: {text}")
        for text in self.rt.check_batches():
            self.note(f"invariant 2: {text}")
        for text in self.provider.premature:
            self.note(f"invariant 6: {text}")
        for text in self.provider.ran_ahead:
            self.note(f"held members: {text}")

    def on_stall(self) -> bool:
        """Everything blocked and no timer left: report it and cancel what waits (invariant 10)."""
        if self.finished:
            return False
        self.stalls += 1
        if self.stalls == 1:
            self.note(
                f"invariant 10: stalled with pending actions {self.player.pending()} and no timer "
                "left"
            )
            self.scenario_scope.cancel()
            return True
        if self.shutting_down and not self.shutdown_scope.cancel_called:
            # a deadlocked shutdown would otherwise hang the run (its exit is shielded)
            self.note("invariant 10: shutdown stalled (work never drained) and no timer left")
            self.shutdown_scope.cancel()
            return True
        if self.stalls == 2:
            self.driver_scope.cancel()
        return False

    # -------------------------------------------------------------- run
    async def main(self) -> None:
        async with trio.open_nursery() as outer:
            outer.start_soon(self.drive)
            async with self.rt:
                with self.scenario_scope:
                    await self.start_up()
                    async with trio.open_nursery() as clients:
                        for action in self.scenario.actions:
                            clients.start_soon(self.player.perform, action)
                self.final = self.counters()
                await self.shut_down()
            self.closing_checks()
            self.finished = True
            self.driver_scope.cancel()

    async def drive(self) -> None:
        with self.driver_scope:
            await self.clock.drive(on_step=self.on_step, on_stall=self.on_stall)

    async def start_up(self) -> None:
        """Load the eager models; warn about actions scheduled before that finishes."""
        for m in self.scenario.models:
            if not m.lazy:
                await self.rt.load_model(m.id)
        now = self.clock.now()
        self.warnings.extend(
            f"action {a.id} at {a.at} is scheduled before the start-up loads finish "
            f"({now:.6f}): it starts then"
            for a in self.scenario.actions
            if a.at < now
        )

    def counters(self) -> dict[str, dict[str, Any]]:
        """Every model's counters once the timeline is over (before the final shutdown)."""
        final = {}
        for entry in self.rt.core.registry.entries():
            status = self.rt.core.registry.status(entry)
            final[entry.id] = {
                "loaded": status.loaded,
                "active_slots": status.active_slots,
                "queued_requests": status.queued_requests,
                "queued_management": status.queued_management,
                "slots": status.slots,
                "loads": self.provider.loads.get(entry.id, 0),
                "state": status.state,
            }
        return final

    async def shut_down(self) -> None:
        """The final shutdown, unless a scenario's own shutdown finished it."""
        self.shutting_down = True
        rt = self.rt
        if rt.closed:  # not rt.closing: a scenario's shutdown may have been cancelled half-way
            return
        try:
            with self.shutdown_scope:
                await rt.shutdown()
        except Exception as exc:  # a wedged model can make teardown itself fail
            self.note(f"invariant 10: shutdown failed: {type(exc).__name__}: {exc}")
            rt.closed = True
        if self.shutdown_scope.cancelled_caught:
            rt.closed = True  # the stall is reported; leaving the runtime must not retry it

    def closing_checks(self) -> None:
        """After shutdown: nothing queued or held, no session or weight left alive."""
        self.on_step()
        for v in check_quiescent(self.rt.core.registry):
            self.note(str(v))
        for model, n in self.provider.live_sessions.items():
            if n:
                self.note(f"invariant 1: {n} sessions of '{model}' alive after shutdown")
        for model, n in self.provider.live_weights.items():
            if n:
                self.note(f"invariant 6: weights of '{model}' alive after shutdown")

    def result(self) -> RunResult:
        return RunResult(
            scenario=self.scenario.name,
            seed=self.seed,
            outcomes=self.player.outcomes,
            violations=self.violations,
            trace=self.log.records,
            final=self.final,
            stalled=self.stalls > 0,
            end_time=self.clock.now(),
            ties=self.clock.ties,
            scheduling=self.clock.scheduling,
            warnings=self.warnings,
        )
