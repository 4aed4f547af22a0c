"""Parallel session slots through the runtime: N requests on one slot vs N slots (seed 003 report).

    python bench/slots.py [--slots 2,4] [--repeats 3] [--only FAMILY,...]

For each family (every registered one with a bench ``workload``) three runtimes
(``Runtime`` + ``ThreadedProvider``, busy timeout 0) serve the same model, side by side:
the original runtime (one guarded session), the parallel runtime at ``slots=1`` and at
``slots=N``. Cold loads (weights plus every session of the pool) are timed on their own,
in that order (later ones may reuse process-level caches the first one filled). After
one warm-up wave on each, every repeat runs, alternately so all see the same machine
load: one request on the original and on the 1-slot runtime, the N requests one after
another on both (measured totals, not N x one), and the same N requests submitted at
once to the N-slot model. BLAS is held to one thread so any speed-up comes from the
slots (worker threads; numpy releases the GIL in its kernels). Peak RSS is sampled from
``/proc/self/statm`` every 50 ms during those runs; every wave's outputs are compared
exactly with the first one's. Each family and N runs in a fresh interpreter, so cold
loads and memory are its own.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if sys.path[:1] != [str(ROOT)]:  # run as a script: the project, not bench/core.py
    sys.path.insert(0, str(ROOT))

import anyio  # noqa: E402
import attrs  # noqa: E402

from bench.common import blas_threads  # noqa: E402
from core.policy import RuntimeKind  # noqa: E402
from server.families import registry  # noqa: E402
from server.provider import ThreadedProvider  # noqa: E402
from server.runtime import ModelSpec, Runtime, RuntimeConfig  # noqa: E402


@attrs.frozen
class Workload:
    """The requests of one family and how to reduce a result to what must be identical."""

    family: str
    label: str
    requests: Callable[[int], list[Any]]  # n -> the n requests of one wave
    fingerprint: Callable[[Any], bytes | str]


@attrs.frozen
class SlotRow:
    """One model at one slot count: the figures of the report (medians of the warm repeats).

    ``orig_*``: the original runtime (one guarded session); ``one_*``: the
    parallel runtime at one slot; ``many_*``: the parallel runtime at N slots.
    """

    model: str
    input: str
    n: int
    repeats: int
    cold_ms: tuple[float, ...]  # original, 1 slot, N slots (in that order)
    orig_one_ms: float
    one_ms: float
    orig_serial_ms: float
    one_serial_ms: float
    many_ms: float
    latency_median_ms: float  # of the requests of the N-slot waves
    latency_max_ms: float
    failures: int
    loaded_rss_mb: float
    peak_rss_mb: float
    identical: bool

    @property
    def one_saved_pct(self) -> float:
        """One request: candidate 1 slot against the original runtime."""
        return time_saved(self.orig_one_ms, self.one_ms)

    @property
    def saved_pct(self) -> float:
        """N requests: N slots against the original runtime's serial completion."""
        return time_saved(self.orig_serial_ms, self.many_ms)

    @property
    def saved_vs_one_slot_pct(self) -> float:
        """N requests: N slots against the same runtime at one slot."""
        return time_saved(self.one_serial_ms, self.many_ms)


def time_saved(base: float, candidate: float) -> float:
    """Elapsed time saved, seed 003: ``100 * (base - candidate) / base``; positive is faster."""
    if base <= 0:
        raise ValueError("base time must be > 0")
    return 100.0 * (base - candidate) / base


def rss_bytes() -> int:
    """Resident set size of this process now."""
    with open("/proc/self/statm", encoding="ascii") as f:
        resident_pages = int(f.read().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


class RssSampler:
    """Highest RSS seen by a background task polling every ``interval_s``."""

    def __init__(self, interval_s: float = 0.05) -> None:
        self.interval_s = interval_s
        self.peak = rss_bytes()
        self.samples = 0

    async def run(self) -> None:
        while True:
            self.peak = max(self.peak, rss_bytes())
            self.samples += 1
            await anyio.sleep(self.interval_s)


def workload(family: str, **options: Any) -> Workload:
    """The bench workload of ``family`` (its registry entry's ``workload``, given ``options``)."""
    make = registry.family(family).workload
    if make is None:
        raise ValueError(f"family {family!r} has no bench workload")
    own = make(**options)
    return Workload(family, own.label, own.requests, own.fingerprint)


def bench_families() -> list[str]:
    """Every registered family with a bench workload, in registry order."""
    return [e.name for e in registry.entries() if e.workload is not None]


async def _timed(rt: Runtime, model: str, request: Any, out: list[Any], lat: list[float]) -> None:
    t0 = time.perf_counter()
    try:
        out.append(await rt.run(model, request))
    except Exception as exc:  # a failure is a figure of the report, not a crash
        out.append(exc)
    lat.append(time.perf_counter() - t0)


async def serial_wave(
    rt: Runtime, model: str, requests: Sequence[Any], lat: list[float]
) -> tuple[float, list[Any]]:
    """The requests one after another; (total seconds, results in order)."""
    out: list[Any] = []
    t0 = time.perf_counter()
    for request in requests:
        await _timed(rt, model, request, out, lat)
    return time.perf_counter() - t0, out


async def parallel_wave(
    rt: Runtime, model: str, requests: Sequence[Any], lat: list[float]
) -> tuple[float, list[Any]]:
    """The requests all submitted at once; (total seconds until the last finished, results in
    order)."""
    outs: list[list[Any]] = [[] for _ in requests]
    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for request, out in zip(requests, outs, strict=True):
            tg.start_soon(_timed, rt, model, request, out, lat)
    return time.perf_counter() - t0, [o[0] for o in outs]


def _spec(family: str, slots: int) -> ModelSpec:
    task = registry.family(family).task
    return ModelSpec(id=f"{family}-x{slots}", family=family, task=task, slots=slots)


async def _cold_load(rt: Runtime, model: str) -> float:
    t0 = time.perf_counter()
    await rt.load_model(model)
    return time.perf_counter() - t0


def _median_ms(values: Sequence[float]) -> float:
    return statistics.median(values) * 1e3


async def measure(workload: Workload, n: int, repeats: int = 3) -> SlotRow:
    """The report row of one family at ``n`` slots (see the module doc)."""
    if n < 2 or repeats < 3:
        raise ValueError("need n >= 2 slots and >= 3 warm repeats")
    family = workload.family
    one_spec, n_spec = _spec(family, 1), _spec(family, n)
    requests = workload.requests(n)
    sampler = RssSampler()
    times: dict[str, list[float]] = {k: [] for k in ("o1", "c1", "oN", "cN", "many")}
    latencies: list[float] = []
    results: list[list[Any]] = []
    parallel = RuntimeConfig(busy_timeout_ms=0)
    original = RuntimeConfig(busy_timeout_ms=0, kind=RuntimeKind.ORIGINAL)
    async with (
        Runtime(ThreadedProvider(), original) as orig,
        Runtime(ThreadedProvider(), parallel) as one,
        Runtime(ThreadedProvider(), parallel) as many,
    ):
        orig.add_model(one_spec)
        one.add_model(one_spec)
        many.add_model(n_spec)
        cold = (
            await _cold_load(orig, one_spec.id),
            await _cold_load(one, one_spec.id),
            await _cold_load(many, n_spec.id),
        )
        loaded_rss = rss_bytes()
        async with anyio.create_task_group() as tg:
            tg.start_soon(sampler.run)
            await serial_wave(orig, one_spec.id, requests, [])  # warm-ups
            await serial_wave(one, one_spec.id, requests, [])
            await parallel_wave(many, n_spec.id, requests, [])  # every slot
            for _ in range(repeats):
                times["o1"].append((await serial_wave(orig, one_spec.id, requests[:1], []))[0])
                times["c1"].append((await serial_wave(one, one_spec.id, requests[:1], []))[0])
                for key, rt in (("oN", orig), ("cN", one)):
                    total, out = await serial_wave(rt, one_spec.id, requests, [])
                    times[key].append(total)
                    results.append(out)
                total, out = await parallel_wave(many, n_spec.id, requests, latencies)
                times["many"].append(total)
                results.append(out)
            tg.cancel_scope.cancel()
    failures = sum(isinstance(r, Exception) for wave_out in results for r in wave_out)
    reference = None if failures else [workload.fingerprint(r) for r in results[0]]
    identical = reference is not None and all(
        [workload.fingerprint(r) for r in wave_out] == reference for wave_out in results
    )
    return SlotRow(
        model=family,
        input=workload.label,
        n=n,
        repeats=repeats,
        cold_ms=tuple(c * 1e3 for c in cold),
        orig_one_ms=_median_ms(times["o1"]),
        one_ms=_median_ms(times["c1"]),
        orig_serial_ms=_median_ms(times["oN"]),
        one_serial_ms=_median_ms(times["cN"]),
        many_ms=_median_ms(times["many"]),
        latency_median_ms=_median_ms(latencies),
        latency_max_ms=max(latencies) * 1e3,
        failures=failures,
        loaded_rss_mb=loaded_rss / 2**20,
        peak_rss_mb=sampler.peak / 2**20,
        identical=identical,
    )


def run(workload: Workload, n: int, repeats: int = 3) -> SlotRow:
    """:func:`measure` in its own event loop, with BLAS on one thread."""
    with blas_threads(1):  # parallelism must come from the slots
        return anyio.run(measure, workload, n, repeats)


COMPARISON = (
    "| model | input | N | one request: original ms | one request: 1 slot ms | saved % "
    "| N serial: original ms | N on N slots ms | saved % | N serial: 1 slot ms | saved vs 1 slot % "
    "| outputs identical |"
)
DETAILS = (
    "| model | N | cold load ms (original / 1 slot / N slots) | N-slot latency median / max ms "
    "| failures | RSS after load MB | peak RSS MB |"
)


def table(rows: Sequence[SlotRow]) -> str:
    """The seed 003 comparison table, then cold loads, latencies, failures and memory."""
    lines = [COMPARISON, "|---|---|" + "---:|" * 9 + "---|"]
    for r in rows:
        lines.append(
            f"| {r.model} | {r.input} | {r.n} | {r.orig_one_ms:.1f} | {r.one_ms:.1f} "
            f"| {r.one_saved_pct:.1f} | {r.orig_serial_ms:.1f} | {r.many_ms:.1f} "
            f"| {r.saved_pct:.1f} | {r.one_serial_ms:.1f} | {r.saved_vs_one_slot_pct:.1f} "
            f"| {'yes' if r.identical else 'no'} |"
        )
    lines += ["", DETAILS, "|---|" + "---:|" * 6]
    for r in rows:
        cold = " / ".join(f"{c:.0f}" for c in r.cold_ms)
        lines.append(
            f"| {r.model} | {r.n} | {cold} | {r.latency_median_ms:.1f} / {r.latency_max_ms:.1f} "
            f"| {r.failures} | {r.loaded_rss_mb:.0f} | {r.peak_rss_mb:.0f} |"
        )
    return "\n".join(lines)


def in_child(family: str, n: int, repeats: int) -> SlotRow:
    """:func:`run` in a fresh interpreter, so cold loads and RSS are this model's alone."""
    command = [sys.executable, __file__, "--child", f"{family}:{n}:{repeats}"]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    fields = json.loads(done.stdout.splitlines()[-1])
    fields["cold_ms"] = tuple(fields["cold_ms"])
    return SlotRow(**fields)


def loadavg() -> str:
    with open("/proc/loadavg", encoding="ascii") as f:
        return " ".join(f.read().split()[:3])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", default="2", help="comma-separated slot counts N (>= 2)")
    parser.add_argument("--repeats", type=int, default=3, help="warm repeats (>= 3)")
    parser.add_argument("--only", default=",".join(bench_families()))
    parser.add_argument("--child", help=argparse.SUPPRESS)  # family:n:repeats, prints one JSON row
    args = parser.parse_args()
    if args.child:
        family, n, repeats = args.child.split(":")
        row = run(workload(family), int(n), int(repeats))
        print(json.dumps(attrs.asdict(row)))
        return 0
    counts = [int(s) for s in args.slots.split(",")]
    families = [f.strip() for f in args.only.split(",")]
    print(f"load average at start: {loadavg()}; cpus: {os.cpu_count()}; repeats: {args.repeats}")
    rows = [in_child(family, n, args.repeats) for family in families for n in counts]
    print(table(rows))
    print(f"outputs identical: {'yes' if all(r.identical for r in rows) else 'no'}")
    print(f"load average at end: {loadavg()}")
    return 0 if all(r.failures == 0 and r.identical for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
