"""The request stream of a workload: when each request arrives, for which model, how long it runs.

Poisson arrivals per model (the superposition: one exponential gap at the total
rate, the model drawn in proportion to its rate), with piecewise-constant rates
that change at each phase (the process is memoryless, so a gap that would cross
a phase boundary is redrawn from the boundary). A trace file replaces the
Poisson stream. The stream draws from its own seeded generator only, so the
same seed gives the same requests whatever the fleet does with them (a sweep
over replica counts compares like with like).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator

import attrs

from sim.fleet.workload import Workload


@attrs.frozen
class Arrival:
    """One request: its number (arrival order), time, model and run duration."""

    n: int
    at: float
    model: str
    duration: float


def _rates_at(workload: Workload, phase_index: int) -> dict[str, float]:
    rates = {m.id: m.rate for m in workload.models}
    for phase in workload.phases[:phase_index]:
        rates.update(phase.rates)
    return rates


def arrivals(workload: Workload, seed: int) -> Iterator[Arrival]:
    """Every arrival of ``workload`` under ``seed``, in time order (lazily)."""
    rng = random.Random(f"voxpool-fleet-arrivals:{seed}")
    cap = workload.requests or None
    durations = {m.id: m.duration for m in workload.models}
    if workload.trace is not None:
        for n, a in enumerate(workload.trace):
            if cap is not None and n >= cap:
                return
            d = a.duration if a.duration is not None else durations[a.model].draw(rng)
            yield Arrival(n, a.at, a.model, d)
        return
    ids = [m.id for m in workload.models]
    boundaries = [p.at for p in workload.phases]
    phase = sum(1 for b in boundaries if b <= 0.0)
    t = 0.0
    n = 0
    end = workload.duration_s
    cum: list[float] = []
    total = 0.0
    cum_phase = -1
    while cap is None or n < cap:
        if cum_phase != phase:  # the cumulative weights of the phase, once per phase
            rates = _rates_at(workload, phase)
            cum = list(itertools.accumulate(rates[i] for i in ids))
            total = cum[-1]
            cum_phase = phase
        next_boundary = boundaries[phase] if phase < len(boundaries) else None
        if total <= 0.0:
            if next_boundary is None:
                return
            t = next_boundary
            phase += 1
            continue
        gap = rng.expovariate(total)
        if next_boundary is not None and t + gap >= next_boundary:
            t = next_boundary  # memoryless: draw again from the boundary at the new rates
            phase += 1
            continue
        t += gap
        if t >= end:
            return
        model = rng.choices(ids, cum_weights=cum)[0]
        yield Arrival(n, t, model, durations[model].draw(rng))
        n += 1
