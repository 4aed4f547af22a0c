"""The fuzzer's oracle: what makes a random scenario a failure.

Any invariant the runner checks, a stall or a crash, the decision monitors of
:mod:`sim.monitors`, or a generic expectation that holds for every scenario
(:func:`generic_failures`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

from sim.fuzz_space import ADMITTED, WORK
from sim.monitors import monitored
from sim.runner import RunResult, run_scenario
from sim.scenario import Scenario

Mutant = Callable[[], contextlib.AbstractContextManager[None]]


def generic_failures(s: Scenario, result: RunResult) -> list[str]:
    """Expectations that hold for any scenario, beyond the invariants.

    Every action resolves. On the original runtime an explicit ``slots`` in a
    registration or reconfiguration is invalid. Once a shutdown has started
    (at a strictly earlier virtual time than an action starts), new work and
    management (load, unload, reconfigure, register) are refused busy with
    ``shutting_down``, unless the model is unknown (not found). Before it, a
    request with an unbounded timeout on a model that nothing manages, faults
    or can evict is never refused busy. A run with stop points whose client left
    ends by its first stop point after that (:func:`late_stops`).
    """
    out = late_stops(s, result)
    for o in result.outcomes.values():
        if o.outcome == "pending":
            out.append(f"{o.id}: never resolved")
    original = s.config.get("runtime", "parallel") == "original"
    # by the virtual time an action really started (start-up loads can delay a timeline)
    shutdown = min(
        (result.outcomes[a.id].started for a in s.actions if a.do == "shutdown"), default=math.inf
    )
    shutdown = math.inf if math.isnan(shutdown) else shutdown
    doomed = {a.params.get("target") for a in s.actions if a.do == "disconnect"}
    leaving = {a.model for a in s.actions if a.do == "disconnect" and "on" in a.params}
    doomed |= {a.id for a in s.actions if a.model in leaving}
    for a in s.actions:
        o = result.outcomes[a.id]
        if o.outcome == "pending" or a.id in doomed:
            continue
        got = (o.outcome, o.reason)
        if original and a.do in ("register", "reconfigure") and "slots" in a.params:
            if got != ("invalid", "slots_require_parallel"):
                out.append(
                    f"{a.id}: explicit slots on the original runtime not refused ({o.outcome} "
                    f"{o.reason})"
                )
        elif (
            o.started > shutdown
            and a.do in ADMITTED
            and o.outcome != "not_found"
            and got != ("busy", "shutting_down")
        ):
            out.append(
                f"{a.id}: {o.outcome} ({o.reason}) after shutdown (must be busy shutting_down)"
            )
    managed: set[str] = set()
    for a in s.actions:
        if a.do in ("unload", "reconfigure", "register", "fault"):
            managed.add(a.model)
        elif a.do == "bulk_unload":
            managed.update(a.params.get("ids", [m.id for m in s.models]))
    if int(s.config.get("max_loaded_models", 0)) or int(s.config.get("memory_budget", 0)):
        return out
    if s.config.get("max_queue") is not None or int(s.config.get("busy_timeout_ms", 0)):
        return out
    ceilings = {m.id: m.busy_timeout_ms or 0 for m in s.models}
    for a in s.actions:
        unbounded = not ceilings.get(a.model, 0) and not a.params.get("timeout_ms")
        o = result.outcomes[a.id]
        if (
            a.do in WORK
            and o.started < shutdown
            and a.model not in managed
            and unbounded
            and o.outcome == "busy"
        ):
            out.append(f"{a.id}: busy ({o.reason}) with an unbounded timeout on an unmanaged model")
    return out


def late_stops(s: Scenario, result: RunResult) -> list[str]:
    """Requests (on a model with a session per lease) run in ``steps`` equal steps with a
    stop point between two (:mod:`core.stopping`): one whose client left while it held
    its lease must end by the first stop point strictly after its departure (or at its
    end), not run on to its end holding the slot."""
    out = []
    batched = {m.id for m in s.models if m.batching}
    for a in s.actions:
        o = result.outcomes[a.id]
        steps = int(a.params.get("steps", 1))
        if a.do != "request" or steps <= 1 or "duration" not in a.params or a.model in batched:
            continue
        if math.isnan(o.left) or math.isnan(o.running) or math.isnan(o.ended):
            continue
        step = float(a.params["duration"]) / steps
        # the first stop point strictly after the departure: one at the very instant may
        # run before the disconnect (ties are the scheduler's), and then the next one stops it
        k = min(steps, max(1, math.floor((o.left - o.running) / step + 1e-9) + 1))
        bound = o.running + k * step
        if o.ended > bound + 1e-6:
            out.append(
                f"{a.id}: ran on after its client left ({o.left:g}; running since "
                f"{o.running:g}) past its stop point at t={bound:.6f} to {o.ended:g} "
                f"('{a.model}')"
            )
    return out


def check(s: Scenario, mutant: Mutant | None = None) -> tuple[list[str], RunResult | None]:
    """Run ``s`` (under ``mutant``) with the monitors; every failure in words."""
    with mutant() if mutant is not None else contextlib.nullcontext():
        try:
            result = run_scenario(s, runtime_factory=monitored())
        except Exception as exc:  # a crash is a finding too
            error: BaseException = exc
            while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
                error = error.exceptions[0]
            return [f"crash: {type(error).__name__}: {error}"], None
    failures = list(result.violations)
    if result.stalled and not any("invariant 10" in f for f in failures):
        failures.append("invariant 10: stalled")
    return failures + generic_failures(s, result), result
