"""Silero VAD live streams through the runtime (issue #14): sustained streams vs chunk latency.

Each stream is a *live member* of one batched ``silero_vad`` model: its owner opens
``Runtime.open_stream(model, VadRequest(empty), feed=feed)`` and reads the
:class:`VadChunk` s as they come, while a paced feeder pushes the stream's next 512
samples (32 ms) into its :class:`core.engine.Feed` every 32 ms of wall time. The
streams' phases are spread evenly over the 32 ms period (as independent clients
would be); one feeder task keeps every stream's own schedule (one task per
stream would measure the event loop's timers, not the runtime). The runtime is
in-process: the production :class:`~server.provider.ThreadedProvider` with the
server's ``threads: "auto"`` policy on ``--threads`` cores, the real Silero
weights, the model registered with ``batching: true`` and one slot per stream.

*Chunk latency* is measured from the moment a chunk's last sample was due (its
scheduled push, so a feeder that falls behind counts against us) to the moment
its owner reads that chunk's result. The first second of every run is warm-up
and not counted. A stream count is *sustained* when the p99 latency stays under
32 ms (one chunk period: the backlog cannot grow).

onnxruntime, in the same run on the same threads: silero's ONNX graph run once
per 32 ms tick over B rows (input ``[B, 576]``, state ``[2, B, 128]``), B
streams batched; its chunk latency is the run's time (no runtime, no feeder),
and B is sustained when the p99 run time is under 32 ms. ``CPU us/chunk`` is the
process's CPU time per chunk (every thread: ours includes the event loop and the
feeder), ``engine us/chunk`` our engine steps' own (worker thread clocks): CPU
clocks, which other processes' load does not inflate as it does wall times.

The rows alternate, onnxruntime's i-th batch size then our i-th stream count, so both see
the same machine; ``load`` is the 1-minute load average when the row started.

Run: ``.venv/bin/python bench/vad_streams.py --streams 100,400,800,1100 --seconds 8``
(``--ort 100,400,800,1100,1400`` for the onnxruntime rows; ``--ours-threads 1`` runs our
runtime on one core's worth of BLAS threads while onnxruntime keeps ``--threads``;
``--math exact,gemm`` runs our engine both ways; ``--loop asyncio`` on asyncio instead of
trio, the server's event loop; ``--engine 150,600,1100`` first measures the engine alone,
no runtime: that many live members stepped with one new chunk each, its CPU per chunk;
``--zero-forward`` replaces our forward by zeros, leaving the runtime's own cost;
``--feed-tick 1`` wakes the feeder at most once a millisecond, pushing every chunk due by
then: a chunk may be pushed up to 1 ms late, which counts against us, and the feeder's
timer per push, a cost of the bench rather than the runtime, goes).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# run as a script, bench/ comes first on the path and its backends.py would hide the package
sys.path[:] = [str(ROOT)] + [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]

import backends  # noqa: E402,F401  # before numpy: OpenBLAS's environment as the server has it

# isort: split
import numpy as np  # noqa: E402

from bench.common import markdown_table  # noqa: E402
from server.provider import ThreadedProvider  # noqa: E402

RATE = 16000
CHUNK = 512
PERIOD = CHUNK / RATE  # 32 ms
WARMUP_S = 1.0
MODEL = "vad"


def _audio(seconds: float) -> np.ndarray:
    """The speech mix fixture, repeated to ``seconds`` plus one period."""
    from server.families.data import read_wav
    from server.families.silero_vad import MIX

    mix = np.asarray(read_wav(MIX), np.float32)
    need = int((seconds + 1) * RATE)
    return np.tile(mix, -(-need // len(mix)))[:need]


def _percentiles(values: list[float]) -> tuple[float, float, float]:
    """p50, p99 and max, in ms."""
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]
    return 1e3 * statistics.median(ordered), 1e3 * p99, 1e3 * ordered[-1]


class _TimedProvider(ThreadedProvider):
    """The production provider, counting the CPU time its worker threads spend in engine
    steps (the thread's own clock: what the load of other processes does not inflate)."""

    engine_cpu = 0.0

    async def step(self, engine: Any, keys: Sequence[int]) -> list[Any]:
        def timed() -> list[Any]:
            start = time.thread_time()
            try:
                return list(engine.step(list(keys)))
            finally:
                self.engine_cpu += time.thread_time() - start

        emitted: list[Any] = await self._thread(timed)
        return emitted


def run_streams(
    streams: int,
    seconds: float,
    threads: int,
    loop: str = "trio",
    math: str = "exact",
    zero_forward: bool = False,
    feed_tick: float = 0.0,
) -> dict[str, Any]:
    """``streams`` live 32 ms streams for ``seconds`` through the runtime on the event loop
    ``loop`` ("trio", the server's, or "asyncio"), the engine's products as ``math`` says
    (the ``batch_math`` load option); one table row. ``zero_forward``: the engine's forward
    answers zeros at no cost (what is left is the runtime's and the engine's bookkeeping).
    ``feed_tick``: the feeder sleeps at least this long (seconds) when it is ahead."""
    import anyio

    from backends.silero_vad import VadRequest
    from core.engine import Feed
    from server.blas import AdaptiveThreads
    from server.runtime import ModelSpec, Runtime, RuntimeConfig

    audio = _audio(seconds)
    ticks = int(seconds / PERIOD)
    offsets = [(i * 7919) % (len(audio) - ticks * CHUNK) for i in range(streams)]
    phases = [PERIOD * i / streams for i in range(streams)]
    latencies: list[float] = []
    load = round(os.getloadavg()[0], 2)

    async def main() -> dict[str, Any]:
        provider = _TimedProvider(threads=AdaptiveThreads(threads))
        rt = Runtime(provider, RuntimeConfig(busy_timeout_ms=0))
        options = {"batch_math": math}
        spec = ModelSpec(
            MODEL, "silero_vad", task="vad", slots=streams, batching=True, load_options=options
        )
        rt.add_model(spec)
        feeds = [Feed() for _ in range(streams)]
        due: list[float] = [0.0] * streams  # when each stream's first chunk is due
        async with rt:
            await rt.load_model(MODEL)
            driver = rt.drivers[MODEL]
            if zero_forward:

                def zeros(keys: Sequence[int], sizes: Sequence[int], _: Any) -> np.ndarray:
                    return np.zeros((max(sizes), len(keys)), np.float32)

                driver.engine._run = zeros  # type: ignore[attr-defined]

            async def own(i: int) -> None:
                request = VadRequest(np.zeros(0, np.float32))
                async with rt.open_stream(MODEL, request, feed=feeds[i]) as chunks:
                    async for chunk in chunks:
                        now = time.monotonic()  # the feeder's clock
                        scheduled = due[i] + chunk.index * PERIOD
                        if chunk.index * PERIOD >= WARMUP_S and chunk.index < ticks:
                            latencies.append(now - scheduled)

            async def feed_all(start: float) -> None:
                order = sorted(range(streams), key=lambda i: phases[i])
                for i in order:
                    due[i] = start + phases[i] + PERIOD
                for k in range(ticks):
                    for i in order:
                        at = due[i] + k * PERIOD
                        ahead = at - time.monotonic()  # trio's own clock has an offset
                        if ahead > 0:
                            await anyio.sleep(max(ahead, feed_tick))
                        lo = offsets[i] + k * CHUNK
                        feeds[i].push(audio[lo : lo + CHUNK])
                for feed in feeds:
                    feed.close()

            async with anyio.create_task_group() as tg:
                for i in range(streams):
                    tg.start_soon(own, i)
                while driver.members < streams:  # every stream is open before the audio starts
                    await anyio.sleep(0.01)
                steps0, cpu0, wall0 = driver.steps, time.process_time(), time.perf_counter()
                engine0 = provider.engine_cpu
                await feed_all(time.monotonic() + 0.05)
            steps = driver.steps - steps0
            cpu = time.process_time() - cpu0
            engine_cpu = provider.engine_cpu - engine0
            wall = time.perf_counter() - wall0
        p50, p99, worst = _percentiles(latencies)
        return {
            "impl": f"voxpool runtime, {'zero forward' if zero_forward else math}, {loop}"
            f" (threads {threads}{f', feed tick {1e3 * feed_tick:g} ms' if feed_tick else ''})",
            "load": load,
            "streams": streams,
            "chunks timed": len(latencies),
            "p50 ms": round(p50, 1),
            "p99 ms": round(p99, 1),
            "max ms": round(worst, 1),
            "steps/s": round(steps / wall, 1),
            "chunks/step": round(streams * ticks / max(steps, 1), 1),
            "CPU": f"{cpu / wall:.2f} cores",
            "CPU us/chunk": round(1e6 * cpu / (streams * ticks)),
            "engine us/chunk": round(1e6 * engine_cpu / (streams * ticks)),
            "sustained": "yes" if p99 < PERIOD * 1e3 else "no",
        }

    result: dict[str, Any] = anyio.run(main, backend=loop)
    return result


def run_engine(members: int, threads: int, math: str, steps: int = 30) -> dict[str, Any]:
    """The engine alone: ``members`` live members pushing one 32 ms chunk each per step,
    ``steps`` steps (after 3 of warm-up) with ``threads`` BLAS threads; its CPU per chunk
    (the stepping thread's clock, and the process's, which BLAS threads add to)."""
    from threadpoolctl import threadpool_limits

    from backends.silero_vad import VadRequest, load_factory
    from core.engine import Feed, Member

    audio = _audio(steps * PERIOD + 1)
    load = round(os.getloadavg()[0], 2)
    with threadpool_limits(threads, user_api="blas"):
        engine = load_factory(batch_math=math).engine(members)
        feeds = [Feed() for _ in range(members)]
        empty = VadRequest(np.zeros(0, np.float32))
        engine.join([Member(k, empty, True, feeds[k]) for k in range(members)])
        keys = list(range(members))
        offsets = [(k * 7919) % (len(audio) - (steps + 4) * CHUNK) for k in range(members)]
        own = cpu = 0.0
        for s in range(steps + 3):
            for k in keys:
                lo = offsets[k] + s * CHUNK
                feeds[k].push(audio[lo : lo + CHUNK])
            t, c = time.thread_time(), time.process_time()
            engine.step(keys)
            if s >= 3:
                own += time.thread_time() - t
                cpu += time.process_time() - c
    return {
        "impl": f"engine alone, {math} (BLAS threads {threads})",
        "load": load,
        "streams": members,
        "chunks timed": members * steps,
        "p50 ms": "",
        "p99 ms": "",
        "max ms": "",
        "steps/s": "",
        "chunks/step": members,
        "CPU": "",
        "CPU us/chunk": round(1e6 * cpu / (members * steps)),
        "engine us/chunk": round(1e6 * own / (members * steps)),
        "sustained": "",
    }


def run_ort(batch: int, threads: int, runs: int = 100) -> dict[str, Any]:
    """onnxruntime: one batched run of ``batch`` rows per tick, ``runs`` ticks; one table row."""
    import onnxruntime as ort

    from backends.silero_vad.weights import ONNX_FILE, package_file

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(
        str(package_file(ONNX_FILE)), providers=["CPUExecutionProvider"], sess_options=opts
    )
    audio = _audio(runs * PERIOD + 1)
    state = np.zeros((2, batch, 128), np.float32)
    context = np.zeros((batch, 64), np.float32)
    sr = np.array(RATE, dtype=np.int64)
    offsets = (np.arange(batch) * 7919) % (len(audio) - (runs + 6) * CHUNK)
    times = []
    cpu = 0.0
    load = round(os.getloadavg()[0], 2)
    for k in range(runs + 5):
        chunk = np.stack([audio[o + k * CHUNK : o + (k + 1) * CHUNK] for o in offsets])
        window = np.concatenate([context, chunk], axis=1)
        t, c = time.perf_counter(), time.process_time()
        _, state = sess.run(None, {"input": window, "state": state, "sr": sr})
        if k >= 5:  # warm-up
            times.append(time.perf_counter() - t)
            cpu += time.process_time() - c
        context = window[:, -64:]
    p50, p99, worst = _percentiles(times)
    return {
        "impl": f"onnxruntime batched run ({threads} threads)",
        "load": load,
        "streams": batch,
        "chunks timed": batch * runs,
        "p50 ms": round(p50, 1),
        "p99 ms": round(p99, 1),
        "max ms": round(worst, 1),
        "steps/s": "",
        "chunks/step": batch,
        "CPU": "",
        "CPU us/chunk": round(1e6 * cpu / (batch * runs)),
        "engine us/chunk": "",
        "sustained": "yes" if p99 < PERIOD * 1e3 else "no",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", default="100,400,800,1100", help="stream counts to run")
    parser.add_argument("--ort", default="100,400,800,1100,1400", help="onnxruntime batch sizes")
    parser.add_argument("--seconds", type=float, default=8.0, help="audio per stream")
    parser.add_argument(
        "--threads", type=int, default=2, help="cores: onnxruntime's and our BLAS threads"
    )
    parser.add_argument(
        "--ours-threads", type=int, default=0, help="our runtime's cores (default: --threads)"
    )
    parser.add_argument(
        "--loop", default="trio", choices=("trio", "asyncio"), help="our event loop (server: trio)"
    )
    parser.add_argument(
        "--math", default="exact", help="our engine's batch_math: exact, gemm or both (exact,gemm)"
    )
    parser.add_argument(
        "--engine", default="", help="member counts for the engine alone (before the rest)"
    )
    parser.add_argument(
        "--zero-forward", action="store_true", help="our forward answers zeros at no cost"
    )
    parser.add_argument(
        "--feed-tick", type=float, default=0.0, help="ms: the feeder wakes at most this often"
    )
    args = parser.parse_args(argv)
    print(f"load before: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}", flush=True)
    ort_sizes = [int(x) for x in args.ort.split(",") if x]
    stream_counts = [int(x) for x in args.streams.split(",") if x]
    ours = args.ours_threads or args.threads
    rows = []
    for n in (int(x) for x in args.engine.split(",") if x):
        for products in args.math.split(","):
            rows.append(run_engine(n, ours, products))
            print(rows[-1], flush=True)
    for i in range(max(len(ort_sizes), len(stream_counts))):  # alternating: the same machine
        if i < len(ort_sizes):
            rows.append(run_ort(ort_sizes[i], args.threads))
            print(rows[-1], flush=True)
        for products in args.math.split(",") if i < len(stream_counts) else ():
            row = run_streams(
                stream_counts[i],
                args.seconds,
                ours,
                args.loop,
                products,
                args.zero_forward,
                args.feed_tick / 1e3,
            )
            rows.append(row)
            print(rows[-1], flush=True)
    print(f"load after: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}")
    print(markdown_table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
