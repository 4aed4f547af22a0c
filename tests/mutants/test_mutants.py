"""Proof that the simulator finds bugs: every mutant fails its scenario and is found by the fuzzer.

For each mutant of the catalogue that lives in code the simulator runs:
(a) its targeted scenario passes on the real code and fails under the mutant;
(b) ``sim fuzz`` finds it from scratch (no scenario given) within
:data:`FUZZ_EXAMPLES` runs of seed 0 (a budget in runs, not seconds, so the outcome
does not depend on the machine's speed or load; ``bench/fuzz_mutants.py`` reports the
seconds), shrinks it to at most 10 actions, and writes a scenario file that passes on the real
code and fails under the mutant. The batching mutant is also covered by the
stateful test of test_batching_mutant.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from core.admission import Admission
from core.batching import BatchScheduler
from core.bulk import BulkUnload
from core.lifecycle import Lifecycle
from core.recorder import Core
from server.runtime.management import Management
from server.runtime.runtime import Runtime
from sim.fuzz import check, search, write
from sim.runner import check_expectations, run_scenario
from sim.scenario import load, parse
from tests.mutants.catalogue import MUTANTS, SIMULATED

ROOT = Path(__file__).resolve().parents[2]
FUZZ_EXAMPLES = 15000
"""Runs the search may draw before its first failure: about five times what the slowest
mutant needs from seed 0 (``manager_timeout_strands``: 3,216 since session 18's space, which
draws long slow streams on batched models; ``abandoned_initializer_strands`` 763,
``run_ignores_stop`` 535, ``member_never_held`` 93; the others' medians over seeds 0-2
7-187); over seeds 0-2 the most any needed was 3,308
(docs/performance.md, "Mutant detection")."""
SHRINK_EXAMPLES = 1000
"""Runs it may spend shrinking (the mutants' shrinks take 29-345)."""
SAFETY_S = 600.0
"""A wall-clock bound on a search that no budget in runs would end (never reached)."""


def test_catalogue_has_thirteen_mutants_with_scenarios() -> None:
    assert len(MUTANTS) >= 13
    for name in SIMULATED:
        assert (ROOT / MUTANTS[name].scenario).is_file(), name


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_mutant_patches_are_undone(name: str) -> None:
    owners = (Admission, Runtime, Lifecycle, BulkUnload, BatchScheduler, Core, Management)
    before = {(o, k): v for o in owners for k, v in vars(o).items()}
    with MUTANTS[name].patch():
        during = {(o, k): v for o in owners for k, v in vars(o).items()}
    after = {(o, k): v for o in owners for k, v in vars(o).items()}
    assert after == before
    assert during != before, "the mutant changes the real code while active"


@pytest.mark.parametrize("name", SIMULATED)
def test_targeted_scenario_fails_only_under_the_mutant(name: str) -> None:
    info = MUTANTS[name]
    scenario = load(ROOT / info.scenario)
    assert check_expectations(scenario, run_scenario(scenario)) == []
    with info.patch():
        failures = check_expectations(scenario, run_scenario(scenario))
    assert failures, f"{info.scenario} does not catch {name}"


def test_deadlocked_shutdown_is_reported_not_hung() -> None:
    # the bulk mutant keeps an idle model's barrier while waiting; a disconnect
    # then leaks it and the runtime's shutdown can never drain
    s = parse(
        {
            "models": [{"id": "a", "lazy": False}, {"id": "b", "lazy": False}],
            "actions": [
                {"at": 2.0, "do": "request", "id": "busy_a", "model": "a", "duration": 5.0},
                {"at": 3.0, "do": "bulk_unload", "id": "bulk"},
                {"at": 4.0, "do": "disconnect", "id": "leave", "target": "bulk"},
            ],
        }
    )
    assert run_scenario(s).ok
    with MUTANTS["bulk_waits_busy_first"].patch():
        result = run_scenario(s)
    assert result.stalled
    assert any("shutdown stalled" in v for v in result.violations)


@pytest.mark.slow
@pytest.mark.parametrize("name", SIMULATED)
def test_fuzzer_finds_mutant_from_scratch(name: str, tmp_path: Path) -> None:
    patch = MUTANTS[name].patch
    finding = search(
        SAFETY_S,
        seed=0,
        mutant=patch,
        shrink_budget=SAFETY_S,
        examples=FUZZ_EXAMPLES,
        shrink_examples=SHRINK_EXAMPLES,
    )
    assert finding.found, f"{name} not found in {finding.examples} examples"
    assert finding.examples_to_find is not None and finding.examples_to_find <= FUZZ_EXAMPLES
    assert finding.scenario is not None and len(finding.scenario.actions) <= 10
    path = write(finding, tmp_path, patch, name)
    scenario = load(path)
    assert len(scenario.actions) <= 10
    assert check_expectations(scenario, run_scenario(scenario)) == [], (
        "the real code passes the file"
    )
    assert check(scenario)[0] == [], "the real code passes the fuzzer's checks"
    with patch():
        assert check_expectations(scenario, run_scenario(scenario)), (
            "'sim run' of the file fails on the bug"
        )
