"""How long one Silero VAD engine call takes when its members advance full offline blocks.

With no live stream in the engine, one engine call advances its run members by
``OFFLINE_STEP_CHUNKS`` (512) chunks in all, shared out among them (at least 8 each), so
a live stream or request that arrives meanwhile waits for a call of about 512 chunks
whatever the members (up to 64). Here ``n`` run members of one offline block (16.4 s)
each join an engine together (their join is the first such call) at one BLAS thread.
Run: ``.venv/bin/python bench/vad_block_wait.py [rounds] [members ...]`` (default 3; 1 4 16).
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
import numpy as np  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

from backends.silero_vad import VadRequest, load_factory  # noqa: E402
from backends.silero_vad.batched import MATHS, OFFLINE_STEP_CHUNKS  # noqa: E402
from bench.common import markdown_table  # noqa: E402
from core.engine import Member  # noqa: E402
from server.families.data import read_wav  # noqa: E402
from server.families.silero_vad import MIX  # noqa: E402
from server.provider import make_backend  # noqa: E402


def _block_audio() -> np.ndarray:
    """The speech mix repeated to exactly one offline block (512 chunks, 16.4 s)."""
    samples = OFFLINE_STEP_CHUNKS * 512
    audio = read_wav(MIX)
    return np.tile(audio, -(-samples // len(audio)))[:samples]


def main() -> None:
    args = sys.argv[1:]
    rounds = int(args[0]) if args else 3
    sizes = [int(a) for a in args[1:]] or [1, 4, 16]
    audio = _block_audio()
    rows = []
    with threadpool_limits(limits=1, user_api="blas"):
        for math in MATHS:
            factory = load_factory(make_backend("numpy", "cpu"), batch_math=math)
            for n in sizes:
                times = []
                for _ in range(rounds):
                    engine = factory.engine(max(sizes))
                    members = [Member(k, VadRequest(audio), False) for k in range(n)]
                    start = time.perf_counter()
                    out = engine.join(members)
                    times.append(time.perf_counter() - start)
                    assert all(e.error is None for e in out)
                median = statistics.median(times)
                rows.append(
                    {
                        "batch_math": math,
                        "members": n,
                        "engine call ms": round(median * 1000, 1),
                        "chunks per member": max(8, OFFLINE_STEP_CHUNKS // n),
                    }
                )
    print(markdown_table(rows))


if __name__ == "__main__":
    main()
