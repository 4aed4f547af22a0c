"""The numpy backend's numba kernels against the numpy passes they replaced, on Whisper's encoder.

    python bench/kernels.py [--threads 1,2] [--rounds 8]

One 30 s window (random log-mel) through ``model.encode`` with the kernels
(``backends/kernels.py``: the attention's softmax rows, GELU, layer norm) and with
the numpy formulas patched back in (max, subtract, ``exp``, sum; ``erf.gelu`` in
chunks; XpBackend's layer norm), alternating in one process, ``--rounds`` rounds
after a warm-up; prints the median seconds per window for each and their ratio,
and the largest difference between the two outputs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if sys.path[:1] != [str(ROOT)]:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from backends import erf, parallel  # noqa: E402
from backends import numpy_backend as nb  # noqa: E402
from backends.whisper import load_factory, model  # noqa: E402
from backends.xp_backend import XpBackend  # noqa: E402


def _numpy_exp_rows(scores: np.ndarray, sums: np.ndarray | None = None) -> np.ndarray:
    if sums is None:
        sums = np.empty((*scores.shape[:-1], 1), scores.dtype)
    scores -= np.max(scores, axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    np.sum(scores, axis=-1, keepdims=True, out=sums)
    return sums


def _numpy_gelu(self: nb.NumpyBackend, x: Any) -> Any:
    flat = np.ascontiguousarray(x).reshape(-1)
    out = np.empty_like(flat)

    def chunk(i: int) -> None:
        out[i : i + nb._CHUNK] = erf.gelu(np, flat[i : i + nb._CHUNK])

    parallel.run_pieces(chunk, range(0, flat.size, nb._CHUNK))
    return out.reshape(x.shape)


def _use(kernels: bool, saved: dict[str, Callable[..., Any]]) -> None:
    """Put the kernels' functions (``kernels``) or the numpy passes in place."""
    nb._exp_rows = saved["exp_rows"] if kernels else _numpy_exp_rows  # type: ignore[assignment]
    nb.NumpyBackend.gelu = saved["gelu"] if kernels else _numpy_gelu  # type: ignore[method-assign]
    layer_norm = saved["layer_norm"] if kernels else XpBackend.layer_norm
    nb.NumpyBackend.layer_norm = layer_norm  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    factory = load_factory()
    be, w = factory.backend, factory.weights
    mel = np.random.default_rng(0).standard_normal((1, 80, 3000)).astype(np.float32)
    saved = {
        "exp_rows": nb._exp_rows,
        "gelu": nb.NumpyBackend.gelu,
        "layer_norm": nb.NumpyBackend.layer_norm,
    }
    print("| threads | numpy passes s | kernels s | kernels / numpy | max abs diff |")
    print("|---:|---:|---:|---:|---:|")
    for threads in (int(t) for t in args.threads.split(",")):
        parallel.SHARE.set_threads(threads)
        times: dict[bool, list[float]] = {False: [], True: []}
        outs: dict[bool, np.ndarray] = {}
        for kernels in (False, True):  # warm-up
            _use(kernels, saved)
            model.encode(be, w, mel)
        for r in range(args.rounds):
            for kernels in (False, True) if r % 2 == 0 else (True, False):
                _use(kernels, saved)
                t0 = time.perf_counter()
                outs[kernels] = np.asarray(model.encode(be, w, mel))
                times[kernels].append(time.perf_counter() - t0)
        old, new = statistics.median(times[False]), statistics.median(times[True])
        diff = float(np.max(np.abs(outs[True] - outs[False])))
        print(f"| {threads} | {old:.3f} | {new:.3f} | {new / old:.2f} | {diff:.1e} |")
    _use(True, saved)


if __name__ == "__main__":
    main()
