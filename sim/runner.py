"""Run a scenario: server.runtime under trio's mock clock, fake sessions, seeded choices.

The runner registers the scenario's fake models, plays its timeline (each
action is a client task that starts at its virtual time), checks the
invariants of docs/reference.md whenever the simulated system is quiescent,
detects stalls (pending work with nothing left to wake it: a deadlock), and
records every core decision and client action in one trace. The same scenario and seed give a
byte-identical trace in any process.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import IO, Any

import attrs
import trio
import trio.testing

from core.events import TraceRecord
from core.invariants import check_quiescent, check_registry
from core.policy import Invalid, RuntimeKind, validate_slots_for_runtime
from server.runtime import (
    BusyError,
    InvalidRequestError,
    ModelSpec,
    NotFoundError,
    Runtime,
    RuntimeConfig,
)
from server.runtime.tracing import TraceLog
from sim.clock import Scheduling, SimClock, seed_trio
from sim.fakes import FakeProvider, FakeScript
from sim.scenario import Action, Expect, Scenario


@attrs.define
class ActionOutcome:
    """What one client action saw."""

    id: str
    do: str
    outcome: str = "pending"
    reason: str = ""
    message: str = ""
    result: Any = None
    started: float = math.nan
    ended: float = math.nan
    granted: float = math.nan  # request/batch: when its lease was granted


@attrs.define
class RunResult:
    """Everything a run produced: outcomes, violations, trace, final counters."""

    scenario: str
    seed: int
    outcomes: dict[str, ActionOutcome]
    violations: list[str]
    trace: list[TraceRecord]
    final: dict[str, dict[str, Any]]
    stalled: bool
    end_time: float
    ties: int
    scheduling: Scheduling = Scheduling.ONE_AT_A_TIME
    warnings: list[str] = attrs.field(factory=list)

    def trace_text(self) -> str:
        return "".join(r.to_json() + "\n" for r in self.trace)

    @property
    def ok(self) -> bool:
        return not self.violations and not self.stalled


SPEC_FIELDS = ("slots", "path", "capacity", "lazy", "busy_timeout_ms", "memory_bytes", "task", "mode", "family")
"""What a register or reconfigure action may set (every field of a model's spec)."""


def model_spec(scenario: Scenario, model_id: str, **overrides: Any) -> ModelSpec:
    """The runtime spec of a scenario model (with a registration's overrides)."""
    base = next((m for m in scenario.models if m.id == model_id), None)
    capacity = overrides.pop("capacity", None)
    if base is None:
        spec = ModelSpec(model_id, "fake")
    else:
        spec = ModelSpec(
            base.id,
            base.family,
            task=base.task,
            mode=base.mode,
            slots=base.slots,
            path=base.path,
            busy_timeout_ms=base.busy_timeout_ms,
            memory_bytes=base.memory_bytes,
            lazy=base.lazy,
        )
    if capacity is not None:
        overrides["session_options"] = {"capacity": int(capacity)}
    return attrs.evolve(spec, **overrides)


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
    box: dict[str, RunResult] = {}
    if runtime_factory is None:
        # decision monitors (sim.monitors) watch every core decision as it is made
        from sim.monitors import monitored

        runtime_factory = monitored(Runtime)
    trio.run(_main, scenario, seed, trace_out, runtime_factory, mock, box, clock=mock)
    return box["result"]


async def _main(
    scenario: Scenario,
    seed: int,
    trace_out: IO[str] | None,
    runtime_factory: Callable[..., Runtime],
    mock: trio.testing.MockClock,
    box: dict[str, RunResult],
) -> None:
    scheduling = Scheduling(scenario.scheduling) if scenario.scheduling else Scheduling.for_seed(seed)
    clock = SimClock(random.Random(seed), mock, scheduling)
    scripts = {m.id: FakeScript.from_mapping(m.script) for m in scenario.models}
    provider = FakeProvider(clock, scripts)
    log = TraceLog(trace_out)
    cfg = scenario.config
    config = RuntimeConfig(
        busy_timeout_ms=int(cfg.get("busy_timeout_ms", 0)),
        max_loaded_models=int(cfg.get("max_loaded_models", 0)),
        memory_budget=int(cfg.get("memory_budget", 0)),
        max_queue=cfg.get("max_queue"),
        idle_unload_ms=int(cfg.get("idle_unload_ms", 0)),
        kind=RuntimeKind(cfg.get("runtime", "parallel")),
    )
    kind = config.kind
    # the original runtime's lock goes to *some* waiter: the seeded RNG picks which
    rt = runtime_factory(
        provider, config, clock=clock, trace=log, choose=lambda c: c[clock.rng.randrange(len(c))]
    )
    for m in scenario.models:
        rt.add_model(model_spec(scenario, m.id))
    outcomes = {a.id: ActionOutcome(a.id, a.do) for a in scenario.actions}
    scopes: dict[str, trio.CancelScope] = {}
    doomed: set[str] = set()
    violations: list[str] = []
    warnings: list[str] = []
    seen: set[str] = set()
    stalls = 0
    scenario_scope = trio.CancelScope()
    shutdown_scope = trio.CancelScope()
    shutting_down = False
    final: dict[str, dict[str, Any]] = {}
    finished = False

    def note(text: str) -> None:
        if text not in seen:
            seen.add(text)
            violations.append(f"t={clock.now():.6f} {text}")

    def on_step() -> None:
        for violation in check_registry(rt.core.registry, clock.now()):
            note(str(violation))
        for text in rt.violations:
            note(f"invariant 6/2: {text}")
        for text in provider.premature:
            note(f"invariant 6: {text}")

    def on_stall() -> bool:
        nonlocal stalls
        if finished:
            return False
        pending = [o.id for o in outcomes.values() if o.outcome == "pending"]
        stalls += 1
        if stalls == 1:
            note(f"invariant 10: stalled with pending actions {pending} and no timer left")
            scenario_scope.cancel()
            return True
        if shutting_down and not shutdown_scope.cancel_called:
            # a deadlocked shutdown would otherwise hang the run (its exit is shielded)
            note("invariant 10: shutdown stalled (work never drained) and no timer left")
            shutdown_scope.cancel()
            return True
        if stalls == 2:
            driver_scope.cancel()
        return False

    async def perform(action: Action) -> None:
        out = outcomes[action.id]
        await clock.sleep_until(action.at)
        out.started = clock.now()
        log(TraceRecord(0, clock.now(), action.model, "action", {"id": action.id, "do": action.do, **dict(action.params)}))
        with trio.CancelScope() as scope:
            scopes[action.id] = scope
            if action.id in doomed:
                scope.cancel()
            try:
                out.result = await execute(action)
                out.outcome = "ok"
            except BusyError as exc:
                out.outcome, out.reason, out.message = "busy", exc.reason.value, exc.message
            except NotFoundError as exc:
                out.outcome, out.reason, out.message = "not_found", exc.reason.value, exc.message
            except InvalidRequestError as exc:
                out.outcome, out.reason, out.message = "invalid", exc.reason.value, exc.message
            except Exception as exc:
                out.outcome, out.reason, out.message = "error", getattr(getattr(exc, "reason", None), "value", ""), str(exc)
        if scope.cancelled_caught:
            out.outcome = "cancelled"
        out.ended = clock.now()
        log(
            TraceRecord(
                0, clock.now(), action.model, "action_end", {"id": action.id}, out.outcome, out.reason
            )
        )

    targets = {a.id: a.model for a in scenario.actions}

    def arm_leave(target: str, event: str) -> None:
        """The target leaves at the first ``event`` of its model once it has started."""

        def fire() -> None:
            if target in scopes:
                scopes[target].cancel()
            elif outcomes[target].outcome == "pending":  # not started yet: wait for the next one
                arm_leave(target, event)

        provider.on_next(targets[target], event, fire)

    def leave_all(model: str) -> None:
        for action_id, scope in scopes.items():
            if targets[action_id] == model and outcomes[action_id].outcome == "pending":
                scope.cancel()

    def leave(target: str) -> None:
        if target in scopes:
            scopes[target].cancel()
        else:
            doomed.add(target)

    async def execute(a: Action) -> Any:
        p = a.params
        timeout = p.get("timeout_ms")
        if a.do == "request":
            req = {"duration": p.get("duration", scripts.get(a.model, FakeScript()).run_time), "fail": p.get("fail", False)}
            async with rt.acquire(a.model, timeout) as held:
                outcomes[a.id].granted = held.lease.granted_at
                return await rt.run_on(held, req)
        if a.do == "stream":
            req = {k: p[k] for k in ("chunks", "chunk_time") if k in p}
            async with rt.open_stream(a.model, req, timeout) as chunks:
                return [c async for c in chunks]
        if a.do == "batch":
            item = {"duration": p.get("duration", scripts.get(a.model, FakeScript()).run_time)}
            async with rt.acquire(a.model, timeout) as held:
                outcomes[a.id].granted = held.lease.granted_at
                return await rt.batch_on(held, [item] * int(p.get("count", 2)))
        if a.do == "load":
            return await rt.load_model(a.model)
        if a.do == "unload":
            return await rt.unload(a.model)
        if a.do in ("reconfigure", "register"):
            if "slots" in p and kind is RuntimeKind.ORIGINAL:
                # the process-level rule (the HTTP layer's); slot ranges are the runtime's own check
                check = validate_slots_for_runtime(kind, p["slots"])
                if isinstance(check, Invalid):
                    raise InvalidRequestError(check.reason, check.message)
            overrides = {k: p[k] for k in SPEC_FIELDS if k in p}
            if "script" in p and a.model not in scripts:  # a runtime-registered model's timings and faults
                scripts[a.model] = provider.scripts[a.model] = FakeScript.from_mapping(p["script"])
            spec = model_spec(scenario, a.model, **overrides)
            changed = await (rt.register(spec) if a.do == "register" else rt.reconfigure(spec))
            return {"reconfigured": changed}
        if a.do == "bulk_unload":
            result = await rt.bulk_unload(p.get("ids"))
            return {"unloaded": list(result.unloaded), "not_found": list(result.not_found)}
        if a.do == "disconnect":
            if "target" not in p:  # every client of the model leaves when the event comes
                provider.on_next(a.model, str(p["on"]), lambda: leave_all(a.model))
            elif "on" in p:  # later, in the very step the target's model reaches that event
                arm_leave(str(p["target"]), str(p["on"]))
            else:
                leave(str(p["target"]))
            return None
        if a.do == "shutdown":
            return await rt.shutdown()
        if a.do == "status":
            rows = [rt.status_of(a.model)] if a.model else rt.status()
            dicts = [attrs.asdict(row) for row in rows]
            return dicts[0] if a.model else {"models": dicts}
        if a.do == "fault":
            script = provider.script(a.model)
            for k, v in dict(p.get("set", {})).items():
                setattr(script, k, v)
            return None
        raise AssertionError(a.do)

    async with trio.open_nursery() as outer:
        driver_scope = trio.CancelScope()

        async def drive() -> None:
            with driver_scope:
                await clock.drive(on_step=on_step, on_stall=on_stall)

        outer.start_soon(drive)
        async with rt:
            with scenario_scope:
                for m in scenario.models:
                    if not m.lazy:
                        await rt.load_model(m.id)
                warnings.extend(
                    f"action {a.id} at {a.at} is scheduled before the start-up loads finish "
                    f"({clock.now():.6f}): it starts then"
                    for a in scenario.actions
                    if a.at < clock.now()
                )
                async with trio.open_nursery() as clients:
                    for action in scenario.actions:
                        clients.start_soon(perform, action)
            for entry in rt.core.registry.entries():
                status = rt.core.registry.status(entry)
                final[entry.id] = {
                    "loaded": status.loaded,
                    "active_slots": status.active_slots,
                    "queued_requests": status.queued_requests,
                    "queued_management": status.queued_management,
                    "slots": status.slots,
                    "loads": provider.loads.get(entry.id, 0),
                    "state": status.state,
                }
            shutting_down = True
            if not rt.closed:  # not rt.closing: a scenario's shutdown may have been cancelled half-way
                try:
                    with shutdown_scope:
                        await rt.shutdown()
                except Exception as exc:  # a wedged model can make teardown itself fail
                    note(f"invariant 10: shutdown failed: {type(exc).__name__}: {exc}")
                    rt.closed = True
                if shutdown_scope.cancelled_caught:
                    rt.closed = True  # the stall is reported; leaving the runtime must not retry it
        on_step()
        for v in check_quiescent(rt.core.registry):
            note(str(v))
        for model, n in provider.live_sessions.items():
            if n:
                note(f"invariant 1: {n} sessions of '{model}' alive after shutdown")
        for model, n in provider.live_weights.items():
            if n:
                note(f"invariant 6: weights of '{model}' alive after shutdown")
        finished = True
        driver_scope.cancel()
    box["result"] = RunResult(
        scenario=scenario.name,
        seed=seed,
        outcomes=outcomes,
        violations=violations,
        trace=log.records,
        final=final,
        stalled=stalls > 0,
        end_time=clock.now(),
        ties=clock.ties,
        scheduling=clock.scheduling,
        warnings=warnings,
    )


def check_expectations(scenario: Scenario, result: RunResult) -> list[str]:
    """Every expectation of ``scenario`` that ``result`` does not meet, in words."""
    failures = list(result.violations)
    outs = result.outcomes
    for e in scenario.expect:
        failures += _check_expect(e, outs)
    for first, then in scenario.order:
        a, b = outs[first], outs[then]
        if not (a.ended < b.ended or (a.ended == b.ended and _end_seq(result, first) < _end_seq(result, then))):
            failures.append(f"order: {first} (ended {a.ended}) should end before {then} (ended {b.ended})")
    for model, expected in scenario.final.items():
        got = result.final.get(model, {})
        for key, value in expected.items():
            if not _matches(value, got.get(key)):
                failures.append(f"final {model}.{key} = {got.get(key)!r}, expected {value!r}")
    return failures


def _check_expect(e: Expect, outs: dict[str, ActionOutcome]) -> list[str]:
    """What one action's expectation finds wrong."""
    failures = []
    o = outs[e.id]
    if e.outcome is not None and o.outcome not in e.outcome:
        failures.append(f"{e.id}: outcome {o.outcome} ({o.reason}: {o.message}), expected {' or '.join(e.outcome)}")
    if e.reason is not None and o.outcome != "ok" and o.reason not in e.reason:
        failures.append(f"{e.id}: reason {o.reason!r}, expected {' or '.join(map(repr, e.reason))}")
    if e.message is not None and e.message not in o.message:
        failures.append(f"{e.id}: message {o.message!r} lacks {e.message!r}")
    if e.revision is not None:
        revisions = _revisions(o.result)
        if revisions != {e.revision}:
            failures.append(f"{e.id}: ran on revision(s) {sorted(revisions)}, expected {e.revision!r}")
    if e.granted_at is not None and not _matches(e.granted_at, o.granted):
        failures.append(f"{e.id}: granted at {o.granted}, expected {e.granted_at!r}")
    got = o.result if isinstance(o.result, dict) else {}
    if e.result is not None:
        for key, value in e.result.items():
            if not _matches(value, got.get(key)):
                failures.append(f"{e.id}: result {key} = {got.get(key)!r}, expected {value!r}")
    for key in e.null:
        if key not in got or got[key] is not None:
            failures.append(f"{e.id}: result {key} = {got.get(key, '<missing>')!r}, expected null")
    for other in e.session_distinct_from:
        if _sessions(o.result) & _sessions(outs[other].result):
            failures.append(f"{e.id} and {other} ran on the same session")
    for other in e.session_same_as:
        mine, theirs = _sessions(o.result), _sessions(outs[other].result)
        if not mine or mine != theirs:
            failures.append(f"{e.id} ran on session(s) {sorted(mine)}, {other} on {sorted(theirs)}: expected the same")
    return failures


def _is_range(value: Any) -> bool:
    return isinstance(value, dict) and bool(value) and set(value) <= {"min", "max"}


def _matches(expected: Any, got: Any) -> bool:
    """``got`` meets ``expected``: a range, a subset of a dict, a list (rows with ids matched
    by id, others element by element), or an equal value (tuples and lists alike)."""
    if _is_range(expected):
        if isinstance(got, bool) or not isinstance(got, int | float):
            return False
        return bool(expected.get("min", got) <= got <= expected.get("max", got))
    if isinstance(expected, dict):
        return isinstance(got, dict) and all(_matches(v, got.get(k)) for k, v in expected.items())
    if isinstance(expected, list | tuple):
        if not isinstance(got, list | tuple):
            return False
        if expected and all(isinstance(x, dict) and "id" in x for x in expected):
            rows = {r.get("id"): r for r in got if isinstance(r, dict)}
            return all(_matches(x, rows.get(x["id"])) for x in expected)
        return len(expected) == len(got) and all(_matches(x, g) for x, g in zip(expected, got, strict=True))
    if isinstance(expected, bool) or isinstance(got, bool):
        return expected is got
    return bool(expected == got)


def _end_seq(result: RunResult, action_id: str) -> int:
    for r in result.trace:
        if r.event == "action_end" and r.args.get("id") == action_id:
            return r.seq
    return 1 << 60


def _revisions(result: Any) -> set[str]:
    if isinstance(result, dict):
        return {str(result["revision"])} if "revision" in result else set()
    if isinstance(result, list):
        return set().union(*(_revisions(r) for r in result)) if result else set()
    return set()


def _sessions(result: Any) -> set[int]:
    if isinstance(result, dict):
        return {int(result["session"])} if "session" in result else set()
    if isinstance(result, list):
        return set().union(*(_sessions(r) for r in result)) if result else set()
    return set()
