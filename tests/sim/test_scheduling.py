"""The simulator's two scheduling modes, event-triggered disconnects and the richer expectations."""

from __future__ import annotations

import math
from pathlib import Path

import attrs
import pytest

from sim.clock import Scheduling
from sim.runner import check_expectations, run_scenario
from sim.scenario import ScenarioError, dump, load, parse
from tests.mutants.catalogue import MUTANTS

ROOT = Path(__file__).resolve().parents[2]
REPORT_2 = ROOT / "scenarios" / "disconnect_at_first_load_failure.toml"


def _two_waiters(**disconnect: object) -> dict[str, object]:
    """r1 loads 'm' (fails at 1.0), r2 waits for it; a disconnect as given; r3 afterwards."""
    return {
        "models": [
            {
                "id": "m",
                "slots": 2,
                "load_time": 1.0,
                "fail_loads": 1,
                "create_time": 0.0,
                "clone_time": 0.0,
            }
        ],
        "actions": [
            {"at": 0.0, "do": "request", "id": "r1", "model": "m"},
            {"at": 0.5, "do": "request", "id": "r2", "model": "m"},
            {"at": 0.0, "do": "disconnect", "id": "leave", **disconnect},
            {"at": 3.0, "do": "request", "id": "r3", "model": "m"},
        ],
        "expect": [
            {"id": "r3", "outcome": "ok"},
            {"id": "r1", "outcome": "error", "reason": "load_failed"},
        ],
        "final": {"m": {"loaded": True, "state": "ready"}},
    }


def test_one_at_a_time_cannot_reach_report_2_together_can() -> None:
    scenario = load(REPORT_2)
    with MUTANTS["abandoned_initializer_strands"].patch():
        one = attrs.evolve(scenario, scheduling="one_at_a_time")
        assert all(not check_expectations(one, run_scenario(one, seed)) for seed in range(10))
        together = attrs.evolve(scenario, scheduling="together")
        exposed = [
            seed for seed in range(10) if check_expectations(together, run_scenario(together, seed))
        ]
    assert exposed, "same-instant waking interleaves the disconnect with the failing load"
    for seed in range(10):  # the real code passes every interleaving
        assert check_expectations(together, run_scenario(together, seed)) == []


@pytest.mark.parametrize(
    "disconnect", [{"target": "r2", "on": "load_end"}, {"model": "m", "on": "load_end"}]
)
def test_a_disconnect_on_load_end_lands_in_the_failing_step(disconnect: dict[str, str]) -> None:
    """Event-triggered: the waiter leaves inside the step where the load fails, in either mode."""
    scenario = parse(_two_waiters(**disconnect))
    for mode in ("one_at_a_time", "together"):
        s = attrs.evolve(scenario, scheduling=mode)
        result = run_scenario(s, 0)
        assert check_expectations(s, result) == [], mode
        assert result.outcomes["r2"].outcome == "cancelled" and result.outcomes["r2"].ended == 1.0
        with MUTANTS["abandoned_initializer_strands"].patch():
            failures = check_expectations(s, run_scenario(s, 0))
        assert any("invariant 10" in f or "loading" in f for f in failures), (mode, failures)


def test_scheduling_is_reported_and_round_trips() -> None:
    scenario = load(REPORT_2)
    assert scenario.scheduling == "together"
    assert run_scenario(scenario, 5).scheduling is Scheduling.TOGETHER
    assert parse({**_two_waiters(target="r2"), "scheduling": "together"}).scheduling == "together"
    back = parse(__import__("tomllib").loads(dump(scenario)))
    assert back.scheduling == "together" and back.actions == scenario.actions
    with pytest.raises(ScenarioError, match="scheduling"):
        parse({"scheduling": "sometimes"})
    with pytest.raises(ScenarioError, match="needs a target"):
        parse({"models": [{"id": "m"}], "actions": [{"do": "disconnect", "id": "d"}]})


FORMAT = {
    "config": {"memory_budget": 0},
    "models": [{"id": "m", "slots": 1, "lazy": False}, {"id": "n", "slots": 2, "lazy": True}],
    "actions": [
        {"at": 2.0, "do": "request", "id": "a", "model": "m", "duration": 1.0},
        {"at": 2.5, "do": "request", "id": "b", "model": "m", "duration": 1.0},
        {"at": 5.0, "do": "status", "id": "all"},
        {"at": 5.0, "do": "status", "id": "n_row", "model": "n"},
        {"at": 5.5, "do": "register", "id": "same", "model": "m", "slots": 1, "lazy": True},
    ],
}


def _check(**expect: object) -> list[str]:
    s = parse({**FORMAT, "expect": [{"id": "b", **expect}] if expect else []})
    return check_expectations(s, run_scenario(s, 0))


def test_expectation_format_outcome_lists_ranges_and_grant_time() -> None:
    assert _check(outcome=["busy", "ok"]) == []
    assert _check(outcome=["busy", "error"]) != []
    assert _check(granted_at=3.0) == []  # b queues behind a, granted when a ends
    assert _check(granted_at={"min": 2.9, "max": 3.1}) == []
    assert _check(granted_at={"max": 2.5}) != []
    assert _check(session_same_as=["a"]) == []  # one slot: one session
    assert _check(session_distinct_from=["a"]) != []


def _status_check(action: str, **expect: object) -> list[str]:
    s = parse({**FORMAT, "expect": [{"id": action, **expect}]})
    return check_expectations(s, run_scenario(s, 0))


def test_expectation_format_rows_by_id_null_and_non_dict_results() -> None:
    rows = [{"id": "n", "loaded": False}, {"id": "m", "loaded": True, "active_slots": {"max": 0}}]
    assert _status_check("all", result={"models": rows}) == []
    assert _status_check("all", result={"models": [{"id": "n", "loaded": True}]}) != []
    assert _status_check("n_row", null=["max_parallel_slots"]) == []
    assert _status_check("n_row", null=["slots"]) != []
    assert _status_check("n_row", result={"slots": {"min": 2, "max": 2}, "generation": 0}) == []
    assert _status_check("same", result={"reconfigured": False}) == []
    assert _status_check("same", result={"reconfigured": True}) != []
    counters = parse({**FORMAT, "final": {"m": {"loads": {"min": 1, "max": 1}, "loaded": True}}})
    assert check_expectations(counters, run_scenario(counters, 0)) == []
    wrong = parse({**FORMAT, "final": {"m": {"loads": {"min": 2}}}})
    assert check_expectations(wrong, run_scenario(wrong, 0)) != []


def test_actions_before_the_start_up_loads_are_warned_about() -> None:
    s = parse({**FORMAT, "actions": [{"at": 0.0, "do": "request", "id": "early", "model": "m"}]})
    result = run_scenario(s, 0)
    assert len(result.warnings) == 1 and "early" in result.warnings[0]
    assert result.outcomes["early"].started > 0 and not math.isnan(result.outcomes["early"].granted)
    assert run_scenario(parse(FORMAT), 0).warnings == []
