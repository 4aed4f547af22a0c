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
) -> Finding:
    """Generate until a failure or ``budget`` seconds pass, then shrink it (``shrink_budget``
    seconds at most).

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
    return Finding(
        shrunk, failures, examples, first[0] - start, time.monotonic() - start, found_after[0]
    )


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
