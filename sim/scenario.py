"""Scenario files: models, a timeline of actions, and expectations (TOML).

A scenario is data: it can be written by hand from a race report, produced by
the fuzzer when it shrinks a failure, and run by ``voxpool sim run``. Format::

    name = "overdue rejection while an unload waits"
    description = "why this scenario exists"
    scheduling = "together"     # optional: one_at_a_time | together; omitted,
                                # the seed chooses (sim.clock.Scheduling)

    [config]                    # runtime settings (all optional)
    busy_timeout_ms = 0         # server ceiling; 0 = unbounded
    max_loaded_models = 0
    memory_budget = 0
    max_queue = 8               # optional request queue bound
    idle_unload_ms = 0
    runtime = "parallel"        # or "original": reconfigure/register with
                                # an explicit slots is then refused (§8.9)

    [[models]]                  # one table per fake model
    id = "m"
    slots = 2
    busy_timeout_ms = 300       # optional model ceiling
    memory_bytes = 0
    lazy = true                 # false: loaded at start
    path = "rev1"               # the revision its runs report
    batching = false            # true: requests and streams run as members of
                                # the model's batched engine (one decode task)
    # any FakeScript field: capacity, load_time, create_time, clone_time,
    # close_time, release_time, run_time, chunk_time, chunks, fail_loads,
    # null_primary, fail_clone_at, interfaces, step_time (one batched
    # step), member_step_time (added per member of a step)

    [[actions]]                 # the timeline, by virtual time
    at = 0.0
    do = "request"              # request | stream | batch | load | unload |
                                # reconfigure | register | bulk_unload |
                                # disconnect | shutdown | fault | status
    id = "r1"                   # names the action for expectations
    model = "m"
    duration = 5.0              # request/batch item run time
    timeout_ms = 15             # request busy_timeout_ms override
    fail = false                # the run raises
    steps = 4                   # request/batch: the run in 4 equal steps with a
                                # stop point between two (core.stopping): a
                                # cancelled run ends at the next one
    chunks = 3                  # stream: chunk count
    chunk_time = 0.2            # stream: time per chunk
    read_time = 0.5             # stream: the client's pause before reading
                                # each chunk (a slow reader)
    fail_step = 2               # batched request/stream: fails at its 2nd step
    count = 2                   # batch: items
    slots = 2                   # reconfigure/register: new slot count
    path = "rev2"               # reconfigure/register: new revision
    capacity = 4                # reconfigure/register: advertised capacity
    ids = ["a", "b"]            # bulk_unload selection (omit: all)
    target = "r1"               # disconnect: the action whose client leaves
    on = "load_end"             # disconnect: not at once, but in the step where the
                                # target's model next finishes loading its weights
                                # (or fails to) after the target started, before
                                # the runtime sees the outcome; with a model and no
                                # target, every started, unfinished action on that
                                # model leaves at its next load end
    set = { fail_loads = 1 }    # fault: FakeScript fields to change on model
                                # status: reads the model's /v1/models row at
                                # once (never waits); its result is that row
                                # (state, loaded, slots, active_slots,
                                # queued_requests, queued_management,
                                # max_parallel_slots, generation); without
                                # a model: { models = [every row] }

    [[expect]]                  # per-action outcome
    id = "r1"
    outcome = "ok"              # ok | busy | error | not_found | invalid | cancelled,
                                # or a list: any of them (["ok", "busy"])
    reason = "slots_overdue"    # core reason code, or a list (optional; checked
                                # only when the outcome is not ok)
    message = "slots exceeded"  # substring of the error message (optional)
    revision = "rev1"           # the revision the run reported (optional)
    session_distinct_from = ["r2"]  # ran on a different session than these
    session_same_as = ["r0"]        # ran on the same session as these
    granted_at = 2.0            # request/batch: when its lease was granted, or
                                # a range { min = 1.0, max = 2.0 }
    result = { loaded = false }     # subset of the action's result: a status row,
                                    # { models = [{ id = "a", loaded = true }] }
                                    # (rows matched by id), a bulk_unload's
                                    # unloaded/not_found, a register's or
                                    # reconfigure's { reconfigured = false };
                                    # a value may be a range { min = 1, max = 3 }
    null = ["max_parallel_slots"]   # result keys that must be null (None)

    [[order]]                   # completion order constraints
    first = "r1"
    then = "u1"

    [final.m]                   # counters at the end (before shutdown); a value
    loaded = false              # may be a range { min = 1, max = 2 }
    active_slots = 0
    queued_requests = 0
    loads = 1                   # weight loads performed by the fake provider
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

ACTIONS = frozenset(
    {
        "request",
        "stream",
        "batch",
        "load",
        "unload",
        "reconfigure",
        "register",
        "bulk_unload",
        "disconnect",
        "shutdown",
        "fault",
        "status",
    }
)
OUTCOMES = frozenset({"ok", "busy", "error", "not_found", "invalid", "cancelled"})
DISCONNECT_EVENTS = frozenset({"load_end"})
SCHEDULING = frozenset({"one_at_a_time", "together"})
EXPECT_KEYS = frozenset(
    {
        "id",
        "outcome",
        "reason",
        "message",
        "revision",
        "session_distinct_from",
        "session_same_as",
        "granted_at",
        "result",
        "null",
    }
)
MODEL_KEYS = frozenset(
    {
        "id",
        "slots",
        "busy_timeout_ms",
        "memory_bytes",
        "lazy",
        "path",
        "family",
        "task",
        "mode",
        "batching",
    }
)


@attrs.frozen
class ModelDef:
    id: str
    slots: int = 1
    busy_timeout_ms: int | None = None
    memory_bytes: int = 0
    lazy: bool = True
    path: str = ""
    family: str = "fake"
    task: str = "tts"
    mode: str = "offline"
    batching: bool = False
    script: Mapping[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class Action:
    at: float
    do: str
    id: str
    model: str = ""
    params: Mapping[str, Any] = attrs.field(factory=dict)


def _one_or_many(value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    return tuple(str(v) for v in value) if isinstance(value, list | tuple) else (str(value),)


@attrs.frozen
class Expect:
    id: str
    outcome: tuple[str, ...] | None = attrs.field(default=None, converter=_one_or_many)
    reason: tuple[str, ...] | None = attrs.field(default=None, converter=_one_or_many)
    message: str | None = None
    revision: str | None = None
    session_distinct_from: Sequence[str] = ()
    session_same_as: Sequence[str] = ()
    granted_at: Any = None
    result: Mapping[str, Any] | None = None
    null: Sequence[str] = ()


@attrs.frozen
class Scenario:
    name: str
    description: str = ""
    config: Mapping[str, Any] = attrs.field(factory=dict)
    models: Sequence[ModelDef] = ()
    actions: Sequence[Action] = ()
    expect: Sequence[Expect] = ()
    order: Sequence[tuple[str, str]] = ()
    final: Mapping[str, Mapping[str, Any]] = attrs.field(factory=dict)
    seed: int = 0
    scheduling: str | None = None


class ScenarioError(ValueError):
    """A scenario file that does not follow the format."""


def load(path: str | Path) -> Scenario:
    """Parse a scenario file."""
    with open(path, "rb") as f:
        raw = tomllib.load(f)
    return parse(raw, default_name=Path(path).stem)


def parse(raw: Mapping[str, Any], default_name: str = "scenario") -> Scenario:
    """Build a :class:`Scenario` from parsed TOML, with clear errors for mistakes."""
    models = []
    for m in raw.get("models", []):
        if "id" not in m:
            raise ScenarioError("every [[models]] entry needs an id")
        known = {k: v for k, v in m.items() if k in MODEL_KEYS}
        script = {k: v for k, v in m.items() if k not in MODEL_KEYS}
        models.append(ModelDef(**known, script=script))
    ids = {m.id for m in models}
    actions = []
    for i, a in enumerate(raw.get("actions", [])):
        do = a.get("do")
        if do not in ACTIONS:
            raise ScenarioError(f"action {i}: 'do' must be one of {sorted(ACTIONS)}, got {do!r}")
        model = a.get("model", "")
        if (
            do
            in {"request", "stream", "batch", "load", "unload", "reconfigure", "register", "fault"}
            and not model
        ):
            raise ScenarioError(f"action {i} ({do}) needs a model")
        if model and model not in ids and do not in {"register", "request", "unload", "status"}:
            raise ScenarioError(f"action {i}: unknown model {model!r}")
        params = {k: v for k, v in a.items() if k not in {"at", "do", "id", "model"}}
        actions.append(
            Action(float(a.get("at", 0.0)), do, str(a.get("id", f"{do}{i}")), model, params)
        )
    names = [a.id for a in actions]
    for a in actions:
        if a.do == "disconnect" and a.params.get("on", "load_end") not in DISCONNECT_EVENTS:
            raise ScenarioError(f"action {a.id}: 'on' must be one of {sorted(DISCONNECT_EVENTS)}")
        if a.do == "disconnect" and "target" not in a.params and not ("on" in a.params and a.model):
            raise ScenarioError(f"action {a.id}: a disconnect needs a target, or a model and 'on'")
        if (
            a.do == "disconnect"
            and "target" in a.params
            and a.params["target"] not in {b.id for b in actions}
        ):
            raise ScenarioError(f"action {a.id}: unknown target {a.params['target']!r}")
    if len(names) != len(set(names)):
        raise ScenarioError("action ids must be unique")
    expect = []
    by_id = {a.id: a for a in actions}
    for e in raw.get("expect", []):
        if e.get("id") not in names:
            raise ScenarioError(f"expectation for unknown action {e.get('id')!r}")
        unknown = set(e) - EXPECT_KEYS
        if unknown:
            raise ScenarioError(f"expectation {e['id']}: unknown keys {sorted(unknown)}")
        outcomes = _one_or_many(e.get("outcome"))
        if outcomes is not None and not set(outcomes) <= OUTCOMES:
            raise ScenarioError(f"outcome must be one of {sorted(OUTCOMES)}")
        if "granted_at" in e and by_id[e["id"]].do not in ("request", "batch"):
            raise ScenarioError(
                f"expectation {e['id']}: granted_at applies to request and batch actions"
            )
        for other in (*e.get("session_distinct_from", ()), *e.get("session_same_as", ())):
            if other not in names:
                raise ScenarioError(f"expectation {e['id']} names an unknown action {other!r}")
        expect.append(
            Expect(
                id=e["id"],
                outcome=outcomes,
                reason=_one_or_many(e.get("reason")),
                message=e.get("message"),
                revision=e.get("revision"),
                session_distinct_from=tuple(e.get("session_distinct_from", ())),
                session_same_as=tuple(e.get("session_same_as", ())),
                granted_at=e.get("granted_at"),
                result=dict(e["result"]) if "result" in e else None,
                null=tuple(e.get("null", ())),
            )
        )
    order = []
    for o in raw.get("order", []):
        if o.get("first") not in names or o.get("then") not in names:
            raise ScenarioError(f"order constraint names an unknown action: {o}")
        order.append((o["first"], o["then"]))
    scheduling = raw.get("scheduling")
    if scheduling is not None and scheduling not in SCHEDULING:
        raise ScenarioError(f"scheduling must be one of {sorted(SCHEDULING)}, got {scheduling!r}")
    return Scenario(
        scheduling=scheduling,
        name=str(raw.get("name", default_name)),
        description=str(raw.get("description", "")),
        config=dict(raw.get("config", {})),
        models=tuple(models),
        actions=tuple(sorted(actions, key=lambda a: a.at)),
        expect=tuple(expect),
        order=tuple(order),
        final={k: dict(v) for k, v in raw.get("final", {}).items()},
        seed=int(raw.get("seed", 0)),
    )


def dump(s: Scenario) -> str:
    """TOML text for ``s``, every section: the one writer of scenario files (the fuzzer
    writes its shrunk findings with it); :func:`parse` reads it back to an equal scenario."""
    lines = [f"name = {_toml(s.name)}", f"description = {_toml(s.description)}", f"seed = {s.seed}"]
    if s.scheduling is not None:
        lines.append(f"scheduling = {_toml(s.scheduling)}")
    lines.append("")
    if s.config:
        lines.append("[config]")
        lines += [f"{k} = {_toml(v)}" for k, v in s.config.items()]
        lines.append("")
    for m in s.models:
        lines += ["[[models]]", f"id = {_toml(m.id)}"]
        for f in attrs.fields(ModelDef):
            value = getattr(m, f.name)
            if f.name not in ("id", "script") and value != f.default and value is not None:
                lines.append(f"{f.name} = {_toml(value)}")
        lines += [f"{k} = {_toml(v)}" for k, v in m.script.items()]
        lines.append("")
    for a in s.actions:
        lines += ["[[actions]]", f"at = {a.at!r}", f"do = {_toml(a.do)}", f"id = {_toml(a.id)}"]
        if a.model:
            lines.append(f"model = {_toml(a.model)}")
        lines += [f"{k} = {_toml(v)}" for k, v in a.params.items()]
        lines.append("")
    for e in s.expect:
        lines += ["[[expect]]", f"id = {_toml(e.id)}"]
        for key in ("outcome", "reason"):
            value = getattr(e, key)
            if value is not None:
                lines.append(f"{key} = {_toml(value[0] if len(value) == 1 else list(value))}")
        for key in ("message", "revision", "granted_at", "result"):
            if getattr(e, key) is not None:
                lines.append(f"{key} = {_toml(getattr(e, key))}")
        for key in ("session_distinct_from", "session_same_as", "null"):
            if getattr(e, key):
                lines.append(f"{key} = {_toml(list(getattr(e, key)))}")
        lines.append("")
    for first, then in s.order:
        lines += ["[[order]]", f"first = {_toml(first)}", f"then = {_toml(then)}", ""]
    for model, counters in s.final.items():
        lines.append(f"[final.{model}]")
        lines += [f"{k} = {_toml(v)}" for k, v in counters.items()]
        lines.append("")
    return "\n".join(lines)


def _toml(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return (
            '"'
            + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
            + '"'
        )
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    if isinstance(v, Mapping):
        return "{ " + ", ".join(f"{k} = {_toml(x)}" for k, x in v.items()) + " }"
    raise ScenarioError(f"cannot write {v!r} as TOML")
