"""Op-level micro-bench: numpy vs OpenCL (PoCL here) vs CUDA (when cupy and a GPU exist).

Shapes are the ones the models run: Whisper tiny.en's encoder (1500 frames, width
384, MLP 1536, 6 heads) and decoder step, Piper's generator convs (512/256
channels, transposed upsampling by 8), Silero VAD's LSTM. Each op is warmed up
once (kernel builds), then timed ``repeats`` times with the device synchronised;
the table shows medians and each backend's ratio to numpy (< 1 is faster).

    .venv/bin/python bench/backends.py [--repeats N] [--backends numpy,opencl,cuda]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backends.numpy_backend import NumpyBackend

Op = tuple[str, str, Callable[[np.random.Generator], list[np.ndarray]], Callable[..., Any]]


def _r(*shape: int, scale: float = 1.0) -> Callable[[np.random.Generator], np.ndarray]:
    return lambda g: (g.standard_normal(shape) * scale).astype(np.float32)


def _ops() -> list[Op]:
    def inputs(
        *makers: Callable[[np.random.Generator], np.ndarray],
    ) -> Callable[[np.random.Generator], list[np.ndarray]]:
        return lambda g: [m(g) for m in makers]

    return [
        (
            "linear",
            "whisper enc qkv [1500,384]x[384,384]",
            inputs(_r(1500, 384), _r(384, 384, scale=0.05), _r(384)),
            lambda be, x, w, b: be.linear(x, w, b),
        ),
        (
            "linear",
            "whisper enc fc1 [1500,384]x[1536,384]",
            inputs(_r(1500, 384), _r(1536, 384, scale=0.05), _r(1536)),
            lambda be, x, w, b: be.linear(x, w, b),
        ),
        (
            "linear",
            "whisper dec step [1,384]x[1536,384]",
            inputs(_r(1, 384), _r(1536, 384, scale=0.05), _r(1536)),
            lambda be, x, w, b: be.linear(x, w, b),
        ),
        (
            "matmul",
            "whisper logits [1,384]x[384,51864]",
            inputs(_r(1, 384), _r(384, 51864, scale=0.05)),
            lambda be, a, b: be.matmul(a, b),
        ),
        (
            "conv1d",
            "whisper conv2 384->384 k3 s2 T3000",
            inputs(_r(1, 384, 3000), _r(384, 384, 3, scale=0.03), _r(384)),
            lambda be, x, w, b: be.conv1d(x, w, b, 2, 1),
        ),
        (
            "attention",
            "whisper enc self [6,1500,64]",
            inputs(_r(1, 6, 1500, 64), _r(1, 6, 1500, 64), _r(1, 6, 1500, 64)),
            lambda be, q, k, v: be.attention(q, k, v),
        ),
        (
            "layer_norm",
            "[1500,384]",
            inputs(_r(1500, 384), _r(384), _r(384)),
            lambda be, x, g, b: be.layer_norm(x, g, b),
        ),
        ("gelu", "[1500,1536]", inputs(_r(1500, 1536)), lambda be, x: be.gelu(x)),
        ("softmax", "[6,1500,1500]", inputs(_r(6, 1500, 1500)), lambda be, x: be.softmax(x)),
        (
            "conv1d",
            "piper pre 192->512 k7 T200",
            inputs(_r(1, 192, 200), _r(512, 192, 7, scale=0.03), _r(512)),
            lambda be, x, w, b: be.conv1d(x, w, b, 1, 3),
        ),
        (
            "conv1d",
            "piper res 256 k3 d3 T1600",
            inputs(_r(1, 256, 1600), _r(256, 256, 3, scale=0.03), _r(256)),
            lambda be, x, w, b: be.conv1d(x, w, b, 1, 3, 3),
        ),
        (
            "conv_transpose1d",
            "piper up 512->256 k16 s8 T200",
            inputs(_r(1, 512, 200), _r(512, 256, 16, scale=0.03), _r(256)),
            lambda be, x, w, b: be.conv_transpose1d(x, w, b, 8, 4),
        ),
        (
            "leaky_relu",
            "[1,256,1600]",
            inputs(_r(1, 256, 1600)),
            lambda be, x: be.leaky_relu(x, 0.1),
        ),
        (
            "add",
            "bcast [1,256,1600]+[256,1]",
            inputs(_r(1, 256, 1600), _r(256, 1)),
            lambda be, a, b: be.add(a, b),
        ),
        (
            "lstm_sequence",
            "silero T100 B1 128->128",
            inputs(
                _r(100, 1, 128),
                _r(1, 128),
                _r(1, 128),
                _r(512, 128, scale=0.1),
                _r(512, 128, scale=0.1),
                _r(512),
            ),
            lambda be, *a: be.lstm_sequence(*a),
        ),
    ]


def _backends(names: list[str]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for name in names:
        try:
            if name == "numpy":
                found[name] = NumpyBackend()
            elif name == "opencl":
                from backends.opencl_backend import make_backend as make_cl

                found[name] = make_cl("0")
            elif name == "cuda":
                from backends.cuda_backend import make_backend as make_cuda

                found[name] = make_cuda("0")
        except Exception as exc:  # a missing library or device is reported, not fatal
            print(f"# {name}: unavailable ({type(exc).__name__}: {exc})")
    return found


def _sync(be: Any, out: Any) -> None:
    if hasattr(be, "finish"):
        be.finish()
    elif not isinstance(out, np.ndarray | tuple):
        be.to_host(out)


def _time(be: Any, fn: Callable[..., Any], args: list[Any], repeats: int) -> float:
    _sync(be, fn(be, *args))  # warm-up: kernel builds, allocator
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        _sync(be, fn(be, *args))
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e3


def bench(
    repeats: int = 3, backends: tuple[str, ...] = ("numpy", "opencl", "cuda")
) -> list[dict[str, object]]:
    """One row per (op, shape): median ms per backend and ratio to numpy."""
    bes = _backends(list(backends))
    rows: list[dict[str, object]] = []
    for op, shape, make, fn in _ops():
        host = make(np.random.default_rng(0))
        row: dict[str, object] = {"op": op, "shape": shape}
        for name, be in bes.items():
            args = [be.to_device(h) for h in host]
            row[f"{name}_ms"] = _time(be, fn, args, repeats)
        base = row.get("numpy_ms")
        for name in bes:
            if name != "numpy" and isinstance(base, float):
                row[f"{name}/numpy"] = float(row[f"{name}_ms"]) / base  # type: ignore[arg-type]
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--backends", default="numpy,opencl,cuda")
    args = parser.parse_args()
    rows = bench(args.repeats, tuple(args.backends.split(",")))
    keys = [k for k in rows[0] if k not in ("op", "shape")] if rows else []
    print(f"{'op':<17} {'shape':<40} " + " ".join(f"{k:>13}" for k in keys))
    for row in rows:
        cells = " ".join(f"{float(row[k]):>13.2f}" for k in keys)  # type: ignore[arg-type]
        print(f"{row['op']!s:<17} {row['shape']!s:<40} {cells}")


if __name__ == "__main__":
    main()
