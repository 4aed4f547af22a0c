"""Playing a scenario's timeline: each action is a client task at its virtual time.

:class:`ActionPlayer` owns what the clients share: the runtime they call, the
fake provider (scripts, event hooks), each action's cancel scope (a
``disconnect`` cancels it) and each action's :class:`~sim.outcomes.ActionOutcome`.
One method per action kind; :meth:`ActionPlayer.perform` turns what the call
raised into an outcome and records the action's start and end in the trace.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio

from core.events import TraceRecord
from core.policy import Invalid, RuntimeKind, validate_slots_for_runtime
from server.runtime import BusyError, InvalidRequestError, ModelSpec, NotFoundError, Runtime
from server.runtime.tracing import TraceLog
from sim.clock import SimClock
from sim.fakes import FakeProvider, FakeScript, Reader
from sim.outcomes import ActionOutcome
from sim.scenario import Action, Scenario

SPEC_FIELDS = (
    "slots",
    "path",
    "capacity",
    "lazy",
    "busy_timeout_ms",
    "memory_bytes",
    "task",
    "mode",
    "family",
    "batching",
)
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
            batching=base.batching,
        )
    if capacity is not None:
        overrides["session_options"] = {"capacity": int(capacity)}
    return attrs.evolve(spec, **overrides)


class ActionPlayer:
    """The clients of one run: performs actions against the runtime and records their outcomes."""

    def __init__(
        self,
        scenario: Scenario,
        rt: Runtime,
        provider: FakeProvider,
        scripts: dict[str, FakeScript],
        clock: SimClock,
        log: TraceLog,
    ) -> None:
        self.scenario = scenario
        self.rt = rt
        self.provider = provider
        self.scripts = scripts
        self.clock = clock
        self.log = log
        self.outcomes = {a.id: ActionOutcome(a.id, a.do) for a in scenario.actions}
        self.targets = {a.id: a.model for a in scenario.actions}
        self.scopes: dict[str, trio.CancelScope] = {}
        self.doomed: set[str] = set()  # disconnected before they started
        self.kinds: dict[str, Callable[[Action], Awaitable[Any]]] = {
            "request": self.request,
            "stream": self.stream,
            "batch": self.batch,
            "load": self.load,
            "unload": self.unload,
            "reconfigure": self.reconfigure,
            "register": self.reconfigure,
            "bulk_unload": self.bulk_unload,
            "disconnect": self.disconnect,
            "shutdown": self.shutdown,
            "status": self.status,
            "fault": self.fault,
        }

    def pending(self) -> list[str]:
        return [o.id for o in self.outcomes.values() if o.outcome == "pending"]

    async def perform(self, action: Action) -> None:
        """Wait for the action's time, run it as a client, record what it saw."""
        out = self.outcomes[action.id]
        await self.clock.sleep_until(action.at)
        out.started = self.clock.now()
        self.log(
            TraceRecord(
                0,
                self.clock.now(),
                action.model,
                "action",
                {"id": action.id, "do": action.do, **dict(action.params)},
            )
        )
        with trio.CancelScope() as scope:
            self.scopes[action.id] = scope
            if action.id in self.doomed:
                scope.cancel()
            try:
                out.result = await self.kinds[action.do](action)
                out.outcome = "ok"
            except BusyError as exc:
                out.outcome, out.reason, out.message = "busy", exc.reason.value, exc.message
            except NotFoundError as exc:
                out.outcome, out.reason, out.message = "not_found", exc.reason.value, exc.message
            except InvalidRequestError as exc:
                out.outcome, out.reason, out.message = "invalid", exc.reason.value, exc.message
            except Exception as exc:
                out.outcome, out.reason, out.message = (
                    "error",
                    getattr(getattr(exc, "reason", None), "value", ""),
                    str(exc),
                )
        if scope.cancelled_caught:
            out.outcome = "cancelled"
        out.ended = self.clock.now()
        self.log(
            TraceRecord(
                0,
                self.clock.now(),
                action.model,
                "action_end",
                {"id": action.id},
                out.outcome,
                out.reason,
            )
        )

    # ------------------------------------------------------------ work
    def _duration(self, a: Action) -> Any:
        return a.params.get("duration", self.scripts.get(a.model, FakeScript()).run_time)

    async def request(self, a: Action) -> Any:
        req = {"duration": self._duration(a), "fail": a.params.get("fail", False)}
        for key in ("fail_step", "steps"):
            if key in a.params:
                req[key] = a.params[key]
        async with self.rt.acquire(a.model, a.params.get("timeout_ms")) as held:
            self.outcomes[a.id].granted = held.lease.granted_at
            self.outcomes[a.id].running = self.clock.now()
            return await self.rt.run_on(held, req)

    async def stream(self, a: Action) -> Any:
        req: dict[str, Any] = {
            k: a.params[k] for k in ("chunks", "chunk_time", "fail_step") if k in a.params
        }
        req["reader"] = reader = Reader(a.id)
        read_time = float(a.params.get("read_time", 0.0))
        got = []
        async with self.rt.open_stream(a.model, req, a.params.get("timeout_ms")) as chunks:
            async for chunk in chunks:
                reader.taken += 1
                if read_time > 0:
                    await self.clock.sleep_until(self.clock.now() + read_time)
                got.append(chunk)
        return got

    async def batch(self, a: Action) -> Any:
        item = {"duration": self._duration(a), "steps": a.params.get("steps", 1)}
        async with self.rt.acquire(a.model, a.params.get("timeout_ms")) as held:
            self.outcomes[a.id].granted = held.lease.granted_at
            return await self.rt.batch_on(held, [item] * int(a.params.get("count", 2)))

    # ------------------------------------------------------- management
    async def load(self, a: Action) -> Any:
        return await self.rt.load_model(a.model)

    async def unload(self, a: Action) -> Any:
        return await self.rt.unload(a.model)

    async def reconfigure(self, a: Action) -> Any:
        """``register`` and ``reconfigure``: any spec field; a new id may bring its script."""
        p = a.params
        kind = self.rt.config.kind
        if "slots" in p and kind is RuntimeKind.ORIGINAL:
            # the process-level rule (the HTTP layer's); slot ranges are the runtime's own check
            check = validate_slots_for_runtime(kind, p["slots"])
            if isinstance(check, Invalid):
                raise InvalidRequestError(check.reason, check.message)
        overrides = {k: p[k] for k in SPEC_FIELDS if k in p}
        if (
            "script" in p and a.model not in self.scripts
        ):  # a runtime-registered model's timings and faults
            self.scripts[a.model] = self.provider.scripts[a.model] = FakeScript.from_mapping(
                p["script"]
            )
        spec = model_spec(self.scenario, a.model, **overrides)
        changed = await (
            self.rt.register(spec) if a.do == "register" else self.rt.reconfigure(spec)
        )
        return {"reconfigured": changed}

    async def bulk_unload(self, a: Action) -> Any:
        result = await self.rt.bulk_unload(a.params.get("ids"))
        return {"unloaded": list(result.unloaded), "not_found": list(result.not_found)}

    async def shutdown(self, a: Action) -> Any:
        return await self.rt.shutdown()

    async def status(self, a: Action) -> Any:
        rows = [self.rt.status_of(a.model)] if a.model else self.rt.status()
        dicts = [attrs.asdict(row) for row in rows]
        return dicts[0] if a.model else {"models": dicts}

    async def fault(self, a: Action) -> Any:
        script = self.provider.script(a.model)
        for k, v in dict(a.params.get("set", {})).items():
            setattr(script, k, v)
        return None

    # ------------------------------------------------------ disconnects
    async def disconnect(self, a: Action) -> Any:
        p = a.params
        if "target" not in p:  # every client of the model leaves when the event comes
            self.provider.on_next(a.model, str(p["on"]), lambda: self.leave_all(a.model))
        elif "on" in p:  # later, in the very step the target's model reaches that event
            self.arm_leave(str(p["target"]), str(p["on"]))
        else:
            self.leave(str(p["target"]))
        return None

    def arm_leave(self, target: str, event: str) -> None:
        """The target leaves at the first ``event`` of its model once it has started."""

        def fire() -> None:
            if target in self.scopes:
                self.cancel(target)
            elif (
                self.outcomes[target].outcome == "pending"
            ):  # not started yet: wait for the next one
                self.arm_leave(target, event)

        self.provider.on_next(self.targets[target], event, fire)

    def leave_all(self, model: str) -> None:
        for action_id in self.scopes:
            if self.targets[action_id] == model and self.outcomes[action_id].outcome == "pending":
                self.cancel(action_id)

    def leave(self, target: str) -> None:
        if target in self.scopes:
            self.cancel(target)
        else:
            self.doomed.add(target)

    def cancel(self, action_id: str) -> None:
        """The client of a started action leaves: its scope is cancelled (the first time noted
        in its outcome's ``left``)."""
        out = self.outcomes[action_id]
        if math.isnan(out.left) and out.outcome == "pending":
            out.left = self.clock.now()
        self.scopes[action_id].cancel()
