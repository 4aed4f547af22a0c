"""The fuzzer: random workloads against the invariants (docs/reference.md), shrunk to a scenario.

Hypothesis draws small scenarios (the parallel or the original runtime; one
or two fake models with slots, durations, slow teardowns and load, null-primary
and clone faults, memory estimates, lazy or eager; a timeline of requests,
streams, batches, loads, unloads, reconfigurations and registrations of new
or existing ids with any spec field (pool fields and operational ones; a new
id with its own load time and faults), faults changed on the fly, shutdowns,
status probes, bulk unloads and disconnects; every runtime knob: busy
timeouts including 0, ``max_loaded_models``, a memory budget, ``max_queue``,
``idle_unload_ms``; and the scheduling mode, chosen by the drawn seed), runs each with
:func:`sim.runner.run_scenario` under the decision monitors of
:mod:`sim.monitors`, and fails a scenario on any invariant violation, stall,
crash or broken generic expectation (see :func:`generic_failures`).
Hypothesis's own shrinking then reduces the first
failure, and :func:`write` saves it as a scenario file whose expectations make
``voxpool sim run`` fail on the bug.

The search runs in rounds of ``hypothesis.find`` with a wall-clock budget; a
``mutant`` (a context-manager factory) is applied around every run, so tests
can show the fuzzer finds re-introduced historical bugs from scratch.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import random
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
from hypothesis import HealthCheck, Phase, find, settings
from hypothesis import strategies as st
from hypothesis.errors import HypothesisException, NoSuchExample

from sim.monitors import monitored
from sim.runner import RunResult, check_expectations, run_scenario
from sim.scenario import Action, Expect, ModelDef, Scenario, dump, load

Mutant = Callable[[], contextlib.AbstractContextManager[None]]

MODEL_IDS = ("a", "b")
NEW_ID = "c"  # registered at run time only (requests, unloads and status probes may name it first)
TIMES = (0.0, 0.5, 1.0, 0.25, 1.5, 2.0, 3.0, 4.0, 6.0)
DURATIONS = (5.0, 1.0, 0.2, 3.0)
REQUEST_TIMEOUTS = (None, 100, 1000, 0)
KINDS = (
    "request", "request", "unload", "stream", "batch", "load", "reconfigure", "bulk_unload", "disconnect",
    "register", "fault", "shutdown", "status",
)
WORK = frozenset({"request", "stream", "batch"})
ADMITTED = WORK | {"load", "unload", "reconfigure", "register"}  # refused busy (shutting_down) once shutdown began
MAY_NAME_NEW = frozenset({"request", "unload", "register", "status"})  # kinds sim.scenario lets name an unknown id
FAULTS = ({"fail_loads": 1}, {"null_primary": 1}, {"fail_clone_at": 1}, {"fail_clone_at": 0}, {"close_time": 1.0})
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
NEW_FAULTS: tuple[dict[str, int], ...] = ({}, {}, {"fail_loads": 1}, {"null_primary": 1}, {"fail_clone_at": 1})
MAX_ACTIONS = 12
MAX_WRITTEN = 10  # actions in a written finding, status probes included
PROBE_DELAY = 0.001  # virtual seconds after a violation that a status probe looks
PROBE_SEEDS = 16  # seeds tried for a probed finding

# ----------------------------------------------------------------- strategies


@st.composite
def _model(draw: st.DrawFn, mid: str, original: bool) -> ModelDef:
    script: dict[str, Any] = {}
    load_time = draw(st.sampled_from((0.5, 2.0)))
    close_time = draw(st.sampled_from((0.01, 1.0)))
    fault = draw(st.sampled_from((None, None, None, "fail_loads", "fail_loads", "null_primary", "fail_clone_at")))
    if load_time != 0.5:
        script["load_time"] = load_time
    if close_time != 0.01:
        script["close_time"] = close_time
    lazy = draw(st.booleans())
    if fault is not None and lazy:  # an eager load failure aborts the start-up, not a scenario
        script[fault] = 1
    return ModelDef(
        id=mid,
        slots=1 if original else draw(st.integers(1, 3)),  # the original runtime has one session a model
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
        params["script"] = {"load_time": draw(st.sampled_from((0.5, 2.0))), **draw(st.sampled_from(NEW_FAULTS))}
    return params


@st.composite
def _action(draw: st.DrawFn, n_models: int, kinds: Sequence[str]) -> tuple[float, str, str, dict[str, Any], int]:
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
        else:
            params["duration"] = draw(st.sampled_from(DURATIONS))
        if do == "batch":
            params["count"] = draw(st.integers(1, 3))
        if do == "request" and draw(st.sampled_from((False, False, False, True))):
            params["fail"] = True
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
            params["on"] = "load_end"  # in the step its load ends (clients giving up on a slow load)
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
    drawn = draw(st.lists(_action(n_models, KINDS), min_size=1, max_size=MAX_ACTIONS))
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


# --------------------------------------------------------------------- oracle


def generic_failures(s: Scenario, result: RunResult) -> list[str]:
    """Expectations that hold for any scenario, beyond the invariants.

    Every action resolves. On the original runtime an explicit ``slots`` in a
    registration or reconfiguration is invalid. Once a shutdown has started
    (at a strictly earlier virtual time than an action starts), new work and
    management (load, unload, reconfigure, register) are refused busy with
    ``shutting_down``, unless the model is unknown (not found). Before it, a
    request with an unbounded timeout on a model that nothing manages, faults
    or can evict is never refused busy.
    """
    out = []
    for o in result.outcomes.values():
        if o.outcome == "pending":
            out.append(f"{o.id}: never resolved")
    original = s.config.get("runtime", "parallel") == "original"
    # by the virtual time an action really started (start-up loads can delay a timeline)
    shutdown = min((result.outcomes[a.id].started for a in s.actions if a.do == "shutdown"), default=math.inf)
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
                out.append(f"{a.id}: explicit slots on the original runtime not refused ({o.outcome} {o.reason})")
        elif o.started > shutdown and a.do in ADMITTED and o.outcome != "not_found" and got != ("busy", "shutting_down"):
            out.append(f"{a.id}: {o.outcome} ({o.reason}) after shutdown (must be busy shutting_down)")
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
        if a.do in WORK and o.started < shutdown and a.model not in managed and unbounded and o.outcome == "busy":
            out.append(f"{a.id}: busy ({o.reason}) with an unbounded timeout on an unmanaged model")
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


# --------------------------------------------------------------------- search


@attrs.define
class Finding:
    """The outcome of a search: the shrunk scenario and how long it took (None: nothing found)."""

    scenario: Scenario | None
    failures: list[str]
    examples: int
    seconds_to_find: float | None
    seconds: float
    examples_to_find: int | None = None
    path: Path | None = None

    @property
    def found(self) -> bool:
        return self.scenario is not None


def search(
    budget: float = 60.0,
    seed: int = 0,
    mutant: Mutant | None = None,
    *,
    shrink_budget: float | None = None,
    batch: int = 200,
) -> Finding:
    """Generate until a failure or ``budget`` seconds pass, then shrink it (``shrink_budget`` seconds at most).

    Verdicts are cached per scenario, so Hypothesis sees one answer per example
    even when the shrink budget runs out (then the smallest failure so far wins).
    """
    start = time.monotonic()
    stop_generating = start + budget
    shrink_for = budget / 2 if shrink_budget is None else shrink_budget
    first: list[float] = []
    found_after: list[int] = []
    verdicts: dict[str, bool] = {}
    best: list[Scenario] = []
    examples = 0

    def fails(s: Scenario) -> bool:
        nonlocal examples
        key = repr(s)
        if key in verdicts:
            return verdicts[key]
        now = time.monotonic()
        if (not first and now > stop_generating) or (first and now > first[0] + shrink_for):
            return False  # out of time: not run, not cached
        examples += 1
        verdict = verdicts[key] = bool(check(s, mutant)[0])
        if verdict:
            if not first:
                first.append(time.monotonic())
                found_after.append(examples)
            if not best or _size(s) < _size(best[0]):
                best[:] = [s]
        return verdict

    rng = random.Random(seed)
    config = settings(
        max_examples=batch,
        deadline=None,
        database=None,
        phases=[Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
    )
    while time.monotonic() < stop_generating and not best:
        with contextlib.suppress(NoSuchExample, HypothesisException):
            find(scenarios(), fails, settings=config, random=random.Random(rng.getrandbits(64)))
    if not best:
        return Finding(None, [], examples, None, time.monotonic() - start)
    shrunk = best[0]
    failures, _ = check(shrunk, mutant)
    return Finding(shrunk, failures, examples, first[0] - start, time.monotonic() - start, found_after[0])


def _size(s: Scenario) -> tuple[int, int, str]:
    return len(s.actions), sum(len(a.params) for a in s.actions), repr(s)


# ------------------------------------------------------------ writing a finding


def expectations(s: Scenario, mutant: Mutant | None, failures: Sequence[str] = ()) -> Scenario:
    """``s`` with expectations that fail on the bug and hold on the real code.

    With a mutant, the real code's run is the reference: every action's outcome,
    plus whichever end-order, final-counter and distinct-session constraints of
    that run the mutant breaks. When the bug shows only to the decision monitors
    (the outcomes do not change), ``status`` probes are added just after the
    first violation, with the rows the real code shows there. Without a mutant
    (a finding in the real code), the invariant violations already fail
    ``sim run``; broken generic expectations are written as outcomes.
    """
    if mutant is None:
        seen = check(s)[1]
        if seen is None:  # a crash: the file reproduces it as it is
            return s
        flagged = {f.split(":")[0]: f for f in generic_failures(s, seen)}
        expect = [_expected(a, flagged[a.id]) for a in s.actions if a.id in flagged]
        return attrs.evolve(s, expect=tuple(expect))
    merged = _distinguish(s, run_scenario(s), mutant)
    bad = _mutant_run(s, mutant)
    if bad is None or check_expectations(merged, bad):
        return merged
    return _with_probes(s, failures, mutant) or merged


def _expected(a: Action, failure: str) -> Expect:
    """What the real code should have answered to ``a``, given how :func:`generic_failures` flagged it."""
    if "after shutdown" in failure:
        return Expect(a.id, outcome="busy", reason="shutting_down")
    if "original runtime" in failure:
        return Expect(a.id, outcome="invalid", reason="slots_require_parallel")
    return Expect(a.id, outcome="error" if a.params.get("fail") else "ok")


def _mutant_run(s: Scenario, mutant: Mutant) -> RunResult | None:
    """``s`` under the mutant as ``sim run`` sees it, with the livelock guard on (None: crashed)."""
    with mutant():
        try:
            return run_scenario(s, runtime_factory=monitored(checks=False))
        except Exception:
            return None


def _distinguish(s: Scenario, real: RunResult, mutant: Mutant) -> Scenario:
    """Every outcome of the real run, plus the candidate constraints the mutant's run breaks."""
    expect = [Expect(a.id, outcome=real.outcomes[a.id].outcome, reason=real.outcomes[a.id].reason or None) for a in s.actions]
    bad = _mutant_run(s, mutant)
    if bad is not None:
        bad = attrs.evolve(bad, violations=[])  # judge each candidate by its own constraint
    kept = [] if bad is None else [c for c in _candidates(s, real) if check_expectations(c, bad)]
    return attrs.evolve(
        s,
        expect=tuple(expect) + tuple(e for c in kept for e in c.expect),
        order=tuple(o for c in kept for o in c.order),
        final=_merge_final(c.final for c in kept),
    )


def _with_probes(s: Scenario, failures: Sequence[str], mutant: Mutant) -> Scenario | None:
    """``s`` plus a status probe of each implicated model just after the first violation, if that tells.

    Adding client tasks can change how the seeded scheduler orders simultaneous
    events, so the probed scenario is tried under a few seeds and kept only if
    the mutant still breaks an invariant there and the probes see it.
    """
    text = " ".join(failures)
    named = [m.id for m in s.models if f"({m.id})" in text or f"'{m.id}'" in text] or [m.id for m in s.models]
    if len(s.actions) + len(named) > MAX_WRITTEN:
        return None
    for seed in dict.fromkeys([s.seed, *range(PROBE_SEEDS)]):
        base = attrs.evolve(s, seed=seed)
        times = sorted(float(t) for t in re.findall(r"t=(\d+\.\d+)", " ".join(check(base, mutant)[0])))
        if not times:
            continue
        probes = [Action(times[0] + PROBE_DELAY, "status", f"probe_{m}", m) for m in named]
        probed = attrs.evolve(base, actions=tuple(sorted((*s.actions, *probes), key=lambda a: a.at)))
        if check(probed)[0] or not check(probed, mutant)[0]:
            continue
        out = _distinguish(probed, run_scenario(probed), mutant)
        bad = _mutant_run(out, mutant)
        if bad is not None and check_expectations(out, bad):
            return out
    return None


def _candidates(s: Scenario, real: RunResult) -> list[Scenario]:
    """One single-constraint scenario per fact of the real run (each checked alone)."""
    base = attrs.evolve(s, expect=(), order=(), final={})
    out = []
    done = sorted(
        (o for o in real.outcomes.values() if o.outcome != "pending"),
        key=lambda o: (o.ended, _end_seq(real, o.id)),
    )
    for early, late in itertools.pairwise(done):
        if early.ended < late.ended:
            out.append(attrs.evolve(base, order=((early.id, late.id),)))
    for model, counters in real.final.items():
        for key in ("loaded", "loads", "active_slots", "queued_requests", "slots"):
            if key in counters:
                out.append(attrs.evolve(base, final={model: {key: counters[key]}}))
    for a in s.actions:
        row = real.outcomes[a.id].result
        if a.do == "status" and isinstance(row, dict):
            for key in ("state", "loaded", "active_slots", "queued_requests", "queued_management"):
                if key in row:
                    out.append(attrs.evolve(base, expect=(Expect(a.id, result={key: row[key]}),)))
    work = [a for a in s.actions if a.do in WORK and real.outcomes[a.id].outcome == "ok"]
    for i, a in enumerate(work):
        for b in work[i + 1 :]:
            ra, rb = real.outcomes[a.id], real.outcomes[b.id]
            if a.model == b.model and ra.started < rb.ended and rb.started < ra.ended:
                e = Expect(b.id, session_distinct_from=(a.id,))
                probe = attrs.evolve(base, expect=(e,))
                if not check_expectations(probe, real):
                    out.append(probe)
    return out


def _end_seq(result: RunResult, action_id: str) -> int:
    for r in result.trace:
        if r.event == "action_end" and r.args.get("id") == action_id:
            return r.seq
    return 1 << 60


def _merge_final(parts: Any) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for part in parts:
        for model, counters in part.items():
            out.setdefault(model, {}).update(counters)
    return out


def to_toml(s: Scenario) -> str:
    """``s`` as a scenario file: :func:`sim.scenario.dump`, plus the sections it does not write."""
    plain = [attrs.evolve(e, session_distinct_from=()) for e in s.expect]
    text = dump(attrs.evolve(s, expect=tuple(plain))).rstrip("\n") + "\n"
    extra: list[str] = []
    for e in s.expect:
        if e.session_distinct_from:
            extra += ["", "[[expect]]", f"id = {_q(e.id)}", f"session_distinct_from = [{', '.join(_q(x) for x in e.session_distinct_from)}]"]
    if s.order and "[[order]]" not in text:
        for first, then in s.order:
            extra += ["", "[[order]]", f"first = {_q(first)}", f"then = {_q(then)}"]
    if s.final and "[final." not in text:
        for model, counters in s.final.items():
            extra += ["", f"[final.{model}]"]
            extra += [f"{k} = {str(v).lower() if isinstance(v, bool) else repr(v)}" for k, v in counters.items()]
    return text + "\n".join(extra) + ("\n" if extra else "")


def _q(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def write(finding: Finding, out: Path, mutant: Mutant | None = None, label: str = "real") -> Path:
    """Write ``finding`` as ``out/fuzz_<label>_<seed>.toml`` and check that it loads back."""
    assert finding.scenario is not None
    s = expectations(finding.scenario, mutant, finding.failures)
    lines = "\n".join(f"  {f}" for f in finding.failures)
    s = attrs.evolve(
        s,
        name=f"fuzz finding ({label})",
        description=(
            f"Found by 'voxpool sim fuzz' ({label}) after {finding.examples_to_find} examples in "
            f"{finding.seconds_to_find:.1f} s, shrunk to {len(s.actions)} actions.\n"
            f"What the fuzzer saw:\n{lines}\n"
        ),
    )
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"fuzz_{label}_{s.seed}_{len(list(out.glob('fuzz_*.toml')))}.toml"
    path.write_text(to_toml(s))
    back = load(path)
    assert back.actions == s.actions, "the scenario file does not round-trip"
    finding.path = path
    return path


def summary(finding: Finding) -> Sequence[str]:
    """Lines for the console."""
    if not finding.found:
        return [f"no failure in {finding.examples} examples ({finding.seconds:.1f} s)"]
    assert finding.scenario is not None
    return [
        f"failure found after {finding.examples_to_find} examples in {finding.seconds_to_find:.1f} s, "
        f"shrunk to {len(finding.scenario.actions)} actions ({finding.examples} runs, {finding.seconds:.1f} s in all)",
        *(f"  {f}" for f in finding.failures),
    ]
