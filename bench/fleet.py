"""Fleet simulator speed: 100 replicas, 1,000,000 requests of virtual traffic, timed.

    python bench/fleet.py [--replicas R] [--requests N] [--seed K] [--no-monitors] [--profile]

The workload (built here, :func:`workload`): 20 models (1-4 slots, loads of
0.5-4 s, normal durations of 0.2-1.2 s), a Poisson stream whose total rate
keeps the fleet about two-thirds busy, each replica holding at most 4 models
(so affinity and eviction both matter), a router queue bound, and one replica
killed a third of the way through. Every replica is the real runtime with its
decision monitors; the invariants are checked as the fleet simulator always
does. Reported: wall and CPU time, requests per wall second, virtual time, and
the run's own answer (latency percentiles, 503 rate). Goal (issue #16): under
600 s wall on 2 cores. ``--profile`` prints the top of a cProfile run instead.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import markdown_table
from sim.fleet.run import run_fleet
from sim.fleet.stats import FleetSummary
from sim.fleet.workload import (
    Duration,
    FleetModel,
    KillEvent,
    ReplicaSettings,
    RouterSettings,
    Workload,
)

MODELS = 20


def workload(replicas: int = 100, requests: int = 1_000_000, seed: int = 7) -> Workload:
    """The benchmark workload: ``requests`` arrivals over as many virtual seconds as a fleet of
    ``replicas`` serves them at about two-thirds of its capacity."""
    models = []
    capacity = 0.0  # requests per second one replica serves with every model at full slots
    for i in range(MODELS):
        slots = 1 + i % 4
        mean = 0.2 + (i % 6) * 0.2
        weight = 1.0 / (1 + i)  # a few hot models, a long tail
        models.append(
            FleetModel(
                f"m{i:02d}",
                slots=slots,
                memory=100 * slots,
                load_time_s=0.5 + (i % 8) * 0.5,
                rate=weight,
                duration=Duration("normal", mean, mean / 4),
            )
        )
        capacity += weight * slots / mean
    total_weight = sum(m.rate for m in models)
    # a replica serves ~ max_ongoing concurrent requests of the weighted mean duration
    mean_duration = sum(m.rate * m.duration.mean for m in models) / total_weight
    per_replica = 4 / mean_duration
    total_rate = 0.5 * per_replica * replicas
    scale = total_rate / total_weight
    models = [
        FleetModel(
            m.id,
            slots=m.slots,
            memory=m.memory,
            load_time_s=m.load_time_s,
            rate=m.rate * scale,
            duration=m.duration,
        )
        for m in models
    ]
    duration_s = requests / total_rate * 1.5  # the request cap ends it first
    return Workload(
        name=f"bench: {replicas} replicas, {requests:,} requests",
        models=tuple(models),
        replicas=ReplicaSettings(
            count=replicas,
            max_ongoing_requests=4,
            start_time_s=5.0,
            max_loaded_models=6,
            max_queue=2,
        ),
        router=RouterSettings(max_queued_requests=2 * replicas),
        seed=seed,
        duration_s=duration_s,
        requests=requests,
        scheduling="one_at_a_time",
        events=(KillEvent(requests / total_rate / 3, 1),),
    )


def table(summary: FleetSummary, wall: float, cpu: float, load: str) -> str:
    rows: list[dict[str, object]] = [
        {"figure": "replicas", "value": summary.replicas},
        {"figure": "requests", "value": f"{summary.requests:,}"},
        {"figure": "virtual time", "value": f"{summary.end_time:,.1f} s"},
        {"figure": "wall time", "value": f"{wall:.1f} s"},
        {"figure": "CPU time", "value": f"{cpu:.1f} s"},
        {"figure": "requests per wall second", "value": f"{summary.requests / wall:,.0f}"},
        {"figure": "load average at start (1 min)", "value": load},
        {"figure": "p50 / p95 / p99", "value": _lat(summary)},
        {"figure": "503 rate", "value": f"{summary.busy_rate:.4%}"},
        {"figure": "failed (replica died)", "value": summary.counts["failed"]},
        {"figure": "invariant violations", "value": len(summary.violations)},
    ]
    return markdown_table(rows)


def _lat(s: FleetSummary) -> str:
    lat = s.latency
    return f"{lat.p50:.3f} / {lat.p95:.3f} / {lat.p99:.3f} s"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=100)
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--no-monitors", action="store_true", help="skip the decision monitors")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    w = workload(args.replicas, args.requests, args.seed)
    monitors = not args.no_monitors
    if args.profile:
        profile = cProfile.Profile()
        profile.enable()
        run_fleet(w, monitors=monitors)
        profile.disable()
        pstats.Stats(profile).sort_stats("tottime").print_stats(40)
        return 0
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    start, cpu = time.perf_counter(), time.process_time()
    summary = run_fleet(w, monitors=monitors)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    print(f"{w.name} (monitors {'on' if monitors else 'off'})")
    print()
    print(table(summary, wall, cpu, load))
    for v in summary.violations[:10]:
        print(f"violation: {v}")
    return 1 if summary.violations else 0


if __name__ == "__main__":
    sys.exit(main())
