"""How fast ``voxpool sim fuzz`` finds each simulated mutant from scratch: a table.

For every mutant of tests/mutants/catalogue.py that lives in code the simulator
runs, and for each seed, run the fuzzer (budget 60 s, shrink budget 20 s) and
print time and examples to the first failure, the shrunk size and the total.

    .venv/bin/python bench/fuzz_mutants.py [--seeds 0 1 2] [--mutants NAME ...]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sim.fuzz import search
from tests.mutants.catalogue import MUTANTS, SIMULATED


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--mutants", nargs="+", default=list(SIMULATED))
    parser.add_argument("--budget", type=float, default=60.0)
    args = parser.parse_args()
    print(
        "| mutant | found (median) | examples (median) | shrunk actions | total (median) | missed |"
    )
    print("|---|---|---|---|---|---|")
    for name in args.mutants:
        found, examples, sizes, totals, missed = [], [], [], [], 0
        for seed in args.seeds:
            f = search(args.budget, seed=seed, mutant=MUTANTS[name].patch, shrink_budget=20.0)
            if not f.found or f.seconds_to_find is None or f.scenario is None:
                missed += 1
                continue
            found.append(f.seconds_to_find)
            examples.append(f.examples_to_find or 0)
            sizes.append(len(f.scenario.actions))
            totals.append(f.seconds)
        if not found:
            print(f"| `{name}` | not found | - | - | - | {missed}/{len(args.seeds)} |", flush=True)
            continue
        print(
            f"| `{name}` | {statistics.median(found):.1f} s (max {max(found):.1f}) | "
            f"{statistics.median(examples):.0f} (max {max(examples)}) | "
            f"{min(sizes)}-{max(sizes)} | "
            f"{statistics.median(totals):.1f} s | {missed}/{len(args.seeds)} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
