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
import random
import time
from collections.abc import Sequence

import attrs
from hypothesis import HealthCheck, Phase, find, settings
from hypothesis.errors import HypothesisException, NoSuchExample

from sim.findings import Finding, expectations, to_toml, write
from sim.fuzz_oracle import Mutant, check, generic_failures
from sim.fuzz_space import MAX_ACTIONS, NEW_ID, scenarios
from sim.scenario import Scenario

__all__ = [
    "MAX_ACTIONS",
    "NEW_ID",
    "Finding",
    "Mutant",
    "check",
    "expectations",
    "generic_failures",
    "scenarios",
    "search",
    "summary",
    "to_toml",
    "write",
]


def search(
    budget: float = 60.0,
    seed: int = 0,
    mutant: Mutant | None = None,
    *,
    shrink_budget: float | None = None,
    batch: int = 200,
    examples: int | None = None,
    shrink_examples: int | None = None,
) -> Finding:
    """Generate until a failure, ``budget`` seconds or ``examples`` runs, then shrink it
    (``shrink_budget`` seconds and ``shrink_examples`` runs at most).

    With a seed the examples drawn are the same in every process, so budgets in runs
    make a search's outcome independent of the machine's speed (what the tests use);
    budgets in seconds bound its time (what the CLI uses). Verdicts are cached per
    scenario, so Hypothesis sees one answer per example even when a budget runs out
    (then the smallest failure so far wins).
    """
    start = time.monotonic()
    budgets = _Budgets(
        generate_until=start + budget,
        shrink_for=budget / 2 if shrink_budget is None else shrink_budget,
        generate_runs=examples,
        shrink_runs=shrink_examples,
    )
    verdicts: dict[str, bool] = {}
    best: list[Scenario] = []

    def fails(s: Scenario) -> bool:
        key = repr(s)
        if key in verdicts:
            return verdicts[key]
        if budgets.spent():
            return False  # out of budget: not run, not cached
        verdict = verdicts[key] = bool(check(s, mutant)[0])
        budgets.ran(verdict)
        if verdict and (not best or _size(s) < _size(best[0])):
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
    while not best and not budgets.spent():
        with contextlib.suppress(NoSuchExample, HypothesisException):
            find(scenarios(), fails, settings=config, random=random.Random(rng.getrandbits(64)))
    if not best:
        return Finding(None, [], budgets.runs, None, time.monotonic() - start)
    shrunk = best[0]
    failures, _ = check(shrunk, mutant)
    assert budgets.found_at is not None and budgets.found_after is not None
    return Finding(
        shrunk,
        failures,
        budgets.runs,
        budgets.found_at - start,
        time.monotonic() - start,
        budgets.found_after,
    )


@attrs.define
class _Budgets:
    """What a search may still spend: before the first failure it generates (until a
    time and, optionally, a number of runs); after it, it shrinks (for a time and,
    optionally, a number of runs)."""

    generate_until: float
    shrink_for: float
    generate_runs: int | None
    shrink_runs: int | None
    runs: int = 0
    found_at: float | None = None  # monotonic time of the first failure
    found_after: int | None = None  # runs up to and including the first failure

    def spent(self) -> bool:
        """Whether the phase the search is in has used its budget."""
        if self.found_at is None or self.found_after is None:
            over_runs = self.generate_runs is not None and self.runs >= self.generate_runs
            return over_runs or time.monotonic() > self.generate_until
        shrinking = self.runs - self.found_after
        over_runs = self.shrink_runs is not None and shrinking >= self.shrink_runs
        return over_runs or time.monotonic() > self.found_at + self.shrink_for

    def ran(self, failed: bool) -> None:
        """Count one run; the first failing one ends the generation phase."""
        self.runs += 1
        if failed and self.found_at is None:
            self.found_at = time.monotonic()
            self.found_after = self.runs


def _size(s: Scenario) -> tuple[int, int, str]:
    return len(s.actions), sum(len(a.params) for a in s.actions), repr(s)


def summary(finding: Finding) -> Sequence[str]:
    """Lines for the console."""
    if not finding.found:
        return [f"no failure in {finding.examples} examples ({finding.seconds:.1f} s)"]
    assert finding.scenario is not None
    return [
        f"failure found after {finding.examples_to_find} examples in "
        f"{finding.seconds_to_find:.1f} s, shrunk to {len(finding.scenario.actions)} actions "
        f"({finding.examples} runs, {finding.seconds:.1f} s in all)",
        *(f"  {f}" for f in finding.failures),
    ]
