"""Adaptive BLAS threads (#15): ``voxpool serve`` with ``threads: "auto"`` vs ``threads: 1``.

    python bench/threads.py [--repeats 2] [--slots 2]

Two real servers (the ASR family, Whisper tiny.en, ``--slots`` slots, no batching) on this machine's
cores, one with the default ``"auto"`` policy (server/blas.py: a call alone gets every
core, concurrent calls share them) and one pinned to one BLAS thread per call (the old
default). Waves of 1, 2 and 8 concurrent transcriptions (the inputs of
``bench/batched_models.py``) over HTTP, alternating between the servers with a 1 s
pause before each wave; median wave seconds and the ratio auto / fixed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if sys.path[:1] != [str(ROOT)]:
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from bench.batched_models import _whisper_inputs  # noqa: E402
from bench.batching import _wav  # noqa: E402
from bench.common import markdown_table  # noqa: E402
from server.families import registry  # noqa: E402
from tests.server.live import LiveServer  # noqa: E402

WAVES = (1, 2, 8)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--slots", type=int, default=2)
    args = p.parse_args(argv)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = ""  # LiveServer pins 1 thread unless a value is named
    logs = Path(tempfile.mkdtemp(prefix="voxpool-threads-"))
    files = [_wav(audio) for _, audio in _whisper_inputs()]
    asr = registry.for_task("asr").name
    servers: dict[str, LiveServer] = {}
    for name, threads in (("auto", "auto"), ("fixed 1", 1)):
        model = {"id": asr, "family": asr, "slots": args.slots}
        path = logs / f"{name.replace(' ', '')}.json"
        path.write_text(json.dumps({"busy_timeout_ms": 0, "threads": threads, "models": [model]}))
        servers[name] = LiveServer(path, logs).start()

    def one(url: str, data: bytes) -> str:
        r = httpx.post(
            url + "/v1/audio/transcriptions",
            files={"file": ("a.wav", data, "audio/wav")},
            data={"model": asr},
            timeout=600.0,
        )
        r.raise_for_status()
        return str(r.json()["text"])

    def wave(url: str, n: int) -> float:
        with ThreadPoolExecutor(n) as pool:
            t0 = time.perf_counter()
            list(pool.map(lambda d: one(url, d), files[:n]))
            return time.perf_counter() - t0

    try:
        for server in servers.values():
            wave(server.url, 1)  # load
        times: dict[tuple[str, int], list[float]] = {}
        for rep in range(args.repeats):
            for n in WAVES:
                for name in list(servers) if rep % 2 == 0 else list(servers)[::-1]:
                    time.sleep(1.0)
                    times.setdefault((name, n), []).append(wave(servers[name].url, n))
    finally:
        for server in servers.values():
            server.stop()
    rows = []
    for n in WAVES:
        auto = statistics.median(times[("auto", n)])
        fixed = statistics.median(times[("fixed 1", n)])
        row = {"concurrent": n, "auto_s": round(auto, 2), "fixed_1_s": round(fixed, 2)}
        rows.append({**row, "auto/fixed": round(auto / fixed, 2)})
    print(f"cores: {len(os.sched_getaffinity(0))}, slots: {args.slots}")
    print(markdown_table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
