"""Checking a run against its scenario: outcomes, orders, results, final counters.

The format of each expectation is documented in :mod:`sim.scenario`; this
module is the one place that decides whether a :class:`~sim.outcomes.RunResult`
meets them. A failed expectation is a sentence naming the action and what was
seen against what was expected.
"""

from __future__ import annotations

from typing import Any

from sim.outcomes import ActionOutcome, RunResult
from sim.scenario import Expect, Scenario


def check_expectations(scenario: Scenario, result: RunResult) -> list[str]:
    """Every expectation of ``scenario`` that ``result`` does not meet, in words."""
    failures = list(result.violations)
    outs = result.outcomes
    for e in scenario.expect:
        failures += _check_expect(e, outs)
    for first, then in scenario.order:
        a, b = outs[first], outs[then]
        if not (
            a.ended < b.ended
            or (a.ended == b.ended and result.end_seq(first) < result.end_seq(then))
        ):
            failures.append(
                f"order: {first} (ended {a.ended}) should end before {then} (ended {b.ended})"
            )
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
        failures.append(
            f"{e.id}: outcome {o.outcome} ({o.reason}: {o.message}), expected "
            f"{' or '.join(e.outcome)}"
        )
    if e.reason is not None and o.outcome != "ok" and o.reason not in e.reason:
        failures.append(f"{e.id}: reason {o.reason!r}, expected {' or '.join(map(repr, e.reason))}")
    if e.message is not None and e.message not in o.message:
        failures.append(f"{e.id}: message {o.message!r} lacks {e.message!r}")
    if e.revision is not None:
        revisions = _revisions(o.result)
        if revisions != {e.revision}:
            failures.append(
                f"{e.id}: ran on revision(s) {sorted(revisions)}, expected {e.revision!r}"
            )
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
            failures.append(
                f"{e.id} ran on session(s) {sorted(mine)}, {other} on {sorted(theirs)}: expected "
                "the same"
            )
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
        return len(expected) == len(got) and all(
            _matches(x, g) for x, g in zip(expected, got, strict=True)
        )
    if isinstance(expected, bool) or isinstance(got, bool):
        return expected is got
    return bool(expected == got)


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
