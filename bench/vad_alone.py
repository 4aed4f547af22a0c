"""One offline Silero VAD request alone: through a batching model's engine vs a session.

Issue #14 asks that batching not tax a request that runs alone by more than 5%.
Two models in one runtime (real sessions, adaptive BLAS threads as ``voxpool
serve`` has them): ``vad`` (2 session slots) and ``vadb`` (``batching: true``,
16 engine rows); the same file through each, one request at a time, alternating.
Prints the medians and the ratio, and checks the probabilities are identical.
Run: ``.venv/bin/python bench/vad_alone.py [rounds] [fixture] [window_ms]`` (default 7,
story). ``window_ms`` replaces the batching model's collection window (how long a lone
arrival waits for others when nothing runs: Silero VAD's engine declares 0, the runtime's
default is 2 ms), to show what it costs a request alone; the table prints the window the
model's scheduler used.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if sys.path[:1] != [str(ROOT)]:  # the project's packages, not bench/backends.py
    sys.path.insert(0, str(ROOT))

import backends  # noqa: E402,F401  # before numpy: OpenBLAS's environment as the server has it

# isort: split
import anyio  # noqa: E402
import numpy as np  # noqa: E402

from bench.common import markdown_table  # noqa: E402
from server.blas import AdaptiveThreads, cores  # noqa: E402
from server.families.data import read_wav  # noqa: E402
from server.provider import ThreadedProvider  # noqa: E402
from server.runtime import ModelSpec, Runtime, RuntimeConfig  # noqa: E402


def _audio(name: str) -> np.ndarray:
    return read_wav(ROOT / "tests/data/whisper" / f"{name}.wav")  # the speech fixtures


async def _measure(
    audio: np.ndarray, rounds: int, window: float | None
) -> tuple[dict[str, list[float]], float]:
    from backends.silero_vad import VadRequest

    rt = Runtime(ThreadedProvider(threads=AdaptiveThreads(cores())), RuntimeConfig())
    rt.add_model(ModelSpec("vad", "silero_vad", task="vad", slots=2))
    rt.add_model(ModelSpec("vadb", "silero_vad", task="vad", slots=16, batching=True))
    times: dict[str, list[float]] = {"vad": [], "vadb": []}
    async with rt:
        first = {m: await rt.run(m, VadRequest(audio)) for m in times}  # loads, warms
        scheduler = rt.drivers["vadb"].scheduler
        if window is not None:
            scheduler.window = window
        same = np.array_equal(first["vad"].probabilities, first["vadb"].probabilities)
        if not same:
            raise SystemExit("batched probabilities differ from the session's")
        for _ in range(rounds):
            for model in times:
                t0 = time.perf_counter()
                await rt.run(model, VadRequest(audio))
                times[model].append(time.perf_counter() - t0)
    return times, scheduler.window


def main() -> None:
    args = sys.argv[1:]
    rounds = int(args[0]) if args else 7
    name = args[1] if len(args) > 1 else "story"
    override = float(args[2]) / 1000 if len(args) > 2 else None
    audio = _audio(name)
    times, window = anyio.run(_measure, audio, rounds, override)
    session, batched = (statistics.median(times[m]) for m in ("vad", "vadb"))
    rows = [
        {
            "input": f"{name} ({len(audio) / 16000:.1f} s)",
            "cores": cores(),
            "window ms": window * 1000,
            "session ms": round(session * 1000, 1),
            "batched engine ms": round(batched * 1000, 1),
            "batched / session": round(batched / session, 2),
        }
    ]
    print(markdown_table(rows))


if __name__ == "__main__":
    main()
