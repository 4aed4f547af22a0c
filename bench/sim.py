"""Simulator speed: a 10-minute virtual workload, timed in real seconds.

    python bench/sim.py [--requests N] [--virtual S] [--seed K] [--runs R] [--profile]

Four fake models, 1,000 requests arriving at random over 600 virtual seconds
(seeded RNG, random durations, a few streams and batches), and management
every few seconds (unload, reconfigure, bulk unload). The workload is an
ordinary :class:`sim.scenario.Scenario` run by :func:`sim.runner.run_scenario`,
invariant checks at every quiescent step included. Reported: wall time,
virtual seconds per real second (speed-up over real time) and trace records per
real second. Goal: >= 1000x real time. ``--profile`` prints the top of a
cProfile run instead.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import pstats
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sim.runner import RunResult, run_scenario
from sim.scenario import Action, ModelDef, Scenario

MODELS = ("tts", "asr", "vad", "tts2")


def workload(requests: int = 1000, virtual: float = 600.0, seed: int = 7) -> Scenario:
    """The benchmark scenario: random arrivals and durations, management every few seconds."""
    rng = random.Random(seed)
    models = tuple(
        ModelDef(
            m,
            slots=s,
            path="rev0",
            lazy=True,
            script={"capacity": 8, "load_time": 0.4, "run_time": 1.0},
        )
        for m, s in zip(MODELS, (2, 4, 4, 1), strict=True)
    )
    actions: list[Action] = []
    for i in range(requests):
        at = round(rng.uniform(0.0, virtual), 3)
        model = rng.choice(MODELS)
        kind = rng.choices(("request", "stream", "batch"), weights=(8, 1, 1))[0]
        params: dict[str, object] = {"duration": round(rng.expovariate(1.0 / 0.8), 3)}
        if kind == "stream":
            params = {"chunks": rng.randint(2, 6), "chunk_time": round(rng.uniform(0.05, 0.3), 3)}
        elif kind == "batch":
            params["count"] = rng.randint(2, 4)
        if rng.random() < 0.1:
            params["timeout_ms"] = rng.choice((50, 500, 2000))
        actions.append(Action(at, kind, f"r{i}", model, params))
    at, n = 0.0, 0
    while True:
        at += rng.uniform(2.0, 8.0)
        if at >= virtual:
            break
        n += 1
        op = rng.choices(("unload", "reconfigure", "bulk_unload"), weights=(3, 2, 1))[0]
        model = rng.choice(MODELS)
        if op == "unload":
            actions.append(Action(round(at, 3), op, f"m{n}", model))
        elif op == "reconfigure":
            params = {"slots": rng.choice((1, 2, 4)), "path": f"rev{n}"}
            actions.append(Action(round(at, 3), op, f"m{n}", model, params))
        else:
            ids = sorted(rng.sample(MODELS, rng.randint(1, len(MODELS))))
            actions.append(Action(round(at, 3), op, f"m{n}", "", {"ids": ids}))
    return Scenario(
        name=f"bench: {len(MODELS)} models, {requests} requests, {virtual:g} virtual seconds",
        models=models,
        actions=tuple(sorted(actions, key=lambda a: a.at)),
        seed=seed,
    )


def timed(scenario: Scenario) -> tuple[float, float, RunResult]:
    """(wall seconds, CPU seconds of this process, result): CPU time is what a busy VM cannot
    inflate."""
    start, cpu = time.perf_counter(), time.process_time()
    result = run_scenario(scenario)
    return time.perf_counter() - start, time.process_time() - cpu, result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--virtual", type=float, default=600.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--runs", type=int, default=3, help="report the median of this many runs")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    scenario = workload(args.requests, args.virtual, args.seed)
    if args.profile:
        profile = cProfile.Profile()
        profile.enable()
        run_scenario(scenario)
        profile.disable()
        pstats.Stats(profile).sort_stats("cumulative").print_stats(35)
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)
        return 0
    walls: list[float] = []
    cpus: list[float] = []
    result: RunResult | None = None
    for _ in range(args.runs):
        wall, cpu, result = timed(scenario)
        walls.append(wall)
        cpus.append(cpu)
    assert result is not None
    wall, cpu = statistics.median(walls), statistics.median(cpus)
    outcomes = collections.Counter(o.outcome for o in result.outcomes.values())
    mgmt = sum(1 for a in scenario.actions if a.do not in ("request", "stream", "batch"))
    print(f"{scenario.name}: {len(scenario.actions)} actions ({mgmt} management)")
    print(
        f"outcomes: {dict(sorted(outcomes.items()))}; "
        f"violations: {len(result.violations)}; stalled: {result.stalled}"
    )
    print()
    print("| figure | value |")
    print("|---|---:|")
    print(f"| wall time (median of {args.runs}) | {wall:.3f} s |")
    print(f"| CPU time (median of {args.runs}) | {cpu:.3f} s |")
    print(f"| virtual time | {result.end_time:.1f} s |")
    print(f"| speed-up over real time (wall) | {result.end_time / wall:,.0f}x |")
    print(f"| speed-up over real time (CPU) | {result.end_time / cpu:,.0f}x |")
    print(f"| trace records | {len(result.trace):,} |")
    print(f"| trace records per wall second | {len(result.trace) / wall:,.0f} |")
    print(f"| trace records per CPU second | {len(result.trace) / cpu:,.0f} |")
    print(f"| tie-breaks | {result.ties:,} |")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
