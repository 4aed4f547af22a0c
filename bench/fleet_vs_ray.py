"""The fleet simulator against a real local Ray Serve deployment: the same 2-replica workload.

Issue #16 asks that, for a 2-replica workload, the simulated p50/p95 latency and
503 rate be within 15% of the same workload run on the real local Ray
deployment with the real models, the simulator's durations taken from measured
model timings. This bench:

1. deploys voxpool on a local Ray cluster (2 replicas, one TTS model of one
   slot and a queue of ``--queue`` each, one BLAS thread, the ingress retrying a
   busy replica ``--retries`` times, the runtime's busy timeout
   ``--busy-timeout-ms``);
2. loads the model on both replicas, then sends requests one at a time: the
   median of (latency - the runtime's queue, load and run from the answer's
   ``Server-Timing`` header) is the time a request spends outside the runtime
   (HTTP proxy, ingress, Ray handle, the way back): the simulator's ``hop_s``;
   a cold replica's first request gives the load time; then two at a time
   (both replicas busy): their mean run time sets the fleet's capacity;
3. a *calibration* run: Poisson arrivals at ``--load`` times that capacity
   (two slots / the run time with both busy) from their own seed: the run
   times the replicas report in ``Server-Timing`` under that load are the
   simulator's durations (measured inside the replicas, so the slowdown of two
   replicas sharing this machine's cores is in them; the queueing is not: that
   is what the simulator models);
4. a *validation* run: new Poisson arrivals (``--seed``) at the same rate,
   played against the deployment from a thread per request (latency from the
   scheduled arrival to the last byte, and the status);
5. runs ``voxpool sim fleet`` on the validation arrivals (a trace), the
   calibration durations, the measured hop and load time, and the same
   replica, queue, busy-timeout and retry settings;
6. prints both side by side with the ratio sim/real, and where the real
   requests' time went (outside the runtime, the replica's queue, the run).

Run: ``.venv/bin/python bench/fleet_vs_ray.py [--requests 400] [--load 0.7]
[--busy-timeout-ms 0] [--save run.json]`` (about 5 minutes on 2 cores).
``--measured run.json`` simulates a saved run again (no Ray);
``--saved bench/data/fleet_vs_ray`` prints every saved run against the
simulator (docs/scale-out.md's table; tests/bench/test_fleet_vs_ray.py holds
the simulator to 15% of them).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import attrs
import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import markdown_table  # noqa: E402
from sim.fleet.stats import FleetSummary  # noqa: E402

TEXT = "The quick brown fox jumps over the lazy dog near the quiet river bank."
MODEL = "tts"
"""The one model's id: the registry's text-to-speech family (see ray_config)."""


@attrs.frozen
class Played:
    """One request as the client saw it: status, seconds from its arrival to its last byte,
    the runtime's phases from its Server-Timing header (seconds; empty for a 503), and how
    many replicas the ingress tried (X-Voxpool-Attempts)."""

    status: int
    seconds: float
    phases: dict[str, float]
    attempts: int = 1

    @property
    def inside(self) -> float:
        """Seconds inside the runtime: queue + load + run."""
        return sum(self.phases.values())

    @property
    def outside(self) -> float:
        """Seconds outside the runtime: proxy, ingress, Ray's router and handle, the way back."""
        return self.seconds - self.inside


def ray_config(queue: int, busy_timeout_ms: int) -> dict[str, Any]:
    from server.families import registry

    family = registry.for_task("tts").name
    return {
        "threads": 1,
        "max_queue": queue,
        "busy_timeout_ms": busy_timeout_ms,
        "models": [{"id": MODEL, "family": family, "slots": 1}],
    }


def server_timing(response: httpx.Response) -> dict[str, float]:
    """The answer's Server-Timing phases in seconds (queue, load, run)."""
    out = {}
    for part in response.headers.get("server-timing", "").split(","):
        if ";dur=" in part:
            name, dur = part.strip().split(";dur=")
            out[name] = float(dur) / 1000.0
    return out


def post(client: httpx.Client, seed: int, due: float | None = None) -> Played:
    """One request (at ``due`` on the perf counter, or now)."""
    if due is not None:
        time.sleep(max(0.0, due - time.perf_counter()))
    t0 = time.perf_counter() if due is None else due
    r = client.post("/v1/audio/speech", json={"model": MODEL, "input": TEXT, "seed": seed})
    seconds = time.perf_counter() - t0
    attempts = int(r.headers.get("x-voxpool-attempts", "1"))
    return Played(r.status_code, seconds, server_timing(r), attempts)


def loaded_on(url: str) -> list[str]:
    rows = httpx.get(url + "/v1/models", timeout=30).json()["data"]
    return list(next(r for r in rows if r["id"] == MODEL)["loaded_on"])


def warm(url: str, queue: int) -> list[Played]:
    """Load the model on both replicas: waves of concurrent requests, one more than a
    replica takes (its slot and queue), until both report it (model affinity keeps a
    wave on the replica that has the model while it has room). The answers."""
    answers: list[Played] = []
    with httpx.Client(base_url=url, timeout=600) as client:
        for attempt in range(30):
            wave = 2 + queue
            pair = [
                threading.Thread(target=lambda s=seed: answers.append(post(client, s)))
                for seed in range(wave * attempt, wave * (attempt + 1))
            ]
            for t in pair:
                t.start()
            for t in pair:
                t.join()
            deadline = time.monotonic() + 5.0  # the replicas report every half second
            while time.monotonic() < deadline:
                if len(loaded_on(url)) == 2:
                    return answers
                time.sleep(0.25)
    raise RuntimeError("the model did not load on both replicas")


def one_at_a_time(url: str, n: int) -> list[Played]:
    """``n`` requests in sequence: nothing queues, nothing waits in Ray's router."""
    with httpx.Client(base_url=url, timeout=600) as client:
        return [post(client, 10_000 + i) for i in range(n)]


def two_at_a_time(url: str, n: int) -> list[Played]:
    """``n`` requests from two closed-loop clients: both replicas busy all the time (with the
    model on both, Ray's two choices give each client's request the idle one), so the run
    times are what a slot takes while the other replica works beside it on these cores."""
    out: list[Played] = []

    def loop(k: int) -> None:
        with httpx.Client(base_url=url, timeout=600) as own:
            out.extend(post(own, 20_000 + 1000 * k + i) for i in range(n // 2))

    threads = [threading.Thread(target=loop, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def arrivals(n: int, rate: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


def play(url: str, times: list[float], seed: int) -> list[Played]:
    """Each request at its time from its own thread."""
    results: list[Played | None] = [None] * len(times)
    client = httpx.Client(base_url=url, timeout=600, limits=httpx.Limits(max_connections=512))
    start = time.perf_counter() + 0.5

    def one(i: int) -> None:
        results[i] = post(client, seed * 100_000 + i, due=start + times[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(times))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    client.close()
    assert all(r is not None for r in results)
    return [r for r in results if r is not None]


def workload_toml(
    times: list[float],
    durations: list[float],
    load: float,
    hop: float,
    args: argparse.Namespace,
    out: Path,
    own: list[float] | None = None,
) -> Path:
    """The simulator's workload: the real settings, ``times`` as a trace, and either each
    arrival's ``own`` run time or run times drawn from ``durations``."""
    trace = out / "arrivals.csv"
    if own is None:
        trace.write_text("".join(f"{t:.6f},{MODEL}\n" for t in times))
    else:  # each arrival with its own run time
        rows = zip(times, own, strict=True)
        trace.write_text("".join(f"{t:.6f},{MODEL},{d:.6f}\n" for t, d in rows))
    path = out / "ray_comparison.toml"
    path.write_text(
        f"""name = "the bench/fleet_vs_ray.py workload"
seed = 1
trace = "{trace.name}"

[replicas]
count = 2
max_ongoing_requests = {1 + args.queue}
start_time_s = 0.0
max_queue = {args.queue}
busy_timeout_ms = {args.busy_timeout_ms}

[router]
retries = {args.retries}
hop_s = {hop:.4f}

[[models]]
id = "{MODEL}"
slots = 1
load_time_s = {load:.4f}
duration = [{", ".join(f"{d:.4f}" for d in durations)}]
"""
    )
    return path


def percentile(values: list[float], q: float) -> float:
    """Nearest rank, as the simulator's report computes it."""
    from sim.fleet.stats import percentile as nearest_rank

    return nearest_rank(sorted(values), q)


def spread(name: str, values: list[float]) -> dict[str, str]:
    return {
        "real requests": name,
        "mean (s)": f"{statistics.fmean(values):.3f}",
        "p50 (s)": f"{percentile(values, 0.50):.3f}",
        "p95 (s)": f"{percentile(values, 0.95):.3f}",
        "max (s)": f"{max(values):.3f}",
    }


def measure(args: argparse.Namespace) -> tuple[list[Played], list[Played], list[float], float]:
    """Deploy, calibrate and play: (calibration run, validation run, validation arrivals,
    load time), plus the hop in ``args.hop``."""
    import ray
    from ray import serve

    from server.ray.app import RayArgs, build

    port = 18600 + args.seed
    url = f"http://127.0.0.1:{port}"
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        config = ray_config(args.queue, args.busy_timeout_ms)
        rargs = RayArgs(config=config, replicas=2, replica_cpus=0, retries=args.retries)
        serve.run(build(rargs), name="voxpool", route_prefix="/")
        cold = warm(url, args.queue)
        alone = one_at_a_time(url, args.alone)
        args.hop = statistics.median(p.outside for p in alone)
        load_time = max(p.phases.get("load", 0.0) for p in cold)
        busy = two_at_a_time(url, args.busy)
        args.run_busy = statistics.fmean(p.phases["run"] for p in busy)
        args.rate = args.load * 2 / args.run_busy
        calibration = play(url, arrivals(args.calibrate, args.rate, args.seed + 1000), 1)
        times = arrivals(args.requests, args.rate, args.seed)
        validation = play(url, times, 2)
    finally:
        serve.shutdown()
        ray.shutdown()
    return calibration, validation, times, load_time


MEASURED = ("hop", "run_busy", "rate", "queue", "retries", "busy_timeout_ms", "load", "seed")


def save(
    path: Path,
    calibration: list[Played],
    real: list[Played],
    times: list[float],
    load_time: float,
    args: argparse.Namespace,
) -> None:
    """The real runs' measurements and settings, for ``--measured``."""
    data = {
        "settings": {k: getattr(args, k) for k in MEASURED},
        "load_time": load_time,
        "times": times,
        "calibration": [attrs.asdict(p) for p in calibration],
        "validation": [attrs.asdict(p) for p in real],
    }
    path.write_text(json.dumps(data))


def restore(
    path: Path, args: argparse.Namespace
) -> tuple[list[Played], list[Played], list[float], float]:
    """What :func:`save` wrote (the settings into ``args``)."""
    data = json.loads(path.read_text())
    for k, v in data["settings"].items():
        setattr(args, k, v)
    args.requests = len(data["times"])
    args.calibrate = len(data["calibration"])
    return (
        [Played(**p) for p in data["calibration"]],
        [Played(**p) for p in data["validation"]],
        data["times"],
        data["load_time"],
    )


def simulate(
    calibration: list[Played],
    real: list[Played],
    times: list[float],
    load_time: float,
    args: argparse.Namespace,
    *,
    drawn: bool = False,
) -> tuple[FleetSummary, FleetSummary | None]:
    """The simulator on the validation run's arrivals and settings: with each request's own
    measured run time, and (``drawn``) with run times drawn from the calibration run's."""
    from sim.fleet.run import run_fleet
    from sim.fleet.workload import load as load_workload

    durations = [p.phases["run"] for p in calibration if p.status == 200]
    # a request the deployment refused never ran: it takes a calibration run time
    own = [p.phases.get("run", durations[i % len(durations)]) for i, p in enumerate(real)]
    with tempfile.TemporaryDirectory() as tmp:
        path = workload_toml(times, durations, load_time, args.hop, args, Path(tmp), own)
        traced = run_fleet(load_workload(path), args.seed)
        if not drawn:
            return traced, None
        path = workload_toml(times, durations, load_time, args.hop, args, Path(tmp))
        return traced, run_fleet(load_workload(path), args.seed)


def figures(real: list[Played], sim: FleetSummary) -> list[tuple[str, float, float]]:
    """(metric, real, simulated) for p50 and p95 latency and the 503 rate."""
    ok = sorted(p.seconds for p in real if p.status == 200)
    busy = sum(1 for p in real if p.status == 503) / len(real)
    return [
        ("p50 latency (s)", percentile(ok, 0.50), sim.latency.p50),
        ("p95 latency (s)", percentile(ok, 0.95), sim.latency.p95),
        ("503 rate", busy, sim.busy_rate),
    ]


def ratio(sim: float, real: float) -> str:
    """sim / real (1.00 when both are 0)."""
    if real:
        return f"{sim / real:.2f}"
    return "1.00" if sim == real else "-"


def saved_table(folder: Path) -> str:
    """Every run saved in ``folder`` (``--save``) against the simulator, one table."""
    rows = []
    for path in sorted(folder.glob("*.json")):
        args = argparse.Namespace()
        calibration, real, times, load_time = restore(path, args)
        traced, drawn = simulate(calibration, real, times, load_time, args, drawn=True)
        assert drawn is not None
        runs = [
            statistics.fmean(p.phases["run"] for p in played if p.status == 200)
            for played in (calibration, real)
        ]
        for (metric, r, sim), (_, _, from_drawn) in zip(
            figures(real, traced), figures(real, drawn), strict=True
        ):
            rows.append(
                {
                    "run": path.stem,
                    "busy timeout (ms)": str(args.busy_timeout_ms),
                    "requests": str(len(real)),
                    "offered (1/s)": f"{args.rate:.2f}",
                    "run time: calibration / validation (s)": f"{runs[0]:.3f} / {runs[1]:.3f}",
                    "hop (ms)": f"{args.hop * 1000:.1f}",
                    "metric": metric,
                    "real Ray": f"{r:.3f}",
                    "sim, own run times": f"{sim:.3f}",
                    "ratio": ratio(sim, r),
                    "sim, calibration run times": f"{from_drawn:.3f}",
                    "ratio ": ratio(from_drawn, r),
                }
            )
    return markdown_table(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=400, help="the validation run's")
    parser.add_argument("--calibrate", type=int, default=200, help="the calibration run's")
    parser.add_argument("--alone", type=int, default=20, help="one-at-a-time requests")
    parser.add_argument("--busy", type=int, default=40, help="two-at-a-time requests")
    parser.add_argument("--load", type=float, default=0.7, help="offered load / capacity")
    parser.add_argument("--queue", type=int, default=1)
    parser.add_argument("--retries", type=int, default=1)
    parser.add_argument("--busy-timeout-ms", type=int, default=0, help="0: none")
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--save", type=Path, help="write the real runs' measurements here")
    parser.add_argument(
        "--measured", type=Path, help="simulate measurements saved with --save (no Ray)"
    )
    parser.add_argument(
        "--saved", type=Path, help="one table of every run saved in this folder (no Ray)"
    )
    args = parser.parse_args()

    if args.saved is not None:
        print(saved_table(args.saved))
        return 0
    if args.measured is not None:
        calibration, real, times, load_time = restore(args.measured, args)
    else:
        calibration, real, times, load_time = measure(args)
        if args.save is not None:
            save(args.save, calibration, real, times, load_time, args)
    durations = [p.phases["run"] for p in calibration if p.status == 200]
    ok = [p for p in real if p.status == 200]
    other = sorted({p.status for p in real if p.status not in (200, 503)})
    traced, drawn = simulate(calibration, real, times, load_time, args, drawn=True)
    assert drawn is not None
    print(
        f"# {args.requests} requests, Poisson at {args.rate:.2f}/s ({args.load:.2f} of 2 slots "
        f"at the run time with both busy, {args.run_busy:.3f} s); {len(durations)} run "
        f"times from a calibration run of {args.calibrate} (mean "
        f"{statistics.fmean(durations):.3f} s; the validation run's: "
        f"{statistics.fmean(p.phases['run'] for p in ok):.3f} s); hop "
        f"{args.hop * 1000:.1f} ms; load {load_time:.2f} s; queue {args.queue}, retries "
        f"{args.retries}, busy timeout {args.busy_timeout_ms} ms"
        + (f"; other statuses: {other}" if other else "")
    )
    print(
        markdown_table(
            [
                {
                    "metric": name,
                    "real Ray (2 replicas)": f"{r:.3f}",
                    "sim, each request's run time": f"{sim:.3f}",
                    "ratio": ratio(sim, r),
                    "sim, calibration run times": f"{from_drawn:.3f}",
                    "ratio ": ratio(from_drawn, r),
                }
                for (name, r, sim), (_, _, from_drawn) in zip(
                    figures(real, traced), figures(real, drawn), strict=True
                )
            ]
        )
    )
    print()
    print(
        markdown_table(
            [
                spread("latency", [p.seconds for p in ok]),
                spread("outside the runtime", [p.outside for p in ok]),
                spread("replica queue", [p.phases.get("queue", 0.0) for p in ok]),
                spread("run", [p.phases["run"] for p in ok]),
            ]
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
