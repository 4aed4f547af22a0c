"""``voxpool sim fleet WORKLOAD.toml``: run a fleet workload, or sweep its replica count.

Prints a table (overall, then per replica; or one row per replica count of a
sweep with the smallest count meeting ``--max-p99`` and ``--max-busy-rate``)
and, with ``--out DIR``, writes the table to ``DIR/fleet.txt`` and the picture
to ``DIR/fleet.png``. Exit status: 0 when the invariants hold in every replica
(and a sweep found a count meeting its goal), 1 otherwise, 2 when the workload
cannot be read or an argument is malformed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sim.fleet import report
from sim.fleet.run import run_fleet
from sim.fleet.workload import WorkloadError, load


def parse_range(text: str) -> tuple[int, int]:
    """``A..B`` (or ``A-B``, or one number) as a range of replica counts, both ends included."""
    sep = ".." if ".." in text else "-" if "-" in text.strip("-") else None
    try:
        if sep is None:
            a = b = int(text)
        else:
            left, right = text.split(sep, 1)
            a, b = int(left), int(right)
    except ValueError:
        raise ValueError(f"--sweep-replicas: expected A..B, got {text!r}") from None
    if a < 1 or b < a:
        raise ValueError(f"--sweep-replicas: need 1 <= A <= B, got {text!r}")
    return a, b


def main(args: argparse.Namespace) -> int:
    try:
        workload = load(args.workload)
        sweep = parse_range(args.sweep_replicas) if args.sweep_replicas else None
    except (WorkloadError, ValueError) as exc:
        print(f"voxpool sim fleet: {exc}", file=sys.stderr)
        return 2
    seed = workload.seed if args.seed is None else args.seed
    monitors = not args.no_monitors
    models = [m.id for m in workload.models]
    if sweep is None:
        summary = run_fleet(workload, seed, monitors=monitors)
        lines = report.summary_lines(workload.name, seed, summary)
        runs = []
        detail = summary
        ok = not summary.violations
    else:
        goal = report.Goal(args.max_p99, args.max_busy_rate)
        runs = [
            run_fleet(workload.with_replicas(n), seed, monitors=monitors)
            for n in range(sweep[0], sweep[1] + 1)
        ]
        lines = report.sweep_lines(workload.name, seed, runs, goal)
        best = report.smallest_meeting(runs, goal)
        detail = best if best is not None else runs[-1]
        ok = best is not None and not any(s.violations for s in runs)
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "fleet.txt").write_text(text, encoding="utf-8")
        report.draw(out / "fleet.png", models, detail, runs)
        print(f"written: {out / 'fleet.txt'}, {out / 'fleet.png'}")
    return 0 if ok else 1
