"""``voxpool sim fuzz``: search random workloads for invariant violations, shrink, write the
failure.

Exit status: 0 when nothing was found within the budget, 1 when a failure was
found (its shrunk scenario file is written under ``--out``), 2 on bad usage.
``--mutant NAME`` (hidden; also ``VOXPOOL_FUZZ_MUTANT``) fuzzes a mutant of the
test catalogue instead of the real code, to show that the fuzzer finds it.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from sim.fuzz import search, summary, write
from sim.mutants import mutant as find_mutant


def main(args: argparse.Namespace) -> int:
    name = getattr(args, "mutant", None) or os.environ.get("VOXPOOL_FUZZ_MUTANT") or None
    patch = None
    if name:
        try:
            patch = find_mutant(name)
        except KeyError as exc:
            print(f"voxpool sim fuzz: {exc.args[0]}", file=sys.stderr)
            return 2
    budget = float(getattr(args, "budget", 60.0))
    seed = int(getattr(args, "seed", 0))
    print(
        f"fuzzing {'mutant ' + name if name else 'the real code'} for up to {budget:g} s (seed "
        f"{seed})"
    )
    finding = search(budget, seed, patch)
    for line in summary(finding):
        print(line)
    if not finding.found:
        return 0
    path = write(finding, Path(getattr(args, "out", "fuzz-out")), patch, name or "real")
    print(f"wrote {path}")
    return 1
