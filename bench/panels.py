"""Packed weights (backends/panels.py) against OpenBLAS on Whisper tiny's decoder shapes.

    python bench/panels.py [--rows 1,2,4,8,16,64] [--rounds 7]

For each weight a decoding step multiplies (the FFN's [1536, 384] and [384, 1536], the
self-attention's [1152, 384], the 80 MB vocabulary projection [51864, 384]; random
float32) and each row count: ``panels.linear`` on one lane and on two, against numpy's
``x @ w.T`` over the same weight stored contiguous ``[in, out]`` (what the step
multiplied before session 11) with OpenBLAS on one thread and on two (threadpoolctl),
alternating in one process, ``--rounds`` rounds after a warm-up. Prints median
microseconds (milliseconds for the vocabulary projection) and the ratios panels /
OpenBLAS at one and two.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if sys.path[:1] != [str(ROOT)]:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

from backends import panels  # noqa: E402

SHAPES = (("FFN in", 1536, 384), ("FFN out", 384, 1536), ("QKV", 1152, 384))
VOCAB = ("vocabulary", 51864, 384)


def _time(fn: Callable[[], object], calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls


def _blas_call(x: np.ndarray, stored: np.ndarray) -> Callable[[], object]:
    return lambda: x @ stored


def _panels_call(x: np.ndarray, packed: panels.PackedWeight, lanes: int) -> Callable[[], object]:
    return lambda: panels.linear(x, packed, None, lanes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,2,4,8,16,64")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print("| weight | rows | OpenBLAS 1 | panels 1 | OpenBLAS 2 | panels 2 | p/B 1 | p/B 2 |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, out_f, in_f in (*SHAPES, VOCAB):
        w = rng.standard_normal((out_f, in_f)).astype(np.float32)
        stored = np.ascontiguousarray(w.T)
        packed = panels.pack(w)
        unit, scale = ("ms", 1e3) if out_f > 10_000 else ("us", 1e6)
        calls = 3 if out_f > 10_000 else 200
        for rows in (int(r) for r in args.rows.split(",")):
            x = rng.standard_normal((rows, in_f)).astype(np.float32)
            runs: dict[str, tuple[Callable[[], object], int]] = {}
            for lanes in (1, 2):
                runs[f"blas{lanes}"] = (_blas_call(x, stored), lanes)
                runs[f"panels{lanes}"] = (_panels_call(x, packed, lanes), 1)
            times: dict[str, list[float]] = {k: [] for k in runs}
            order = list(runs)
            for r in range(-1, args.rounds):  # round -1: a warm-up
                for key in order[r % 4 :] + order[: r % 4]:
                    fn, threads = runs[key]
                    with threadpool_limits(limits=threads, user_api="blas"):
                        spent = _time(fn, calls)
                    if r >= 0:
                        times[key].append(spent)
            med = {k: statistics.median(v) * scale for k, v in times.items()}
            print(
                f"| {name} [{out_f}, {in_f}], {unit} | {rows} | {med['blas1']:.1f} | "
                f"{med['panels1']:.1f} | {med['blas2']:.1f} | {med['panels2']:.1f} | "
                f"{med['panels1'] / med['blas1']:.2f} | {med['panels2'] / med['blas2']:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
