"""``voxpool sim run FILE``: run one scenario, show what each action saw, check it.

Exit status: 0 when every expectation and invariant holds, 1 when one does not,
2 when the scenario cannot be read or ``--plot`` cannot be drawn (the timeline
module is not available, or the path's suffix is not a format it writes),
checked before the scenario runs.
"""

from __future__ import annotations

import argparse
import importlib
import math
import sys
from pathlib import Path
from types import ModuleType
from typing import IO

from sim.runner import ActionOutcome, RunResult, check_expectations, run_scenario
from sim.scenario import Scenario, ScenarioError, load

COLUMNS = ("id", "do", "model", "start", "end", "outcome", "reason")


def _time(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.3f}"


def action_table(scenario: Scenario, result: RunResult) -> list[str]:
    """The per-action table, one line per action in timeline order."""
    rows: list[tuple[str, ...]] = [COLUMNS]
    for action in scenario.actions:
        o: ActionOutcome = result.outcomes[action.id]
        rows.append(
            (
                o.id,
                o.do,
                action.model or "-",
                _time(o.started),
                _time(o.ended),
                o.outcome,
                o.reason or "-",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    return [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


def report(scenario: Scenario, result: RunResult, failures: list[str], out: IO[str]) -> None:
    """Print the header, the table and every failed expectation or violated invariant."""
    print(f"scenario: {scenario.name} (seed {result.seed})", file=out)
    for line in action_table(scenario, result):
        print(line, file=out)
    print(
        f"virtual time {result.end_time:.3f}s, {len(result.trace)} trace records, {result.ties} "
        f"tie-breaks, {result.scheduling.value} scheduling",
        file=out,
    )
    for warning in result.warnings:
        print(f"warning: {warning}", file=out)
    if failures:
        print(f"FAILED: {len(failures)} expectation(s) or invariant(s) not met", file=out)
        for f in failures:
            print(f"  - {f}", file=out)
    else:
        print(
            f"OK: {len(scenario.expect)} expectation(s), {len(scenario.order)} order rule(s), "
            "invariants hold",
            file=out,
        )


def plotter(path: str) -> ModuleType:
    """The timeline module to draw ``path`` with; ValueError naming the problem when it is not
    available or does not write ``path``'s format (decided before the scenario runs)."""
    try:
        timeline = importlib.import_module("sim.timeline")
    except ModuleNotFoundError as exc:
        if exc.name != "sim.timeline":
            raise
        raise ValueError("--plot needs sim/timeline.py, which is not available") from None
    suffixes: tuple[str, ...] = timeline.SUFFIXES
    if Path(path).suffix.lower() not in suffixes:
        raise ValueError(f"--plot {path}: unsupported format; use {' or '.join(suffixes)}")
    return timeline


def main(args: argparse.Namespace) -> int:
    try:
        scenario = load(args.file)
    except (OSError, ScenarioError, ValueError) as exc:
        print(f"voxpool sim run: cannot read scenario {args.file}: {exc}", file=sys.stderr)
        return 2
    plot_path = getattr(args, "plot", None)
    try:
        timeline = plotter(plot_path) if plot_path else None
    except ValueError as exc:
        print(f"voxpool sim run: {exc}", file=sys.stderr)
        return 2
    seed = getattr(args, "seed", None)
    trace_path = getattr(args, "trace", None)
    if trace_path:
        with open(trace_path, "w", encoding="utf-8") as trace_out:
            result = run_scenario(scenario, seed, trace_out=trace_out)
    else:
        result = run_scenario(scenario, seed)
    failures = check_expectations(scenario, result)
    report(scenario, result, failures, sys.stdout)
    if trace_path:
        print(f"trace written to {trace_path}")
    if timeline is not None:
        timeline.draw(result, plot_path)
        print(f"timeline drawn to {plot_path}")
    return 1 if failures else 0
