"""Soak a real ``voxpool serve``: N concurrent clients on every route for a while, then a table.

Starts the embedded default (bundled models, numpy, 2 slots each) on a free
loopback port, runs ``--clients`` client tasks for ``--seconds``, each picking a
route at random (seeded): speech (WAV), speech streamed as SSE (a quarter of them
disconnect after the first event), transcription (multipart WAV), VAD,
``/v1/models`` and ``/health``; each task's model is the first the server lists
for it. Prints per-route counts, the status histogram,
p50/p95/p99 latency, the server's resident memory at start, after warm-up
(a fifth of the run) and at the end (flat = within 10% after warm-up), and the
counters once the clients stop (every active slot and queue must be back at 0).

    .venv/bin/python bench/soak.py [--clients 32] [--seconds 180] [--seed 0]

Exit status 0 when memory is flat and the counters drain, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import socket
import statistics
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
HELLO = (ROOT / "tests" / "data" / "server" / "audio" / "hello.wav").read_bytes()
TEXTS = (
    "Hello world.",
    "The quick brown fox jumps over the lazy dog.",
    "Soak testing keeps servers honest.",
)
ROUTES = ("speech", "speech_sse", "transcribe", "vad", "models", "health")
WEIGHTS = (3, 2, 2, 2, 1, 1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def task_models(client: httpx.AsyncClient) -> dict[str, str]:
    """Task -> the id of the first model the server lists for it."""
    rows = (await client.get("/v1/models")).json()["data"]
    models: dict[str, str] = {}
    for row in rows:
        models.setdefault(row["task"], row["id"])
    return models


async def one(
    client: httpx.AsyncClient, route: str, rng: random.Random, models: dict[str, str]
) -> int:
    """One request on ``route`` to the model of its task (``models``); the status code (499:
    the client left on purpose)."""
    text = rng.choice(TEXTS)
    if route == "speech":
        body = {"model": models["tts"], "input": text, "response_format": "wav"}
        r = await client.post("/v1/audio/speech", json=body)
        return r.status_code
    if route == "speech_sse":
        body = {"model": models["tts"], "input": text, "stream": True}
        leave = rng.random() < 0.25
        async with client.stream("POST", "/v1/audio/speech", json=body) as r:
            async for _ in r.aiter_lines():
                if leave:
                    return 499  # a mid-stream disconnect: closing the stream drops the connection
            return r.status_code
    if route == "transcribe":
        files = {"file": ("hello.wav", HELLO, "audio/wav")}
        data = {"model": models["asr"]}
        r = await client.post("/v1/audio/transcriptions", files=files, data=data)
        return r.status_code
    if route == "vad":
        files = {"file": ("hello.wav", HELLO, "audio/wav")}
        r = await client.post("/v1/audio/vad", files=files, data={"model": models["vad"]})
        return r.status_code
    r = await client.get("/v1/models" if route == "models" else "/health")
    return r.status_code


async def soak(url: str, pid: int, clients: int, seconds: float, seed: int) -> dict[str, object]:
    latencies: dict[str, list[float]] = defaultdict(list)
    statuses: Counter[tuple[str, int]] = Counter()
    memory = {"start": rss_mib(pid)}
    start = time.monotonic()
    stop = start + seconds
    async with httpx.AsyncClient(base_url=url, timeout=10.0) as client:
        models = await task_models(client)

    async def client_task(n: int) -> None:
        rng = random.Random(seed * 1000 + n)
        async with httpx.AsyncClient(base_url=url, timeout=120.0) as client:
            while time.monotonic() < stop:
                route = rng.choices(ROUTES, WEIGHTS)[0]
                t0 = time.monotonic()
                try:
                    status = await one(client, route, rng, models)
                except httpx.HTTPError:
                    status = 0  # a transport failure: counted, never hidden
                latencies[route].append(time.monotonic() - t0)
                statuses[(route, status)] += 1

    async def sample_memory() -> None:
        await asyncio.sleep(seconds / 5)
        memory["warm"] = rss_mib(pid)

    await asyncio.gather(sample_memory(), *(client_task(n) for n in range(clients)))
    memory["end"] = rss_mib(pid)
    async with httpx.AsyncClient(base_url=url, timeout=10.0) as client:
        deadline = time.monotonic() + 60.0  # a hang guard: the counters must drain
        while True:
            rows = (await client.get("/v1/models")).json()["data"]
            busy = {
                r["id"]: (r["active_slots"], r["queued_requests"], r["queued_management"])
                for r in rows
            }
            if all(v == (0, 0, 0) for v in busy.values()) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
    return {
        "latencies": latencies,
        "statuses": statuses,
        "memory": memory,
        "counters": busy,
        "wall": time.monotonic() - start,
    }


def pct(values: list[float], q: float) -> float:
    return (
        statistics.quantiles(values, n=100, method="inclusive")[q - 1]
        if len(values) > 1
        else values[0]
    )


def report(out: dict[str, object], clients: int, seconds: float) -> bool:
    latencies: dict[str, list[float]] = out["latencies"]  # type: ignore[assignment]
    statuses: Counter[tuple[str, int]] = out["statuses"]  # type: ignore[assignment]
    memory: dict[str, float] = out["memory"]  # type: ignore[assignment]
    counters: dict[str, tuple[int, int, int]] = out["counters"]  # type: ignore[assignment]
    print(f"soak: {clients} clients for {seconds:g} s (wall {out['wall']:.1f} s)")
    print("| route | requests | statuses | p50 | p95 | p99 |")
    print("|---|---:|---|---:|---:|---:|")
    for route in ROUTES:
        lat = latencies.get(route, [])
        if not lat:
            continue
        codes = ", ".join(f"{code}: {n}" for (r, code), n in sorted(statuses.items()) if r == route)
        print(
            f"| {route} | {len(lat)} | {codes} | {pct(lat, 50):.2f} s | "
            f"{pct(lat, 95):.2f} s | {pct(lat, 99):.2f} s |"
        )
    histogram = Counter[int]()
    for (_, code), n in statuses.items():
        histogram[code] += n
    print("status histogram:", ", ".join(f"{code}: {n}" for code, n in sorted(histogram.items())))
    flat = memory["end"] <= memory["warm"] * 1.10
    print(
        f"resident memory: start {memory['start']:.0f} MiB, "
        f"after warm-up {memory['warm']:.0f} MiB, "
        f"end {memory['end']:.0f} MiB ({'flat' if flat else 'GREW'}: "
        f"end/warm = {memory['end'] / memory['warm']:.3f})"
    )
    drained = all(v == (0, 0, 0) for v in counters.values())
    print(
        "counters after the run (active, queued requests, queued management):",
        counters,
        "OK" if drained else "NOT DRAINED",
    )
    unexpected = {code for code in histogram if code not in (200, 499)}
    if unexpected:
        print("unexpected statuses:", sorted(unexpected))
    return flat and drained and not unexpected


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=180.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "server.cli", "serve", "--parallel-jobs", "--port", str(port)]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120.0
        while True:
            try:
                if httpx.get(url + "/health", timeout=2.0).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                print("the server did not start", file=sys.stderr)
                return 1
            time.sleep(0.2)
        out = asyncio.run(soak(url, proc.pid, args.clients, args.seconds, args.seed))
        ok = report(out, args.clients, args.seconds)
    finally:
        proc.terminate()
        code = proc.wait(timeout=120)
    print(f"server exit code after SIGTERM: {code}")
    return 0 if ok and code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
