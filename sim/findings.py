"""Writing a fuzzer finding as a scenario file whose expectations fail on the bug.

With a mutant, the real code's run is the reference: every action's outcome,
plus whichever end-order, final-counter and distinct-session constraints of
that run the mutant breaks, and status probes just after the first violation
when the bug shows only to the decision monitors. Without a mutant, the
invariant violations already fail ``sim run``; broken generic expectations are
written as outcomes.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from sim.fuzz_oracle import Mutant, check, generic_failures
from sim.fuzz_space import MAX_WRITTEN, PROBE_DELAY, PROBE_SEEDS, WORK
from sim.monitors import monitored
from sim.runner import RunResult, check_expectations, run_scenario
from sim.scenario import Action, Expect, Scenario, dump, load


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
    """What the real code should have answered to ``a``, given how :func:`generic_failures` flagged
    it."""
    if "after shutdown" in failure:
        return Expect(a.id, outcome="busy", reason="shutting_down")
    if "original runtime" in failure:
        return Expect(a.id, outcome="invalid", reason="slots_require_parallel")
    if "stop point" in failure:  # late_stops: its client left, so it ends cancelled
        return Expect(a.id, outcome="cancelled")
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
    expect = [
        Expect(a.id, outcome=real.outcomes[a.id].outcome, reason=real.outcomes[a.id].reason or None)
        for a in s.actions
    ]
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
    """``s`` plus a status probe of each implicated model just after the first violation, if that
    tells.

    Adding client tasks can change how the seeded scheduler orders simultaneous
    events, so the probed scenario is tried under a few seeds and kept only if
    the mutant still breaks an invariant there and the probes see it.
    """
    text = " ".join(failures)
    named = [m.id for m in s.models if f"({m.id})" in text or f"'{m.id}'" in text] or [
        m.id for m in s.models
    ]
    if len(s.actions) + len(named) > MAX_WRITTEN:
        return None
    for seed in dict.fromkeys([s.seed, *range(PROBE_SEEDS)]):
        base = attrs.evolve(s, seed=seed)
        times = sorted(
            float(t) for t in re.findall(r"t=(\d+\.\d+)", " ".join(check(base, mutant)[0]))
        )
        if not times:
            continue
        probes = [Action(times[0] + PROBE_DELAY, "status", f"probe_{m}", m) for m in named]
        probed = attrs.evolve(
            base, actions=tuple(sorted((*s.actions, *probes), key=lambda a: a.at))
        )
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
        key=lambda o: (o.ended, real.end_seq(o.id)),
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


def _merge_final(parts: Any) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for part in parts:
        for model, counters in part.items():
            out.setdefault(model, {}).update(counters)
    return out


def to_toml(s: Scenario) -> str:
    """``s`` as a scenario file (the one writer: :func:`sim.scenario.dump`)."""
    return dump(s)


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
