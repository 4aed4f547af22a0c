"""Parallel session slots through the runtime: N requests on one slot vs N slots (seed 003 report).

    python bench/slots.py [--slots 2,4] [--repeats 3] [--only piper,whisper,silero_vad]

For each family two runtimes (``Runtime`` + ``ThreadedProvider``, busy timeout 0)
serve the same model, one at ``slots=1`` and one at ``slots=N``, side by side.
Cold load (weights plus every session of the pool) is timed on its own. Then,
after one warm-up wave on each, every repeat runs, alternately so both see the
same machine load: one request on the 1-slot model, the N requests one after
another on the 1-slot model (measured total, not N x one), and the same N
requests submitted at once on the N-slot model. BLAS is held to one thread so
any speed-up comes from the slots (worker threads; numpy releases the GIL).
Peak RSS is sampled from ``/proc/self/statm`` every 50 ms during those runs,
and the concurrent outputs are compared with the serial ones exactly.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import wave
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if sys.path[:1] != [str(ROOT)]:  # run as a script: the project, not bench/core.py
    sys.path.insert(0, str(ROOT))

import anyio  # noqa: E402
import attrs  # noqa: E402
import numpy as np  # noqa: E402

from server.provider import ThreadedProvider  # noqa: E402
from server.runtime import ModelSpec, Runtime, RuntimeConfig  # noqa: E402

DATA = ROOT / "tests" / "data"
PIPER_TEXT = "The weather is lovely today, let us go for a walk."
TASKS = {"piper": "tts", "whisper": "asr", "silero_vad": "vad"}


@attrs.frozen
class Workload:
    """The requests of one family and how to reduce a result to what must be identical."""

    family: str
    label: str
    requests: Callable[[int], list[Any]]  # n -> the n requests of one wave
    fingerprint: Callable[[Any], bytes | str]


@attrs.frozen
class SlotRow:
    """One model at one slot count: the measured figures of the report."""

    model: str
    input: str
    n: int
    repeats: int
    cold_1_ms: float
    cold_n_ms: float
    one_ms: float
    serial_ms: float
    parallel_ms: float
    latency_median_ms: float
    latency_max_ms: float
    failures: int
    peak_rss_mb: float
    identical: bool

    @property
    def saved_pct(self) -> float:
        return time_saved(self.serial_ms, self.parallel_ms)


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


@contextmanager
def one_blas_thread() -> Iterator[None]:
    """BLAS on one thread per call: parallelism must come from the slots."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1):
        yield


def read_wav(path: Path) -> np.ndarray:
    """16-bit mono WAV as float32 in [-1, 1]."""
    with wave.open(str(path)) as f:
        if f.getsampwidth() != 2 or f.getnchannels() != 1:
            raise ValueError(f"{path}: expected 16-bit mono")
        pcm = np.frombuffer(f.readframes(f.getnframes()), dtype="<i2")
    return (pcm.astype(np.float32) / 32768.0).copy()


def piper_workload() -> Workload:
    from backends.piper import PiperRequest

    def requests(n: int) -> list[Any]:
        return [PiperRequest(PIPER_TEXT, seed=i) for i in range(n)]

    return Workload("piper", "1 sentence, seed i", requests, lambda r: r.audio.tobytes())


def whisper_workload() -> Workload:
    from backends.whisper.types import WhisperRequest

    clips = [read_wav(DATA / "whisper" / name) for name in ("short.wav", "weather.wav")]

    def requests(n: int) -> list[Any]:
        return [WhisperRequest(clips[i % len(clips)]) for i in range(n)]

    return Workload("whisper", "short.wav, weather.wav", requests, lambda r: r.text)


def vad_workload(seconds: float = 15.0) -> Workload:
    from backends.silero_vad import VadRequest

    audio = read_wav(DATA / "silero_vad" / "speech_mix_16k.wav")[: int(seconds * 16000)]

    def requests(n: int) -> list[Any]:
        return [VadRequest(audio) for _ in range(n)]

    label = f"speech_mix {audio.size / 16000:.1f} s"
    return Workload("silero_vad", label, requests, lambda r: r.probabilities.tobytes())


WORKLOADS: dict[str, Callable[[], Workload]] = {
    "piper": piper_workload,
    "whisper": whisper_workload,
    "silero_vad": vad_workload,
}


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
    """The requests all submitted at once; (total seconds until the last finished, results in order)."""
    outs: list[list[Any]] = [[] for _ in requests]
    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for request, out in zip(requests, outs, strict=True):
            tg.start_soon(_timed, rt, model, request, out, lat)
    return time.perf_counter() - t0, [o[0] for o in outs]


def _spec(family: str, slots: int) -> ModelSpec:
    return ModelSpec(id=f"{family}-x{slots}", family=family, task=TASKS[family], slots=slots)


async def _cold_load(rt: Runtime, model: str) -> float:
    t0 = time.perf_counter()
    await rt.load_model(model)
    return time.perf_counter() - t0


async def measure(workload: Workload, n: int, repeats: int = 3) -> SlotRow:
    """The report row of one family at ``n`` slots (see the module doc)."""
    if n < 2 or repeats < 3:
        raise ValueError("need n >= 2 slots and >= 3 warm repeats")
    family = workload.family
    one_spec, n_spec = _spec(family, 1), _spec(family, n)
    requests = workload.requests(n)
    config = RuntimeConfig(busy_timeout_ms=0)
    sampler = RssSampler()
    one_s: list[float] = []
    serial_s: list[float] = []
    parallel_s: list[float] = []
    latencies: list[float] = []
    results: list[list[Any]] = []
    async with (
        Runtime(ThreadedProvider(), config) as one,
        Runtime(ThreadedProvider(), config) as many,
    ):
        one.add_model(one_spec)
        many.add_model(n_spec)
        cold_1 = await _cold_load(one, one_spec.id)
        cold_n = await _cold_load(many, n_spec.id)
        async with anyio.create_task_group() as tg:
            tg.start_soon(sampler.run)
            await serial_wave(one, one_spec.id, requests, [])  # warm-up
            await parallel_wave(many, n_spec.id, requests, [])  # warm-up of every slot
            for _ in range(repeats):
                one_s.append((await serial_wave(one, one_spec.id, requests[:1], []))[0])
                total, out = await serial_wave(one, one_spec.id, requests, latencies)
                serial_s.append(total)
                results.append(out)
                total, out = await parallel_wave(many, n_spec.id, requests, latencies)
                parallel_s.append(total)
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
        cold_1_ms=cold_1 * 1e3,
        cold_n_ms=cold_n * 1e3,
        one_ms=statistics.median(one_s) * 1e3,
        serial_ms=statistics.median(serial_s) * 1e3,
        parallel_ms=statistics.median(parallel_s) * 1e3,
        latency_median_ms=statistics.median(latencies) * 1e3,
        latency_max_ms=max(latencies) * 1e3,
        failures=failures,
        peak_rss_mb=sampler.peak / 2**20,
        identical=identical,
    )


def run(workload: Workload, n: int, repeats: int = 3) -> SlotRow:
    """:func:`measure` in its own event loop, with BLAS on one thread."""
    with one_blas_thread():
        return anyio.run(measure, workload, n, repeats)


HEAD = (
    "| model | input | N | cold 1-slot ms | cold N-slot ms | one request ms | N serial ms (1 slot) "
    "| N on N slots ms | time saved % | latency median / max ms | failures | peak RSS MB | outputs identical |"
)


def table(rows: Sequence[SlotRow]) -> str:
    """The rows as a Markdown table (medians of the warm repeats)."""
    lines = [HEAD, "|" + "---|" * 3 + "---:|" * 9 + "---|"]
    for r in rows:
        lines.append(
            f"| {r.model} | {r.input} | {r.n} | {r.cold_1_ms:.0f} | {r.cold_n_ms:.0f} | {r.one_ms:.1f} "
            f"| {r.serial_ms:.1f} | {r.parallel_ms:.1f} | {r.saved_pct:.1f} "
            f"| {r.latency_median_ms:.1f} / {r.latency_max_ms:.1f} | {r.failures} "
            f"| {r.peak_rss_mb:.0f} | {'yes' if r.identical else 'no'} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", default="2", help="comma-separated slot counts N (>= 2)")
    parser.add_argument("--repeats", type=int, default=3, help="warm repeats (>= 3)")
    parser.add_argument("--only", default=",".join(WORKLOADS))
    args = parser.parse_args()
    counts = [int(s) for s in args.slots.split(",")]
    families = [f.strip() for f in args.only.split(",")]
    with open("/proc/loadavg", encoding="ascii") as f:
        print(
            f"load average at start: {f.read().split()[:3]}; cpus: {os.cpu_count()}; repeats: {args.repeats}"
        )
    rows = [run(WORKLOADS[family](), n, args.repeats) for family in families for n in counts]
    print(table(rows))
    print(f"outputs identical: {'yes' if all(r.identical for r in rows) else 'no'}")
    with open("/proc/loadavg", encoding="ascii") as f:
        print(f"load average at end: {f.read().split()[:3]}")
    return 0 if all(r.failures == 0 and r.identical for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
