"""The fleet simulator against a real local Ray Serve deployment: the same 2-replica workload.

Issue #16 asks that, for a 2-replica workload, the simulated p50/p95 latency and
503 rate be within 15% of the same workload run on the real local Ray
deployment with the real models, the simulator's durations taken from measured
model timings. This bench:

1. deploys voxpool on a local Ray cluster (2 replicas, one TTS model of one
   slot and a queue of ``--queue`` each, one BLAS thread, the ingress retrying a
   busy replica ``--retries`` times);
2. measures the model on this deployment (:func:`calibrate`): the model
   loaded on both replicas, two closed-loop clients, one request running on
   each replica at a time: their latencies are the simulator's duration list
   (no queueing in them: the simulator models the queueing), and a cold
   replica's first request gives the load time;
3. draws Poisson arrivals at ``--load`` times the fleet's capacity (two slots /
   the mean duration) and plays them against the deployment from a thread per
   request (latency from the scheduled arrival to the last byte, and the
   status);
4. runs ``voxpool sim fleet`` on the same arrival times (a trace), the
   measured durations, and the same replica, queue and retry settings;
5. prints both side by side with the ratio sim/real.

Run: ``.venv/bin/python bench/fleet_vs_ray.py [--requests 300] [--load 0.75]``
(about 3 minutes on 2 cores). Results and the machine go in docs/scale-out.md.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import markdown_table  # noqa: E402

TEXT = "The quick brown fox jumps over the lazy dog near the quiet river bank."
MODEL = "tts"
"""The one model's id: the registry's text-to-speech family (see ray_config)."""


def ray_config(queue: int) -> dict[str, Any]:
    from server.families import registry

    family = registry.for_task("tts").name
    return {
        "threads": 1,
        "max_queue": queue,
        "busy_timeout_ms": 120000,
        "models": [{"id": MODEL, "family": family, "slots": 1}],
    }


def post(client: httpx.Client, seed: int) -> tuple[int, float]:
    t0 = time.perf_counter()
    r = client.post("/v1/audio/speech", json={"model": MODEL, "input": TEXT, "seed": seed})
    return r.status_code, time.perf_counter() - t0


def loaded_on(url: str) -> list[str]:
    rows = httpx.get(url + "/v1/models", timeout=30).json()["data"]
    return list(next(r for r in rows if r["id"] == MODEL)["loaded_on"])


def calibrate(url: str, n: int) -> tuple[list[float], float]:
    """The model's timings on this deployment, and a cold replica's load time.

    First both replicas load the model (pairs of concurrent requests until both
    report it); then two closed-loop clients send ``n`` requests in all: with
    the model on both replicas Ray's two choices put one on each, so each
    request runs alone on its replica while the other replica is busy too, as
    under load (the two replicas share this machine's cores). Their latencies
    are the simulator's durations; the load time is the slowest cold request
    minus the median.
    """
    cold: list[float] = []
    with httpx.Client(base_url=url, timeout=600) as client:
        for _ in range(10):
            pair = [threading.Thread(target=lambda: cold.append(post(client, 0)[1]))]
            pair.append(threading.Thread(target=lambda: cold.append(post(client, 1)[1])))
            for t in pair:
                t.start()
            for t in pair:
                t.join()
            time.sleep(1.0)  # the replicas report every half second
            if len(loaded_on(url)) == 2:
                break
        else:
            raise RuntimeError("the model did not load on both replicas")
    durations: list[float] = []
    lock = threading.Lock()

    def loop(k: int) -> None:
        with httpx.Client(base_url=url, timeout=600) as own:
            for i in range(n // 2):
                status, seconds = post(own, 100 + 1000 * k + i)
                assert status == 200
                with lock:
                    durations.append(seconds)

    threads = [threading.Thread(target=loop, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return durations, max(0.0, max(cold) - statistics.median(durations))


def arrivals(n: int, rate: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


def play(url: str, times: list[float]) -> list[tuple[int, float]]:
    """Each request at its time from its own thread: (status, seconds from its arrival)."""
    results: list[tuple[int, float]] = [(0, 0.0)] * len(times)
    client = httpx.Client(base_url=url, timeout=600, limits=httpx.Limits(max_connections=256))
    start = time.perf_counter() + 0.5

    def one(i: int) -> None:
        due = start + times[i]
        time.sleep(max(0.0, due - time.perf_counter()))
        r = client.post("/v1/audio/speech", json={"model": MODEL, "input": TEXT, "seed": i})
        results[i] = (r.status_code, time.perf_counter() - due)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(times))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    client.close()
    return results


def workload_toml(
    times: list[float], durations: list[float], load: float, queue: int, retries: int, out: Path
) -> Path:
    trace = out / "arrivals.csv"
    trace.write_text("".join(f"{t:.6f},{MODEL}\n" for t in times))
    path = out / "ray_comparison.toml"
    path.write_text(
        f"""name = "the bench/fleet_vs_ray.py workload"
seed = 1
trace = "{trace.name}"

[replicas]
count = 2
max_ongoing_requests = {1 + queue}
start_time_s = 0.0
max_queue = {queue}
busy_timeout_ms = 120000

[router]
retries = {retries}

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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--load", type=float, default=0.75, help="offered load / capacity")
    parser.add_argument("--calibrate", type=int, default=40)
    parser.add_argument("--queue", type=int, default=1)
    parser.add_argument("--retries", type=int, default=1)
    parser.add_argument("--seed", type=int, default=5)
    args = parser.parse_args()

    import ray
    from ray import serve

    from server.ray.app import RayArgs, build
    from sim.fleet.run import run_fleet
    from sim.fleet.workload import load as load_workload

    port = 18600 + args.seed
    url = f"http://127.0.0.1:{port}"
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        rargs = RayArgs(
            config=ray_config(args.queue), replicas=2, replica_cpus=0, retries=args.retries
        )
        serve.run(build(rargs), name="voxpool", route_prefix="/")
        durations, load_time = calibrate(url, args.calibrate)
        mean = statistics.fmean(durations)
        rate = args.load * 2 / mean
        times = arrivals(args.requests, rate, args.seed)
        real = play(url, times)
    finally:
        serve.shutdown()
        ray.shutdown()

    with tempfile.TemporaryDirectory() as tmp:
        path = workload_toml(times, durations, load_time, args.queue, args.retries, Path(tmp))
        summary = run_fleet(load_workload(path), args.seed)

    ok = [s for status, s in real if status == 200]
    real_busy = sum(1 for status, _ in real if status == 503) / len(real)
    other = sorted({status for status, _ in real if status not in (200, 503)})
    rows = [
        ("p50 latency (s)", percentile(ok, 0.50), summary.latency.p50),
        ("p95 latency (s)", percentile(ok, 0.95), summary.latency.p95),
        ("503 rate", real_busy, summary.busy_rate),
    ]
    print(
        f"# {args.requests} requests, Poisson at {rate:.2f}/s ({args.load:.2f} of 2 slots), "
        f"durations: {len(durations)} measured, mean {mean:.3f} s, load {load_time:.2f} s; "
        f"queue {args.queue}, retries {args.retries}"
        + (f"; other statuses: {other}" if other else "")
    )
    print(
        markdown_table(
            [
                {
                    "metric": name,
                    "real Ray (2 replicas)": f"{r:.3f}",
                    "voxpool sim fleet": f"{sim:.3f}",
                    "sim / real": f"{sim / r:.2f}" if r else "-",
                }
                for name, r, sim in rows
            ]
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
