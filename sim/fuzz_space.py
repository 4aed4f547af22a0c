"""The fuzzer's search space: Hypothesis strategies for small random scenarios.

One or two fake models (slots, durations, slow teardowns, load, null-primary
and clone faults, memory estimates, lazy or eager, batched or one session per
lease) on either runtime, every runtime knob (busy timeouts including 0,
``max_loaded_models``, a memory budget, ``max_queue``, ``idle_unload_ms``), and
a timeline of every action kind: requests (some failing, on a batched model
some at a step, on another some run in steps with stop points between them),
streams (some read slowly), batches, loads, unloads, reconfigurations and
registrations with any spec field (a new id with its own load time and
faults), faults changed on the fly, shutdowns, status probes, bulk unloads and
disconnects (at a time, or every client of a model at its load end). The
drawn seed also picks the scheduling mode. docs/simulator.md lists the values.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hypothesis import strategies as st

from sim.scenario import Action, ModelDef, Scenario

MODEL_IDS = ("a", "b")
NEW_ID = "c"  # registered at run time only (requests, unloads and status probes may name it first)
TIMES = (0.0, 0.5, 1.0, 0.25, 1.5, 2.0, 3.0, 4.0, 6.0)
DURATIONS = (5.0, 1.0, 0.2, 3.0)
STEPS = (1, 1, 4)  # a request's run in this many steps, a stop point between two
REQUEST_TIMEOUTS = (None, 100, 1000, 0)
KINDS = (
    "request",
    "request",
    "unload",
    "stream",
    "batch",
    "load",
    "reconfigure",
    "bulk_unload",
    "disconnect",
    "register",
    "fault",
    "shutdown",
    "status",
)
WORK = frozenset({"request", "stream", "batch"})
ADMITTED = WORK | {
    "load",
    "unload",
    "reconfigure",
    "register",
}  # refused busy (shutting_down) once shutdown began
MAY_NAME_NEW = frozenset(
    {"request", "unload", "register", "status"}
)  # kinds sim.scenario lets name an unknown id
FAULTS = (
    {"fail_loads": 1},
    {"null_primary": 1},
    {"fail_clone_at": 1},
    {"fail_clone_at": 0},
    {"close_time": 1.0},
)
RUNTIMES = ("parallel", "parallel", "parallel", "original")
MEMORY = (0, 0, 100, 200)
CONFIG_CHOICES = (  # every knob the runtime reads (0 / None: off)
    ("max_loaded_models", (0, 1, 2)),
    ("memory_budget", (0, 0, 300)),
    ("max_queue", (None, None, 1, 2)),
    ("idle_unload_ms", (0, 0, 1000, 2000)),
)
SPEC_CHOICES = (
    ("slots", (1, 2, 3)),
    ("path", ("rev1", "rev2")),
    ("capacity", (1, 4)),
    ("lazy", (True, False)),
    ("busy_timeout_ms", (0, 500, 60_000)),
    ("memory_bytes", MEMORY),
)
NEW_FAULTS: tuple[dict[str, int], ...] = (
    {},
    {},
    {"fail_loads": 1},
    {"null_primary": 1},
    {"fail_clone_at": 1},
)
MAX_ACTIONS = 12
MAX_WRITTEN = 10  # actions in a written finding, status probes included
PROBE_DELAY = 0.001  # virtual seconds after a violation that a status probe looks
PROBE_SEEDS = 16  # seeds tried for a probed finding


@st.composite
def _model(draw: st.DrawFn, mid: str, original: bool) -> ModelDef:
    script: dict[str, Any] = {}
    load_time = draw(st.sampled_from((0.5, 2.0)))
    close_time = draw(st.sampled_from((0.01, 1.0)))
    fault = draw(
        st.sampled_from(
            (None, None, None, "fail_loads", "fail_loads", "null_primary", "fail_clone_at")
        )
    )
    if load_time != 0.5:
        script["load_time"] = load_time
    if close_time != 0.01:
        script["close_time"] = close_time
    lazy = draw(st.booleans())
    if fault is not None and lazy:  # an eager load failure aborts the start-up, not a scenario
        script[fault] = 1
    batching = draw(st.sampled_from((False, False, False, True)))
    return ModelDef(
        id=mid,
        batching=batching,
        slots=1
        if original
        else draw(st.integers(1, 3)),  # the original runtime has one session a model
        busy_timeout_ms=draw(st.sampled_from((None, 1000, 500, 0))),
        memory_bytes=draw(st.sampled_from(MEMORY)),
        lazy=lazy,
        script=script,
    )


@st.composite
def _spec_fields(draw: st.DrawFn, new_id: bool) -> dict[str, Any]:
    """What a register or reconfigure may set: pool fields (slots, path, capacity) and
    operational ones (lazy, busy_timeout_ms, memory_bytes); a new id's timings and faults."""
    params: dict[str, Any] = {}
    for key, values in SPEC_CHOICES:
        if draw(st.booleans()):
            params[key] = draw(st.sampled_from(values))
    if new_id and draw(st.booleans()):
        params["script"] = {
            "load_time": draw(st.sampled_from((0.5, 2.0))),
            **draw(st.sampled_from(NEW_FAULTS)),
        }
    return params


@st.composite
def _action(
    draw: st.DrawFn, n_models: int, kinds: Sequence[str], batched: frozenset[str] = frozenset()
) -> tuple[float, str, str, dict[str, Any], int]:
    at = draw(st.sampled_from(TIMES))
    do = draw(st.sampled_from(kinds))
    known = MODEL_IDS[:n_models]
    named = (*known, NEW_ID) if do in MAY_NAME_NEW else known
    model = named[draw(st.integers(0, len(named) - 1))]
    params: dict[str, Any] = {}
    target = 0
    if do in WORK:
        timeout = draw(st.sampled_from(REQUEST_TIMEOUTS))
        if timeout is not None:
            params["timeout_ms"] = timeout
        if do == "stream":
            params["chunks"] = draw(st.integers(1, 3))
            params["chunk_time"] = draw(st.sampled_from((0.2, 1.0)))
            if model in batched and draw(st.booleans()):
                params["read_time"] = 1.0  # a slow reader (what batching must survive)
                params["chunks"] = draw(st.sampled_from((3, 12)))  # long: it must be held
        else:
            params["duration"] = draw(st.sampled_from(DURATIONS))
        if do == "batch":
            params["count"] = draw(st.integers(1, 3))
        if do == "request" and draw(st.sampled_from((False, False, False, True))):
            failure = draw(st.sampled_from(("fail", "fail_step"))) if model in batched else "fail"
            params[failure] = True
        if do == "request" and model not in batched:
            steps = draw(st.sampled_from(STEPS))
            if steps > 1:
                params["steps"] = steps  # stop points between steps (core.stopping)
    elif do in ("reconfigure", "register"):  # explicit slots are refused on the original runtime
        params.update(draw(_spec_fields(model == NEW_ID)))
    elif do == "fault":
        params["set"] = dict(draw(st.sampled_from(FAULTS)))
    elif do == "status":
        model = draw(st.sampled_from(("", model)))
    elif do == "shutdown":
        model = ""
    elif do == "bulk_unload":
        model = ""
        ids = draw(st.none() | st.lists(st.sampled_from(known), min_size=1, unique=True))
        if ids is not None:
            params["ids"] = ids
    elif do == "disconnect":
        target = draw(st.integers(0, MAX_ACTIONS - 1))
        if draw(st.booleans()):  # armed from the start: every client of the model leaves
            params["on"] = (
                "load_end"  # in the step its load ends (clients giving up on a slow load)
            )
            at = 0.0
        else:
            model = ""
    return at, do, model, params, target


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    """Small random scenarios (see the module docstring for the space)."""
    config: dict[str, Any] = {}
    runtime = draw(st.sampled_from(RUNTIMES))
    if runtime != "parallel":
        config["runtime"] = runtime
    n_models = draw(st.integers(1, 2))
    models = tuple(draw(_model(MODEL_IDS[i], runtime == "original")) for i in range(n_models))
    busy = draw(st.sampled_from((0, 1000, 3000)))
    if busy:
        config["busy_timeout_ms"] = busy
    for key, values in CONFIG_CHOICES:
        value = draw(st.sampled_from(values))
        if value:
            config[key] = value
    batched = frozenset(m.id for m in models if m.batching)
    drawn = draw(st.lists(_action(n_models, KINDS, batched), min_size=1, max_size=MAX_ACTIONS))
    drawn.sort(key=lambda a: a[0])
    ids = [f"{do}{i}" for i, (_, do, _, _, _) in enumerate(drawn)]
    actions = []
    for i, (at, do, model, params, target) in enumerate(drawn):
        if do == "disconnect" and "on" not in params:
            others = [x for j, x in enumerate(ids) if j != i]
            if not others:
                continue
            params = {"target": others[target % len(others)]}
        actions.append(Action(at, do, ids[i], model, params))
    seed = draw(st.integers(0, 7))
    return Scenario(name="fuzz", config=config, models=models, actions=tuple(actions), seed=seed)
