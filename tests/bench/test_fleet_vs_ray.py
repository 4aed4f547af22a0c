"""The fleet simulator reproduces the real Ray deployment's measured runs (issue #16).

bench/data/fleet_vs_ray/ holds what ``bench/fleet_vs_ray.py --save`` measured on a
real local 2-replica Ray deployment with the real Piper model: each request's
arrival, status, latency, attempts and the replica's Server-Timing phases, plus
the settings. Replaying those arrivals through ``voxpool sim fleet`` with each
request's own measured run time must give p50 and p95 latency and a 503 rate
within 15% of the real ones (docs/scale-out.md). No cluster needed: this guards
the simulator's model of Ray's routing (FIFO hand-over, routing tasks, backoff),
the ingress's retries and the hop against later changes. Deterministic: the
simulator is seeded.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from tests.bench.bench_module import ROOT, bench_module

RUNS = sorted((ROOT / "bench" / "data" / "fleet_vs_ray").glob("*.json"))
TOLERANCE = 0.15


bench = bench_module("fleet_vs_ray")


def test_the_saved_runs_cover_both_workloads() -> None:
    timeouts = set()
    for path in RUNS:
        args = argparse.Namespace()
        _, real, _, _ = bench.restore(path, args)
        timeouts.add(args.busy_timeout_ms)
        assert len(real) >= 400
    assert 0 in timeouts and len(timeouts) >= 2, "a run without 503s and one with"


@pytest.mark.parametrize("path", RUNS, ids=[p.stem for p in RUNS])
def test_the_simulator_is_within_15_percent_of_the_real_deployment(path: Path) -> None:
    args = argparse.Namespace()
    calibration, real, times, load_time = bench.restore(path, args)
    traced, _ = bench.simulate(calibration, real, times, load_time, args)
    assert not traced.violations
    for metric, measured, simulated in bench.figures(real, traced):
        if measured == 0:
            assert simulated == 0, metric
        else:
            assert abs(simulated / measured - 1) <= TOLERANCE, (metric, measured, simulated)
