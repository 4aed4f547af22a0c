"""The fuzzer: its scenarios are valid and round-trip, its checks see bugs and spare the real
code."""

from __future__ import annotations

import math
import tomllib
from pathlib import Path

import attrs
import pytest
from hypothesis import HealthCheck, Phase, find, given, settings

from server.cli import main as cli_main
from sim.fuzz import (
    MAX_ACTIONS,
    NEW_ID,
    check,
    expectations,
    generic_failures,
    scenarios,
    search,
    to_toml,
)
from sim.monitors import MAX_DECISIONS, MAX_REPEATS, Livelock, Monitor, monitored
from sim.runner import ActionOutcome, RunResult, run_scenario
from sim.scenario import Scenario, load, parse

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = sorted((ROOT / "scenarios").glob("*.toml"))


@settings(max_examples=40, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(scenarios())
def test_generated_scenarios_round_trip_and_pass_on_the_real_code(s: Scenario) -> None:
    assert len(s.actions) <= MAX_ACTIONS
    back = parse(tomllib.loads(to_toml(s)))
    assert back.actions == s.actions and back.models == s.models and back.config == s.config
    assert back.seed == s.seed
    failures, result = check(s)
    assert failures == [], failures
    assert result is not None and all(o.outcome != "pending" for o in result.outcomes.values())


def test_real_code_survives_a_short_search() -> None:
    finding = search(600.0, seed=1, examples=150)
    assert not finding.found, finding.failures
    assert finding.examples == 150  # a budget in runs ends the search, whatever the speed


def test_a_search_in_runs_gives_the_same_finding_in_any_run() -> None:
    """Seed 0 finds the double first load at the same run each time (the budgets in runs
    that tests rely on); its shrink stops within its own budget in runs."""
    from tests.mutants.catalogue import MUTANTS

    mutant = MUTANTS["double_first_load"].patch
    first, again = (
        search(600.0, seed=0, mutant=mutant, examples=500, shrink_examples=30) for _ in range(2)
    )
    assert first.found and again.found
    assert first.examples_to_find == again.examples_to_find
    assert first.examples == again.examples
    assert first.examples_to_find is not None
    assert first.examples <= first.examples_to_find + 30
    assert first.scenario == again.scenario
    missed = search(600.0, seed=0, mutant=mutant, examples=first.examples_to_find - 1)
    assert not missed.found and missed.examples == first.examples_to_find - 1


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_monitors_add_no_violation_and_do_not_perturb_the_trace(path: Path) -> None:
    s = load(path)
    plain = run_scenario(s)
    watched = run_scenario(s, runtime_factory=monitored())
    assert watched.trace_text() == plain.trace_text()
    assert watched.violations == plain.violations


def _result(
    s: Scenario, outcomes: dict[str, str], reasons: dict[str, str] | None = None
) -> RunResult:
    reasons = reasons or {}
    outs = {
        k: ActionOutcome(
            k, "request", outcome=v, reason=reasons.get(k, "queue_timeout" if v == "busy" else "")
        )
        for k, v in outcomes.items()
    }
    for a in s.actions:
        outs[a.id].started = a.at
    return RunResult(s.name, 0, outs, [], [], {}, False, 0.0, 0)


@pytest.mark.parametrize(
    "what",
    ["original", "register_new", "reregister", "fault", "shutdown", "status", "status_all"],
)
def test_search_space_reaches_every_kind(what: str) -> None:
    def has(s: Scenario) -> bool:
        return {
            "original": s.config.get("runtime") == "original"
            and all(m.slots == 1 for m in s.models),
            "register_new": any(a.do == "register" and a.model == NEW_ID for a in s.actions),
            "reregister": any(
                a.do == "register" and a.model == "a" and "slots" in a.params for a in s.actions
            ),
            "fault": any(a.do == "fault" and "null_primary" in a.params["set"] for a in s.actions),
            "shutdown": any(a.do == "shutdown" for a in s.actions)
            and any(a.do == "request" for a in s.actions),
            "status": any(a.do == "status" and a.model for a in s.actions),
            "status_all": any(a.do == "status" and not a.model for a in s.actions),
        }[what]

    cfg = settings(
        max_examples=2000,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    s = find(scenarios(), has, settings=cfg)
    assert check(s)[0] == []


def test_generic_expectations_after_shutdown_and_on_the_original_runtime() -> None:
    s = parse(
        {
            "config": {"runtime": "original"},
            "models": [{"id": "m"}],
            "actions": [
                {"at": 0, "do": "request", "id": "early", "model": "m"},
                {"at": 1, "do": "shutdown", "id": "stop"},
                {"at": 2, "do": "request", "id": "late", "model": "m"},
                {"at": 2, "do": "load", "id": "late_load", "model": "m"},
                {"at": 2, "do": "request", "id": "unknown", "model": "c"},
                {"at": 3, "do": "register", "id": "reg", "model": "c", "slots": 1},
            ],
        }
    )
    base = {
        "early": "ok",
        "stop": "ok",
        "late": "busy",
        "late_load": "busy",
        "unknown": "not_found",
        "reg": "invalid",
    }
    reasons = {
        "late": "shutting_down",
        "late_load": "shutting_down",
        "reg": "slots_require_parallel",
    }
    assert generic_failures(s, _result(s, base, reasons)) == []
    served = generic_failures(s, _result(s, {**base, "late": "ok", "late_load": "ok"}, reasons))
    assert [f.split(":")[0] for f in served] == ["late", "late_load"]
    timed_out = generic_failures(s, _result(s, base, {**reasons, "late": "queue_timeout"}))
    assert [f.split(":")[0] for f in timed_out] == ["late"]
    allowed = generic_failures(
        s, _result(s, {**base, "reg": "busy"}, {**reasons, "reg": "shutting_down"})
    )
    assert [f.split(":")[0] for f in allowed] == ["reg"], (
        "explicit slots on the original runtime are invalid first"
    )
    early_busy = generic_failures(s, _result(s, {**base, "early": "busy"}, reasons))
    assert [f.split(":")[0] for f in early_busy] == ["early"], (
        "before shutdown an unbounded request is served"
    )
    written = expectations(s, None)
    assert written.expect == ()  # the real code passes: nothing to pin


def test_a_late_request_is_refused_after_shutdown_on_the_real_code() -> None:
    s = parse(
        {
            "models": [{"id": "m", "lazy": False}],
            "actions": [
                {"at": 0, "do": "request", "id": "r1", "model": "m", "duration": 2.0},
                {"at": 1, "do": "shutdown", "id": "stop"},
                {"at": 1.5, "do": "register", "id": "reg", "model": NEW_ID},
                {"at": 1.5, "do": "stream", "id": "late", "model": "m"},
            ],
        }
    )
    failures, result = check(s)
    assert failures == [], failures
    assert result is not None
    assert (result.outcomes["reg"].outcome, result.outcomes["reg"].reason) == (
        "busy",
        "shutting_down",
    )
    assert result.outcomes["r1"].outcome == "ok", "work admitted before shutdown drains"


def test_generic_expectations() -> None:
    s = parse(
        {
            "models": [{"id": "m"}],
            "actions": [
                {"at": 0, "do": "request", "id": "r1", "model": "m"},
                {"at": 0, "do": "request", "id": "r2", "model": "m", "timeout_ms": 100},
                {"at": 0, "do": "request", "id": "r3", "model": "m"},
            ],
        }
    )
    failures = generic_failures(s, _result(s, {"r1": "busy", "r2": "busy", "r3": "pending"}))
    assert any(f.startswith("r1: busy") for f in failures), "unbounded wait refused busy"
    assert not any(f.startswith("r2") for f in failures), "a bounded request may time out"
    assert any(f.startswith("r3: never resolved") for f in failures)
    managed = parse(
        {
            **{"models": [{"id": "m"}]},
            "actions": [
                {"at": 0, "do": "request", "id": "r1", "model": "m"},
                {"at": 0, "do": "unload", "id": "u", "model": "m"},
            ],
        }
    )
    assert generic_failures(managed, _result(managed, {"r1": "busy", "u": "ok"})) == []


def test_a_departure_on_a_stop_point_may_stop_at_the_next_one() -> None:
    """r1 runs 1 s in four steps from t=1; its client leaves at t=1.5, the very instant of a
    stop point. The scheduler orders the tie either way (the step's wake-up first: the flag
    is still down there, and the run stops at 1.75), and neither order is a late stop; the
    mutant that ignores the flag is flagged under every seed."""
    s = parse(
        {
            "models": [{"id": "m", "lazy": False}],
            "actions": [
                {"at": 1.0, "do": "request", "id": "r1", "model": "m", "duration": 1.0, "steps": 4},
                {"at": 1.5, "do": "disconnect", "id": "leave", "target": "r1"},
            ],
        }
    )
    from tests.mutants.catalogue import MUTANTS

    ends = set()
    for seed in range(24):
        seeded = attrs.evolve(s, seed=seed)
        failures, result = check(seeded)
        assert failures == [], (seed, failures)
        assert result is not None
        ends.add(result.outcomes["r1"].ended)
        late, _ = check(seeded, MUTANTS["run_ignores_stop"].patch)
        assert any("after its client left" in f for f in late), (seed, late)
    assert ends <= {1.5, 1.75}, ends


def test_livelock_guard() -> None:
    from core.events import TraceRecord

    m = Monitor()
    for i in range(MAX_DECISIONS):
        m.observe(TraceRecord(0, float(i), "", "expire", {}))
    with pytest.raises(Livelock):
        m.observe(TraceRecord(0, -1.0, "", "expire", {}))
    spin = Monitor()
    record = TraceRecord(0, 1.25, "m", "expire", {}, "granted=[] expired=[]")
    for _ in range(MAX_REPEATS + 1):
        spin.observe(record)
    with pytest.raises(Livelock, match="repeated"):
        spin.observe(record)


def test_cli_fuzz_finds_a_mutant_and_writes_a_runnable_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli_main(
        [
            "sim",
            "fuzz",
            "--budget",
            "20",
            "--seed",
            "0",
            "--mutant",
            "session_zero",
            "--out",
            str(tmp_path),
        ]
    )
    out = capsys.readouterr().out
    assert code == 1, out
    files = list(tmp_path.glob("fuzz_session_zero_*.toml"))
    assert len(files) == 1
    s = load(files[0])
    assert len(s.actions) <= 10
    assert math.isfinite(run_scenario(s).end_time)
    assert cli_main(["sim", "run", str(files[0])]) == 0, "the real code passes the written scenario"


def test_cli_fuzz_rejects_an_unknown_mutant(tmp_path: Path) -> None:
    assert (
        cli_main(
            ["sim", "fuzz", "--budget", "1", "--mutant", "no_such_bug", "--out", str(tmp_path)]
        )
        == 2
    )


@pytest.mark.parametrize("budget", ["-1", "0", "nan", "inf", "soon"])
def test_cli_fuzz_rejects_a_budget_that_cannot_search(
    budget: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli_main(["sim", "fuzz", "--budget", budget, "--out", str(tmp_path)])
    assert exit_.value.code == 2
    assert "argument --budget: " in capsys.readouterr().err
